"""Estimands E1/E2/E3 of one score table on (shared) cluster-bootstrap draws (PROTOCOL.md §5).

E1 and E1_paired (attack vs clean), E2 (mean within-step AUC) and E3[c] (attack vs control c),
step-weighted (:func:`ipi.metrics.table.step_weights`), with intervals from
:mod:`ipi.metrics.bootstrap` and the effective clusters of the gate (PROTOCOL.md §7.0).
Definitions: docs/estimands.md."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ipi.metrics.auc import bootstrap_weighted_auc, grouped_weighted_auc, weighted_auc
from ipi.metrics.bootstrap import (
    BCA,
    INTERVAL,
    INTERVALS,
    LEVEL,
    N_BOOT,
    SEED,
    Draws,
    Interval,
    check_level,
    make_draws,
    make_interval,
)
from ipi.metrics.keys import E1, E1_PAIRED, E2, E3
from ipi.metrics.table import ATTACK, CLEAN, is_control, step_weights, validate_table

__all__ = ["EstimandSet", "estimands"]


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
            having both; E3[c]: trajectories with a step having an attack and a ``c`` row;
            ``"e1_paired"``: as E2.
        e1_paired: E1 over the steps having both an attack and a clean row (check 1).
        effective: Kish effective test trajectories per estimand, ``{"e1", "e1_paired", "e2":
            float, "e3": {control: float}}`` (docs/estimands.md; the verdict's gate).
    """

    e1: Interval
    e2: Interval
    e3: dict[str, Interval]
    replicates: dict = field(repr=False)
    draws: Draws = field(repr=False)
    level: float = LEVEL
    jackknife: dict | None = field(default=None, repr=False)
    interval: str = INTERVAL
    contributors: dict = field(default_factory=dict, repr=False)
    e1_paired: Interval | None = None
    effective: dict = field(default_factory=dict, repr=False)

    def cluster_counts(self) -> dict:
        """``{"e1": n, "e1_paired": n, "e2": n, "e3": {control: n}}``: sizes of :attr:`contributors`."""
        c = self.contributors
        out = {E1: len(c.get(E1, ()))}
        if E1_PAIRED in c:
            out[E1_PAIRED] = len(c[E1_PAIRED])
        out.update({E2: len(c.get(E2, ())), E3: {k: len(v) for k, v in c.get(E3, {}).items()}})
        return out

    def effective_counts(self) -> dict:
        """``{"e1": k, "e1_paired": k, "e2": k, "e3": {control: k}}``: Kish effective test
        trajectories of each estimand (min over its two sides; docs/estimands.md)."""
        return {k: (dict(self.effective[k]) if k == E3 else self.effective[k])
                for k in (E1, E1_PAIRED, E2, E3) if k in self.effective}

    def __getitem__(self, key: str):
        if key not in (E1, E2, E3):
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        return iter((E1, E2, E3))

    def __len__(self) -> int:
        return 3

    def to_dict(self) -> dict:
        """``{"e1": {...}, "e1_paired": {...}, "e2": {...}, "e3": {control: {...}}}`` with JSON-ready
        intervals (``e1_paired`` when computed)."""
        out = {E1: self.e1.to_dict()}
        if self.e1_paired is not None:
            out[E1_PAIRED] = self.e1_paired.to_dict()
        out.update({E2: self.e2.to_dict(), E3: {c: iv.to_dict() for c, iv in self.e3.items()}})
        return out


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
    interval: str = INTERVAL,
    n_boot: int | None = None,
    n_clusters: int | None = None,
) -> tuple[Interval, np.ndarray, np.ndarray | None]:
    # m holds the B bootstrap rows, then (interval="bca") T jackknife rows.
    estimate = weighted_auc(f[positive], f[negative], w[positive], w[negative])
    rows = positive | negative
    reps = bootstrap_weighted_auc(f[rows], positive[rows], w[rows], m, clusters=col[rows])
    b = m.shape[0] if n_boot is None else n_boot
    reps, jack = reps[:b], (reps[b:] if interval == BCA else None)
    return make_interval(interval, estimate, reps, jack, level, n_clusters), reps, jack


def kish(weights) -> float:
    """Kish's effective number ``(Σ w)² / Σ w²`` of non-negative cluster weights (0 when all are 0)."""
    w = np.asarray(weights, dtype=np.float64)
    s2 = float(np.sum(w * w))
    return float(np.sum(w) ** 2 / s2) if s2 > 0 else 0.0



@dataclass(frozen=True)
class ReplicateFrame:
    """A validated score table laid out for vectorised bootstrap replicates (the estimands and the
    operating point compute every replicate as one matrix product over these arrays).

    Attributes:
        table: The validated table (:func:`ipi.metrics.table.validate_table`).
        draws: The cluster-bootstrap draws.
        col: Each row's cluster column in ``draws`` ``[n]``.
        m: Cluster multiplicities ``[B, clusters]``; for BCa the ``T`` leave-one-cluster-out rows
            follow ``[B + T, clusters]`` (jackknife values on the same code path).
        n_boot: ``B``, the leading rows of ``m`` that are replicates.
        score: Scores ``[n]`` (float64).
        weight: Step weights ``[n]`` (:func:`ipi.metrics.table.step_weights`).
        variant: Variants ``[n]`` (object).
    """

    table: pd.DataFrame
    draws: Draws
    col: np.ndarray
    m: np.ndarray
    n_boot: int
    score: np.ndarray
    weight: np.ndarray
    variant: np.ndarray


def replicate_frame(table: pd.DataFrame, *, n_boot: int, seed: int, draws: Draws | None,
                    interval: str) -> ReplicateFrame:
    """Validate ``table`` and lay it out over ``draws`` (fresh draws of ``n_boot`` over its
    trajectories with ``seed`` when None); ``interval="bca"`` appends the jackknife rows."""
    t = validate_table(table)
    if draws is None:
        draws = make_draws(t["trajectory_id"], n_boot=n_boot, seed=seed)
    m = np.asarray(draws.multiplicity, dtype=np.float64)
    nb = m.shape[0]
    if interval == BCA:
        m = np.vstack([m, 1.0 - np.eye(draws.n_clusters)])
    return ReplicateFrame(t, draws, draws.columns(t["trajectory_id"]), m, nb, t["score"].to_numpy(dtype=np.float64),
                          step_weights(t), t["variant"].to_numpy(dtype=object))


def _e2_replicates(step_key: np.ndarray, f: np.ndarray, w: np.ndarray, col: np.ndarray, is_attack: np.ndarray,
                   sel: np.ndarray, m: np.ndarray, n_t: int) -> tuple[float, np.ndarray, np.ndarray]:
    """E2 and its replicates: the within-step AUCs of the rows ``sel`` (fixed under the cluster
    bootstrap), averaged per replicate with the trajectories' multiplicities ``m`` as weights.

    Returns:
        ``(estimate, replicate values [rows of m], defined steps per trajectory [n_t])``.
    """
    step_auc = grouped_weighted_auc(step_key[sel], f[sel], is_attack[sel], w[sel])
    n_keys = int(step_key.max()) + 1
    step_auc = np.concatenate([step_auc, np.full(n_keys - step_auc.size, np.nan)])
    step_col = np.zeros(n_keys, dtype=np.int64)
    step_col[step_key] = col
    defined = np.isfinite(step_auc)
    estimate = float(np.mean(step_auc[defined])) if defined.any() else math.nan
    auc_sum = np.bincount(step_col[defined], weights=step_auc[defined], minlength=n_t)
    n_steps = np.bincount(step_col[defined], minlength=n_t).astype(np.float64)
    numer = m @ auc_sum
    denom = m @ n_steps
    reps = np.full(m.shape[0], np.nan)
    ok = denom > 0
    reps[ok] = numer[ok] / denom[ok]
    return estimate, reps, n_steps


def estimands(
    table: pd.DataFrame,
    *,
    n_boot: int = N_BOOT,
    seed: int = SEED,
    level: float = LEVEL,
    draws: Draws | None = None,
    interval: str = INTERVAL,
) -> EstimandSet:
    """E1, E2 and E3[c] of a score table with cluster-bootstrap intervals (PROTOCOL.md §5).

    Definitions: docs/estimands.md. In a replicate, rows are reweighted by their trajectory's
    draw count with scores fixed (E2: the multiplicity-weighted mean of the per-step AUCs);
    replicates where an estimand is undefined are dropped for that estimand and counted.

    Args:
        table: Score table (columns ``trajectory_id, step, variant, score[, weight]``).
        n_boot: Replicates ``B`` (ignored when ``draws`` is given).
        seed: Seed of the draws (ignored when ``draws`` is given).
        level: Interval coverage, e.g. 0.95.
        draws: Shared draws (from :func:`make_draws`) to pair this table with others; every
            trajectory of the table must be one of its clusters. Default: fresh draws over the
            table's own trajectories.
        interval: ``"expanded"`` (default; :func:`expanded_percentile_interval`),
            ``"percentile"`` (PROTOCOL.md §5) or ``"bca"`` (:func:`bca_interval`, acceleration
            from the leave-one-trajectory-out jackknife).

    Returns:
        An :class:`EstimandSet` (intervals plus the raw replicate arrays in ``.replicates``).

    Raises:
        ValueError: On an invalid table (see :func:`validate_table`), a bad ``level``, or a
            trajectory missing from ``draws``.
"""
    level = check_level(level)
    if interval not in INTERVALS:
        raise ValueError(f"interval {interval!r} unknown; expected one of {', '.join(INTERVALS)}")
    rf = replicate_frame(table, n_boot=n_boot, seed=seed, draws=draws, interval=interval)
    t, draws, col, m, nb, f, w, variant = rf.table, rf.draws, rf.col, rf.m, rf.n_boot, rf.score, rf.weight, rf.variant
    _, step_key = np.unique(
        np.stack([col, t["step"].to_numpy(dtype=np.int64)], axis=1), axis=0, return_inverse=True
    )
    step_key = step_key.reshape(-1).astype(np.int64)
    is_attack = variant == ATTACK
    is_clean = variant == CLEAN

    replicates: dict = {}
    jackknife: dict = {E3: {}}
    ids = np.asarray(draws.trajectory_ids, dtype=object)
    positive_w = w > 0
    n_t = draws.n_clusters

    def side(mask: np.ndarray) -> np.ndarray:
        # per-trajectory total weight of one side's rows
        return np.bincount(col[mask], weights=w[mask], minlength=n_t)

    def having_both(pos: np.ndarray, neg: np.ndarray) -> set[str]:
        # trajectories with (positive-weight) rows on both sides
        has_p = np.bincount(col[pos & positive_w], minlength=n_t) > 0
        has_n = np.bincount(col[neg & positive_w], minlength=n_t) > 0
        return set(ids[has_p & has_n])

    def effective(pos: np.ndarray, neg: np.ndarray) -> float:
        return min(kish(side(pos)), kish(side(neg)))

    contributors: dict = {E3: {}}
    eff: dict = {E3: {}}
    # E1: pooled over all attack and clean rows.
    contributors[E1] = having_both(is_attack, is_clean)
    eff[E1] = effective(is_attack, is_clean)
    e1, replicates[E1], jackknife[E1] = _auc_with_replicates(f, w, col, is_attack, is_clean, m, level,
                                                             interval, nb, len(contributors[E1]))

    # E1 over the steps having both (check 1): the same numbers when every such row is in one.
    both_ac = _both_mask(step_key, variant, ATTACK, CLEAN)
    pa, pc = is_attack & both_ac, is_clean & both_ac
    contributors[E1_PAIRED] = having_both(pa, pc)
    eff[E1_PAIRED] = effective(pa, pc)
    if np.array_equal(pa, is_attack) and np.array_equal(pc, is_clean):
        e1_paired, replicates[E1_PAIRED], jackknife[E1_PAIRED] = e1, replicates[E1], jackknife[E1]
    else:
        e1_paired, replicates[E1_PAIRED], jackknife[E1_PAIRED] = _auc_with_replicates(
            f, w, col, pa, pc, m, level, interval, nb, len(contributors[E1_PAIRED]))

    # E2: within-step AUCs (fixed under the cluster bootstrap), averaged per replicate with the
    # trajectories' multiplicities as weights.
    sel = (is_attack | is_clean) & both_ac
    e2_estimate, e2_reps, n_steps = _e2_replicates(step_key, f, w, col, is_attack, sel, m, n_t)
    replicates[E2], jackknife[E2] = e2_reps[:nb], (e2_reps[nb:] if interval == BCA else None)
    contributors[E2] = having_both(is_attack & sel, is_clean & sel)
    eff[E2] = kish(n_steps)
    e2 = make_interval(interval, e2_estimate, replicates[E2], jackknife[E2], level, len(contributors[E2]))

    # E3[c]: attack vs control c over the steps having both.
    e3: dict[str, Interval] = {}
    replicates[E3] = {}
    for control in sorted({v for v in variant if is_control(v)}):
        both = _both_mask(step_key, variant, ATTACK, control)
        pos, neg = is_attack & both, (variant == control) & both
        contributors[E3][control] = having_both(pos, neg)
        eff[E3][control] = effective(pos, neg)
        e3[control], replicates[E3][control], jackknife[E3][control] = _auc_with_replicates(
            f, w, col, pos, neg, m, level, interval, nb, len(contributors[E3][control])
        )
    return EstimandSet(e1=e1, e2=e2, e3=e3, replicates=replicates, draws=draws, level=level,
                       jackknife=jackknife if interval == BCA else None, interval=interval,
                       contributors=contributors, e1_paired=e1_paired, effective=eff)
