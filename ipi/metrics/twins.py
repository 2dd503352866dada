"""The random-weight twins on the shared draws: per-seed estimands, the envelope, the differences (check 6).

The same probe on the features of random-weight twins of the backbone (:mod:`ipi.run.twin`), one
score table per twin seed on the same rows, is bootstrapped on the run's shared draws
(docs/estimands.md, check 6). For each seed ``s``: ``E1_s, E2_s, E3_s[c]`` and the paired
differences ``E1 − E1_s``, ``E3[c] − E3_s[c]``. The **envelope** ``max_s`` is taken per draw, so
the interval of ``E3[c] − max_s E3_s[c]`` has its lower bound above 0 exactly when the trained
probe beats every twin seed on (at least) the upper ``(1+level)/2`` share of the draws. The
**seed-predictive** interval (:func:`seed_predictive_difference`) covers a *new* random draw of
the architecture.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ipi.metrics.bootstrap import (
    BCA,
    INTERVAL,
    LEVEL,
    Draws,
    Interval,
    bootstrap_p,
    check_level,
    float_or_none,
    make_interval,
    paired_difference,
)
from ipi.metrics.estimands import EstimandSet, estimands
from ipi.metrics.keys import (
    BY_SEED,
    E1,
    E1_MINUS_TWIN_E1,
    E1_MINUS_TWIN_E1_BY_SEED,
    E1_MINUS_TWIN_E1_PREDICTIVE,
    E2,
    E3,
    E3_MINUS_TWIN_E3,
    E3_MINUS_TWIN_E3_BY_SEED,
    E3_MINUS_TWIN_E3_PREDICTIVE,
    SEEDS,
)
from ipi.metrics.table import validate_table

__all__ = ["Difference", "RandomTwin", "SeedPredictive", "TwinDifferences", "compare_twins",
           "seed_predictive_difference", "twin_tables"]


@dataclass(frozen=True)
class SeedPredictive:
    """Trained − a new random-weight twin: the seed-predictive interval (:func:`seed_predictive_difference`).

    Attributes:
        estimate: ``E − mean_s E_s`` (``nan`` when undefined).
        ci_low: Lower bound of the Student-t prediction interval (``nan`` with < 2 seeds).
        ci_high: Upper bound (``nan`` with < 2 seeds).
        p_value: One-sided p of ``E − new twin <= 0`` (``nan`` with < 2 seeds).
        n_boot_used: Replicates kept by the paired data interval.
        twin_mean: ``mean_s E_s``.
        seed_sd: SD (``ddof=1``) of the twins' estimates.
        seed_half_width: Half-width ``t_{S−1,(1+level)/2} · sd · sqrt(1 + 1/S)``.
        n_seeds: ``S``.
        data_ci_low: Paired bootstrap interval of ``E − mean_s E_s`` on the shared draws (low).
        data_ci_high: ... (high).
    """

    estimate: float
    ci_low: float
    ci_high: float
    p_value: float
    n_boot_used: int
    twin_mean: float
    seed_sd: float
    seed_half_width: float
    n_seeds: int
    data_ci_low: float
    data_ci_high: float

    def to_dict(self, *, p_value: bool = True) -> dict:
        """JSON-ready dict (``nan`` → ``None``); ``p_value=False`` leaves the p-value out (the results
        keep it under ``p_values``)."""
        out = {"estimate": float_or_none(self.estimate), "ci_low": float_or_none(self.ci_low),
               "ci_high": float_or_none(self.ci_high)}
        if p_value:
            out["p_value"] = float_or_none(self.p_value)
        out.update({"n_boot_used": int(self.n_boot_used), "twin_mean": float_or_none(self.twin_mean),
                    "seed_sd": float_or_none(self.seed_sd), "seed_half_width": float_or_none(self.seed_half_width),
                    "n_seeds": int(self.n_seeds), "data_ci_low": float_or_none(self.data_ci_low),
                    "data_ci_high": float_or_none(self.data_ci_high)})
        return out


def seed_predictive_difference(
    estimate: float,
    replicates,
    twin_estimates: Sequence[float],
    twin_replicates,
    *,
    level: float = LEVEL,
    interval: str = INTERVAL,
    jackknife=None,
    twin_jackknife=None,
) -> SeedPredictive:
    """Trained − a *new* random-weight twin: the Student-t prediction interval of init-seed variance.

    The envelope (``E − max_s E_s``, paired over test trajectories) covers the sampling of test
    trajectories for the S given twins; it bounds the variability between random
    initialisations only through ``1/(S+1)``. This interval covers that variability on the run's
    own test set (docs/estimands.md, check 6, "seed-predictive"): if the trained network were
    just another random draw of the architecture, its estimate and the S twins' would be
    exchangeable, and under a normal init effect
    ``(E − m) / (sd · sqrt(1 + 1/S)) ~ t_{S−1}`` exactly (``m``, ``sd``: mean and SD,
    ``ddof=1``, of the S twin estimates on the same rows). So:

    * ``estimate`` ``d = E − m``;
    * ``[ci_low, ci_high] = d ∓ h``, ``h = t_{S−1, (1+level)/2} · sd · sqrt(1 + 1/S)``;
    * ``p_value = P(t_{S−1} >= d / (sd · sqrt(1 + 1/S)))``, one-sided, so
      ``p_value < (1 − level)/2`` exactly when ``ci_low > 0``.

    ``ci_low > 0`` then happens for a trained net that is just another random draw with
    probability ``(1 − level)/2`` on every test set. Check 6 needs it together with the
    envelope's paired interval above 0, which covers the sampling of test trajectories (an
    intersection-union test: each null is tested at its level). The paired bootstrap interval
    of ``E − mean_s E_s`` (test-trajectory sampling) is reported beside it as
    ``data_ci_low``/``data_ci_high``.

    Args:
        estimate: The trained probe's estimate ``E``.
        replicates: Its bootstrap replicates ``[B]``.
        twin_estimates: The twins' estimates ``[S]``.
        twin_replicates: The twins' replicates on the same draws ``[S, B]``.
        level: Coverage, in ``(0, 1)``.
        interval: ``"percentile"`` or ``"bca"`` for the data interval (``bca`` needs the
            jackknife values ``[T]`` and ``[S, T]``).
        jackknife: The trained side's jackknife values (``bca`` only).
        twin_jackknife: The twins' jackknife values (``bca`` only).

    Returns:
        The :class:`SeedPredictive`; with fewer than two seeds (no SD) or an undefined side, the
        bounds and ``p_value`` are ``nan`` (``None`` in its :meth:`~SeedPredictive.to_dict`).

    Raises:
        ValueError: The replicate arrays do not share the draws.
    """
    # function-local: only runs with random twins need scipy.stats, a heavy import (1.4 s after ipi.metrics,
    # measured on the busy 2-core dev machine, load 7.5)
    from scipy.stats import t as student_t

    level = check_level(level)
    te = np.asarray(twin_estimates, dtype=np.float64)
    tr = np.asarray(twin_replicates, dtype=np.float64)
    n = int(te.size)
    if tr.ndim != 2 or tr.shape[0] != n:
        raise ValueError(f"twin replicates must be [S, B] with S = {n} seeds, got shape {tr.shape}")
    mean = float(np.mean(te)) if n else math.nan
    mean_jack = np.mean(np.asarray(twin_jackknife, dtype=np.float64), axis=0) if interval == BCA else None
    iv, _ = paired_difference(estimate, replicates, mean, tr.mean(axis=0), level=level, interval=interval,
                              jackknife_a=jackknife, jackknife_b=mean_jack)
    d = float(estimate) - mean
    sd = float(np.std(te, ddof=1)) if n >= 2 else math.nan
    scale = sd * math.sqrt(1.0 + 1.0 / n) if n >= 2 else math.nan
    low = high = p_value = h = math.nan
    if n >= 2 and math.isfinite(d) and math.isfinite(scale):
        h = float(student_t.ppf((1.0 + level) / 2.0, n - 1)) * scale
        low, high = d - h, d + h
        if scale > 0.0:
            p_value = float(student_t.sf(d / scale, n - 1))
        else:  # identical twins: no init variance to cover
            p_value = 0.0 if d > 0.0 else 1.0
    return SeedPredictive(estimate=d, ci_low=low, ci_high=high, p_value=p_value, n_boot_used=int(iv.n_boot_used),
                          twin_mean=mean, seed_sd=sd, seed_half_width=h, n_seeds=n,
                          data_ci_low=iv.ci_low, data_ci_high=iv.ci_high)


@dataclass(frozen=True)
class Difference:
    """One paired difference of two estimands on the shared draws, and who it rests on (§7.0).

    Attributes:
        value: Its :class:`~ipi.metrics.bootstrap.Interval` (or :class:`SeedPredictive`).
        clusters: Test trajectories contributing rows to both sides of **both** estimands.
    """

    value: Interval | SeedPredictive
    clusters: int

    def to_dict(self) -> dict:
        """The value's JSON-ready dict (a seed-predictive one without its p-value)."""
        if isinstance(self.value, SeedPredictive):
            return self.value.to_dict(p_value=False)
        return self.value.to_dict()


@dataclass(frozen=True)
class RandomTwin:
    """The twins' estimands: the envelope (per-draw maximum over seeds) and each seed's own.

    Attributes:
        e1: Envelope of E1.
        e2: Envelope of E2.
        e3: Envelope of E3 per control (the controls every twin and the probe have).
        by_seed: ``{seed (str): EstimandSet}`` in the order given.
    """

    e1: Interval
    e2: Interval
    e3: dict[str, Interval]
    by_seed: dict[str, EstimandSet]

    @property
    def seeds(self) -> list[str]:
        """The twin seeds, in order."""
        return list(self.by_seed)

    def to_dict(self) -> dict:
        """``{"e1", "e2", "e3": {control}, "seeds", "by_seed": {seed: {"e1", "e2", "e3"}}}``."""
        return {E1: self.e1.to_dict(), E2: self.e2.to_dict(), E3: {c: iv.to_dict() for c, iv in self.e3.items()},
                SEEDS: self.seeds, BY_SEED: {seed: s.to_dict() for seed, s in self.by_seed.items()}}

    def cluster_counts(self) -> dict:
        """Trajectories contributing to every seed's estimand (§7.0), and each seed's own counts."""
        sets = list(self.by_seed.values())
        ids = set(sets[0].draws.trajectory_ids)

        def every(get) -> int:
            return len(ids.intersection(*(get(s) for s in sets)))

        return {E1: every(lambda s: s.contributors[E1]), E2: every(lambda s: s.contributors[E2]),
                E3: {c: every(lambda s, c=c: s.contributors[E3][c]) for c in self.e3},
                BY_SEED: {seed: s.cluster_counts() for seed, s in self.by_seed.items()}}


@dataclass(frozen=True)
class TwinDifferences:
    """Trained − twin: against the envelope, against each seed, against a new draw (check 6).

    Attributes:
        e1: ``E1 − max_s E1_s``.
        e3: ``E3[c] − max_s E3_s[c]`` per control.
        e1_by_seed: ``E1 − E1_s`` per seed.
        e3_by_seed: ``E3[c] − E3_s[c]`` per seed, per control.
        e1_predictive: ``E1 −`` a new twin (seed-predictive).
        e3_predictive: ``E3[c] −`` a new twin, per control.
        p_e3: One-sided bootstrap p of ``E3[c] − max_s E3_s[c] <= 0`` per control.
    """

    e1: Difference
    e3: dict[str, Difference]
    e1_by_seed: dict[str, Difference]
    e3_by_seed: dict[str, dict[str, Difference]]
    e1_predictive: Difference
    e3_predictive: dict[str, Difference]
    p_e3: dict[str, float | None]

    def _tree(self, leaf) -> dict:
        return {E1_MINUS_TWIN_E1: leaf(self.e1),
                E3_MINUS_TWIN_E3: {c: leaf(d) for c, d in self.e3.items()},
                E1_MINUS_TWIN_E1_BY_SEED: {s: leaf(d) for s, d in self.e1_by_seed.items()},
                E3_MINUS_TWIN_E3_BY_SEED: {s: {c: leaf(d) for c, d in by_c.items()}
                                           for s, by_c in self.e3_by_seed.items()},
                E1_MINUS_TWIN_E1_PREDICTIVE: leaf(self.e1_predictive),
                E3_MINUS_TWIN_E3_PREDICTIVE: {c: leaf(d) for c, d in self.e3_predictive.items()}}

    def to_dict(self) -> dict:
        """The ``differences`` entries of the twins (JSON-ready)."""
        return self._tree(Difference.to_dict)

    def cluster_counts(self) -> dict:
        """The same tree with each difference's contributing-trajectory count."""
        return self._tree(lambda d: d.clusters)

    def p_values(self) -> dict:
        """``{"e3_minus_twin_e3": {c: p}, "e3_minus_twin_e3_predictive": {c: p}}``."""
        return {E3_MINUS_TWIN_E3: dict(self.p_e3),
                E3_MINUS_TWIN_E3_PREDICTIVE: {c: float_or_none(d.value.p_value) for c, d in self.e3_predictive.items()}}


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


def _envelope(sets: Sequence[EstimandSet], get, interval: str, level: float):
    """Interval, replicates and jackknife of ``max over twins`` of one estimand on shared draws.

    Per bootstrap draw (and per jackknife value) the maximum over the twins' values of that
    draw; a draw where any twin's value is undefined is dropped (``nan``). The point estimate
    is the maximum of the twins' estimates.
    """
    est = max(float(get(s, "iv").estimate) for s in sets)
    reps = np.max(np.stack([np.asarray(get(s, "rep"), dtype=np.float64) for s in sets]), axis=0)
    jack = None
    if interval == BCA:
        jack = np.max(np.stack([np.asarray(get(s, "jack"), dtype=np.float64) for s in sets]), axis=0)
    return make_interval(interval, est, reps, jack, level), reps, jack


def _side(name: str, control: str | None = None):
    """Getter of one estimand of an :class:`EstimandSet`: its interval, replicates or jackknife."""
    def get(s: EstimandSet, what: str):
        if what == "iv":
            return s.e3[control] if control else getattr(s, name)
        if what == "rep":
            return s.replicates[E3][control] if control else s.replicates[name]
        return s.jackknife[E3][control] if control else s.jackknife[name]
    return get


def compare_twins(main: EstimandSet, twins: Mapping[str, pd.DataFrame], *, draws: Draws, level: float = LEVEL,
                  interval: str = INTERVAL) -> tuple[RandomTwin, TwinDifferences]:
    """The random-weight twins' estimands, their envelope and the paired differences (check 6).

    Args:
        main: The trained probe's estimands on ``draws``.
        twins: ``{seed: validated score table}`` (:func:`twin_tables`), at least one, on the same rows.
        draws: The shared draws (every twin trajectory among its clusters).
        level: Interval coverage.
        interval: ``"percentile"`` or ``"bca"``.

    Returns:
        ``(random_twin, differences)``.
    """
    level = check_level(level)
    sets = {seed: estimands(tbl, level=level, draws=draws, interval=interval) for seed, tbl in twins.items()}
    ts = list(sets.values())
    jk = main.jackknife or {E1: None, E2: None, E3: {}}

    env: dict = {}
    env_rep: dict = {E3: {}}
    env_jack: dict = {E3: {}}
    for name in (E1, E2):
        env[name], env_rep[name], env_jack[name] = _envelope(ts, _side(name), interval, level)
    controls = [c for c in main.e3 if all(c in s.e3 for s in ts)]
    env_e3 = {}
    for c in controls:
        env_e3[c], env_rep[E3][c], env_jack[E3][c] = _envelope(ts, _side(E3, c), interval, level)

    def both(a: set, sides: list[set]) -> int:
        return len(set(a).intersection(*sides))

    def pair(est_a, rep_a, jack_a, est_b, rep_b, jack_b):
        return paired_difference(est_a, rep_a, est_b, rep_b, level=level, interval=interval,
                                 jackknife_a=jack_a, jackknife_b=jack_b)

    iv, _ = pair(main.e1.estimate, main.replicates[E1], jk[E1], env[E1].estimate, env_rep[E1], env_jack[E1])
    e1 = Difference(iv, both(main.contributors[E1], [s.contributors[E1] for s in ts]))
    e3, p_e3 = {}, {}
    for c in controls:
        iv, diff = pair(main.e3[c].estimate, main.replicates[E3][c], jk[E3].get(c), env_e3[c].estimate,
                        env_rep[E3][c], env_jack[E3][c])
        e3[c] = Difference(iv, both(main.contributors[E3][c], [s.contributors[E3][c] for s in ts]))
        p_e3[c] = bootstrap_p(diff, 0.0)
    e1_by_seed, e3_by_seed = {}, {}
    for seed, s in sets.items():
        iv, _ = pair(main.e1.estimate, main.replicates[E1], jk[E1], s.e1.estimate, s.replicates[E1],
                     (s.jackknife or {}).get(E1))
        e1_by_seed[seed] = Difference(iv, both(main.contributors[E1], [s.contributors[E1]]))
        e3_by_seed[seed] = {}
        for c in controls:
            iv, _ = pair(main.e3[c].estimate, main.replicates[E3][c], jk[E3].get(c), s.e3[c].estimate,
                         s.replicates[E3][c], ((s.jackknife or {}).get(E3) or {}).get(c))
            e3_by_seed[seed][c] = Difference(iv, both(main.contributors[E3][c], [s.contributors[E3][c]]))

    def predictive(name, control=None) -> SeedPredictive:
        get = _side(name, control)
        own = main.e3[control] if control else getattr(main, name)
        own_rep = main.replicates[E3][control] if control else main.replicates[name]
        own_jack = jk[E3].get(control) if control else jk[name]
        return seed_predictive_difference(
            own.estimate, own_rep, [get(s, "iv").estimate for s in ts],
            np.stack([np.asarray(get(s, "rep"), dtype=np.float64) for s in ts]), level=level, interval=interval,
            jackknife=own_jack,
            twin_jackknife=(np.stack([np.asarray(get(s, "jack"), dtype=np.float64) for s in ts])
                            if interval == BCA else None))

    differences = TwinDifferences(
        e1=e1, e3=e3, e1_by_seed=e1_by_seed, e3_by_seed=e3_by_seed,
        e1_predictive=Difference(predictive(E1), e1.clusters),
        e3_predictive={c: Difference(predictive(E3, c), e3[c].clusters) for c in controls},
        p_e3=p_e3)
    return RandomTwin(e1=env[E1], e2=env[E2], e3=env_e3, by_seed=sets), differences
