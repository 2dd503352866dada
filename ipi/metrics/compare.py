"""The probe's estimands beside its baselines and twins on shared draws: the numbers of a run (PROTOCOL.md §5–§7).

:func:`compare_tables` bootstraps the probe's score table, the baseline tables and the
random-weight twins' tables with **one** :class:`~ipi.metrics.bootstrap.Draws` (PROTOCOL.md §5:
"paired differences … use the same replicates") and returns the typed :class:`Estimates`, whose
:meth:`Estimates.to_dict` is the numbers part of ``results.json``. The verdict and the
reportability marks are judgements on these numbers (:func:`ipi.evaluation.assess.assess`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ipi.metrics.bootstrap import INTERVAL, LEVEL, N_BOOT, SEED, check_level, make_draws, paired_difference, plus_one_p
from ipi.metrics.estimands import EstimandSet, estimands
from ipi.metrics.keys import (
    BOOTSTRAP,
    CLUSTERS_BY_ESTIMAND,
    DIFFERENCES,
    E1,
    E1_MINUS_E3,
    E1_PAIRED,
    E3,
    EFFECTIVE_CLUSTERS_BY_ESTIMAND,
    INTERVAL_KEY,
    LEVEL_KEY,
    N_BOOT_KEY,
    N_CLUSTERS,
    P_VALUES,
    PERMUTATION,
    RANDOM_TWIN,
    RESERVED_KEYS,
    SEED_KEY,
    e1_minus_baseline_e1,
    e3_minus_baseline_e3,
)
from ipi.metrics.permutation import ALPHA, PermutationSummary, permutation_summary
from ipi.metrics.table import step_weights, validate_table
from ipi.metrics.twins import Difference, RandomTwin, TwinDifferences, compare_twins, twin_tables

__all__ = ["BootstrapInfo", "Differences", "Estimates", "PValues", "compare_tables"]


@dataclass(frozen=True)
class Differences:
    """Paired differences on the shared draws (PROTOCOL.md §5), each with its contributing trajectories.

    Attributes:
        baselines: ``E1 − <baseline> E1`` by baseline name (key ``e1_minus_<name>_e1``).
        e1_minus_e3: ``E1 − E3[c]`` per control.
        twin: Trained − random-weight twin (:class:`~ipi.metrics.twins.TwinDifferences`), or None.
        baselines_e3: ``E3[c] − <baseline> E3[c]`` per baseline, per control (key
            ``e3_minus_<name>_e3``): checks 2 and 5 of the content claim (PROTOCOL.md §7).
    """

    baselines: dict[str, Difference]
    e1_minus_e3: dict[str, Difference]
    twin: TwinDifferences | None = None
    baselines_e3: dict[str, dict[str, Difference]] = field(default_factory=dict)

    def _tree(self, leaf, twin_tree) -> dict:
        out = {e1_minus_baseline_e1(name): leaf(d) for name, d in self.baselines.items()}
        out.update({e3_minus_baseline_e3(name): {c: leaf(d) for c, d in by_c.items()}
                    for name, by_c in self.baselines_e3.items()})
        out[E1_MINUS_E3] = {c: leaf(d) for c, d in self.e1_minus_e3.items()}
        if self.twin is not None:
            out.update(twin_tree(self.twin))
        return out

    def to_dict(self) -> dict:
        """JSON-ready ``{"e1_minus_<b>_e1", "e3_minus_<b>_e3": {c}, "e1_minus_e3": {c}, "e1_minus_twin_e1", ...}``."""
        return self._tree(Difference.to_dict, TwinDifferences.to_dict)

    def cluster_counts(self) -> dict:
        """The same keys, each the number of test trajectories behind that difference (§7.0)."""
        return self._tree(lambda d: d.clusters, TwinDifferences.cluster_counts)

    def effective_counts(self) -> dict:
        """The same keys, each the Kish effective count behind that difference (the smaller of
        its two estimands'; None where not computed)."""
        return self._tree(lambda d: d.effective, TwinDifferences.effective_counts)


@dataclass(frozen=True)
class PValues:
    """One-sided bootstrap p-values ``(1 + k)/(B + 1)`` (:func:`~ipi.metrics.bootstrap.plus_one_p`:
    never 0), used by the sweep's family-wise control (``ipi.reporting.sweep``).

    Attributes:
        e1: ``H0: E1 <= 0.5``.
        e3: ``H0: E3[c] <= 0.5`` per control.
        baselines: ``H0: E1 − <baseline> E1 <= 0`` by baseline name.
        twin: ``{"e3_minus_mean_twin_e3": {c: p}}`` (check 6's paired interval) or None.
        e1_paired: ``H0: E1_paired <= 0.5`` (check 1's estimand).
        baselines_e3: ``H0: E3[c] − <baseline> E3[c] <= 0`` per baseline, per control.
    """

    e1: float | None
    e3: dict[str, float | None]
    baselines: dict[str, float | None] = field(default_factory=dict)
    twin: dict | None = None
    e1_paired: float | None = None
    baselines_e3: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """``{"e1", "e1_paired", "e3": {c}, "e1_minus_<b>_e1", "e3_minus_<b>_e3": {c}, "e3_minus_mean_twin_e3": {c}}``."""
        out = {E1: self.e1, E1_PAIRED: self.e1_paired, E3: dict(self.e3)}
        out.update({e1_minus_baseline_e1(name): p for name, p in self.baselines.items()})
        out.update({e3_minus_baseline_e3(name): dict(by_c) for name, by_c in self.baselines_e3.items()})
        if self.twin is not None:
            out.update(self.twin)
        return out


@dataclass(frozen=True)
class BootstrapInfo:
    """The cluster bootstrap's facts: ``B``, seed, level, clusters ``T``, interval method."""

    n_boot: int
    seed: int
    level: float
    n_clusters: int
    interval: str

    def to_dict(self) -> dict:
        """``{"n_boot", "seed", "level", "n_clusters", "interval"}``."""
        return {N_BOOT_KEY: self.n_boot, SEED_KEY: self.seed, LEVEL_KEY: self.level, N_CLUSTERS: self.n_clusters,
                INTERVAL_KEY: self.interval}


@dataclass(frozen=True)
class Estimates:
    """The numbers of one run: every table's estimands on shared draws and what is derived from them.

    Attributes:
        main: The probe's :class:`~ipi.metrics.estimands.EstimandSet`.
        baselines: ``{name: EstimandSet}`` in the order given (``c1``, ``collapse_only``, ...).
        differences: The paired differences.
        p_values: The one-sided bootstrap p-values.
        bootstrap: The bootstrap's facts.
        random_twin: The twins' per-seed estimands and guards, or None.
        permutation: The exact permutation test, or None.
    """

    main: EstimandSet
    baselines: dict[str, EstimandSet]
    differences: Differences
    p_values: PValues
    bootstrap: BootstrapInfo
    random_twin: RandomTwin | None = None
    permutation: PermutationSummary | None = None

    def _counts(self, method: str) -> dict:
        out = getattr(self.main, method)()
        out.update({name: getattr(b, method)() for name, b in self.baselines.items()})
        if self.random_twin is not None:
            out[RANDOM_TWIN] = getattr(self.random_twin, method)()
        out[DIFFERENCES] = getattr(self.differences, method)()
        return out

    def cluster_counts(self) -> dict:
        """``bootstrap.clusters_by_estimand``: test trajectories contributing rows to both sides of
        every estimand (PROTOCOL.md §7.0; :attr:`EstimandSet.contributors`), in the results' layout."""
        return self._counts("cluster_counts")

    def effective_counts(self) -> dict:
        """``bootstrap.effective_clusters_by_estimand``: the Kish effective test trajectories of
        every estimand (:attr:`EstimandSet.effective`), the tree of :meth:`cluster_counts`: the
        count the verdict's gate and the reportability marks read (PROTOCOL.md §7.0)."""
        return self._counts("effective_counts")

    def to_dict(self) -> dict:
        """The JSON-ready numbers of ``results.json``, in this order::

            {"e1", "e2", "e3": {control},
             "<baseline>": {"e1", "e2", "e3"},                      # per baseline
             "random_twin": {"seeds", "guards", "by_seed"},          # with twins
             "differences": {...}, "p_values": {...},
             "permutation": {...},                                   # with the permutation test
             "bootstrap": {"n_boot", "seed", "level", "n_clusters", "interval", "clusters_by_estimand",
                           "effective_clusters_by_estimand"}}

        where each interval is ``{"estimate", "ci_low", "ci_high", "n_boot_used"}`` with Python
        floats (``None`` for undefined values).
        """
        out = self.main.to_dict()
        out.update({name: b.to_dict() for name, b in self.baselines.items()})
        if self.random_twin is not None:
            out[RANDOM_TWIN] = self.random_twin.to_dict()
        out[DIFFERENCES] = self.differences.to_dict()
        out[P_VALUES] = self.p_values.to_dict()
        if self.permutation is not None:
            out[PERMUTATION] = self.permutation.to_dict()
        out[BOOTSTRAP] = {**self.bootstrap.to_dict(), CLUSTERS_BY_ESTIMAND: self.cluster_counts(),
                          EFFECTIVE_CLUSTERS_BY_ESTIMAND: self.effective_counts()}
        return out


def _part(s: EstimandSet, key: str, control: str | None = None) -> tuple:
    """``(estimate, replicates, jackknife values, contributing trajectories, Kish effective count)``
    of the estimand ``key`` of ``s`` (E3 of ``control`` when given)."""
    if control is None:
        return (getattr(s, key).estimate, s.replicates[key], (s.jackknife or {}).get(key),
                s.contributors[key], s.effective.get(key))
    return (s.e3[control].estimate, s.replicates[E3][control], ((s.jackknife or {}).get(E3) or {}).get(control),
            s.contributors[E3][control], s.effective.get(E3, {}).get(control))


def _paired(a: tuple, b: tuple, level: float, interval: str) -> tuple[Difference, np.ndarray]:
    """The paired difference A − B of two estimands (:func:`_part`) on the shared draws, with its
    counts, and its replicate values."""
    ea, ra, ja, ca, ka = a
    eb, rb, jb, cb, kb = b
    iv, d = paired_difference(ea, ra, eb, rb, level=level, interval=interval, jackknife_a=ja, jackknife_b=jb,
                              n_clusters=min(len(ca), len(cb)))
    return Difference(iv, len(ca & cb), None if ka is None or kb is None else min(ka, kb)), d


def compare_tables(
    main: pd.DataFrame,
    baselines: Mapping[str, pd.DataFrame] | None = None,
    *,
    n_boot: int = N_BOOT,
    seed: int = SEED,
    level: float = LEVEL,
    interval: str = INTERVAL,
    permutation: Mapping | None = None,
    twins: Mapping[int | str, pd.DataFrame] | None = None,
    alpha: float = ALPHA,
) -> Estimates:
    """Estimands of the probe and its baselines on shared draws, with paired differences.

    All tables are bootstrapped with the same draws over the sorted union of their trajectory
    ids; a trajectory a table lacks contributes nothing to that table's replicates.

    Args:
        main: The probe's score table.
        baselines: Named baseline score tables on the same test trajectories, e.g.
            ``{"c1": ..., "collapse_only": ..., "permuted": ...}`` (PROTOCOL.md §5, §6).
        n_boot: Replicates ``B``.
        seed: Seed of ``numpy.random.default_rng`` for the draws.
        level: Interval coverage.
        interval: ``"expanded"`` (default), ``"percentile"`` or ``"bca"``
            (:func:`ipi.metrics.estimands.estimands`).
        permutation: Optional input of check 4's exact permutation test (PROTOCOL.md §7.4;
            :meth:`ipi.detectors.crossfit.CrossFit.permutation_input`: ``null_scores``
            ``[M, n_main]`` aligned with main's rows, ``seed`` and optional ``refit_scores``,
            ``unit``, ``design``, ``alpha``), summarised by
            :func:`ipi.metrics.permutation.permutation_summary`.
        twins: ``{seed: table}``, the same probe's score tables on the random-weight twins'
            features (same rows, same folds), or None (:mod:`ipi.metrics.twins`).
        alpha: Level of the permutation test (an ``"alpha"`` in ``permutation`` wins).

    Returns:
        The :class:`Estimates`.

    Raises:
        ValueError: On an invalid table, or a baseline name that collides with a result key.
        TypeError: ``twins`` is not a mapping.
"""
    level = check_level(level)
    baselines = dict(baselines or {})
    for name in baselines:
        if not isinstance(name, str) or not name or name in RESERVED_KEYS:
            raise ValueError(
                f"baseline name {name!r} is not allowed (reserved: {sorted(RESERVED_KEYS)})"
            )
    main_v = validate_table(main, "main score table")
    base_v = {k: validate_table(v, f"baseline {k!r} score table") for k, v in baselines.items()}
    twin_v = twin_tables(twins)
    ids = set(main_v["trajectory_id"])
    for v in (*base_v.values(), *twin_v.values()):
        ids |= set(v["trajectory_id"])
    draws = make_draws(ids, n_boot=n_boot, seed=seed)

    res = estimands(main_v, level=level, draws=draws, interval=interval)
    sets: dict[str, EstimandSet] = {}
    by_baseline: dict[str, Difference] = {}
    by_baseline_e3: dict[str, dict[str, Difference]] = {}
    p_baselines: dict[str, float | None] = {}
    p_baselines_e3: dict[str, dict[str, float | None]] = {}

    for name, tbl in base_v.items():
        b = sets[name] = estimands(tbl, level=level, draws=draws, interval=interval)
        by_baseline[name], diff = _paired(_part(res, E1), _part(b, E1), level, interval)
        p_baselines[name] = plus_one_p(diff, 0.0)
        by_baseline_e3[name], p_baselines_e3[name] = {}, {}
        for control in res.e3:
            if control in b.e3:
                by_baseline_e3[name][control], diff = _paired(_part(res, E3, control), _part(b, E3, control),
                                                              level, interval)
                p_baselines_e3[name][control] = plus_one_p(diff, 0.0)
    e1_minus_e3 = {c: _paired(_part(res, E1), _part(res, E3, c), level, interval)[0] for c in res.e3}
    random_twin = twin_diffs = None
    if twin_v:
        random_twin, twin_diffs = compare_twins(res, main_v, twin_v, draws=draws, level=level, interval=interval)
    perm = None
    if permutation is not None:
        perm = permutation_summary(main_v, permutation["null_scores"], res.e1.estimate,
                                   weights=step_weights(main_v), alpha=permutation.get("alpha", alpha),
                                   seed=permutation.get("seed"), refit_scores=permutation.get("refit_scores"),
                                   unit=permutation.get("unit"), design=permutation.get("design"),
                                   null_attack=permutation.get("null_attack"))
    return Estimates(
        main=res,
        baselines=sets,
        differences=Differences(by_baseline, e1_minus_e3, twin_diffs, by_baseline_e3),
        p_values=PValues(e1=plus_one_p(res.replicates[E1], 0.5),
                         e3={c: plus_one_p(r, 0.5) for c, r in res.replicates[E3].items()},
                         baselines=p_baselines, twin=None if twin_diffs is None else twin_diffs.p_values(),
                         e1_paired=plus_one_p(res.replicates[E1_PAIRED], 0.5), baselines_e3=p_baselines_e3),
        bootstrap=BootstrapInfo(n_boot=int(draws.n_boot), seed=int(seed), level=float(level),
                                n_clusters=int(draws.n_clusters), interval=interval),
        random_twin=random_twin,
        permutation=perm,
    )

