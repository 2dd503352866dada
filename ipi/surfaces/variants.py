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

    :meth:`ipi.surfaces.surface.Surface.make_variants` of ``surface`` (a registered surface's
    name, or the object); the other arguments and the order of the variants are that method's.

    Raises:
        ValueError: Unknown surface, or as :meth:`~ipi.surfaces.surface.Surface.make_variants`.
"""
    return get_surface(surface).make_variants(trajectory_id, step, controls, n_attacks=n_attacks,
                                              count_tokens=count_tokens, wording=wording)
