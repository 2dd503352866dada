"""Held-out attack wording: the text banks split into families by the trajectory split (PROTOCOL.md §7, check 3).

Each bank (attack templates, goals, benign imperatives) is split into wording families aligned
with the trajectory split (``holdout``: ``train``/``test``; ``kfold``: ``fold0 … fold{k-1}``), and
every trajectory uses the family of the fold it is tested in, so its text is a function of the
split alone. Rules: docs/surfaces.md, "Held-out attack wording"."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ipi.attacks.pool import AttackPool, project_pool
from ipi.attacks.source import load_data
from ipi.surfaces.bank import stable_int

__all__ = ["WordingFamily", "WordingPlan", "full_family", "source_wording_plan",
           "wording_overlap", "wording_plan"]


def _default_pool() -> AttackPool:
    return project_pool()


@dataclass(frozen=True)
class WordingFamily:
    """The bank entries one trajectory's rows may use.

    Attributes:
        name: ``"train"``/``"test"`` (holdout), ``"fold<i>"`` (kfold) or the held-out source's
            family (``split.wording=source``); ``"all"`` for the whole pool (held-out wording off).
        templates: Indices into the pool's templates (sorted); for the project pool
            :data:`~ipi.surfaces.bank.ATTACK_TEMPLATES`.
        goals: Indices into the pool's goals (sorted; project: :data:`~ipi.surfaces.bank.ATTACK_GOAL_LIST`).
        imperatives: Indices into the pool's benign texts (sorted; project:
            :data:`~ipi.surfaces.bank.BENIGN_IMPERATIVES`).
        pool: The run's :class:`~ipi.attacks.pool.AttackPool` (None: the project pool).
        context: Slot values of the trajectory the family is bound to (:meth:`bind`), e.g.
            ``(("task", "<the trajectory's task>"),)``.
    """

    name: str
    templates: tuple[int, ...]
    goals: tuple[int, ...]
    imperatives: tuple[int, ...]
    pool: Any = field(default=None, compare=False)
    context: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)

    @property
    def attack_pool(self) -> AttackPool:
        """The pool the indices point into."""
        return self.pool if self.pool is not None else _default_pool()

    @property
    def imperative_texts(self) -> tuple[str, ...]:
        """The benign imperatives of this family (pool order)."""
        b = self.attack_pool.benign
        return tuple(b[i].text for i in self.imperatives)

    def bind(self, task: str | None) -> WordingFamily:
        """This family with the trajectory's task as the ``{task}`` slot's value (AgentDojo)."""
        return replace(self, context=(("task", task),) if task else ())

    def attacks(self, trajectory_id: str, step: int, n_attacks: int) -> list[tuple[str, dict]]:
        """The ``n_attacks`` attack texts of a step (:meth:`ipi.attacks.pool.AttackPool.choose`)."""
        ctx = dict(self.context)
        return [self.attack_pool.choose(trajectory_id, step, k, self.templates, self.goals, ctx)
                for k in range(n_attacks)]

    def to_dict(self) -> dict:
        """JSON-ready ``{"templates", "goals", "imperatives"}`` index lists."""
        return {"templates": list(self.templates), "goals": list(self.goals),
                "imperatives": list(self.imperatives)}


def full_family(pool: AttackPool | None = None) -> WordingFamily:
    """Every entry of every bank of ``pool`` (default the project pool): held-out wording off."""
    p = pool if pool is not None else _default_pool()
    return WordingFamily("all", tuple(range(len(p.templates))), tuple(range(len(p.goals))),
                         tuple(range(len(p.benign))), pool)


@dataclass(frozen=True)
class WordingPlan:
    """Wording families and the family of every trajectory.

    Attributes:
        scheme: ``"holdout"``, ``"kfold"`` or ``"source"`` (leave-one-source-out).
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
        """JSON-ready summary: scheme, seed, each family's entries (pool indices) and trajectory count."""
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


def _goal_order(rng: np.random.Generator, pool: AttackPool) -> list[int]:
    """Goal indices permuted within each goal family, then interleaved across families.

    Families in order of first appearance in the pool (for the project pool, the order of
    :data:`~ipi.surfaces.bank.ATTACK_GOALS`), goals of a family in pool order.
    """
    by_family: dict[str, list[int]] = {}
    for j, g in enumerate(pool.goals):
        by_family.setdefault(g.family, []).append(j)
    per_family = []
    for fam in rng.permutation(list(by_family)):
        phrasings = by_family[str(fam)]
        per_family.append([phrasings[i] for i in rng.permutation(len(phrasings))])
    longest = max(len(p) for p in per_family)
    return [p[r] for r in range(longest) for p in per_family if r < len(p)]


def split_banks(names: Sequence[str], shares: Sequence[float], seed: int,
                pool: AttackPool | None = None) -> dict[str, WordingFamily]:
    """Partition every bank of ``pool`` into families with the given shares.

    Args:
        names: Family names.
        shares: Share of each bank per family (positive, summing to 1).
        seed: Split seed (hashed with a purpose tag into a NumPy seed).
        pool: The run's attack pool (default the project pool).

    Returns:
        Name → family; the families partition each bank, each family has at least one entry of
        each bank.

    Raises:
        ValueError: More families than the smallest bank has entries.
    """
    pool = pool if pool is not None else _default_pool()
    nt, ng, nb = len(pool.templates), len(pool.goals), len(pool.benign)
    n_min = min(nt, ng, nb)
    if len(names) > n_min:
        raise ValueError(
            f"held-out wording: {len(names)} wording families but the smallest bank of attack={pool.name} "
            f"has {n_min} entries; use split.k <= {n_min} or evaluation.heldout_wording=false")
    rng = np.random.default_rng(stable_int("heldout-wording", int(seed)) % 2**63)
    t = _cut(rng.permutation(nt), _sizes(nt, shares))
    g = _cut(_goal_order(rng, pool), _sizes(ng, shares))
    m = _cut(rng.permutation(nb), _sizes(nb, shares))
    fams = {n: WordingFamily(n, t[i], g[i], m[i], pool) for i, n in enumerate(names)}
    for f in fams.values():  # a family whose templates accept none of its goals cannot draw an attack
        if not any(pool.templates[i].accepts(pool.goals[j]) for i in f.templates for j in f.goals):
            raise ValueError(f"held-out wording: family {f.name} of attack={pool.name} has no template that "
                             "accepts one of its goals; use another split.seed")
    return fams


def wording_plan(folds: Sequence[tuple[Iterable[str], Iterable[str]]], seed: int,
                 pool: AttackPool | None = None) -> WordingPlan:
    """Wording families aligned with a trajectory split (docs/surfaces.md, "Held-out attack wording").

    Args:
        folds: ``[(train_ids, test_ids)]`` (one fold: holdout) or the ``k`` folds of a grouped
            K-fold (test sets partition the ids), as :func:`ipi.probe.folds.make_folds` gives.
        seed: The split seed.
        pool: The run's attack pool (default the project pool).

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
        fams = split_banks(["train", "test"], [1.0 - frac, frac], seed, pool)
        family_of = {**{t: "train" for t in train}, **{t: "test" for t in test}}
        return WordingPlan("holdout", int(seed), fams, family_of)
    tests = [{str(t) for t in te} for _, te in folds]
    total = sum(len(te) for te in tests)
    names = [f"fold{i}" for i in range(len(folds))]
    fams = split_banks(names, [len(te) / total for te in tests], seed, pool)
    family_of = {t: names[i] for i, te in enumerate(tests) for t in te}
    return WordingPlan("kfold", int(seed), fams, family_of)


def source_owner(pool: AttackPool) -> dict[int, str]:
    """Template index → the attack source whose wording it is, under ``split.wording=source``.

    A template's own ``source``, except that a text published by two sources belongs to the one
    listed in ``ipi/attacks/data/shared.yaml``.

    Raises:
        ValueError: A text shared across sources with no owner in ``shared.yaml``, or an owner that
            is not one of the pool's attack sources.
"""
    shared = load_data("shared.yaml") or {}
    owner = {i: str(shared.get(t.id, t.source)) for i, t in enumerate(pool.templates)}
    for i, o in owner.items():
        if o not in pool.sources:
            raise ValueError(f"ipi/attacks/data/shared.yaml: {pool.templates[i].id} -> {o!r} is not an attack "
                             f"source of attack={pool.name} ({', '.join(pool.sources)})")
    by_text: dict[str, set[str]] = {}
    for i, t in enumerate(pool.templates):
        by_text.setdefault(t.text, set()).add(owner[i])
    bad = [sorted(v) for v in by_text.values() if len(v) > 1]
    if bad:
        raise ValueError(f"split.wording=source: one template text in families {bad}; name its owner in "
                         "ipi/attacks/data/shared.yaml")
    return owner


def source_wording_plan(folds: Sequence[tuple[Iterable[str], Iterable[str]]], seed: int,
                        pool: AttackPool) -> WordingPlan:
    """Leave-one-source-out wording (``split.wording=source``): fold ``i`` holds out source ``i``.

    The attack sources of the pool (sorted) are the families, one per fold: the test
    trajectories of fold ``i`` draw template **and** goal from source ``i`` only (ownership:
    :func:`source_owner`). Benign texts: a source's own; those of benign-only sources are dealt
    out (seeded, equal shares) to the sources that have none.

    Args:
        folds: The ``k`` folds of a grouped K-fold; ``k`` must equal the number of attack sources.
        seed: The split seed.
        pool: The run's attack pool (a mix of at least two attack sources).

    Raises:
        ValueError: Fewer than two attack sources, ``k`` not their number, or a source left with
            no benign text.
"""
    sources = sorted(pool.sources)
    if len(sources) < 2:
        raise ValueError(f"split.wording=source needs an attack pool of >= 2 sources (attack=mix); "
                         f"attack={pool.name} has {sources}")
    if len(folds) != len(sources):
        raise ValueError(f"split.wording=source: {len(folds)} folds but {len(sources)} attack sources "
                         f"({', '.join(sources)}); use split=kfold split.k={len(sources)}")
    owner = source_owner(pool)
    own_benign = {s: [m for m, b in enumerate(pool.benign) if b.source == s] for s in sources}
    spare = [m for m, b in enumerate(pool.benign) if b.source not in sources]
    needy = [s for s in sources if not own_benign[s]]
    if needy:
        if len(spare) < len(needy):
            raise ValueError(f"split.wording=source: sources {needy} have no benign text and only {len(spare)} "
                             "benign texts of benign-only sources are left to share (attack.benign)")
        rng = np.random.default_rng(stable_int("source-benign", int(seed)) % 2**63)
        order = [spare[i] for i in rng.permutation(len(spare))]
        for s, part in zip(needy, _cut(order, _sizes(len(spare), [1 / len(needy)] * len(needy)))):
            own_benign[s] = list(part)
    fams = {s: WordingFamily(s, tuple(i for i in range(len(pool.templates)) if owner[i] == s),
                             tuple(j for j, g in enumerate(pool.goals) if g.source == s),
                             tuple(sorted(own_benign[s])), pool) for s in sources}
    tests = [{str(t) for t in te} for _, te in folds]
    family_of = {t: sources[i] for i, te in enumerate(tests) for t in te}
    return WordingPlan("source", int(seed), fams, family_of)


def wording_overlap(rows_meta: Sequence[Mapping], folds, plan: WordingPlan | None,
                    pool: AttackPool | None = None) -> dict:
    """Wording seen on both sides of each fold, counted from the rows (PROTOCOL.md §7 check 3).

    Templates and goals are read from the rows' own metadata; imperatives are the family bank
    each row may draw from (the whole pool's when ``plan`` is None). Entries are counted by
    **text**, so two sources' copies of one text are one wording.

    Args:
        rows_meta: Per row a mapping with ``trajectory_id``, ``variant`` and, for attack and
            control rows, ``template`` and ``goal`` (indices into the pool).
        folds: ``[(train_ids, test_ids), ...]``.
        plan: The wording plan the rows were built with, or None (shared wording).
        pool: The run's attack pool when ``plan`` is None (default the project pool).

    Returns:
        ``{"heldout", "overlap", "per_fold": [{"templates", "goals", "imperatives"} as
        {"train": n, "test": n, "shared": n}], "families": ...}``; ``overlap`` is the total of
        shared entries over banks and folds (0 under held-out wording).
"""
    if plan is not None:
        pool = next(iter(plan.families.values())).attack_pool
    pool = pool if pool is not None else _default_pool()
    text = {"templates": [t.text for t in pool.templates], "goals": [g.text for g in pool.goals],
            "imperatives": [b.text for b in pool.benign]}
    used: dict[str, dict[str, set[str]]] = {}
    for r in rows_meta:
        if r.get("variant") == "clean" or r.get("template") is None:
            continue
        u = used.setdefault(str(r["trajectory_id"]), {"templates": set(), "goals": set()})
        u["templates"].add(text["templates"][int(r["template"])])
        u["goals"].add(text["goals"][int(r["goal"])])
    full = full_family(pool)
    imper = {t: {text["imperatives"][m] for m in (plan.family(t) if plan else full).imperatives} for t in used}
    per_fold, total = [], 0
    for train, test in folds:
        entry = {}
        for bank in ("templates", "goals", "imperatives"):
            def seen(ids, bank=bank):
                out: set[str] = set()
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
