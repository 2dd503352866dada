"""The exact permutation test of verdict check 4 (PROTOCOL.md §7.4).

Randomisation unit: a training (trajectory, step), within which the attack/clean labels of its
labelled rows are permuted. Each replicate refits the probe on the permuted training labels and
scores the **fixed** test rows; its statistic is the test E1. Under the null the observed E1 is
exchangeable with the M replicates, so ``p = (1 + #{E1_perm ≥ E1}) / (M + 1)`` is exact, and
the null is symmetric around 0.5: a null mean off 0.5 means leakage or a bug.

:func:`permute_within` draws the labels; :func:`permutation_summary` turns the replicate scores
into the reported numbers; the refits are :func:`ipi.detectors.crossfit.cross_fit`'s."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ipi.metrics.auc import weighted_auc
from ipi.metrics.keys import (DESIGN, E1, E1_REFIT, M_KEY, N_GE, NULL_MEAN, NULL_Q025, NULL_Q975, NULL_SD, P_VALUE,
                              SEED_KEY, TOLERANCE)
from ipi.metrics.table import ATTACK, CLEAN

__all__ = ["ALPHA", "PermutationSummary", "null_tolerance", "permutation_summary", "permute_within"]

#: Level of the exact permutation test (``evaluation.permutation.alpha``): PASS needs ``p <= alpha``.
ALPHA = 0.05


def permute_within(groups: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Permute labels at random within each group (PROTOCOL.md §7.4's randomisation unit).

    Args:
        groups: ``[n]`` integer group code of each row (a training (trajectory, step)).
        y: ``[n]`` labels.
        rng: Random generator (one uniform draw per row).

    Returns:
        ``[n]`` labels; each group holds the same multiset of labels as in ``y``, so class
        counts (hence the balanced class weights) are unchanged.
    """
    groups = np.asarray(groups)
    y = np.asarray(y)
    n = y.shape[0]
    by_position = np.lexsort((np.arange(n), groups))  # rows grouped, in their order
    shuffled = np.lexsort((rng.random(n), groups))  # rows grouped, in random order
    out = np.empty_like(y)
    out[by_position] = y[shuffled]
    return out


def _weight_of_variant(table: pd.DataFrame, variant: str) -> np.ndarray:
    """``[n]`` the step weight a row would have as ``variant``: ``1 / rows of that variant at its
    (trajectory, step)`` (PROTOCOL.md §5's default step weights)."""
    steps = table["trajectory_id"].astype(str) + "\x00" + table["step"].astype(str)
    n = (table["variant"] == variant).groupby(steps).transform("sum").to_numpy(dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.where(n > 0, 1.0 / np.maximum(n, 1.0), 0.0)


def null_tolerance(sd: float, m: int) -> float:
    """How far the null mean may lie from 0.5: ``max(0.02, 3·SD/√M)`` (PROTOCOL.md §7.4)."""
    return max(0.02, 3.0 * float(sd) / math.sqrt(m))


@dataclass(frozen=True)
class PermutationSummary:
    """The exact permutation test's numbers (PROTOCOL.md §7.4; :func:`permutation_summary`).

    Attributes:
        m: Refits ``M``.
        e1: The observed E1 (the test statistic).
        null_e1: E1 of each refit ``[M]``.
        null_mean: Mean of ``null_e1``.
        null_sd: Sample SD (``ddof=1``) of ``null_e1`` (0 with one refit).
        null_q025: 2.5% quantile of ``null_e1`` (``numpy.quantile``, linear).
        null_q975: 97.5% quantile.
        n_ge: Refits with E1 >= the observed E1.
        p_value: ``(1 + n_ge) / (M + 1)``.
        alpha: Level of the test.
        tolerance: How far the null mean may lie from 0.5 (:func:`null_tolerance`).
        seed: Seed of the label permutations, or None.
        e1_refit: E1 of the same refit procedure on the true labels, or None.
        unit: The randomisation unit in words, or None (then not written).
        design: The refits' solver design in words, or None (then not written).
    """

    m: int
    e1: float
    null_e1: list[float]
    null_mean: float
    null_sd: float
    null_q025: float
    null_q975: float
    n_ge: int
    p_value: float
    alpha: float
    tolerance: float
    seed: int | None
    e1_refit: float | None
    unit: str | None = None
    design: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready ``{"m", "e1", "null_e1", ..., "seed", "e1_refit"[, "unit"][, "design"]}`` (no
        timings: results.json is reproducible bit for bit)."""
        out = {M_KEY: self.m, E1: self.e1, "null_e1": list(self.null_e1), NULL_MEAN: self.null_mean,
               NULL_SD: self.null_sd, NULL_Q025: self.null_q025, NULL_Q975: self.null_q975, N_GE: self.n_ge,
               P_VALUE: self.p_value, "alpha": self.alpha, TOLERANCE: self.tolerance, SEED_KEY: self.seed,
               E1_REFIT: self.e1_refit}
        if self.unit is not None:
            out["unit"] = self.unit
        if self.design is not None:
            out[DESIGN] = self.design
        return out


def permutation_summary(table: pd.DataFrame, null_scores: np.ndarray, e1: float, *,
                        weights: np.ndarray | None = None, alpha: float = ALPHA,
                        seed: int | None = None, refit_scores: np.ndarray | None = None,
                        unit: str | None = None, design: str | None = None,
                        null_attack: np.ndarray | None = None) -> PermutationSummary:
    """Null distribution, p-value and decision numbers of the permutation test (§7.4).

    Args:
        table: The probe's validated score table (``variant`` column), ``[n]`` rows.
        null_scores: ``[M, n]`` scores of the table's rows by each permuted-label refit
            (``nan`` allowed on rows that are neither attack nor clean).
        e1: The observed E1 (the test statistic).
        weights: ``[n]`` step weights (PROTOCOL.md §5); default all ones.
        alpha: Level of the test.
        seed: Seed of the label permutations (recorded).
        refit_scores: Optional ``[n]`` scores of the same refit procedure on the **true**
            labels; their E1 is reported as ``e1_refit`` (it should equal ``e1`` up to the
            solvers' tolerance).
        unit: The randomisation unit in words (recorded), or None.
        design: The refits' design in words (recorded), or None.
        null_attack: ``[M, n]`` booleans: replicate ``j``'s attack/clean labels of the table's
            rows (True = attack), or None: every replicate is evaluated on the true labels.
            Under K-fold each replicate is evaluated on its permuted labels, the step weights
            following the permuted variant.

    Returns:
        The :class:`PermutationSummary`.

    Raises:
        ValueError: If ``null_scores`` does not have one column per table row, or a replicate
            leaves an attack/clean row unscored.
"""
    null_scores = np.asarray(null_scores, dtype=np.float64)
    if null_scores.ndim != 2 or null_scores.shape[1] != len(table) or null_scores.shape[0] < 1:
        raise ValueError(f"null_scores must be [M >= 1, {len(table)}], got {null_scores.shape}")
    variant = table["variant"].to_numpy(dtype=object)
    pos, neg = variant == ATTACK, variant == CLEAN
    w = np.ones(len(table)) if weights is None else np.asarray(weights, dtype=np.float64)
    lab = pos | neg
    if not np.isfinite(null_scores[:, lab]).all():
        raise ValueError("null_scores: a permuted-label refit left an attack/clean test row unscored")
    if null_attack is None:
        null = np.array([weighted_auc(s[pos], s[neg], w[pos], w[neg]) for s in null_scores])
    else:
        null_attack = np.asarray(null_attack, dtype=bool)
        if weights is not None and "weight" in table.columns:
            raise ValueError("null_attack: a table with its own weight column cannot be relabelled (the weights "
                             "of a permuted variant are unknown)")
        if null_attack.shape != null_scores.shape:
            raise ValueError(f"null_attack must be {null_scores.shape} like null_scores, got {null_attack.shape}")
        # the step weight of a row follows its (permuted) variant: 1 / rows of that variant at its step
        w_pos, w_neg = _weight_of_variant(table, ATTACK), _weight_of_variant(table, CLEAN)
        null = np.array([weighted_auc(s[lab & a], s[lab & ~a], w_pos[lab & a], w_neg[lab & ~a])
                         for s, a in zip(null_scores, null_attack)])
    m = int(null.size)
    sd = float(np.std(null, ddof=1)) if m > 1 else 0.0
    n_ge = int(np.sum(null >= e1))
    q025, q975 = np.quantile(null, [0.025, 0.975])
    return PermutationSummary(
        m=m,
        e1=float(e1),
        null_e1=[float(v) for v in null],
        null_mean=float(np.mean(null)),
        null_sd=sd,
        null_q025=float(q025),
        null_q975=float(q975),
        n_ge=n_ge,
        p_value=(1 + n_ge) / (m + 1),
        alpha=float(alpha),
        tolerance=null_tolerance(sd, m),
        seed=None if seed is None else int(seed),
        e1_refit=(None if refit_scores is None else
                  float(weighted_auc(np.asarray(refit_scores)[pos], np.asarray(refit_scores)[neg], w[pos], w[neg]))),
        unit=unit,
        design=design,
    )
