"""The ``project`` source: the bank ipi wrote itself (:mod:`ipi.surfaces.bank`), texts unchanged.

Item ids index the bank: ``project/template_<i>`` is ``ATTACK_TEMPLATES[i]``, ``project/goal_<j>``
is ``ATTACK_GOAL_LIST[j]`` (the index ``meta["goal"]`` of a row), ``project/benign_<m>`` is
``BENIGN_IMPERATIVES[m]``. Goal targets: what :func:`ipi.attacks.targets.extract_targets` finds
(URLs, ``element [n]``) plus ``data/project.yaml`` (fields, credentials, abandon answers).
"""

from __future__ import annotations

import functools

from ipi.attacks.source import AttackSourceError, BenignText, Goal, Provenance, Template, load_data
from ipi.attacks.targets import extract_targets, merge_targets
from ipi.surfaces.bank import ATTACK_GOAL_LIST, ATTACK_TEMPLATES, BENIGN_IMPERATIVES

__all__ = ["ProjectSource"]

_ORIGIN = "ipi/surfaces/bank.py"


class ProjectSource:
    """The project's own bank as an :class:`~ipi.attacks.source.AttackSource`."""

    family = "project"

    def templates(self) -> tuple[Template, ...]:
        return tuple(Template(id=f"project/template_{i:02d}", source=self.family, text=t,
                              name=f"ATTACK_TEMPLATES[{i}]", origin=_ORIGIN)
                     for i, t in enumerate(ATTACK_TEMPLATES))

    def goals(self) -> tuple[Goal, ...]:
        return self._goals

    @functools.cached_property
    def _goals(self) -> tuple[Goal, ...]:
        extra = load_data("project.yaml") or {}
        known = {g for _, g in ATTACK_GOAL_LIST}
        stale = sorted(set(extra) - known)
        if stale:
            raise AttackSourceError(f"ipi/attacks/data/project.yaml: not a bank goal: {stale}")
        return tuple(Goal(id=f"project/goal_{j:02d}", source=self.family, family=fam, text=g,
                          target=merge_targets(extract_targets(g), extra.get(g, {})),
                          origin=f"{_ORIGIN} ATTACK_GOALS[{fam!r}]")
                     for j, (fam, g) in enumerate(ATTACK_GOAL_LIST))

    def benign(self) -> tuple[BenignText, ...]:
        return tuple(BenignText(id=f"project/benign_{m:02d}", source=self.family, text=t,
                                category="ui", origin=f"{_ORIGIN} BENIGN_IMPERATIVES")
                     for m, t in enumerate(BENIGN_IMPERATIVES))

    def provenance(self) -> tuple[Provenance, ...]:
        return (Provenance(source=self.family, origin="ipi", version="this repository",
                           paths=(_ORIGIN,), license="Apache-2.0",
                           note="written for ipi; .example domains only (RFC 2606)"),)
