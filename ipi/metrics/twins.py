"""The random-weight twins on the shared draws: per-seed estimands, E3 − mean twin E3, the guards (check 6).

The same probe's score table on each twin's features (:mod:`ipi.run.twin`) is bootstrapped on
the run's shared draws, giving ``E1_s, E2_s, E3_s[c]`` per seed; check 6 (PROTOCOL.md §7.6) reads
the rank of the trained E3[c] among them and the paired interval of ``E3[c] − mean_s E3_s[c]``,
after the guards of :func:`twin_guards`. Nothing else about the twins is computed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ipi.metrics.bootstrap import BCA, INTERVAL, LEVEL, Draws, Interval, check_level, paired_difference, plus_one_p
from ipi.metrics.estimands import EstimandSet, estimands
from ipi.metrics.keys import BY_SEED, E1_PAIRED, E3, E3_MINUS_MEAN_TWIN_E3, GUARDS, SEEDS
from ipi.metrics.table import validate_table

__all__ = ["DISTINCT_MAX_RANK_CORRELATION", "Difference", "RandomTwin", "TwinDifferences", "compare_twins",
           "rank_correlations", "twin_guards", "twin_tables"]

#: Two score tables whose Spearman rank correlation over the same rows reaches this are one network
#: counted twice (a seed that was never applied, a copy with numeric noise): the rank level
#: ``1/(S+1)`` needs S distinct networks. Distinct random initialisations of the shipped
#: architectures correlate far less (docs/estimands.md, "Twins must be distinct networks").
DISTINCT_MAX_RANK_CORRELATION = 0.99


@dataclass(frozen=True)
class Difference:
    """One paired difference of two estimands on the shared draws, and who it rests on (§7.0).

    Attributes:
        value: Its :class:`~ipi.metrics.bootstrap.Interval`.
        clusters: Test trajectories contributing rows to both sides of **both** estimands.
        effective: The smaller Kish effective count of its estimands (the verdict's gate), or
            None where not computed.
    """

    value: Interval
    clusters: int
    effective: float | None = None

    def to_dict(self) -> dict:
        """The interval's JSON-ready dict."""
        return self.value.to_dict()


@dataclass(frozen=True)
class RandomTwin:
    """Each twin seed's estimands and the guards.

    Attributes:
        by_seed: ``{seed (str): EstimandSet}`` in the order given.
        guards: Why the twin tables cannot be judged (:func:`twin_guards`; check 6 NOT RUN with
            these reasons); empty when they can.
    """

    by_seed: dict[str, EstimandSet]
    guards: tuple[str, ...] = ()

    @property
    def seeds(self) -> list[str]:
        """The twin seeds, in order."""
        return list(self.by_seed)

    def to_dict(self) -> dict:
        """``{"seeds", "guards", "by_seed": {seed: {"e1", "e2", "e3"}}}``."""
        return {SEEDS: self.seeds, GUARDS: list(self.guards),
                BY_SEED: {seed: {k: v for k, v in s.to_dict().items() if k != E1_PAIRED}
                          for seed, s in self.by_seed.items()}}

    def cluster_counts(self) -> dict:
        """Each seed's contributing trajectories per estimand (§7.0)."""
        return {BY_SEED: {seed: s.cluster_counts() for seed, s in self.by_seed.items()}}

    def effective_counts(self) -> dict:
        """Each seed's Kish effective counts per estimand."""
        return {BY_SEED: {seed: s.effective_counts() for seed, s in self.by_seed.items()}}


@dataclass(frozen=True)
class TwinDifferences:
    """Trained − mean over the twin seeds of E3[c], per control (check 6's paired interval).

    Attributes:
        e3_mean: ``E3[c] − mean_s E3_s[c]`` per control.
        p_e3_mean: One-sided bootstrap p of ``E3[c] − mean_s E3_s[c] <= 0`` per control.
    """

    e3_mean: dict[str, Difference] = field(default_factory=dict)
    p_e3_mean: dict[str, float | None] = field(default_factory=dict)

    def _tree(self, leaf) -> dict:
        return {E3_MINUS_MEAN_TWIN_E3: {c: leaf(d) for c, d in self.e3_mean.items()}}

    def to_dict(self) -> dict:
        """The ``differences`` entries of the twins (JSON-ready)."""
        return self._tree(Difference.to_dict)

    def cluster_counts(self) -> dict:
        """The same tree with each difference's contributing-trajectory count."""
        return self._tree(lambda d: d.clusters)

    def effective_counts(self) -> dict:
        """The same tree with each difference's Kish effective count."""
        return self._tree(lambda d: d.effective)

    def p_values(self) -> dict:
        """``{"e3_minus_mean_twin_e3": {c: p}}``."""
        return {E3_MINUS_MEAN_TWIN_E3: dict(self.p_e3_mean)}


def twin_tables(twins) -> dict[str, pd.DataFrame]:
    """``{str(seed): validated table}`` of the random-weight twins (empty for None).

    Raises:
        TypeError: ``twins`` is not a mapping ``{seed: table}``.
        ValueError: A seed given twice (as int and str), or an invalid table.
    """
    if twins is None:
        return {}
    if isinstance(twins, pd.DataFrame) or not isinstance(twins, Mapping):
        raise TypeError("twins must be a mapping {twin seed: score table} (one table per twin seed)")
    out = {}
    for seed, tbl in twins.items():
        if str(seed) in out:
            raise ValueError(f"twin seed {seed!r} given twice")
        out[str(seed)] = validate_table(tbl, f"random-twin (seed {seed}) score table")
    return out


def _keyed_scores(table: pd.DataFrame) -> pd.Series:
    """Scores indexed by (trajectory, step, variant, occurrence): rows matched across tables."""
    keys = ["trajectory_id", "step", "variant"]
    t = table[keys + ["score"]].copy()
    t["trajectory_id"] = t["trajectory_id"].map(str)
    t["_occurrence"] = t.groupby(keys, sort=False).cumcount()
    return t.set_index([*keys, "_occurrence"])["score"]


def rank_correlations(scores: Mapping[str, np.ndarray]) -> dict[tuple[str, str], float]:
    """Spearman rank correlation of every pair of aligned score vectors (average ranks for ties).

    Args:
        scores: ``{name: [n] scores}``, all on the same rows in the same order.

    Returns:
        ``{(a, b): rho}`` for every pair ``a`` before ``b`` in ``scores``' order (``nan`` when one
        side is constant).
    """
    names = list(scores)
    ranks = pd.DataFrame({k: np.asarray(v, dtype=np.float64) for k, v in scores.items()}).rank(method="average")
    corr = ranks.corr(method="pearson").to_numpy()
    return {(a, b): float(corr[i, j]) for i, a in enumerate(names) for j, b in enumerate(names) if j > i}


def twin_guards(main: pd.DataFrame, twins: Mapping[str, pd.DataFrame]) -> list[str]:
    """Why check 6 cannot be judged on these twin score tables (empty list: it can).

    Rows are matched on (trajectory, step, variant, occurrence within that triple). Refused:

    * a twin's rows differ from the main table's;
    * a twin scores every row the same;
    * a twin's scores agree with the main table's beyond what distinct networks give (Spearman
      rank correlation >= :data:`DISTINCT_MAX_RANK_CORRELATION`): not a random-weight twin;
    * two twins agree so: one network counted twice, so the rank level ``1/(S+1)`` would be
      wrong. Every such pair is named.

    Args:
        main: The probe's validated score table.
        twins: ``{seed: validated score table}``.

    Returns:
        One reason per finding, naming the seed(s).
"""
    reasons: list[str] = []
    a = _keyed_scores(main)
    aligned: dict[str, np.ndarray] = {}
    for seed, tbl in twins.items():
        b = _keyed_scores(tbl)
        missing, extra = a.index.difference(b.index), b.index.difference(a.index)
        if len(missing) or len(extra):
            reasons.append(f"twin seed {seed}: its rows differ from the main table's ({len(a) - len(missing)} of "
                           f"{len(a)} main rows scored, {len(extra)} rows the main table lacks); every twin must "
                           "score exactly the main table's rows")
            continue
        sb = b.reindex(a.index).to_numpy(dtype=np.float64)
        if np.ptp(sb) == 0.0:
            reasons.append(f"twin seed {seed}: every row has the same score ({sb[0]:g}): no twin to compare with")
            continue
        aligned[str(seed)] = sb
    main_key = "\x00main"
    rho = rank_correlations({main_key: a.to_numpy(dtype=np.float64), **aligned})
    for (s1, s2), r in rho.items():
        # a sign-flipped copy (|rho| near 1, negative) is the same network read backwards
        if not abs(r) >= DISTINCT_MAX_RANK_CORRELATION:  # nan (a constant main table) never flags
            continue
        if s1 == main_key:
            reasons.append(f"twin seed {s2}: its scores agree with the trained backbone's (|Spearman| {abs(r):.4f} >= "
                           f"{DISTINCT_MAX_RANK_CORRELATION:g}): not a random-weight twin")
        else:
            reasons.append(f"twin seeds {s1} and {s2}: their scores agree beyond what distinct random "
                           f"initialisations give (|Spearman| {abs(r):.4f} >= {DISTINCT_MAX_RANK_CORRELATION:g}): one "
                           "network counted twice, so the rank level 1/(S+1) would be wrong")
    return reasons


def compare_twins(main: EstimandSet, main_table: pd.DataFrame, twins: Mapping[str, pd.DataFrame], *, draws: Draws,
                  level: float = LEVEL, interval: str = INTERVAL) -> tuple[RandomTwin, TwinDifferences]:
    """The random-weight twins' estimands and check 6's paired differences on the shared draws.

    Args:
        main: The trained probe's estimands on ``draws``.
        main_table: The probe's validated score table, for :func:`twin_guards`.
        twins: ``{seed: validated score table}`` (:func:`twin_tables`), at least one, on the same rows.
        draws: The shared draws (every twin trajectory among its clusters).
        level: Interval coverage.
        interval: ``"expanded"``, ``"percentile"`` or ``"bca"``.

    Returns:
        ``(random_twin, differences)``.
    """
    level = check_level(level)
    sets = {seed: estimands(tbl, level=level, draws=draws, interval=interval) for seed, tbl in twins.items()}
    ts = list(sets.values())
    jk = main.jackknife or {E3: {}}
    controls = [c for c in main.e3 if all(c in s.e3 for s in ts)]
    e3_mean, p_e3_mean = {}, {}
    for c in controls:
        contributors = [s.contributors[E3][c] for s in ts]
        n_c = min([len(main.contributors[E3][c]), *(len(x) for x in contributors)])
        k_c = len(set(main.contributors[E3][c]).intersection(*contributors))
        eff = min([main.effective[E3][c], *(s.effective[E3][c] for s in ts)])
        # shared draws: the seeds' mean replicate pairs with the trained one's
        mean_rep = np.mean(np.stack([np.asarray(s.replicates[E3][c], dtype=np.float64) for s in ts]), axis=0)
        mean_jack = (np.mean(np.stack([np.asarray(s.jackknife[E3][c], dtype=np.float64) for s in ts]), axis=0)
                     if interval == BCA else None)
        mean_est = float(np.mean([s.e3[c].estimate for s in ts]))
        iv, diff = paired_difference(main.e3[c].estimate, main.replicates[E3][c], mean_est, mean_rep, level=level,
                                     interval=interval, jackknife_a=jk[E3].get(c), jackknife_b=mean_jack,
                                     n_clusters=n_c)
        e3_mean[c] = Difference(iv, k_c, eff)
        p_e3_mean[c] = plus_one_p(diff, 0.0)
    return RandomTwin(by_seed=sets, guards=tuple(twin_guards(main_table, twins))), TwinDifferences(e3_mean=e3_mean, p_e3_mean=p_e3_mean)
