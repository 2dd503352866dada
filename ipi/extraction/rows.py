"""Replay rows: one forward pass per (trajectory, step, surface, variant) (PROTOCOL.md §2)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipi.data.schema import Step, Trajectory
from ipi.io import content_digest
from ipi.replay import PromptParts
from ipi.surfaces.variants import Variant, make_variants
from ipi.attacks.wording import WordingPlan, full_family

if TYPE_CHECKING:
    from ipi.attacks.pool import AttackPool


@dataclass(frozen=True)
class ReplayRow:
    """One row to replay.

    Attributes:
        row_id: ``"<trajectory_id>|<step>|<surface>|<variant>|<attack_index>"``; unique.
        trajectory_id: The cluster unit.
        task: Task instruction.
        horizon: Number of agent turns of the trajectory.
        step: The recorded step.
        variant: The (possibly injected) variant of the step.
    """

    row_id: str
    trajectory_id: str
    task: str
    horizon: int
    step: Step
    variant: Variant

    def parts(self, system_prompt: str, has_image: bool) -> PromptParts:
        """Prompt pieces of this row (injection applied)."""
        return PromptParts(
            system=system_prompt,
            task=self.task,
            history=tuple(self.step.history),
            tool_result=self.variant.tool_result,
            element_text=self.variant.element_text,
            gold=self.step.gold_text,
            has_image=has_image,
        )

    def metadata(self) -> dict:
        """Row metadata (PROTOCOL.md §3) known before the forward pass."""
        return {
            "row_id": self.row_id,
            "trajectory_id": self.trajectory_id,
            "step": self.step.step,
            "horizon": self.horizon,
            "surface": self.variant.surface,
            "variant": self.variant.variant,
            "attack_index": self.variant.attack_index,
        }


def row_fingerprint(row: ReplayRow, system_prompt: str, has_image: bool) -> str:
    """Hash of everything about a row that changes its features (prompt texts, image bytes, banner).

    The screenshot enters by its bytes (:func:`ipi.io.content_digest`), never by its path alone.
"""
    v = row.variant
    payload = repr((
        row.row_id, row.parts(system_prompt, has_image), v.injected_text,
        v.banner, content_digest(row.step.screenshot) if has_image else None,
    ))
    return hashlib.sha256(payload.encode()).hexdigest()


def build_rows(
    trajectories: Sequence[Trajectory],
    surface: str,
    controls: Sequence[str],
    *,
    n_attacks: int = 1,
    count_tokens: Callable[[str], int] | None = None,
    wording: WordingPlan | None = None,
    pool: AttackPool | None = None,
) -> list[ReplayRow]:
    """Expand trajectories into replay rows for one surface.

    Args:
        trajectories: Imported trajectories (skipped steps are already left out).
        surface: ``i_vis`` | ``i_dom`` | ``i_tool``.
        controls: Controls to build (must apply to the surface).
        n_attacks: Attack rows per step.
        count_tokens: Token counter for text-surface controls (matched token count).
        wording: Held-out wording plan (:func:`ipi.attacks.wording.wording_plan`): each
            trajectory's attack and imperative texts come from its own family only. None: every
            row draws from the whole pool.
        pool: The run's attack pool (:mod:`ipi.attacks.pool`) when ``wording`` is None; default
            the project bank. Each trajectory's family is bound to its task (the ``{task}`` slot).

    Returns:
        Rows in (trajectory, step, variant) order.
    """
    rows = []
    for t in trajectories:
        for s in t.steps:
            fam = (wording.family(t.trajectory_id) if wording is not None else full_family(pool)).bind(t.task)
            for v in make_variants(t.trajectory_id, s, surface, controls, n_attacks=n_attacks,
                                   count_tokens=count_tokens, wording=fam):
                rid = f"{t.trajectory_id}|{s.step}|{surface}|{v.variant}|{v.attack_index}"
                rows.append(ReplayRow(rid, t.trajectory_id, t.task, t.horizon, s, v))
    ids = [r.row_id for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError("build_rows: duplicate row ids (duplicate trajectory ids in the data?)")
    return rows


def image_tokens(processor, path: str, image_size: dict | None) -> int:
    """Image tokens a screenshot adds to a Qwen2.5-VL prompt, from its size alone (no decoding).

    The count the image processor gives (``grid_t · grid_h · grid_w / merge_size²`` after
    ``smart_resize`` within the pixel limits), read with its ``get_number_of_image_patches``; a
    variant's banner is drawn inside the screenshot, so every variant of a step has its count.

    Args:
        processor: A Qwen2.5-VL processor (``image_processor`` with ``merge_size``).
        path: The screenshot file (only its header is read: the replay feeds the pixels as stored,
            :func:`ipi.data.images.load_rgb` applies no EXIF rotation, so neither does the count).
        image_size: Pixel limits ``{"shortest_edge", "longest_edge"}`` (total pixels), or None.

    Returns:
        The number of image tokens.
    """
    from PIL import Image

    with Image.open(path) as im:
        width, height = im.size
    ip = processor.image_processor
    patches = ip.get_number_of_image_patches(height, width, {"size": image_size} if image_size else None)
    return int(patches) // int(getattr(ip, "merge_size", 2)) ** 2


def sequence_lengths(rows: Sequence[ReplayRow], processor, system_prompt: str, multimodal: bool,
                     image_size: dict | None = None, *, show: bool = True) -> list[tuple[int, int]]:
    """Tokens each row puts through the backbone (prompt and gold action), image tokens included.

    The same rendering and tokenisation as the extraction's (:func:`ipi.replay.render_prompt`,
    :func:`ipi.replay.encode_prompt`), without the forward pass and without decoding any image.

    Args:
        rows: Replay rows.
        processor: The backbone's processor (multimodal) or chat processor (text-only).
        system_prompt: The agent's system prompt.
        multimodal: Whether the screenshot is part of the prompt.
        image_size: The backbone's pixel limits.
        show: Show a progress bar (off for the few rows of one step).

    Returns:
        ``(tokens, image tokens)`` per row, in order.
    """
    from ipi.progress import track
    from ipi.replay import encode_prompt, render_prompt

    tok = getattr(processor, "tokenizer", processor)
    out, memo, shots, last = [], {}, {}, None
    for r in (track(rows, "prompt lengths (rows)") if show else rows):
        key = (r.trajectory_id, r.step.step)
        if key != last:
            memo, shots, last = {}, {}, key
        n_image = 0
        if multimodal:
            if r.step.screenshot not in shots:
                shots[r.step.screenshot] = image_tokens(processor, r.step.screenshot, image_size)
            n_image = shots[r.step.screenshot]
        rendered = render_prompt(processor, r.parts(system_prompt, multimodal))
        _, ids, _, _ = encode_prompt(tok, rendered, image_pad="<|image_pad|>" if multimodal else None,
                                     n_image_tokens=n_image, memo=memo)
        out.append((int(ids.numel()), n_image))
    return out


def over_context(rows: Sequence[ReplayRow], lengths: Sequence[tuple[int, int]], positions: int,
                 ) -> tuple[list[ReplayRow], list[dict]]:
    """Leave out every step whose longest row needs more positions than the backbone has.

    A whole step goes (all its variants on the surface), so the variants a step keeps stay
    matched: an attack row is never kept without its clean row for being shorter.

    Args:
        rows: Replay rows.
        lengths: :func:`sequence_lengths` of ``rows``.
        positions: The backbone's context (:func:`ipi.backbone.context_positions`).

    Returns:
        ``(rows kept, skipped steps)``; each skip is ``{"trajectory_id", "step", "reason", "path"}``
        as the importers' step skips, its reason giving the longest row's tokens (image tokens
        among them) and the context.
    """
    longest: dict[tuple, tuple[int, int, str]] = {}
    for r, (n, n_image) in zip(rows, lengths):
        key = (r.trajectory_id, r.step.step)
        if key not in longest or n > longest[key][0]:
            longest[key] = (n, n_image, r.variant.variant)
    over = {k: v for k, v in longest.items() if v[0] > positions}
    kept = [r for r in rows if (r.trajectory_id, r.step.step) not in over]
    paths = {(r.trajectory_id, r.step.step): r.step.screenshot for r in rows}
    skips = [{"trajectory_id": k[0], "step": k[1], "path": paths[k],
              "reason": (f"prompt over the backbone's context: the {var} row has {n} tokens"
                         f"{f' ({n_image} of them image tokens)' if n_image else ''}, the context {positions} positions")}
             for k, (n, n_image, var) in over.items()]
    return kept, skips
