"""Estimands E1/E2/E3 with paired cluster-bootstrap intervals (PROTOCOL.md §5).

A *score table* is a :class:`pandas.DataFrame` with one row per forward pass on the test split:

============== =====================================================================
column         meaning
============== =====================================================================
trajectory_id  the cluster of the bootstrap (compared as strings)
step           0-based step index within the trajectory (integer)
variant        ``"clean"``, ``"attack"`` or a control ``"c_<name>"`` (PROTOCOL.md §2)
score          the probe's score ``f`` (finite float; larger = more attack-like)
weight         optional row weight ``w`` overriding the default step weights
============== =====================================================================

Definitions (PROTOCOL.md §5; ``AUC`` is :func:`ipi.metrics.auc.weighted_auc`):

* step weight (default) ``w = 1 / #rows with the same (trajectory_id, step, variant)``;
* ``E1 = AUC(attack rows, clean rows)`` pooled over **all** test rows of the two variants (no
  restriction to steps that have both; this is what the checked cases of §9 require, see
  ``docs/estimands.md``);
* ``E2`` = unweighted mean over the (trajectory, step) pairs having both attack and clean rows of
  the within-step ``AUC(attack, clean)``;
* ``E3[c] = AUC(attack rows, c rows)`` pooled over the steps having both an attack and a ``c`` row.

Intervals come from a cluster bootstrap over test trajectories (:func:`draw_multiplicities`):
replicate ``b`` gives trajectory ``t`` the multiplicity ``m[b, t]`` (its draw count); every row of
``t`` then carries weight ``m[b, t] · w``, scores held fixed. Replicates where an estimand is
undefined (no positive or no negative weight) are dropped for that estimand and counted
(``n_boot_used``). Tables scored on the same trajectories share one :class:`Draws` so paired
differences (probe E1 − C1 E1, E1 − E3[c]) are computed replicate by replicate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ipi.metrics.auc import bootstrap_weighted_auc, grouped_weighted_auc, weighted_auc
from ipi.metrics.permutation import permutation_summary

__all__ = [
    "ATTACK",
    "CLEAN",
    "CONTROL_PREFIX",
    "REQUIRED_COLUMNS",
    "RESERVED_KEYS",
    "Draws",
    "EstimandSet",
    "Interval",
    "INTERVALS",
    "bca_interval",
    "bootstrap_p",
    "draw_multiplicities",
    "make_interval",
    "estimands",
    "evaluate_tables",
    "is_control",
    "make_draws",
    "paired_difference",
    "seed_predictive_difference",
    "percentile_interval",
    "step_weights",
    "validate_table",
]

CLEAN = "clean"
ATTACK = "attack"
CONTROL_PREFIX = "c_"
REQUIRED_COLUMNS = ("trajectory_id", "step", "variant", "score")
#: Keys of :func:`evaluate_tables`' result (and of the reports built on it) that a baseline
#: name may not take.
RESERVED_KEYS = frozenset(
    {"e1", "e2", "e3", "differences", "bootstrap", "counts", "verdict", "source", "baselines",
     "permutation", "p_values", "random_twin"}
)


# --------------------------------------------------------------------------------------------
# Validation and step weights
# --------------------------------------------------------------------------------------------


def is_control(variant: str) -> bool:
    """Whether ``variant`` names a nuisance-matched control (``"c_<name>"``, PROTOCOL.md §2)."""
    return isinstance(variant, str) and variant.startswith(CONTROL_PREFIX) and len(variant) > 2


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validate_table(
    table: pd.DataFrame,
    source: str = "score table",
    *,
    row_name: Callable[[int], str] | None = None,
) -> pd.DataFrame:
    """Check a score table and return a normalised copy (PROTOCOL.md §5, §9).

    Checks the columns ``trajectory_id, step, variant, score`` (and ``weight`` when present),
    their types, that scores are finite, that every variant is ``clean``, ``attack`` or
    ``c_<name>``, and that there is at least one attack and one clean row. Extra columns are
    kept untouched.

    Args:
        table: The score table.
        source: Name used at the start of error messages (e.g. the file path).
        row_name: Maps a 0-based row position to the text naming it in messages
            (default ``"row <i>"``).

    Returns:
        A copy with ``trajectory_id`` and ``variant`` as Python ``str`` objects, ``step`` as
        ``int64``, ``score`` (and ``weight``) as ``float64``, and a fresh ``RangeIndex``.

    Raises:
        ValueError: One-line message ``"<source>: column '<col>' <row>: <problem>"`` naming the
            first offending column/row.
    """
    name = row_name or (lambda i: f"row {i}")
    if not isinstance(table, pd.DataFrame):
        raise ValueError(f"{source}: expected a pandas DataFrame, got {type(table).__name__}")
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(
            f"{source}: missing column(s) {', '.join(repr(c) for c in missing)} "
            f"(need {', '.join(REQUIRED_COLUMNS)}[, weight]; found {list(map(str, table.columns))})"
        )
    if table.columns.duplicated().any():
        dup = table.columns[table.columns.duplicated()][0]
        raise ValueError(f"{source}: duplicated column {dup!r}")
    if len(table) == 0:
        raise ValueError(f"{source}: the table has no rows")
    out = table.reset_index(drop=True).copy()

    def first_bad(mask: np.ndarray) -> int:
        return int(np.flatnonzero(mask)[0])

    # trajectory_id: present, non-empty; compared as strings.
    tid = out["trajectory_id"]
    bad = tid.isna().to_numpy()
    if bad.any():
        raise ValueError(f"{source}: column 'trajectory_id' {name(first_bad(bad))}: missing value")
    tid = tid.map(str)
    bad = (tid.str.len() == 0).to_numpy()
    if bad.any():
        raise ValueError(f"{source}: column 'trajectory_id' {name(first_bad(bad))}: empty string")
    out["trajectory_id"] = tid.astype(object)

    # step: integer-valued, non-negative.
    step = out["step"]
    if not (pd.api.types.is_integer_dtype(step) or pd.api.types.is_float_dtype(step)):
        num = pd.to_numeric(step, errors="coerce")
        bad = num.isna().to_numpy()
        if bad.any():
            i = first_bad(bad)
            raise ValueError(
                f"{source}: column 'step' {name(i)}: not an integer ({_short(step.iloc[i])})"
            )
        step = num
    vals = step.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(vals) | (vals != np.round(vals)) | (vals < 0)
    if bad.any():
        i = first_bad(bad)
        raise ValueError(
            f"{source}: column 'step' {name(i)}: expected a non-negative integer, "
            f"got {_short(step.iloc[i])}"
        )
    out["step"] = vals.astype(np.int64)

    # variant: clean | attack | c_<name>.
    var = out["variant"]
    ok = np.array(
        [isinstance(v, str) and (v in (CLEAN, ATTACK) or is_control(v)) for v in var], dtype=bool
    )
    if not ok.all():
        i = first_bad(~ok)
        raise ValueError(
            f"{source}: column 'variant' {name(i)}: unknown variant {_short(var.iloc[i])} "
            f"(expected 'clean', 'attack' or 'c_<name>')"
        )
    out["variant"] = var.astype(object)

    # score (and weight): numeric and finite.
    for col, allow_negative in (("score", True), ("weight", False)):
        if col not in out.columns:
            continue
        s = out[col]
        if pd.api.types.is_bool_dtype(s):
            raise ValueError(f"{source}: column {col!r}: booleans, expected numbers")
        if not pd.api.types.is_numeric_dtype(s):
            num = pd.to_numeric(s, errors="coerce")
            bad = (num.isna() & s.notna()).to_numpy()
            if bad.any():
                i = first_bad(bad)
                raise ValueError(
                    f"{source}: column {col!r} {name(i)}: not a number ({_short(s.iloc[i])})"
                )
            s = num
        vals = s.to_numpy(dtype=np.float64, na_value=np.nan)
        bad = np.isnan(vals)
        if bad.any():
            raise ValueError(f"{source}: column {col!r} {name(first_bad(bad))}: NaN {col}")
        bad = ~np.isfinite(vals)
        if bad.any():
            i = first_bad(bad)
            raise ValueError(f"{source}: column {col!r} {name(i)}: infinite {col} ({vals[i]})")
        if not allow_negative:
            bad = vals < 0
            if bad.any():
                i = first_bad(bad)
                raise ValueError(f"{source}: column {col!r} {name(i)}: negative {col} ({vals[i]})")
        out[col] = vals

    variants = set(out["variant"])
    for needed in (ATTACK, CLEAN):
        if needed not in variants:
            raise ValueError(
                f"{source}: column 'variant': no {needed!r} rows (found {sorted(variants)})"
            )
    return out


def step_weights(table: pd.DataFrame) -> np.ndarray:
    """Row weights of PROTOCOL.md §5.

    Default: ``w = 1 / (number of rows with the same (trajectory_id, step, variant))`` so that
    every step counts once per variant. A ``weight`` column, when present, overrides this.

    Args:
        table: A score table (see :func:`validate_table`).

    Returns:
        ``float64`` array ``[n_rows]`` aligned with the table's rows.
    """
    if "weight" in table.columns:
        return table["weight"].to_numpy(dtype=np.float64)
    keys = [table["trajectory_id"].map(str), table["step"], table["variant"]]
    counts = table.groupby(keys, sort=False)["score"].transform("size").to_numpy()
    return 1.0 / counts.astype(np.float64)


# --------------------------------------------------------------------------------------------
# Intervals and draws
# --------------------------------------------------------------------------------------------


def _float_or_none(x) -> float | None:
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
            "estimate": _float_or_none(self.estimate),
            "ci_low": _float_or_none(self.ci_low),
            "ci_high": _float_or_none(self.ci_high),
            "n_boot_used": int(self.n_boot_used),
        }

    def contains(self, value: float) -> bool:
        """Whether ``ci_low <= value <= ci_high`` (False when the interval is undefined)."""
        return bool(self.ci_low <= value <= self.ci_high)


def _check_level(level: float) -> float:
    level = float(level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return level


def percentile_interval(estimate: float, replicates, level: float = 0.95) -> Interval:
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
    level = _check_level(level)
    reps = np.asarray(replicates, dtype=np.float64).reshape(-1)
    kept = reps[np.isfinite(reps)]
    if kept.size == 0:
        return Interval(float(estimate), math.nan, math.nan, 0)
    alpha = 1.0 - level
    low, high = np.quantile(kept, [alpha / 2.0, 1.0 - alpha / 2.0])
    return Interval(float(estimate), float(low), float(high), int(kept.size))


INTERVALS = ("percentile", "bca")
"""Interval methods of :func:`estimands` (``evaluation.interval``; docs/estimands.md)."""


def bca_interval(estimate: float, replicates, jackknife, level: float = 0.95) -> Interval:
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

    level = _check_level(level)
    reps = np.asarray(replicates, dtype=np.float64).reshape(-1)
    kept = reps[np.isfinite(reps)]
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


def bootstrap_p(replicates, null: float) -> float | None:
    """One-sided bootstrap p-value of ``H0: θ <= null`` against ``θ > null``.

    The achieved significance level of the percentile bootstrap (Efron & Tibshirani 1993,
    §16.4): the fraction of kept replicates ``<= null``. A check "CI low > null" of a two-sided
    percentile interval at ``level`` is (up to quantile interpolation) the test ``p < (1 −
    level)/2``; ``ipi.reporting.sweep`` applies Holm's procedure to these p-values.

    Args:
        replicates: Bootstrap replicates ``[B]`` (``nan`` = dropped).
        null: The null boundary (0.5 for an AUC, 0 for a difference).

    Returns:
        The p-value, or None when no replicate was kept.
    """
    reps = np.asarray(replicates, dtype=np.float64).reshape(-1)
    kept = reps[np.isfinite(reps)]
    return float(np.mean(kept <= null)) if kept.size else None


def make_interval(method: str, estimate: float, replicates, jackknife=None, level: float = 0.95) -> Interval:
    """The interval of ``method`` (``"percentile"`` or ``"bca"``; see :data:`INTERVALS`).

    Raises:
        ValueError: Unknown method, or ``bca`` without jackknife values.
    """
    if method == "percentile":
        return percentile_interval(estimate, replicates, level)
    if method == "bca":
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
    level: float = 0.95,
    interval: str = "percentile",
    jackknife_a=None,
    jackknife_b=None,
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
    if interval == "bca":
        if jackknife_a is None or jackknife_b is None:
            raise ValueError("interval=bca needs the jackknife values of both sides")
        jack = np.asarray(jackknife_a, dtype=np.float64) - np.asarray(jackknife_b, dtype=np.float64)
    return make_interval(interval, float(estimate_a) - float(estimate_b), diff, jack, level), diff


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


def make_draws(trajectory_ids: Sequence[str], n_boot: int = 1000, seed: int = 0) -> Draws:
    """:class:`Draws` over the sorted distinct ``trajectory_ids`` (see :func:`draw_multiplicities`).

    Args:
        trajectory_ids: Trajectory ids (any order, repeats allowed).
        n_boot: Number of replicates ``B``.
        seed: Seed of ``numpy.random.default_rng``.

    Returns:
        The draws, to pass as ``draws=`` to every :func:`estimands` call that must be paired.
    """
    ids = tuple(sorted({str(t) for t in trajectory_ids}))
    return Draws(ids, draw_multiplicities(ids, n_boot, seed), seed)


# --------------------------------------------------------------------------------------------
# Estimands
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class EstimandSet(Mapping):
    """E1, E2, E3 of one score table with their bootstrap replicates (PROTOCOL.md §5).

    A read-only mapping with the keys ``"e1"``, ``"e2"``, ``"e3"`` (``result["e1"]`` is an
    :class:`Interval`, ``result["e3"]`` a ``{control: Interval}`` dict); the replicate arrays
    live in ``.replicates``.

    Attributes:
        e1: E1 interval.
        e2: E2 interval.
        e3: ``{control: Interval}`` for every control variant of the table (sorted).
        replicates: ``{"e1": [B], "e2": [B], "e3": {control: [B]}}`` replicate arrays
            (``nan`` = dropped), for paired differences with other tables on the same draws.
        draws: The draws used.
        level: Interval coverage.
        jackknife: Leave-one-cluster-out values ``{"e1": [T], "e2": [T], "e3": {c: [T]}}``
            (``interval="bca"`` only; None otherwise).
        interval: The interval method.
        contributors: The test trajectories contributing rows to **both** sides of each
            estimand (PROTOCOL.md §7.0): ``{"e1": {ids}, "e2": {ids}, "e3": {control: {ids}}}``
            — E1: trajectories with an attack and a clean row; E2: trajectories with a step
            having both; E3[c]: trajectories with a step having an attack and a ``c`` row.
    """

    e1: Interval
    e2: Interval
    e3: dict[str, Interval]
    replicates: dict = field(repr=False)
    draws: Draws = field(repr=False)
    level: float = 0.95
    jackknife: dict | None = field(default=None, repr=False)
    interval: str = "percentile"
    contributors: dict = field(default_factory=dict, repr=False)

    def cluster_counts(self) -> dict:
        """``{"e1": n, "e2": n, "e3": {control: n}}``: sizes of :attr:`contributors`."""
        c = self.contributors
        return {"e1": len(c.get("e1", ())), "e2": len(c.get("e2", ())),
                "e3": {k: len(v) for k, v in c.get("e3", {}).items()}}

    def __getitem__(self, key: str):
        if key not in ("e1", "e2", "e3"):
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        return iter(("e1", "e2", "e3"))

    def __len__(self) -> int:
        return 3

    def to_dict(self) -> dict:
        """``{"e1": {...}, "e2": {...}, "e3": {control: {...}}}`` with JSON-ready intervals."""
        return {
            "e1": self.e1.to_dict(),
            "e2": self.e2.to_dict(),
            "e3": {c: iv.to_dict() for c, iv in self.e3.items()},
        }


def _both_mask(step_key: np.ndarray, variant: np.ndarray, a: str, b: str) -> np.ndarray:
    """Rows whose (trajectory, step) has at least one ``a`` row and one ``b`` row."""
    n_keys = int(step_key.max()) + 1
    has_a = np.bincount(step_key[variant == a], minlength=n_keys) > 0
    has_b = np.bincount(step_key[variant == b], minlength=n_keys) > 0
    return (has_a & has_b)[step_key]


def _auc_with_replicates(
    f: np.ndarray,
    w: np.ndarray,
    col: np.ndarray,
    positive: np.ndarray,
    negative: np.ndarray,
    m: np.ndarray,
    level: float,
    interval: str = "percentile",
    n_boot: int | None = None,
) -> tuple[Interval, np.ndarray, np.ndarray | None]:
    # m holds the B bootstrap rows, then (interval="bca") T jackknife rows.
    estimate = weighted_auc(f[positive], f[negative], w[positive], w[negative])
    rows = positive | negative
    reps = bootstrap_weighted_auc(f[rows], positive[rows], w[rows], m, clusters=col[rows])
    b = m.shape[0] if n_boot is None else n_boot
    reps, jack = reps[:b], (reps[b:] if interval == "bca" else None)
    return make_interval(interval, estimate, reps, jack, level), reps, jack


def estimands(
    table: pd.DataFrame,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    draws: Draws | None = None,
    interval: str = "percentile",
) -> EstimandSet:
    """E1, E2 and E3[c] of a score table with cluster-bootstrap intervals (PROTOCOL.md §5).

    * ``E1 = AUC(attack, clean)`` over all attack and clean rows (step-weighted).
    * ``E2`` = mean over (trajectory, step) with both attack and clean rows of the within-step
      ``AUC(attack, clean)``. In a replicate: the multiplicity-weighted mean of the per-step AUCs
      of the drawn trajectories.
    * ``E3[c] = AUC(attack, c)`` over the steps having both an attack row and a ``c`` row, for
      every control variant ``c`` in the table.

    Every replicate reweights rows by their trajectory's draw count with scores fixed; replicates
    where an estimand is undefined are dropped for that estimand and counted.

    Args:
        table: Score table (columns ``trajectory_id, step, variant, score[, weight]``).
        n_boot: Replicates ``B`` (ignored when ``draws`` is given).
        seed: Seed of the draws (ignored when ``draws`` is given).
        level: Interval coverage, e.g. 0.95.
        draws: Shared draws (from :func:`make_draws`) to pair this table with others; every
            trajectory of the table must be one of its clusters. Default: fresh draws over the
            table's own trajectories.
        interval: ``"percentile"`` (PROTOCOL.md §5, the default) or ``"bca"`` (bias-corrected
            and accelerated, acceleration from the leave-one-trajectory-out jackknife, computed
            with the same vectorised code as the replicates; :func:`bca_interval`).

    Returns:
        An :class:`EstimandSet` (intervals plus the raw replicate arrays in ``.replicates``).

    Raises:
        ValueError: On an invalid table (see :func:`validate_table`), a bad ``level``, or a
            trajectory missing from ``draws``.
    """
    level = _check_level(level)
    if interval not in INTERVALS:
        raise ValueError(f"interval {interval!r} unknown; expected one of {', '.join(INTERVALS)}")
    t = validate_table(table)
    if draws is None:
        draws = make_draws(t["trajectory_id"], n_boot=n_boot, seed=seed)
    col = draws.columns(t["trajectory_id"])
    m = np.asarray(draws.multiplicity, dtype=np.float64)
    nb = m.shape[0]
    if interval == "bca":  # append the T leave-one-cluster-out rows: jackknife values, same code path
        m = np.vstack([m, 1.0 - np.eye(draws.n_clusters)])
    f = t["score"].to_numpy(dtype=np.float64)
    w = step_weights(t)
    variant = t["variant"].to_numpy(dtype=object)
    _, step_key = np.unique(
        np.stack([col, t["step"].to_numpy(dtype=np.int64)], axis=1), axis=0, return_inverse=True
    )
    step_key = step_key.reshape(-1).astype(np.int64)
    is_attack = variant == ATTACK
    is_clean = variant == CLEAN

    replicates: dict = {}
    jackknife: dict = {"e3": {}}
    # E1: pooled over all attack and clean rows.
    e1, replicates["e1"], jackknife["e1"] = _auc_with_replicates(f, w, col, is_attack, is_clean, m, level,
                                                                 interval, nb)

    # E2: within-step AUCs (fixed under the cluster bootstrap), averaged per replicate with the
    # trajectories' multiplicities as weights.
    sel = (is_attack | is_clean) & _both_mask(step_key, variant, ATTACK, CLEAN)
    step_auc = grouped_weighted_auc(step_key[sel], f[sel], is_attack[sel], w[sel])
    n_keys = int(step_key.max()) + 1
    step_auc = np.concatenate([step_auc, np.full(n_keys - step_auc.size, np.nan)])
    step_col = np.zeros(n_keys, dtype=np.int64)
    step_col[step_key] = col
    defined = np.isfinite(step_auc)
    e2_estimate = float(np.mean(step_auc[defined])) if defined.any() else math.nan
    auc_sum = np.bincount(step_col[defined], weights=step_auc[defined], minlength=draws.n_clusters)
    n_steps = np.bincount(step_col[defined], minlength=draws.n_clusters).astype(np.float64)
    numer = m @ auc_sum
    denom = m @ n_steps
    e2_reps = np.full(m.shape[0], np.nan)
    ok = denom > 0
    e2_reps[ok] = numer[ok] / denom[ok]
    replicates["e2"], jackknife["e2"] = e2_reps[:nb], (e2_reps[nb:] if interval == "bca" else None)
    e2 = make_interval(interval, e2_estimate, replicates["e2"], jackknife["e2"], level)

    # E3[c]: attack vs control c over the steps having both.
    e3: dict[str, Interval] = {}
    replicates["e3"] = {}
    ids = np.asarray(draws.trajectory_ids, dtype=object)
    positive_w = w > 0

    def having_both(pos: np.ndarray, neg: np.ndarray) -> set[str]:
        # trajectories with (positive-weight) rows on both sides
        has_p = np.bincount(col[pos & positive_w], minlength=draws.n_clusters) > 0
        has_n = np.bincount(col[neg & positive_w], minlength=draws.n_clusters) > 0
        return set(ids[has_p & has_n])

    contributors: dict = {"e1": having_both(is_attack, is_clean), "e2": having_both(is_attack & sel, is_clean & sel),
                          "e3": {}}
    for control in sorted({v for v in variant if is_control(v)}):
        both = _both_mask(step_key, variant, ATTACK, control)
        e3[control], replicates["e3"][control], jackknife["e3"][control] = _auc_with_replicates(
            f, w, col, is_attack & both, (variant == control) & both, m, level, interval, nb
        )
        contributors["e3"][control] = having_both(is_attack & both, (variant == control) & both)
    return EstimandSet(e1=e1, e2=e2, e3=e3, replicates=replicates, draws=draws, level=level,
                       jackknife=jackknife if interval == "bca" else None, interval=interval,
                       contributors=contributors)


def seed_predictive_difference(
    estimate: float,
    replicates,
    twin_estimates: Sequence[float],
    twin_replicates,
    *,
    level: float = 0.95,
    interval: str = "percentile",
    jackknife=None,
    twin_jackknife=None,
) -> dict:
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
        ``{"estimate", "ci_low", "ci_high", "p_value", "n_boot_used", "twin_mean", "seed_sd",
        "seed_half_width", "n_seeds", "data_ci_low", "data_ci_high"}``; with fewer than two
        seeds (no SD) or an undefined side, the bounds and ``p_value`` are ``None``.

    Raises:
        ValueError: The replicate arrays do not share the draws.
    """
    from scipy.stats import t as student_t

    level = _check_level(level)
    te = np.asarray(twin_estimates, dtype=np.float64)
    tr = np.asarray(twin_replicates, dtype=np.float64)
    n = int(te.size)
    if tr.ndim != 2 or tr.shape[0] != n:
        raise ValueError(f"twin replicates must be [S, B] with S = {n} seeds, got shape {tr.shape}")
    mean = float(np.mean(te)) if n else math.nan
    mean_jack = np.mean(np.asarray(twin_jackknife, dtype=np.float64), axis=0) if interval == "bca" else None
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
    data = iv.to_dict()
    return {"estimate": _float_or_none(d), "ci_low": _float_or_none(low), "ci_high": _float_or_none(high),
            "p_value": _float_or_none(p_value), "n_boot_used": int(iv.n_boot_used), "twin_mean": _float_or_none(mean),
            "seed_sd": _float_or_none(sd), "seed_half_width": _float_or_none(h), "n_seeds": n,
            "data_ci_low": data["ci_low"], "data_ci_high": data["ci_high"]}


def _twin_tables(twins) -> dict[str, pd.DataFrame]:
    """``{str(seed): validated table}`` of the random-weight twins (empty for None)."""
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
    if interval == "bca":
        jack = np.max(np.stack([np.asarray(get(s, "jack"), dtype=np.float64) for s in sets]), axis=0)
    return make_interval(interval, est, reps, jack, level), reps, jack


def _twin_envelope(res: EstimandSet, twins: Mapping[str, pd.DataFrame], *, draws: Draws, level: float,
                   interval: str, differences: dict, diff_clusters: dict, p_values: dict) -> tuple[dict, dict]:
    """The random-weight twins' estimands, their envelope and the paired differences (check 6).

    For each twin seed ``s``: ``E1_s, E2_s, E3_s[c]`` on the shared draws, and the paired
    differences ``E1 − E1_s``, ``E3[c] − E3_s[c]``. The **envelope** ``max_s`` is taken per
    draw, so the interval of ``E3[c] − max_s E3_s[c]`` has its lower bound above 0 exactly when
    the trained probe beats every twin seed on (at least) the upper ``(1+level)/2`` share of the
    draws (docs/estimands.md, check 6). Fills ``differences``, ``diff_clusters`` and
    ``p_values`` (``e3_minus_twin_e3``: one-sided p of the envelope difference ``<= 0``).

    Returns:
        ``(random_twin, clusters)``: the envelope's ``{"e1", "e2", "e3"}`` plus ``"seeds"`` and
        ``"by_seed"``; trajectory counts contributing to every seed's estimand (§7.0).
    """
    sets = {seed: estimands(tbl, level=level, draws=draws, interval=interval) for seed, tbl in twins.items()}
    ts = list(sets.values())
    jk = res.jackknife or {"e1": None, "e2": None, "e3": {}}

    def side(name, control=None):
        def get(s: EstimandSet, what: str):
            if what == "iv":
                return s.e3[control] if control else getattr(s, name)
            if what == "rep":
                return s.replicates["e3"][control] if control else s.replicates[name]
            return (s.jackknife["e3"][control] if control else s.jackknife[name])
        return get

    env: dict = {}
    env_rep: dict = {"e3": {}}
    env_jack: dict = {"e3": {}}
    for name in ("e1", "e2"):
        iv, env_rep[name], env_jack[name] = _envelope(ts, side(name), interval, level)
        env[name] = iv.to_dict()
    controls = [c for c in res.e3 if all(c in s.e3 for s in ts)]
    env["e3"] = {}
    for c in controls:
        iv, env_rep["e3"][c], env_jack["e3"][c] = _envelope(ts, side("e3", c), interval, level)
        env["e3"][c] = iv.to_dict()

    def both(a: set, sides: list[set]) -> int:
        out = set(a)
        for x in sides:
            out &= x
        return len(out)

    def pair(est_a, rep_a, jack_a, est_b, rep_b, jack_b):
        return paired_difference(est_a, rep_a, est_b, rep_b, level=level, interval=interval,
                                 jackknife_a=jack_a, jackknife_b=jack_b)

    iv, _ = pair(res.e1.estimate, res.replicates["e1"], jk["e1"], env["e1"]["estimate"], env_rep["e1"],
                 env_jack["e1"])
    differences["e1_minus_twin_e1"] = iv.to_dict()
    diff_clusters["e1_minus_twin_e1"] = both(res.contributors["e1"], [s.contributors["e1"] for s in ts])
    differences["e3_minus_twin_e3"], diff_clusters["e3_minus_twin_e3"] = {}, {}
    p_values["e3_minus_twin_e3"] = {}
    for c in controls:
        iv, diff = pair(res.e3[c].estimate, res.replicates["e3"][c], jk["e3"].get(c), env["e3"][c]["estimate"],
                        env_rep["e3"][c], env_jack["e3"][c])
        differences["e3_minus_twin_e3"][c] = iv.to_dict()
        diff_clusters["e3_minus_twin_e3"][c] = both(res.contributors["e3"][c], [s.contributors["e3"][c] for s in ts])
        p_values["e3_minus_twin_e3"][c] = bootstrap_p(diff, 0.0)
    by_seed_e1, by_seed_e3, cl_e1, cl_e3 = {}, {}, {}, {}
    for seed, s in sets.items():
        iv, _ = pair(res.e1.estimate, res.replicates["e1"], jk["e1"], s.e1.estimate, s.replicates["e1"],
                     (s.jackknife or {}).get("e1"))
        by_seed_e1[seed] = iv.to_dict()
        cl_e1[seed] = both(res.contributors["e1"], [s.contributors["e1"]])
        by_seed_e3[seed], cl_e3[seed] = {}, {}
        for c in controls:
            iv, _ = pair(res.e3[c].estimate, res.replicates["e3"][c], jk["e3"].get(c), s.e3[c].estimate,
                         s.replicates["e3"][c], ((s.jackknife or {}).get("e3") or {}).get(c))
            by_seed_e3[seed][c] = iv.to_dict()
            cl_e3[seed][c] = both(res.contributors["e3"][c], [s.contributors["e3"][c]])
    differences["e1_minus_twin_e1_by_seed"], diff_clusters["e1_minus_twin_e1_by_seed"] = by_seed_e1, cl_e1
    differences["e3_minus_twin_e3_by_seed"], diff_clusters["e3_minus_twin_e3_by_seed"] = by_seed_e3, cl_e3

    def predictive(name, control=None):
        get = side(name, control)
        own_jack = (jk["e3"].get(control) if control else jk[name])
        own = (res.e3[control] if control else getattr(res, name))
        own_rep = (res.replicates["e3"][control] if control else res.replicates[name])
        return seed_predictive_difference(
            own.estimate, own_rep, [get(s, "iv").estimate for s in ts],
            np.stack([np.asarray(get(s, "rep"), dtype=np.float64) for s in ts]), level=level, interval=interval,
            jackknife=own_jack,
            twin_jackknife=(np.stack([np.asarray(get(s, "jack"), dtype=np.float64) for s in ts])
                            if interval == "bca" else None))

    differences["e1_minus_twin_e1_predictive"] = predictive("e1")
    differences["e1_minus_twin_e1_predictive"].pop("p_value")
    diff_clusters["e1_minus_twin_e1_predictive"] = diff_clusters["e1_minus_twin_e1"]
    differences["e3_minus_twin_e3_predictive"] = {c: predictive("e3", c) for c in controls}
    p_values["e3_minus_twin_e3_predictive"] = {c: differences["e3_minus_twin_e3_predictive"][c].pop("p_value")
                                               for c in controls}
    diff_clusters["e3_minus_twin_e3_predictive"] = dict(diff_clusters["e3_minus_twin_e3"])
    clusters = {"e1": both(set(draws.trajectory_ids), [s.contributors["e1"] for s in ts]),
                "e2": both(set(draws.trajectory_ids), [s.contributors["e2"] for s in ts]),
                "e3": {c: both(set(draws.trajectory_ids), [s.contributors["e3"][c] for s in ts]) for c in controls},
                "by_seed": {seed: s.cluster_counts() for seed, s in sets.items()}}
    out = {**env, "seeds": list(sets), "by_seed": {seed: s.to_dict() for seed, s in sets.items()}}
    return out, clusters


def evaluate_tables(
    main: pd.DataFrame,
    baselines: Mapping[str, pd.DataFrame] | None = None,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    interval: str = "percentile",
    permutation: Mapping | None = None,
    twins: Mapping[int | str, pd.DataFrame] | None = None,
) -> dict:
    """Estimands of the probe and its baselines on shared draws, with paired differences.

    All tables are bootstrapped with the same :class:`Draws`, drawn over the sorted union of
    their trajectory ids (PROTOCOL.md §5: "paired differences … use the same replicates"). A
    trajectory a table lacks contributes nothing to that table's replicates.

    Args:
        main: The probe's score table.
        baselines: Named baseline score tables on the same test trajectories, e.g.
            ``{"c1": ..., "collapse_only": ..., "permuted": ...}`` (PROTOCOL.md §5, §6).
        n_boot: Replicates ``B``.
        seed: Seed of ``numpy.random.default_rng`` for the draws.
        level: Interval coverage.
        interval: ``"percentile"`` (default, PROTOCOL.md §5) or ``"bca"`` (see :func:`estimands`).
        permutation: Optional exact permutation test of verdict check 4 (PROTOCOL.md §7.4):
            ``{"null_scores": [M, n_main] array aligned with ``main``'s rows, "seed": int,
            "alpha": float (default 0.05)[, "refit_scores": [n_main], "unit": str,
            "design": str]}``; summarised by
            :func:`ipi.metrics.permutation.permutation_summary` against the observed E1.
        twins: The same probe's score tables on the random-weight twins' features, one per
            twin seed ``{seed: table}`` (same rows, same folds; :mod:`ipi.twin`), or None. Each
            seed's E1, E2 and E3[c] go under ``"random_twin"["by_seed"][str(seed)]``; the
            **envelope** (per shared draw, the maximum over seeds) under ``"random_twin"``'s
            own ``e1``/``e2``/``e3``; the paired differences trained − envelope of E1 and each
            E3[c] under ``"differences"`` (``e1_minus_twin_e1``, ``e3_minus_twin_e3``) and
            trained − each seed under ``e1_minus_twin_e1_by_seed`` /
            ``e3_minus_twin_e3_by_seed``, all on the shared draws (docs/estimands.md, check 6).

    Returns:
        JSON-ready dict::

            {"e1": {...}, "e2": {...}, "e3": {control: {...}},
             "<baseline>": {"e1": {...}, "e2": {...}, "e3": {control: {...}}},  # per baseline
             "random_twin": {"e1": {...}, "e2": {...}, "e3": {control: {...}},  # envelope (max)
                             "seeds": [seed, ...],                             # with twins
                             "by_seed": {seed: {"e1": {...}, "e2": {...}, "e3": {control: {...}}}}},
             "differences": {"e1_minus_<baseline>_e1": {...},      # per baseline, e.g. c1
                             "e1_minus_e3": {control: {...}},
                             "e1_minus_twin_e1": {...},            # trained − envelope (twins)
                             "e3_minus_twin_e3": {control: {...}},  # trained − envelope (twins)
                             "e1_minus_twin_e1_by_seed": {seed: {...}},
                             "e3_minus_twin_e3_by_seed": {seed: {control: {...}}}},
             "permutation": {...},                                 # only with ``permutation``
             "bootstrap": {"n_boot": B, "seed": seed, "level": level, "n_clusters": T,
                           "clusters_by_estimand": {...}, "interval": interval},
             "p_values": {"e1": p, "e3": {control: p},            # H0: AUC <= 0.5
                          "e1_minus_<baseline>_e1": p}}          # H0: difference <= 0

        where each ``p`` is the one-sided bootstrap p-value of :func:`bootstrap_p` (used by
        ``ipi.reporting.sweep`` for family-wise control). The key list above continues:

        where each ``{...}`` is ``{"estimate", "ci_low", "ci_high", "n_boot_used"}`` with
        Python floats (``None`` for undefined values). ``clusters_by_estimand`` counts, for
        every estimand, the test trajectories contributing rows to both of its sides
        (PROTOCOL.md §7.0; :attr:`EstimandSet.contributors`): keys ``e1``, ``e2``,
        ``e3: {control: n}``, per baseline ``{"e1", "e2", "e3"}``, and ``differences`` with the
        same keys as above counting trajectories that contribute to both sides of **both**
        estimands of the difference.

    Raises:
        ValueError: On an invalid table, or a baseline name that collides with a result key.
    """
    level = _check_level(level)
    baselines = dict(baselines or {})
    for name in baselines:
        if not isinstance(name, str) or not name or name in RESERVED_KEYS:
            raise ValueError(
                f"baseline name {name!r} is not allowed (reserved: {sorted(RESERVED_KEYS)})"
            )
    main_v = validate_table(main, "main score table")
    base_v = {k: validate_table(v, f"baseline {k!r} score table") for k, v in baselines.items()}
    twin_v = _twin_tables(twins)
    ids = set(main_v["trajectory_id"])
    for v in (*base_v.values(), *twin_v.values()):
        ids |= set(v["trajectory_id"])
    draws = make_draws(ids, n_boot=n_boot, seed=seed)

    res = estimands(main_v, level=level, draws=draws, interval=interval)
    jk = res.jackknife or {"e1": None, "e3": {}}
    out: dict = res.to_dict()
    clusters: dict = res.cluster_counts()
    differences: dict = {}
    diff_clusters: dict = {}
    p_values: dict = {"e1": bootstrap_p(res.replicates["e1"], 0.5),
                      "e3": {c: bootstrap_p(r, 0.5) for c, r in res.replicates["e3"].items()}}
    for name, tbl in base_v.items():
        b = estimands(tbl, level=level, draws=draws, interval=interval)
        out[name] = b.to_dict()
        clusters[name] = b.cluster_counts()
        iv, diff = paired_difference(
            res.e1.estimate, res.replicates["e1"], b.e1.estimate, b.replicates["e1"], level=level,
            interval=interval, jackknife_a=jk["e1"], jackknife_b=(b.jackknife or {}).get("e1"),
        )
        differences[f"e1_minus_{name}_e1"] = iv.to_dict()
        p_values[f"e1_minus_{name}_e1"] = bootstrap_p(diff, 0.0)
        diff_clusters[f"e1_minus_{name}_e1"] = len(res.contributors["e1"] & b.contributors["e1"])
    differences["e1_minus_e3"] = {}
    diff_clusters["e1_minus_e3"] = {}
    for control, e3 in res.e3.items():
        iv, _ = paired_difference(
            res.e1.estimate,
            res.replicates["e1"],
            e3.estimate,
            res.replicates["e3"][control],
            level=level,
            interval=interval,
            jackknife_a=jk["e1"],
            jackknife_b=jk["e3"].get(control),
        )
        differences["e1_minus_e3"][control] = iv.to_dict()
        diff_clusters["e1_minus_e3"][control] = len(res.contributors["e1"] & res.contributors["e3"][control])
    if twin_v:
        twin_out, twin_clusters = _twin_envelope(res, twin_v, draws=draws, level=level, interval=interval,
                                                 differences=differences, diff_clusters=diff_clusters,
                                                 p_values=p_values)
        out["random_twin"] = twin_out
        clusters["random_twin"] = twin_clusters
    out["differences"] = differences
    out["p_values"] = p_values
    clusters["differences"] = diff_clusters
    if permutation is not None:
        perm = permutation_summary(main_v, permutation["null_scores"], res.e1.estimate,
                                   weights=step_weights(main_v), alpha=permutation.get("alpha", 0.05),
                                   seed=permutation.get("seed"),
                                   refit_scores=permutation.get("refit_scores"))
        for key in ("unit", "design"):  # no timings: results.json is reproducible bit for bit
            if permutation.get(key) is not None:
                perm[key] = permutation[key]
        out["permutation"] = perm
    out["bootstrap"] = {
        "n_boot": int(draws.n_boot),
        "seed": int(seed),
        "level": float(level),
        "n_clusters": int(draws.n_clusters),
        "interval": interval,
        "clusters_by_estimand": clusters,
    }
    return out
