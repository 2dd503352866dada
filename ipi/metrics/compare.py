"""The probe's estimands beside its baselines and twins on shared draws: the numbers of a run (PROTOCOL.md §5–§7).

:func:`compare_tables` bootstraps the probe's score table, the named baseline tables and the
random-weight twins' tables with **one** :class:`~ipi.metrics.bootstrap.Draws` drawn over the
sorted union of their trajectory ids (PROTOCOL.md §5: "paired differences … use the same
replicates"), and returns the typed :class:`Estimates`: each table's E1/E2/E3, the paired
differences, the one-sided bootstrap p-values, the twins' envelope (:mod:`ipi.metrics.twins`),
the exact permutation test (:mod:`ipi.metrics.permutation`) and the bootstrap's own facts. Its
:meth:`Estimates.to_dict` is the numbers part of ``results.json`` (key names:
:mod:`ipi.metrics.keys`). The verdict and the reportability marks are judgements on these
numbers and live in :mod:`ipi.evaluation` (:func:`ipi.evaluation.assess.assess`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from ipi.metrics.bootstrap import INTERVAL, LEVEL, N_BOOT, SEED, bootstrap_p, check_level, make_draws, paired_difference
from ipi.metrics.estimands import EstimandSet, estimands
from ipi.metrics.keys import (
    BOOTSTRAP,
    CLUSTERS_BY_ESTIMAND,
    DIFFERENCES,
    E1,
    E1_MINUS_E3,
    E3,
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
)
from ipi.metrics.permutation import ALPHA, PermutationSummary, permutation_summary
from ipi.metrics.table import step_weights, validate_table
from ipi.metrics.twins import Difference, RandomTwin, TwinDifferences, compare_twins, twin_tables

__all__ = ["BootstrapInfo", "Differences", "Estimates", "PValues", "compare_tables", "evaluate_tables"]


@dataclass(frozen=True)
class Differences:
    """Paired differences on the shared draws (PROTOCOL.md §5), each with its contributing trajectories.

    Attributes:
        baselines: ``E1 − <baseline> E1`` by baseline name (key ``e1_minus_<name>_e1``).
        e1_minus_e3: ``E1 − E3[c]`` per control.
        twin: Trained − random-weight twin (:class:`~ipi.metrics.twins.TwinDifferences`), or None.
    """

    baselines: dict[str, Difference]
    e1_minus_e3: dict[str, Difference]
    twin: TwinDifferences | None = None

    def to_dict(self) -> dict:
        """JSON-ready ``{"e1_minus_<b>_e1", "e1_minus_e3": {c}, "e1_minus_twin_e1", ...}``."""
        out = {e1_minus_baseline_e1(name): d.to_dict() for name, d in self.baselines.items()}
        out[E1_MINUS_E3] = {c: d.to_dict() for c, d in self.e1_minus_e3.items()}
        if self.twin is not None:
            out.update(self.twin.to_dict())
        return out

    def cluster_counts(self) -> dict:
        """The same keys, each the number of test trajectories behind that difference (§7.0)."""
        out = {e1_minus_baseline_e1(name): d.clusters for name, d in self.baselines.items()}
        out[E1_MINUS_E3] = {c: d.clusters for c, d in self.e1_minus_e3.items()}
        if self.twin is not None:
            out.update(self.twin.cluster_counts())
        return out


@dataclass(frozen=True)
class PValues:
    """One-sided bootstrap p-values (:func:`~ipi.metrics.bootstrap.bootstrap_p`), used by the sweep's
    family-wise control (``ipi.reporting.sweep``).

    Attributes:
        e1: ``H0: E1 <= 0.5``.
        e3: ``H0: E3[c] <= 0.5`` per control.
        baselines: ``H0: E1 − <baseline> E1 <= 0`` by baseline name.
        twin: ``{"e3_minus_twin_e3": {c: p}, "e3_minus_twin_e3_predictive": {c: p}}`` or None.
    """

    e1: float | None
    e3: dict[str, float | None]
    baselines: dict[str, float | None] = field(default_factory=dict)
    twin: dict | None = None

    def to_dict(self) -> dict:
        """``{"e1", "e3": {c}, "e1_minus_<b>_e1", "e3_minus_twin_e3": {c}, "e3_minus_twin_e3_predictive": {c}}``."""
        out = {E1: self.e1, E3: dict(self.e3)}
        out.update({e1_minus_baseline_e1(name): p for name, p in self.baselines.items()})
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
        random_twin: The twins' envelope and per-seed estimands, or None.
        permutation: The exact permutation test, or None.
    """

    main: EstimandSet
    baselines: dict[str, EstimandSet]
    differences: Differences
    p_values: PValues
    bootstrap: BootstrapInfo
    random_twin: RandomTwin | None = None
    permutation: PermutationSummary | None = None

    def cluster_counts(self) -> dict:
        """``bootstrap.clusters_by_estimand``: test trajectories contributing rows to both sides of
        every estimand (PROTOCOL.md §7.0; :attr:`EstimandSet.contributors`), in the results' layout."""
        out = self.main.cluster_counts()
        out.update({name: b.cluster_counts() for name, b in self.baselines.items()})
        if self.random_twin is not None:
            out[RANDOM_TWIN] = self.random_twin.cluster_counts()
        out[DIFFERENCES] = self.differences.cluster_counts()
        return out

    def to_dict(self) -> dict:
        """The JSON-ready numbers of ``results.json``, in this order::

            {"e1", "e2", "e3": {control},
             "<baseline>": {"e1", "e2", "e3"},                      # per baseline
             "random_twin": {"e1", "e2", "e3", "seeds", "by_seed"},  # with twins
             "differences": {...}, "p_values": {...},
             "permutation": {...},                                   # with the permutation test
             "bootstrap": {"n_boot", "seed", "level", "n_clusters", "interval", "clusters_by_estimand"}}

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
        out[BOOTSTRAP] = {**self.bootstrap.to_dict(), CLUSTERS_BY_ESTIMAND: self.cluster_counts()}
        return out


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
        interval: ``"percentile"`` (default, PROTOCOL.md §5) or ``"bca"``
            (:func:`ipi.metrics.estimands.estimands`).
        permutation: Optional exact permutation test of verdict check 4 (PROTOCOL.md §7.4):
            ``{"null_scores": [M, n_main] array aligned with main's rows, "seed": int[,
            "refit_scores": [n_main], "unit": str, "design": str, "alpha": float]}``
            (:meth:`ipi.probe.crossfit.CrossFit.permutation_input`), summarised by
            :func:`ipi.metrics.permutation.permutation_summary` against the observed E1.
        twins: The same probe's score tables on the random-weight twins' features, one per
            twin seed ``{seed: table}`` (same rows, same folds; :mod:`ipi.run.twin`), or None
            (:mod:`ipi.metrics.twins`).
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
    jk = res.jackknife or {E1: None, E3: {}}
    sets: dict[str, EstimandSet] = {}
    by_baseline: dict[str, Difference] = {}
    p_baselines: dict[str, float | None] = {}
    for name, tbl in base_v.items():
        b = sets[name] = estimands(tbl, level=level, draws=draws, interval=interval)
        iv, diff = paired_difference(
            res.e1.estimate, res.replicates[E1], b.e1.estimate, b.replicates[E1], level=level,
            interval=interval, jackknife_a=jk[E1], jackknife_b=(b.jackknife or {}).get(E1),
        )
        by_baseline[name] = Difference(iv, len(res.contributors[E1] & b.contributors[E1]))
        p_baselines[name] = bootstrap_p(diff, 0.0)
    e1_minus_e3 = {}
    for control, e3 in res.e3.items():
        iv, _ = paired_difference(res.e1.estimate, res.replicates[E1], e3.estimate, res.replicates[E3][control],
                                  level=level, interval=interval, jackknife_a=jk[E1],
                                  jackknife_b=jk[E3].get(control))
        e1_minus_e3[control] = Difference(iv, len(res.contributors[E1] & res.contributors[E3][control]))
    random_twin = twin_diffs = None
    if twin_v:
        random_twin, twin_diffs = compare_twins(res, twin_v, draws=draws, level=level, interval=interval)
    perm = None
    if permutation is not None:
        perm = permutation_summary(main_v, permutation["null_scores"], res.e1.estimate,
                                   weights=step_weights(main_v), alpha=permutation.get("alpha", alpha),
                                   seed=permutation.get("seed"), refit_scores=permutation.get("refit_scores"),
                                   unit=permutation.get("unit"), design=permutation.get("design"))
    return Estimates(
        main=res,
        baselines=sets,
        differences=Differences(by_baseline, e1_minus_e3, twin_diffs),
        p_values=PValues(e1=bootstrap_p(res.replicates[E1], 0.5),
                         e3={c: bootstrap_p(r, 0.5) for c, r in res.replicates[E3].items()},
                         baselines=p_baselines, twin=None if twin_diffs is None else twin_diffs.p_values()),
        bootstrap=BootstrapInfo(n_boot=int(draws.n_boot), seed=int(seed), level=float(level),
                                n_clusters=int(draws.n_clusters), interval=interval),
        random_twin=random_twin,
        permutation=perm,
    )


def evaluate_tables(main: pd.DataFrame, baselines: Mapping[str, pd.DataFrame] | None = None, **kwargs) -> dict:
    """:func:`compare_tables`' JSON-ready dict (:meth:`Estimates.to_dict`): the numbers alone.

    A run's results (numbers, verdict and reportability) come from
    :func:`ipi.evaluation.assess.assess`; this is for code that wants the numbers only.
    """
    return compare_tables(main, baselines, **kwargs).to_dict()
