"""The ``injecagent`` source: InjecAgent's attacker instructions and its two attack settings.

InjecAgent (Zhan et al., Findings of ACL 2024; MIT) injects an attacker instruction into a tool
response: direct-harm (``dh``) and data-stealing (``ds``) cases. Shipped as
``data/injecagent/injecagent.json`` with its license and provenance
(``scripts/build_attack_data.py`` rebuilds it); docs/attacks.md, "injecagent":

* templates: ``base`` (``{goal}``) and ``enhanced`` (InjecAgent's hacking prompt);
* goals: the attacker instructions; family by first attacker tool
  (``data/injecagent/families.yaml``); targets: the attacker tools, what
  :mod:`ipi.attacks.targets` finds, and the account numbers of ``families.yaml``;
* no benign texts."""

from __future__ import annotations

import functools

from ipi.attacks.source import AttackSourceError, BenignText, Goal, Provenance, Template, load_data
from ipi.attacks.targets import extract_targets, merge_targets

__all__ = ["InjecAgentSource"]

_DATA = "injecagent/injecagent.json"


class InjecAgentSource:
    """InjecAgent as an :class:`~ipi.attacks.source.AttackSource` (module docstring)."""

    family = "injecagent"

    @functools.cached_property
    def _data(self) -> dict:
        return load_data(_DATA)

    def templates(self) -> tuple[Template, ...]:
        return tuple(Template(id=f"injecagent/{t['name']}", source=self.family, text=t["text"],
                              name=t["name"], origin=t["origin"]) for t in self._data["templates"])

    @functools.cached_property
    def _goals(self) -> tuple[Goal, ...]:
        cfg = load_data("injecagent/families.yaml")
        out = []
        for g in self._data["goals"]:
            tool = g["attacker_tools"][0]
            if g["name"].startswith("ds_"):
                fam = cfg["data_stealing_family"]
            elif tool in cfg["families"]:
                fam = cfg["families"][tool]
            else:
                raise AttackSourceError(
                    f"ipi/attacks/data/injecagent/families.yaml: no family for attacker tool {tool!r} ({g['origin']})")
            out.append(Goal(id=f"injecagent/{g['name']}", source=self.family, family=fam, text=g["text"],
                            target=merge_targets({"tool": g["attacker_tools"]}, extract_targets(g["text"]),
                                                 (cfg.get("extra_targets") or {}).get(tool, {})),
                            origin=f"{self._data['repository']}@{self._data['commit'][:12]} {g['origin']}"))
        return tuple(out)

    def goals(self) -> tuple[Goal, ...]:
        return self._goals

    def benign(self) -> tuple[BenignText, ...]:
        return ()

    def provenance(self) -> tuple[Provenance, ...]:
        return (Provenance(source=self.family, origin=self._data["repository"], version=self._data["commit"],
                           paths=("data/attacker_cases_dh.jsonl", "data/attacker_cases_ds.jsonl",
                                  "data/test_cases_dh_enhanced.json", "data/test_cases_ds_enhanced.json"),
                           license="MIT", notice="Copyright (c) 2023 Qiusi Zhan",
                           note="fork of uiuc-kang-lab/InjecAgent (upstream not reachable here); "
                                "data/injecagent/PROVENANCE.md"),)
