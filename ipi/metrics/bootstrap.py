"""Cluster-bootstrap draws and intervals (PROTOCOL.md §5).

Replicate ``b`` gives test trajectory ``t`` the multiplicity ``m[b, t]`` (its draw count,
:func:`draw_multiplicities`); every row of ``t`` then carries weight ``m[b, t] · w``, scores
held fixed. Replicates where an estimand is undefined are dropped for it and counted
(``n_boot_used``). Tables scored on the same trajectories share one :class:`Draws`, so paired
differences are computed replicate by replicate (:func:`paired_difference`). The bootstrap's
defaults (:data:`N_BOOT`, :data:`SEED`, :data:`LEVEL`, :data:`INTERVAL`) are written here once."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ipi.metrics.keys import CI_HIGH, CI_LOW, ESTIMATE, N_BOOT_USED

__all__ = [
    "BCA",
    "EXPANDED",
    "INTERVAL",
    "INTERVALS",
    "LEVEL",
    "N_BOOT",
    "PERCENTILE",
    "SEED",
    "Draws",
    "Interval",
    "bca_interval",
    "check_level",
    "draw_multiplicities",
    "expanded_percentile_interval",
    "float_or_none",
    "make_draws",
    "make_interval",
    "paired_difference",
    "percentile_interval",
    "plus_one_p",
]

PERCENTILE = "percentile"
BCA = "bca"
EXPANDED = "expanded"
INTERVALS = (EXPANDED, PERCENTILE, BCA)
"""Interval methods of :func:`ipi.metrics.estimands.estimands` (``evaluation.interval``; docs/estimands.md)."""

#: Bootstrap replicates ``B`` (``evaluation.n_boot``).
N_BOOT = 1000
#: Seed of the draws (``evaluation.seed``).
SEED = 0
#: Interval coverage (``evaluation.level``).
LEVEL = 0.95
#: Interval method (``evaluation.interval``): the expanded percentile interval (its coverage: docs/selftest.md).
INTERVAL = EXPANDED


def float_or_none(x) -> float | None:
    """``float(x)``, or ``None`` for NaN (JSON-ready)."""
    x = float(x)
    return None if math.isnan(x) else x


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap percentile interval (PROTOCOL.md §5).

    Attributes:
        estimate: The estimand on the observed table (``nan`` when undefined).
        ci_low: Lower percentile bound (``nan`` when no replicate was usable).
        ci_high: Upper percentile bound (``nan`` when no replicate was usable).
        n_boot_used: Number of replicates kept (the others had no positives or no negatives
            and were dropped).
    """

    estimate: float
    ci_low: float
    ci_high: float
    n_boot_used: int

    def to_dict(self) -> dict:
        """JSON-ready dict: Python floats, ``nan`` → ``None``, ``n_boot_used`` an ``int``."""
        return {
            ESTIMATE: float_or_none(self.estimate),
            CI_LOW: float_or_none(self.ci_low),
            CI_HIGH: float_or_none(self.ci_high),
            N_BOOT_USED: int(self.n_boot_used),
        }

def _kept(replicates) -> tuple[np.ndarray, np.ndarray]:
    """``(replicates [B] as float64, its finite values)``."""
    reps = np.asarray(replicates, dtype=np.float64).reshape(-1)
    return reps, reps[np.isfinite(reps)]


def check_level(level: float) -> float:
    """``level`` as a float; raises ``ValueError`` unless it lies in ``(0, 1)``."""
    level = float(level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return level


def percentile_interval(estimate: float, replicates, level: float = LEVEL) -> Interval:
    """Percentile bootstrap interval from replicate values (PROTOCOL.md §5).

    Non-finite replicates (undefined estimand: no positives or no negatives) are dropped and
    counted; the bounds are the ``(1 − level)/2`` and ``(1 + level)/2`` quantiles of the rest
    (``numpy.quantile``, linear interpolation between order statistics).

    Args:
        estimate: The point estimate on the observed table.
        replicates: Replicate values, shape ``[B]``; ``nan`` marks a dropped replicate.
        level: Coverage of the interval, in ``(0, 1)``.

    Returns:
        The :class:`Interval`; bounds are ``nan`` when every replicate was dropped.
    """
    level = check_level(level)
    reps, kept = _kept(replicates)
    if kept.size == 0:
        return Interval(float(estimate), math.nan, math.nan, 0)
    alpha = 1.0 - level
    low, high = np.quantile(kept, [alpha / 2.0, 1.0 - alpha / 2.0])
    return Interval(float(estimate), float(low), float(high), int(kept.size))


def expanded_percentile_interval(estimate: float, replicates, n_clusters: int | None,
                                 level: float = LEVEL) -> Interval:
    """Hesterberg's (2015) expanded percentile interval: the percentile interval at a wider tail.

    The bounds are the ``α'/2`` and ``1 − α'/2`` quantiles of the kept replicates with
    ``α'/2 = Φ(−sqrt(n/(n−1)) · t_{n−1, 1−α/2})``, ``α = 1 − level`` and ``n`` the test
    trajectories contributing to the estimand (Hesterberg, "What teachers should know about the
    bootstrap", 2015, §5). With ``n < 2`` (or unknown) it is the percentile interval.

    Args:
        estimate: The point estimate.
        replicates: Replicates ``[B]`` (``nan`` = dropped).
        n_clusters: Contributing test trajectories ``n`` (for a paired difference the smaller
            count of its two estimands), or None.
        level: Coverage.

    Returns:
        The :class:`Interval`.
"""
    from scipy.special import ndtr
    from scipy.stats import t as student_t

    level = check_level(level)
    reps, kept = _kept(replicates)
    n = 0 if n_clusters is None else int(n_clusters)
    if kept.size == 0 or n < 2:
        return percentile_interval(estimate, reps, level)
    z = math.sqrt(n / (n - 1.0)) * float(student_t.ppf(1.0 - (1.0 - level) / 2.0, n - 1))
    tail = float(ndtr(-z))
    low, high = np.quantile(kept, [tail, 1.0 - tail])
    return Interval(float(estimate), float(low), float(high), int(kept.size))


def bca_interval(estimate: float, replicates, jackknife, level: float = LEVEL) -> Interval:
    """Bias-corrected and accelerated (BCa) bootstrap interval (Efron 1987; DiCiccio & Efron 1996).

    ``z0 = Φ⁻¹((#{θ* < θ̂} + ½ #{θ* = θ̂}) / B)`` (ties count half: AUC replicates are discrete),
    acceleration ``a = Σ (θ̄ − θ₍ᵢ₎)³ / (6 [Σ (θ̄ − θ₍ᵢ₎)²]^{3/2})`` from the leave-one-cluster-out
    (jackknife) values ``θ₍ᵢ₎`` (one per test trajectory; undefined ones dropped), and bounds the
    ``Φ(z0 + (z0 + z_q)/(1 − a(z0 + z_q)))`` quantiles of the replicates for
    ``q = (1 ∓ level)/2``. Falls back to the percentile interval when ``z0`` is infinite (every
    replicate on one side of the estimate) or fewer than 3 jackknife values are defined.

    Args:
        estimate: Point estimate.
        replicates: Bootstrap replicates ``[B]`` (``nan`` = dropped).
        jackknife: Leave-one-cluster-out estimates ``[T]`` (``nan`` = undefined).
        level: Coverage.

    Returns:
        The :class:`Interval`.
    """
    from scipy.special import ndtr, ndtri

    level = check_level(level)
    reps, kept = _kept(replicates)
    jack = np.asarray(jackknife, dtype=np.float64).reshape(-1)
    jack = jack[np.isfinite(jack)]
    if kept.size == 0 or not math.isfinite(float(estimate)):
        return percentile_interval(estimate, reps, level)
    frac = (np.sum(kept < estimate) + 0.5 * np.sum(kept == estimate)) / kept.size
    z0 = float(ndtri(frac))
    if not math.isfinite(z0) or jack.size < 3:
        return percentile_interval(estimate, reps, level)
    d = jack.mean() - jack
    ss = float(np.sum(d**2))
    a = float(np.sum(d**3)) / (6.0 * ss**1.5) if ss > 0 else 0.0
    alpha = 1.0 - level
    qs = []
    for z in (ndtri(alpha / 2.0), ndtri(1.0 - alpha / 2.0)):
        qs.append(float(ndtr(z0 + (z0 + z) / (1.0 - a * (z0 + z)))))
    low, high = np.quantile(kept, qs)
    return Interval(float(estimate), float(low), float(high), int(kept.size))


def plus_one_p(replicates, null: float) -> float | None:
    """One-sided bootstrap p of ``H0: θ <= null``: ``(1 + #{θ*_b <= null}) / (B_used + 1)``.

    Never below ``1/(B+1)`` (Davison & Hinkley 1997, §4.4; North, Curtis & Sham 2002), so Holm
    over ``N`` cells needs ``B + 1 >= N/α`` (:mod:`ipi.reporting.sweep` says so).

    Args:
        replicates: Bootstrap replicates ``[B]`` (``nan`` = dropped).
        null: The null boundary (0.5 for an AUC, 0 for a difference).

    Returns:
        The p-value in ``[1/(B+1), 1]``, or None when no replicate was kept.
"""
    reps, kept = _kept(replicates)
    if kept.size == 0:
        return None
    return float((1.0 + np.sum(kept <= null)) / (kept.size + 1.0))


def make_interval(method: str, estimate: float, replicates, jackknife=None, level: float = LEVEL,
                  n_clusters: int | None = None) -> Interval:
    """The interval of ``method`` (``"expanded"``, ``"percentile"`` or ``"bca"``; see :data:`INTERVALS`).

    ``n_clusters`` is the expanded interval's ``n`` (contributing test trajectories).

    Raises:
        ValueError: Unknown method, or ``bca`` without jackknife values.
    """
    if method == EXPANDED:
        return expanded_percentile_interval(estimate, replicates, n_clusters, level)
    if method == PERCENTILE:
        return percentile_interval(estimate, replicates, level)
    if method == BCA:
        if jackknife is None:
            raise ValueError("interval=bca needs the jackknife values")
        return bca_interval(estimate, replicates, jackknife, level)
    raise ValueError(f"interval {method!r} unknown; expected one of {', '.join(INTERVALS)}")


def paired_difference(
    estimate_a: float,
    replicates_a,
    estimate_b: float,
    replicates_b,
    *,
    level: float = LEVEL,
    interval: str = INTERVAL,
    jackknife_a=None,
    jackknife_b=None,
    n_clusters: int | None = None,
) -> tuple[Interval, np.ndarray]:
    """Paired bootstrap interval of ``A − B`` on shared replicates (PROTOCOL.md §5).

    Both replicate arrays must come from the same :class:`Draws`. The difference replicate is
    ``replicates_a[b] − replicates_b[b]`` where both are defined (else dropped); the point
    estimate is ``estimate_a − estimate_b``.

    Args:
        estimate_a: Point estimate of ``A``.
        replicates_a: Replicates of ``A``, shape ``[B]``.
        estimate_b: Point estimate of ``B``.
        replicates_b: Replicates of ``B``, shape ``[B]`` (same draws as ``A``).
        level: Coverage of the interval.
        interval: ``"percentile"`` or ``"bca"`` (then ``jackknife_a``/``jackknife_b``, the
            leave-one-cluster-out values ``[T]`` on the same clusters, are required).
        jackknife_a: Jackknife values of ``A`` (``bca`` only).
        jackknife_b: Jackknife values of ``B`` (``bca`` only).
        n_clusters: The expanded interval's ``n``: the smaller contributing-trajectory count of
            the two estimands.

    Returns:
        ``(interval, difference_replicates)``; the replicates are ``nan`` where dropped.

    Raises:
        ValueError: If the replicate arrays differ in length.
    """
    ra = np.asarray(replicates_a, dtype=np.float64)
    rb = np.asarray(replicates_b, dtype=np.float64)
    if ra.shape != rb.shape:
        raise ValueError(
            f"paired replicates must come from the same draws: shapes {ra.shape} vs {rb.shape}"
        )
    diff = ra - rb  # nan wherever either side is undefined
    jack = None
    if interval == BCA:
        if jackknife_a is None or jackknife_b is None:
            raise ValueError("interval=bca needs the jackknife values of both sides")
        jack = np.asarray(jackknife_a, dtype=np.float64) - np.asarray(jackknife_b, dtype=np.float64)
    return make_interval(interval, float(estimate_a) - float(estimate_b), diff, jack, level, n_clusters), diff


def draw_multiplicities(trajectory_ids: Sequence[str], n_boot: int, seed: int) -> np.ndarray:
    """Cluster-bootstrap draws as per-trajectory multiplicities (PROTOCOL.md §5).

    The clusters are the **sorted distinct** ids (as strings), so the result does not depend on
    row order or duplicates in ``trajectory_ids``. Replicate ``b`` draws ``T`` trajectories
    uniformly with replacement from the ``T`` clusters:
    ``numpy.random.default_rng(seed).integers(0, T, size=(n_boot, T))``; the returned entry
    ``[b, k]`` is how often the ``k``-th sorted id was drawn in replicate ``b``.

    Args:
        trajectory_ids: Trajectory ids (any order, repeats allowed).
        n_boot: Number of replicates ``B`` (>= 1).
        seed: Seed of ``numpy.random.default_rng``.

    Returns:
        ``int64`` array ``[B, T]``; each row sums to ``T``.

    Raises:
        ValueError: If there are no ids or ``n_boot < 1``.
    """
    ids = sorted({str(t) for t in trajectory_ids})
    n_traj = len(ids)
    if n_traj == 0:
        raise ValueError("draw_multiplicities: no trajectory ids")
    n_boot = int(n_boot)
    if n_boot < 1:
        raise ValueError(f"draw_multiplicities: n_boot must be >= 1, got {n_boot}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_traj, size=(n_boot, n_traj))
    flat = (idx + (np.arange(n_boot) * n_traj)[:, None]).ravel()
    return np.bincount(flat, minlength=n_boot * n_traj).reshape(n_boot, n_traj).astype(np.int64)


@dataclass(frozen=True)
class Draws:
    """Shared cluster-bootstrap draws (PROTOCOL.md §5, paired design).

    Attributes:
        trajectory_ids: The clusters, sorted; column ``k`` of ``multiplicity`` belongs to
            ``trajectory_ids[k]``.
        multiplicity: ``int64`` array ``[B, T]`` of draw counts (see
            :func:`draw_multiplicities`).
        seed: The seed the draws came from (``None`` for hand-made draws).
    """

    trajectory_ids: tuple[str, ...]
    multiplicity: np.ndarray
    seed: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "trajectory_ids", tuple(str(t) for t in self.trajectory_ids))
        m = np.asarray(self.multiplicity)
        if m.ndim == 2 and not (np.all(np.isfinite(m)) and np.all(m >= 0)):
            raise ValueError("Draws: multiplicities must be finite and non-negative")
        object.__setattr__(self, "multiplicity", m)
        if m.ndim != 2 or m.shape[1] != len(self.trajectory_ids):
            raise ValueError(
                f"Draws: multiplicity shape {m.shape} does not match "
                f"{len(self.trajectory_ids)} trajectory ids"
            )
        if list(self.trajectory_ids) != sorted(set(self.trajectory_ids)):
            raise ValueError("Draws: trajectory_ids must be sorted and distinct")

    @property
    def n_boot(self) -> int:
        """Number of replicates ``B``."""
        return int(self.multiplicity.shape[0])

    @property
    def n_clusters(self) -> int:
        """Number of clusters (test trajectories) ``T``."""
        return len(self.trajectory_ids)

    def columns(self, trajectory_ids) -> np.ndarray:
        """Column index of each given id.

        Args:
            trajectory_ids: Ids to look up (compared as strings), shape ``[n]``.

        Returns:
            ``int64`` array ``[n]``.

        Raises:
            ValueError: If an id is not one of the draws' clusters.
        """
        ids = np.asarray([str(t) for t in trajectory_ids], dtype=object)
        lookup = {t: k for k, t in enumerate(self.trajectory_ids)}
        try:
            return np.fromiter((lookup[t] for t in ids), dtype=np.int64, count=ids.size)
        except KeyError as err:
            raise ValueError(
                f"trajectory id {err.args[0]!r} is not among the bootstrap clusters"
            ) from None


def make_draws(trajectory_ids: Sequence[str], n_boot: int = N_BOOT, seed: int = SEED) -> Draws:
    """:class:`Draws` over the sorted distinct ``trajectory_ids`` (see :func:`draw_multiplicities`).

    Args:
        trajectory_ids: Trajectory ids (any order, repeats allowed).
        n_boot: Number of replicates ``B``.
        seed: Seed of ``numpy.random.default_rng``.

    Returns:
        The draws, to pass as ``draws=`` to every :func:`ipi.metrics.estimands.estimands` call that must be paired.
    """
    ids = tuple(sorted({str(t) for t in trajectory_ids}))
    return Draws(ids, draw_multiplicities(ids, n_boot, seed), seed)
