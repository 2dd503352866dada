"""The ``mix`` source: every attack source at once, each item keeping its own source family.

By default the members are every source module of :mod:`ipi.attacks`
(:func:`ipi.attacks.available_sources`, composites excluded), in name order; pass ``sources`` to
mix a chosen few. Held-out-by-source splits read each item's ``source``, never ``"mix"``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from ipi.attacks.source import AttackSource, AttackSourceError, BenignText, Goal, Provenance, Template

__all__ = ["MixSource"]


class MixSource:
    """The union of several sources (module docstring).

    Attributes:
        members: The member sources' families, in order; items carry one of them in ``source``.
    """

    family = "mix"
    composite = True

    def __init__(self, sources: Sequence[AttackSource] | None = None) -> None:
        """Args:
            sources: Member sources; default one instance of every available source.

        Raises:
            AttackSourceError: No member, a composite member, or two members of one family.
        """
        if sources is None:
            from ipi.attacks import available_sources

            sources = [cls() for cls in available_sources().values()]
        self._sources = tuple(sources)
        fams = [s.family for s in self._sources]
        if not fams:
            raise AttackSourceError("attack source mix: no member sources")
        if any(getattr(s, "composite", False) for s in self._sources):
            raise AttackSourceError("attack source mix: a mix cannot contain a mix")
        if len(set(fams)) != len(fams):
            raise AttackSourceError(f"attack source mix: repeated member families {fams}")
        self.members = tuple(fams)

    @functools.cached_property
    def _items(self) -> tuple[tuple[Template, ...], tuple[Goal, ...], tuple[BenignText, ...]]:
        return (tuple(t for s in self._sources for t in s.templates()),
                tuple(g for s in self._sources for g in s.goals()),
                tuple(b for s in self._sources for b in s.benign()))

    def templates(self) -> tuple[Template, ...]:
        return self._items[0]

    def goals(self) -> tuple[Goal, ...]:
        return self._items[1]

    def benign(self) -> tuple[BenignText, ...]:
        return self._items[2]

    def provenance(self) -> tuple[Provenance, ...]:
        return tuple(p for s in self._sources for p in s.provenance())
