"""The ``notinject`` source: NotInject's benign sentences full of injection trigger words.

NotInject (InjecGuard, Li & Liu 2024; MIT) is an over-defence set: benign requests built around
one to three words common in prompt injections ("ignore", "bypass", "override", ...). It yields
only **benign** texts, the ``c_imperative`` control's material for a probe that must not fire on
instruction-like wording alone. Shipped as ``data/notinject/notinject.json``
(``scripts/build_attack_data.py``): the 255 English sentences; no templates, no goals.
"""

from __future__ import annotations

import functools

from ipi.attacks.source import BenignText, Goal, Provenance, Template, load_data

__all__ = ["NotInjectSource"]


class NotInjectSource:
    """NotInject as an :class:`~ipi.attacks.source.AttackSource` (module docstring)."""

    family = "notinject"

    @functools.cached_property
    def _data(self) -> dict:
        return load_data("notinject/notinject.json")

    def templates(self) -> tuple[Template, ...]:
        return ()

    def goals(self) -> tuple[Goal, ...]:
        return ()

    @functools.cached_property
    def _benign(self) -> tuple[BenignText, ...]:
        return tuple(BenignText(id=f"notinject/{b['name']}", source=self.family, text=b["text"],
                                category=b["category"],
                                origin=f"{self._data['repository']}@{self._data['commit'][:12]} {b['origin']}")
                     for b in self._data["benign"])

    def benign(self) -> tuple[BenignText, ...]:
        return self._benign

    def provenance(self) -> tuple[Provenance, ...]:
        return (Provenance(source=self.family, origin=self._data["repository"], version=self._data["commit"],
                           paths=("datasets/NotInject_one.json", "datasets/NotInject_two.json",
                                  "datasets/NotInject_three.json"),
                           license="MIT", notice="Copyright (c) 2024 Hao Li",
                           note="English sentences only; data/notinject/PROVENANCE.md"),)
