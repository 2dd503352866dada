"""``i_tool``: a notice line appended to the tool result block (PROTOCOL.md §2; docs/surfaces.md).

The injection is appended on a new line formatted like a tool output field,
``tool_result + "\\n[page notice] " + text`` (just ``"[page notice] " + text`` when the tool result
is empty). Controls go to the same place with the same prefix and token count
(:class:`~ipi.surfaces.surface.TextSurface`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from ipi.surfaces.surface import Insertion, TextSurface

if TYPE_CHECKING:
    from ipi.data.schema import Step

__all__ = ["TOOL_NOTICE_PREFIX", "ToolResultSurface"]

#: Prefix of the line appended to the tool result block.
TOOL_NOTICE_PREFIX = "[page notice] "


class _ToolNotice(Insertion):
    """The notice line after the step's tool result."""

    def __init__(self, step: Step):
        self.original = step.tool_result
        self.meta = {}

    def line(self, text: str) -> str:
        return TOOL_NOTICE_PREFIX + text

    def apply(self, text: str | None) -> tuple[str, int, int]:
        if text is None:
            return self.original, len(self.original), len(self.original)
        head = (self.original + "\n") if self.original else ""
        start = len(head) + len(TOOL_NOTICE_PREFIX)
        return head + TOOL_NOTICE_PREFIX + text, start, start + len(text)


class ToolResultSurface(TextSurface):
    """A notice line in the tool result block (``conf/surface/i_tool.yaml``)."""

    name: ClassVar[str] = "i_tool"
    controls: ClassVar[tuple[str, ...]] = ("c_scrambled", "c_imperative")
    required_controls: ClassVar[tuple[str, ...]] = ("c_scrambled", "c_imperative")
    needs_image: ClassVar[bool] = False
    token_matched: ClassVar[bool] = True
    untrusted_group: ClassVar[str] = "observation"
    gallery_title: ClassVar[str] = ("i_tool: line appended to the tool result block "
                                    "(controls: same place and prefix, same token count)")
    field: ClassVar[str] = "tool_result"
    new_line: ClassVar[bool] = True
    # ipi.replay's template: "...action:\n{tool_result}\nPage elements:\n..." (TextSurface.follows)
    follows: ClassVar[str] = "\n"

    def insertion(self, trajectory_id: str, step: Step) -> Insertion:
        return _ToolNotice(step)
