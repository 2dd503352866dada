"""Held-out attack wording: the text banks split into families by the trajectory split (PROTOCOL.md §7, check 3).

Check 3 ("not surface statistics") asks that the attack and imperative **wording** on test rows
be disjoint from the wording seen in training; otherwise a probe that memorised the bank's own
phrases passes it. This module splits each bank — attack templates, attack goals and benign
imperatives (:mod:`ipi.surfaces.bank`) — into *wording families* aligned with the trajectory
split, and assigns every trajectory the family of the fold it is **tested** in:

* ``holdout`` (one fold): two families, ``"train"`` and ``"test"``; the test family holds
  ``round(test_fraction · n)`` entries of each bank (at least 1, at most ``n − 1``). Training
  trajectories use only the ``train`` family, test trajectories only the ``test`` family.
* ``kfold`` (``k`` folds): ``k`` families ``fold0 … fold{k-1}`` of near-equal size; a trajectory
  in test fold ``i`` uses family ``fold{i}``. In fold ``i`` the test rows use ``fold{i}``'s
  wording and the training rows (every other fold's trajectories) use the other families, so the
  two sides are disjoint in **every** fold, and each trajectory's rows are the same in all folds.

A trajectory's text is therefore a deterministic function of the split (kind, seed, test
fraction or ``k``, and the set of trajectory ids) and of nothing else: layer and token-group
sweeps on the same split share their activation-cache entries; a different ``split.seed`` makes
different rows (and a new cache entry). Goals are interleaved across the goal families
(redirect, exfiltrate, click, credentials, abandon) before cutting, so each wording family gets
goals of as many intents as its size allows: the held-out part is the **phrasing**, not the kind
of attack.

Family assignment of the banks is seeded by :func:`~ipi.surfaces.bank.stable_int` of the split
seed, so it is identical across processes and machines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ipi.surfaces.bank import (
    ATTACK_GOAL_LIST,
    ATTACK_GOALS,
    ATTACK_TEMPLATES,
    BENIGN_IMPERATIVES,
    stable_int,
)

__all__ = ["WordingFamily", "WordingPlan", "wording_overlap", "wording_plan"]


@dataclass(frozen=True)
class WordingFamily:
    """The bank entries one trajectory's rows may use.

    Attributes:
        name: ``"train"``/``"test"`` (holdout) or ``"fold<i>"`` (kfold); ``"all"`` for the
            whole bank (held-out wording off).
        templates: Indices into :data:`~ipi.surfaces.bank.ATTACK_TEMPLATES` (sorted).
        goals: Indices into :data:`~ipi.surfaces.bank.ATTACK_GOAL_LIST` (sorted).
        imperatives: Indices into :data:`~ipi.surfaces.bank.BENIGN_IMPERATIVES` (sorted).
    """

    name: str
    templates: tuple[int, ...]
    goals: tuple[int, ...]
    imperatives: tuple[int, ...]

    @property
    def imperative_texts(self) -> tuple[str, ...]:
        """The benign imperatives of this family (bank order)."""
        return tuple(BENIGN_IMPERATIVES[i] for i in self.imperatives)

    def to_dict(self) -> dict:
        """JSON-ready ``{"templates", "goals", "imperatives"}`` index lists."""
        return {"templates": list(self.templates), "goals": list(self.goals),
                "imperatives": list(self.imperatives)}


FULL_BANK = WordingFamily("all", tuple(range(len(ATTACK_TEMPLATES))), tuple(range(len(ATTACK_GOAL_LIST))),
                          tuple(range(len(BENIGN_IMPERATIVES))))
"""Every entry of every bank (held-out wording off)."""


@dataclass(frozen=True)
class WordingPlan:
    """Wording families and the family of every trajectory.

    Attributes:
        scheme: ``"holdout"`` or ``"kfold"``.
        seed: The split seed the families were drawn with.
        families: Family name → :class:`WordingFamily`.
        family_of: Trajectory id → family name.
    """

    scheme: str
    seed: int
    families: Mapping[str, WordingFamily]
    family_of: Mapping[str, str]

    def family(self, trajectory_id: str) -> WordingFamily:
        """The family of ``trajectory_id``.

        Raises:
            KeyError: The trajectory was not part of the split the plan was made from.
        """
        try:
            return self.families[self.family_of[str(trajectory_id)]]
        except KeyError:
            raise KeyError(f"trajectory {trajectory_id!r} has no wording family (not in the split)") from None

    def to_dict(self) -> dict:
        """JSON-ready summary: scheme, seed, each family's entries and trajectory count."""
        counts: dict[str, int] = {}
        for f in self.family_of.values():
            counts[f] = counts.get(f, 0) + 1
        return {"scheme": self.scheme, "seed": int(self.seed),
                "families": {n: {**f.to_dict(), "trajectories": counts.get(n, 0)} for n, f in self.families.items()}}


def _cut(order: Sequence[int], sizes: Sequence[int]) -> list[tuple[int, ...]]:
    out, start = [], 0
    for s in sizes:
        out.append(tuple(sorted(int(i) for i in order[start:start + s])))
        start += s
    return out


def _sizes(n: int, shares: Sequence[float]) -> list[int]:
    """Largest-remainder sizes for ``shares`` (summing to 1) of ``n`` items, each ``>= 1``."""
    raw = np.asarray(shares, dtype=np.float64) * n
    sizes = np.maximum(np.floor(raw).astype(int), 1)
    while sizes.sum() < n:
        sizes[int(np.argmax(raw - sizes))] += 1
    while sizes.sum() > n:
        i = int(np.argmax(np.where(sizes > 1, sizes - raw, -np.inf)))
        sizes[i] -= 1
    return [int(s) for s in sizes]


def _goal_order(rng: np.random.Generator) -> list[int]:
    """Goal indices permuted within each goal family, then interleaved across families."""
    index = {g: j for j, g in enumerate(ATTACK_GOAL_LIST)}
    per_family = []
    for fam in rng.permutation(list(ATTACK_GOALS)):
        phrasings = [index[(str(fam), p)] for p in ATTACK_GOALS[str(fam)]]
        per_family.append([phrasings[i] for i in rng.permutation(len(phrasings))])
    longest = max(len(p) for p in per_family)
    return [p[r] for r in range(longest) for p in per_family if r < len(p)]


def split_banks(names: Sequence[str], shares: Sequence[float], seed: int) -> dict[str, WordingFamily]:
    """Partition every bank into families with the given shares.

    Args:
        names: Family names.
        shares: Share of each bank per family (positive, summing to 1).
        seed: Split seed (hashed with a purpose tag into a NumPy seed).

    Returns:
        Name → family; the families partition each bank, each family has at least one entry of
        each bank.

    Raises:
        ValueError: More families than the smallest bank has entries.
    """
    n_min = min(len(ATTACK_TEMPLATES), len(ATTACK_GOAL_LIST), len(BENIGN_IMPERATIVES))
    if len(names) > n_min:
        raise ValueError(
            f"held-out wording: {len(names)} wording families but the smallest bank has {n_min} entries; "
            f"use split.k <= {n_min} or evaluation.heldout_wording=false")
    rng = np.random.default_rng(stable_int("heldout-wording", int(seed)) % 2**63)
    t = _cut(rng.permutation(len(ATTACK_TEMPLATES)), _sizes(len(ATTACK_TEMPLATES), shares))
    g = _cut(_goal_order(rng), _sizes(len(ATTACK_GOAL_LIST), shares))
    m = _cut(rng.permutation(len(BENIGN_IMPERATIVES)), _sizes(len(BENIGN_IMPERATIVES), shares))
    return {n: WordingFamily(n, t[i], g[i], m[i]) for i, n in enumerate(names)}


def wording_plan(folds: Sequence[tuple[Iterable[str], Iterable[str]]], seed: int) -> WordingPlan:
    """Wording families aligned with a trajectory split (module docstring).

    Args:
        folds: ``[(train_ids, test_ids)]`` (one fold: holdout) or the ``k`` folds of a grouped
            K-fold (test sets partition the ids), as :func:`ipi.probe.crossfit.make_folds` gives.
        seed: The split seed.

    Returns:
        The plan. Holdout: families ``train`` (share ``1 − f``) and ``test`` (share ``f``, ``f`` the
        fraction of trajectories in the test set); kfold: ``fold<i>`` with shares proportional to
        the folds' sizes.

    Raises:
        ValueError: No folds, or more folds than a bank can serve.
    """
    if not folds:
        raise ValueError("wording_plan: no folds")
    if len(folds) == 1:
        train, test = ({str(t) for t in s} for s in folds[0])
        frac = len(test) / (len(train) + len(test))
        fams = split_banks(["train", "test"], [1.0 - frac, frac], seed)
        family_of = {**{t: "train" for t in train}, **{t: "test" for t in test}}
        return WordingPlan("holdout", int(seed), fams, family_of)
    tests = [{str(t) for t in te} for _, te in folds]
    total = sum(len(te) for te in tests)
    names = [f"fold{i}" for i in range(len(folds))]
    fams = split_banks(names, [len(te) / total for te in tests], seed)
    family_of = {t: names[i] for i, te in enumerate(tests) for t in te}
    return WordingPlan("kfold", int(seed), fams, family_of)


def wording_overlap(rows_meta: Sequence[Mapping], folds, plan: WordingPlan | None) -> dict:
    """Bank entries seen on both sides of each fold, counted from the rows (PROTOCOL.md §7 check 3).

    Templates and goals are read from the rows' own metadata (``template``, ``goal``: the attack
    a row is or is matched to); imperatives are the family bank each row may draw from (every
    imperative of the whole bank when ``plan`` is None).

    Args:
        rows_meta: Per row a mapping with ``trajectory_id``, ``variant`` and, for attack and
            control rows, ``template`` and ``goal``.
        folds: ``[(train_ids, test_ids), ...]``.
        plan: The wording plan the rows were built with, or None (shared wording).

    Returns:
        ``{"heldout", "overlap", "per_fold": [{"templates", "goals", "imperatives"} as
        {"train": n, "test": n, "shared": n}], "families": ...}``; ``overlap`` is the total of
        shared entries over banks and folds (0 under held-out wording).
    """
    used: dict[str, dict[str, set[int]]] = {}
    for r in rows_meta:
        if r.get("variant") == "clean" or r.get("template") is None:
            continue
        u = used.setdefault(str(r["trajectory_id"]), {"templates": set(), "goals": set()})
        u["templates"].add(int(r["template"]))
        u["goals"].add(int(r["goal"]))
    imper = {t: set((plan.family(t) if plan else FULL_BANK).imperatives) for t in used}
    per_fold, total = [], 0
    for train, test in folds:
        entry = {}
        for bank in ("templates", "goals", "imperatives"):
            def seen(ids, bank=bank):
                out: set[int] = set()
                for t in ids:
                    t = str(t)
                    if t in used:
                        out |= imper[t] if bank == "imperatives" else used[t][bank]
                return out
            a, b = seen(train), seen(test)
            entry[bank] = {"train": len(a), "test": len(b), "shared": len(a & b)}
            total += len(a & b)
        per_fold.append(entry)
    return {"heldout": plan is not None, "overlap": total, "per_fold": per_fold,
            **({"scheme": plan.scheme, "families": plan.to_dict()["families"]} if plan else {})}
