"""``i_dom``: a new entry in the page's element list (PROTOCOL.md §2; docs/surfaces.md).

WebVoyager page text is a list of entries ``[<label>]: "<text>", …`` separated by ``";\\t"``. The
injection becomes a new entry ``[<n>]: "<text>";`` with ``n`` one past the largest existing
label, inserted after the ``p``-th entry, ``p`` drawn from ``0 … number of entries`` by a stable
hash of ``(trajectory_id, step)``. A text with a double quote or a line break is carried as one
line with ``'`` for ``"`` (:meth:`_ElementEntry.adapt`, flagged ``meta["adapted"]``). Controls go
to the same position with the same label, wrapper and token count
(:class:`~ipi.surfaces.surface.TextSurface`)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, ClassVar

from ipi.surfaces.bank import stable_int
from ipi.surfaces.surface import Insertion, TextSurface

if TYPE_CHECKING:
    from ipi.data.schema import Step

__all__ = ["ELEMENT_SEPARATOR", "ElementListSurface"]

#: Separator between entries of a WebVoyager element list.
ELEMENT_SEPARATOR = ";\t"

_LABEL = re.compile(r"^\s*\[(\d+)\]")


class _ElementEntry(Insertion):
    """The injected entry of one step: its position among the entries and its label."""

    def __init__(self, trajectory_id: str, step: Step):
        self.original = step.element_text
        self.trailing = self.original.endswith(";")
        body = self.original[:-1] if self.trailing else self.original
        self.entries = body.split(ELEMENT_SEPARATOR) if body.strip() else []
        labels = [int(m.group(1)) for e in self.entries if (m := _LABEL.match(e))]
        self.label = max(labels) + 1 if labels else 0
        self.position = stable_int("i_dom-position", trajectory_id, step.step) % (len(self.entries) + 1)
        head = ELEMENT_SEPARATOR.join(self.entries[: self.position])
        self.entry_start = len(head) + len(ELEMENT_SEPARATOR) if self.position else 0
        self.meta = {"position": self.position, "label": self.label}

    def line(self, text: str) -> str:
        return f'[{self.label}]: "{text}";'

    def adapt(self, text: str) -> str:
        """One line without double quotes: ``"`` becomes ``'``, every whitespace run one space.

        An entry is ``[n]: "<text>";`` on the page's one line with ``";\\t"`` between entries, so a
        published text's ``"`` would close the entry early and its newlines and tabs would break
        the list (docs/attacks.md, "What the integration must do").
        """
        return " ".join(text.replace('"', "'").split())

    def apply(self, text: str | None) -> tuple[str, int, int]:
        if text is None:
            point = min(self.entry_start, len(self.original))  # appended after the last
            return self.original, point, point
        wrapped = f'[{self.label}]: "{text}"'
        parts = self.entries[: self.position] + [wrapped] + self.entries[self.position :]
        out = ELEMENT_SEPARATOR.join(parts)
        # The original's trailing ";" (or ours when the list was empty) closes the last entry.
        if self.trailing or not self.entries:
            out += ";"
        start = self.entry_start + len(f'[{self.label}]: "')
        return out, start, start + len(text)


class ElementListSurface(TextSurface):
    """A new element entry in the page text (``conf/surface/i_dom.yaml``)."""

    name: ClassVar[str] = "i_dom"
    controls: ClassVar[tuple[str, ...]] = ("c_scrambled", "c_imperative")
    required_controls: ClassVar[tuple[str, ...]] = ("c_scrambled", "c_imperative")
    needs_image: ClassVar[bool] = False
    token_matched: ClassVar[bool] = True
    untrusted_group: ClassVar[str] = "observation"
    gallery_title: ClassVar[str] = ("i_dom: new element entry in the page text at a seeded position "
                                    "(controls: same position and wrapper, same token count)")
    field: ClassVar[str] = "element_text"
    new_line: ClassVar[bool] = False

    def insertion(self, trajectory_id: str, step: Step) -> Insertion:
        return _ElementEntry(trajectory_id, step)
