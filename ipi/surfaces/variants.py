"""Variants of one (trajectory, step, surface): clean, attack(s) and nuisance-matched controls.

See ``docs/surfaces.md`` for the researcher-facing description. In short:

* ``i_vis`` — a banner drawn on the screenshot (:mod:`ipi.surfaces.banner`); controls keep the
  box, colours and font and the attack's character count and layout.
* ``i_dom`` — a new element entry ``[<n>]: "<text>"`` inserted into the page's element list at a
  seeded position; controls go to the same position with the same wrapper and the same token
  count.
* ``i_tool`` — a line ``[page notice] <text>`` appended to the tool result block; controls go to
  the same place with the same token count.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PIL import Image

from ipi.data.images import load_rgb
from ipi.protocol import CONTROLS_BY_SURFACE, SURFACES
from ipi.surfaces.bank import attack_text, stable_int
from ipi.surfaces.banner import BannerSpec, banner_spec, draw_banner, text_fits
from ipi.surfaces.controls import (
    benign_imperative,
    imperative_sentences,
    match_token_count,
    scramble,
    scramble_tokens,
)

if TYPE_CHECKING:
    from ipi.data.schema import Step
    from ipi.surfaces.wording import WordingFamily


#: Separator between entries of a WebVoyager element list.
ELEMENT_SEPARATOR = ";\t"
#: Prefix of the line appended to the tool result block on ``i_tool``.
TOOL_NOTICE_PREFIX = "[page notice] "

_LABEL = re.compile(r"^\s*\[(\d+)\]")


@dataclass(frozen=True)
class Variant:
    """One variant of one (trajectory, step, surface): what the prompt will show.

    Attributes:
        surface: ``i_vis``, ``i_dom`` or ``i_tool``.
        variant: ``clean``, ``attack``, ``c_scrambled``, ``c_imperative`` or ``c_occlusion``.
        attack_index: ``k`` of the attack (controls are matched to ``k = 0`` and carry 0);
            ``-1`` for clean.
        injected_text: The text inserted or drawn; ``None`` for clean and ``c_occlusion``.
        element_text: Page text the prompt will show.
        tool_result: Tool result block the prompt will show.
        banner: The step's banner spec on ``i_vis`` (clean rows carry it too, so that an
            ``overlay`` token group can pool the same patches), ``None`` on text surfaces.
        meta: JSON-serialisable details: ``template``/``goal``/``goal_family`` of the attack the
            row is (matched to); on text surfaces ``insert_start``/``insert_end`` (character
            span of the injected text in ``element_text`` or ``tool_result``; for clean rows the
            insertion point, start == end), ``n_tokens`` (tokens of the whole changed field) and
            ``token_delta`` (``n_tokens`` minus that of the attack ``k = 0`` row: 0 for matched
            controls, negative for clean); on ``i_dom`` also ``position``
            (entries before the injected one) and ``label``; on ``i_vis`` ``banner`` (the spec
            as a dict) and ``text_fits``.
    """

    surface: str
    variant: str
    attack_index: int
    injected_text: str | None
    element_text: str
    tool_result: str
    banner: BannerSpec | None
    meta: dict

    def image(self, step: Step, screenshot: Image.Image | None = None) -> Image.Image:
        """Return the screenshot the prompt will show (a new RGB image, :func:`ipi.data.images.to_rgb`).

        Args:
            step: The step this variant was made from (its ``screenshot`` is opened).
            screenshot: ``step``'s screenshot already decoded (:func:`ipi.data.images.load_rgb`),
                shared by the variants of one step so the file is decoded once; it is returned
                as is for clean rows and never modified (the banner is drawn on a copy).

        Returns:
            The clean screenshot, or, for non-clean ``i_vis`` variants, the screenshot with the
            banner drawn (the empty box for ``c_occlusion``).

        Raises:
            DataError: The screenshot cannot be decoded (message names the file and step; the
                importer's header check cannot see a compressed stream forged with valid CRCs).
        """
        # Any mode Pillow opens, as a person sees it (16-bit grey, transparency, CMYK, ...).
        img = screenshot if screenshot is not None else load_rgb(step.screenshot, step.step)
        if self.banner is None or self.variant == "clean":
            return img
        return draw_banner(img, self.banner, self.injected_text)


def _check_args(surface: str, controls: Sequence[str]) -> None:
    if surface not in SURFACES:
        raise ValueError(f"unknown surface {surface!r}; allowed: {', '.join(SURFACES)}")
    allowed = CONTROLS_BY_SURFACE[surface]
    for c in controls:
        if c not in allowed:
            raise ValueError(
                f"control {c!r} does not apply to surface {surface!r}; "
                f"allowed: {', '.join(allowed)}"
            )
    if len(set(controls)) != len(controls):
        raise ValueError(f"duplicate control in {list(controls)!r}; allowed: {', '.join(allowed)}")


def _seed_key(trajectory_id: str, step: int, control: str) -> str:
    # Surface-independent on purpose: the attack text of a step is the same on every surface,
    # and so is its scrambled / imperative source before token matching.
    return f"{trajectory_id}\x1f{step}\x1f{control}"


class _Inserter:
    """Where and how a text lands in the element list or the tool result."""

    def __init__(self, surface: str, trajectory_id: str, step: Step):
        self.surface = surface
        self.position = -1
        self.label = -1
        if surface == "i_dom":
            self.original = step.element_text
            self.trailing = self.original.endswith(";")
            body = self.original[:-1] if self.trailing else self.original
            self.entries = body.split(ELEMENT_SEPARATOR) if body.strip() else []
            labels = [int(m.group(1)) for e in self.entries if (m := _LABEL.match(e))]
            self.label = max(labels) + 1 if labels else 0
            self.position = stable_int("i_dom-position", trajectory_id, step.step) % (
                len(self.entries) + 1
            )
            head = ELEMENT_SEPARATOR.join(self.entries[: self.position])
            self.entry_start = len(head) + len(ELEMENT_SEPARATOR) if self.position else 0
        else:
            self.original = step.tool_result

    def line(self, text: str) -> str:
        """The injected unit as it appears in the field (wrapper included)."""
        if self.surface == "i_dom":
            return f'[{self.label}]: "{text}";'
        return TOOL_NOTICE_PREFIX + text

    def apply(self, text: str | None) -> tuple[str, int, int]:
        """Return ``(field, start, end)``: the new field and the span of ``text`` in it.

        For ``text=None`` (clean) the field is the original and the span is the empty span at
        the insertion point.
        """
        if self.surface == "i_dom":
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
        if text is None:
            return self.original, len(self.original), len(self.original)
        head = (self.original + "\n") if self.original else ""
        out = head + TOOL_NOTICE_PREFIX + text
        start = len(head) + len(TOOL_NOTICE_PREFIX)
        return out, start, start + len(text)


def _memoised(count_tokens: Callable[[str], int]) -> Callable[[str], int]:
    """``count_tokens`` with a memo (one per step: its texts are not seen again)."""
    counted: dict[str, int] = {}

    def count(text: str) -> int:
        if text not in counted:
            counted[text] = count_tokens(text)
        return counted[text]

    return count


def make_variants(
    trajectory_id: str,
    step: Step,
    surface: str,
    controls: Sequence[str],
    *,
    n_attacks: int = 1,
    count_tokens: Callable[[str], int] | None = None,
    wording: WordingFamily | None = None,
) -> list[Variant]:
    """Build the clean, attack and control variants of one (trajectory, step, surface).

    Order: ``clean``, ``attack`` for ``k = 0 .. n_attacks - 1``, then the controls in the order
    given. Controls are matched to attack ``k = 0`` (with ``n_attacks > 1`` the other attacks
    have no control of their own; their banner is the same box).

    ``i_vis``: ``c_scrambled`` is :func:`~ipi.surfaces.controls.scramble` of the attack text,
    ``c_imperative`` is :func:`~ipi.surfaces.controls.benign_imperative` of the attack's
    character count, ``c_occlusion`` the empty box; page text and tool result are unchanged.
    On ``i_dom``/``i_tool``, ``c_imperative`` is whole sentences
    (:func:`~ipi.surfaces.controls.imperative_sentences`).

    ``i_dom``/``i_tool``: controls are inserted at the attack's place with the attack's wrapper
    and token count. Matching first counts the injected unit alone (``[n]: "<text>";`` or
    ``[page notice] <text>``), then checks the whole changed field; if the field's count differs
    from the attack's (tokenizer merges across the boundary), it re-matches on the whole field.
    ``meta["token_delta"]`` reports any remaining difference (0 when exact).

    Args:
        trajectory_id: Trajectory id (seeds every choice together with ``step.step``).
        step: The recorded step.
        surface: ``i_vis``, ``i_dom`` or ``i_tool``.
        controls: Controls to build, a subset of ``CONTROLS_BY_SURFACE[surface]``.
        n_attacks: Number of attack rows (``>= 1``).
        count_tokens: Token counter of the backbone's tokenizer; required on ``i_dom`` and
            ``i_tool``, unused on ``i_vis``.
        wording: The trajectory's held-out wording family (:mod:`ipi.surfaces.wording`):
            attack templates, goals and ``c_imperative`` sentences are drawn from it only.
            None: the whole bank.

    Returns:
        The variants.

    Raises:
        ValueError: Unknown surface, a control not applicable to the surface, a duplicate
            control, ``n_attacks < 1``, or ``count_tokens`` missing on a text surface.
    """
    _check_args(surface, controls)
    if n_attacks < 1:
        raise ValueError(f"n_attacks must be >= 1, got {n_attacks}")
    tpl, gls, imp = ((wording.templates, wording.goals, wording.imperative_texts) if wording is not None
                     else (None, None, None))
    attacks = [attack_text(trajectory_id, step.step, k, templates=tpl, goals=gls) for k in range(n_attacks)]
    a0_text, a0_meta = attacks[0]
    out: list[Variant] = []

    if surface == "i_vis":
        with Image.open(step.screenshot) as im:
            size = im.size
        spec = banner_spec(trajectory_id, step.step, size)
        spec_d = spec.to_dict()

        def vis(variant: str, k: int, text: str | None, meta: dict) -> Variant:
            fits = True if text is None else text_fits(spec, text)
            m = {**meta, "banner": spec_d, "text_fits": fits}
            return Variant("i_vis", variant, k, text, step.element_text, step.tool_result, spec, m)

        out.append(vis("clean", -1, None, {}))
        for k, (text, meta) in enumerate(attacks):
            out.append(vis("attack", k, text, meta))
        for c in controls:
            key = _seed_key(trajectory_id, step.step, c)
            if c == "c_scrambled":
                text = scramble(a0_text, key)
            elif c == "c_imperative":
                text = benign_imperative(len(a0_text), key, imp)
            else:
                text = None
            out.append(vis(c, 0, text, {**a0_meta, "n_chars": len(a0_text)}))
        return out

    if count_tokens is None:
        raise ValueError(f"count_tokens is required for surface {surface!r} (token matching)")
    # The searches below count the same field or line more than once (the attack's field, each
    # control's field before and after matching): a per-step memo of the pure counter.
    count_tokens = _memoised(count_tokens)
    ins = _Inserter(surface, trajectory_id, step)
    extra = {"position": ins.position, "label": ins.label} if surface == "i_dom" else {}

    def field_count(text: str) -> int:
        return count_tokens(ins.apply(text)[0])

    def line_count(text: str) -> int:
        return count_tokens(ins.line(text))

    target_field = field_count(a0_text)

    def row(variant: str, k: int, text: str | None, meta: dict) -> Variant:
        field, start, end = ins.apply(text)
        n = count_tokens(field)
        m = {**meta, **extra, "insert_start": start, "insert_end": end, "n_tokens": n,
             "token_delta": n - target_field}
        element_text = field if surface == "i_dom" else step.element_text
        tool_result = field if surface == "i_tool" else step.tool_result
        return Variant(surface, variant, k, text, element_text, tool_result, None, m)

    out.append(row("clean", -1, None, {}))
    for k, (text, meta) in enumerate(attacks):
        out.append(row("attack", k, text, meta))
    target_line = line_count(a0_text)
    for c in controls:
        key = _seed_key(trajectory_id, step.step, c)
        if c == "c_scrambled":
            text = scramble_tokens(a0_text, key, line_count, target_tokens=target_line)
            if field_count(text) != target_field:
                text = match_token_count(scramble(a0_text, key), target_field, field_count)
        else:
            # Whole sentences only (docs/surfaces.md): matched on the inserted line, then, if the
            # page context shifts a boundary token, on the whole field.
            text = imperative_sentences(target_line, key, line_count, bank=imp)
            if field_count(text) != target_field:
                alt = imperative_sentences(target_field, key, field_count, bank=imp)
                if abs(field_count(alt) - target_field) < abs(field_count(text) - target_field):
                    text = alt
        out.append(row(c, 0, text, dict(a0_meta)))
    return out
