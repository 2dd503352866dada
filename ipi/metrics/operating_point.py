"""The operating point a defender deploys at: TPR at a fixed FPR, with cluster-bootstrap intervals.

Attack rows against clean rows or one control's, step-weighted, a row flagged when
``score >= t``; ``TPR@FPR = max {TPR(t) : FPR(t) <= fpr}`` (the ROC curve of
:func:`sklearn.metrics.roc_curve` read at ``fpr``), the threshold re-chosen in every bootstrap
replicate. Definitions: docs/estimands.md, "The operating point"."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ipi.metrics.bootstrap import BCA, INTERVAL, LEVEL, N_BOOT, SEED, Draws, make_interval
from ipi.metrics.estimands import replicate_frame
from ipi.metrics.keys import FPR, N_NEGATIVE_STEPS, VS
from ipi.metrics.table import is_control

__all__ = ["DEFAULT_FPR", "operating_points"]

#: The default false-positive rate of the operating point (``evaluation.operating_fpr``).
DEFAULT_FPR = 0.01


def _tpr_at_fpr_rows(score: np.ndarray, positive: np.ndarray, weights: np.ndarray, fpr: float) -> np.ndarray:
    """TPR at ``fpr`` for each row of ``weights`` ``[R, n]`` (one weighting per row), scores fixed."""
    order = np.argsort(-score, kind="stable")
    s, pos = score[order], positive[order]
    w = weights[:, order]
    wp = np.where(pos, w, 0.0)
    wn = np.where(pos, 0.0, w)
    # thresholds at the last row of each run of tied scores (score >= t flags the whole run)
    ends = np.flatnonzero(np.r_[s[1:] != s[:-1], True])
    tp = np.cumsum(wp, axis=1)[:, ends]
    fp = np.cumsum(wn, axis=1)[:, ends]
    p_tot, n_tot = wp.sum(axis=1, keepdims=True), wn.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpr, fpr_t = tp / p_tot, fp / n_tot
    ok = fpr_t <= fpr + 1e-12
    out = np.where(ok, tpr, 0.0).max(axis=1, initial=0.0)
    out[(p_tot[:, 0] <= 0) | (n_tot[:, 0] <= 0)] = np.nan
    return out


def operating_points(table: pd.DataFrame, fpr: float = DEFAULT_FPR, *, n_boot: int = N_BOOT, seed: int = SEED,
                     level: float = LEVEL, interval: str = INTERVAL, draws: Draws | None = None) -> dict:
    """TPR at ``fpr`` for attack vs clean and attack vs each control, with cluster-bootstrap intervals.

    Args:
        table: Test score table (``trajectory_id, step, variant, score[, weight]``).
        fpr: The false-positive rate (``evaluation.operating_fpr``).
        n_boot: Replicates (ignored when ``draws`` is given).
        seed: Seed of the draws (ignored when ``draws`` is given).
        level: Interval coverage.
        interval: ``"percentile"`` or ``"bca"`` (jackknife over trajectories).
        draws: Shared cluster-bootstrap draws (the run's), or None for fresh ones.

    Returns:
        ``{"fpr": fpr, "vs": {"clean": {...}, "<control>": {...}}}``; each entry is an interval
        dict (``estimate``, ``ci_low``, ``ci_high``, ``n_boot_used``, ...) plus
        ``n_negative_steps``; a negative class absent from the table is left out.

    Raises:
        ValueError: An invalid table or ``fpr``.
    """
    if not 0.0 <= fpr < 1.0:
        raise ValueError(f"evaluation.operating_fpr must be in [0, 1), got {fpr}")
    rf = replicate_frame(table, n_boot=n_boot, seed=seed, draws=draws, interval=interval)
    t, col, m, nb, f, w, variant = rf.table, rf.col, rf.m, rf.n_boot, rf.score, rf.weight, rf.variant
    is_attack = variant == "attack"
    negatives = ["clean"] + sorted({str(v) for v in variant if is_control(str(v))})
    out: dict = {FPR: float(fpr), VS: {}}
    for neg in negatives:
        is_neg = variant == neg
        if not is_neg.any() or not is_attack.any():
            continue
        rows = is_attack | is_neg
        fr, pr, wr, cr = f[rows], is_attack[rows], w[rows], col[rows]
        estimate = float(_tpr_at_fpr_rows(fr, pr, wr[None, :], fpr)[0])
        reps = _tpr_at_fpr_rows(fr, pr, wr[None, :] * m[:, cr], fpr)
        jack = reps[nb:] if interval == BCA else None
        iv = make_interval(interval, estimate, reps[:nb], jack, level)
        steps = t.loc[is_neg, ["trajectory_id", "step"]].astype(str).drop_duplicates()
        out[VS][neg] = {**iv.to_dict(), N_NEGATIVE_STEPS: int(len(steps))}
    return out
