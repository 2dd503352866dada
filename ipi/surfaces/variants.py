"""Variants of one (trajectory, step, surface): clean, attack(s) and nuisance-matched controls.

:func:`make_variants` asks the surface object (:mod:`ipi.surfaces.registry`) to build them; each
surface's module says how (``ipi.surfaces.i_vis``: a banner on the screenshot, ``i_dom``: an
entry in the element list, ``i_tool``: a notice in the tool result; docs/surfaces.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ipi.surfaces.surface import Surface, Variant
from ipi.surfaces.registry import get_surface

if TYPE_CHECKING:
    from ipi.data.schema import Step
    from ipi.surfaces.surface import WordingFamily

__all__ = ["Variant", "make_variants"]


def make_variants(
    trajectory_id: str,
    step: Step,
    surface: str | Surface,
    controls: Sequence[str],
    *,
    n_attacks: int = 1,
    count_tokens: Callable[[str], int] | None = None,
    wording: WordingFamily | None = None,
) -> list[Variant]:
    """Build the clean, attack and control variants of one (trajectory, step, surface).

    Order: ``clean``, ``attack`` for ``k = 0 .. n_attacks - 1``, then the controls in the order
    given, each matched to attack ``k = 0`` (:meth:`ipi.surfaces.surface.Surface.make_variants`).

    Args:
        trajectory_id: Trajectory id (seeds every choice together with ``step.step``).
        step: The recorded step.
        surface: A registered surface's name (``i_vis``, ``i_dom``, ``i_tool``, ...) or object.
        controls: Controls to build, a subset of the surface's ``controls``.
        n_attacks: Number of attack rows (``>= 1``).
        count_tokens: Token counter of the backbone's tokenizer; required on token-matched
            surfaces (``i_dom``, ``i_tool``), unused on ``i_vis``.
        wording: The trajectory's held-out wording family (:mod:`ipi.attacks.wording`):
            attack templates, goals and ``c_imperative`` sentences are drawn from it only.
            None: the whole bank.

    Returns:
        The variants.

    Raises:
        ValueError: Unknown surface, a control not applicable to the surface, a duplicate
            control, ``n_attacks < 1``, or ``count_tokens`` missing on a token-matched surface.
    """
    return get_surface(surface).make_variants(trajectory_id, step, controls, n_attacks=n_attacks,
                                              count_tokens=count_tokens, wording=wording)
