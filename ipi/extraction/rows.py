"""Replay rows: one forward pass per (trajectory, step, surface, variant) (PROTOCOL.md §2)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
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

    The screenshot enters by its bytes (:func:`ipi.io.content_digest`, memoised by the file's
    inode, size and times, never by its path alone: two data roots whose importers wrote the
    same file name, or a screenshot rewritten between two jobs of a sweep, key by what they hold).
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
