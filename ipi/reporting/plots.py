"""Figures of a run and of a sweep (matplotlib, Agg backend, PNG written atomically).

* :func:`plot_roc` — ROC curves of attack vs clean and attack vs each control, weighted exactly
  like the estimands (PROTOCOL.md §5): step weights ``1 / #rows of the same (trajectory, step,
  variant)``; the control curves use only the steps that have both an attack and that control
  row (the rows E3 pools). The AUC in each legend entry is the area under that weighted curve,
  i.e. E1 and E3[c].
* :func:`plot_forest` — every estimand with its bootstrap interval and the 0.5 line (the shape of
  the paper's results table), paired differences in a second panel with the 0 line.
* :func:`plot_heatmap` — a layers × token-groups grid of one estimand (used by
  :mod:`ipi.reporting.sweep`).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ipi.evaluation.reportable import estimand_entries, reportability_of
from ipi.evaluation.verdict import read_keys
from ipi.evaluation.results import ResultsView
from ipi.io import atomic_path
from ipi.metrics.keys import CI_HIGH, CI_LOW, DIFFERENCES, ESTIMATE
from ipi.metrics.table import ATTACK, CLEAN, is_control, step_weights, validate_table

__all__ = ["forest_rows", "plot_forest", "plot_heatmap", "plot_roc", "roc_curves", "save_figure"]

DPI = 110

#: Every string in a figure is drawn as given: labels, ids, data-root and source names come from
#: users and datasets, so ``$``, ``_``, ``^`` and ``\\`` are characters, never mathtext or TeX.
PLAIN_TEXT = {"text.parse_math": False, "text.usetex": False}


def plain_text(draw):
    """Run a figure function with :data:`PLAIN_TEXT` in force, from its first artist to the saved PNG.

    Tick labels and legend entries are made while the figure is drawn (at save time), so the
    settings must hold until :func:`save_figure` returns; wrapping the whole function does that.
    """

    @functools.wraps(draw)
    def wrapped(*args, **kwargs):
        with plt.rc_context(PLAIN_TEXT):
            return draw(*args, **kwargs)

    return wrapped


@plain_text
def save_figure(fig, path: str | os.PathLike) -> Path:
    """Save a figure as PNG atomically and close it.

    Args:
        fig: A matplotlib figure.
        path: Destination ``.png``.

    Returns:
        The destination path.
    """
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def _paired_steps(table: pd.DataFrame, a: str, b: str) -> np.ndarray:
    """Mask of rows whose (trajectory, step) has at least one ``a`` and one ``b`` row."""
    key = table["trajectory_id"].astype(str) + "\x00" + table["step"].astype(str)
    has_a = set(key[table["variant"] == a])
    has_b = set(key[table["variant"] == b])
    both = has_a & has_b
    return key.isin(both).to_numpy()


def roc_curves(scores: pd.DataFrame) -> dict[str, dict]:
    """Weighted ROC curves of attack vs clean and attack vs every control of a score table.

    Args:
        scores: Score table (``trajectory_id, step, variant, score[, weight]``; PROTOCOL.md §5).

    Returns:
        ``{negative_variant: {"fpr": array, "tpr": array, "auc": float, "n_pos": int,
        "n_neg": int}}`` with ``"clean"`` first, then the controls sorted. ``auc`` is
        ``sklearn.metrics.roc_auc_score`` with the step weights, equal to E1 / E3[c].

    Raises:
        ValueError: On an invalid table (see :func:`ipi.metrics.table.validate_table`).
    """
    from sklearn.metrics import roc_auc_score, roc_curve

    t = validate_table(scores, "score table")
    w = step_weights(t)
    f = t["score"].to_numpy(dtype=np.float64)
    v = t["variant"].to_numpy(dtype=object)
    out: dict[str, dict] = {}
    negatives = [CLEAN] + sorted({x for x in v if is_control(x)})
    for neg in negatives:
        rows = (v == ATTACK) | (v == neg)
        if neg != CLEAN:  # E3 pools only the steps having both an attack and a `neg` row
            rows &= _paired_steps(t, ATTACK, neg)
        y = (v[rows] == ATTACK).astype(int)
        if y.min(initial=1) == y.max(initial=0) or not rows.any():
            continue
        fpr, tpr, _ = roc_curve(y, f[rows], sample_weight=w[rows])
        auc = float(roc_auc_score(y, f[rows], sample_weight=w[rows]))
        out[neg] = {"fpr": fpr, "tpr": tpr, "auc": auc, "n_pos": int(y.sum()), "n_neg": int((1 - y).sum())}
    return out


@plain_text
def plot_roc(scores: pd.DataFrame, path: str | os.PathLike, title: str = "") -> Path:
    """Write the ROC figure of a score table (see :func:`roc_curves`).

    Args:
        scores: The probe's test-row score table.
        path: Destination PNG.
        title: Figure title (e.g. surface and backbone).

    Returns:
        The PNG path.
    """
    curves = roc_curves(scores)
    fig, ax = plt.subplots(figsize=(5.2, 5.0))
    for neg, c in curves.items():
        name = "E1 attack vs clean" if neg == CLEAN else f"E3 attack vs {neg}"
        ax.plot(c["fpr"], c["tpr"], lw=2 if neg == CLEAN else 1.4,
                label=f"{name}: AUC {c['auc']:.3f} ({c['n_pos']} vs {c['n_neg']} rows)")
    ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=1, label="chance (0.5)")
    ax.set_xlabel("false positive rate (step-weighted)")
    ax.set_ylabel("true positive rate (step-weighted)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.01)
    ax.set_aspect("equal")
    ax.grid(alpha=0.3)
    # Below the axes, never over the curves (their upper-left region is where a good probe's go).
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=7.5, frameon=False)
    ax.set_title(title or "ROC on the test split", fontsize=10)
    return save_figure(fig, path)


def _iv(x) -> tuple[float, float, float] | None:
    if not isinstance(x, Mapping) or x.get(ESTIMATE) is None:
        return None
    est = float(x[ESTIMATE])
    lo = x.get(CI_LOW)
    hi = x.get(CI_HIGH)
    return est, float(lo) if lo is not None else math.nan, float(hi) if hi is not None else math.nan


def _diff_label(key: str) -> str:
    parts = key.split(".")[1:]  # differences.<name>[.<control>]
    name = parts[0].replace("_minus_", " − ").replace("_", " ")
    return f"{name}[{parts[1]}]" if len(parts) > 1 else name


def forest_rows(results: Mapping, *, readers: Mapping[str, list[int]] | None = None):
    """The estimands of a ``results.json`` as forest-plot rows.

    Args:
        results: The dict written to ``results.json``.
        readers: ``{key: [check ids]}`` (:func:`ipi.evaluation.verdict.read_keys`): a label then
            names the checks reading it; or None.

    Returns:
        ``(auc_rows, difference_rows)``, each a list of ``(label, estimate, ci_low, ci_high, why)``
        (``nan`` bounds where the interval is undefined; ``why`` None or why it is not
        reportable). AUC rows: E1, E2, E3 per control, then every baseline's E1 and E2;
        difference rows: the paired differences.
    """
    marks = reportability_of(results)
    aucs, diffs = [], []
    for key, label, x in estimand_entries(results):
        iv = _iv(x)
        if iv is None:
            continue
        is_diff = key.startswith(f"{DIFFERENCES}.")
        label = _diff_label(key) if is_diff else label
        ids = (readers or {}).get(key)
        if ids:
            label += f" [check{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}]"
        (diffs if is_diff else aucs).append((label, *iv, marks.get(key)))
    return aucs, diffs


GREY = "#9a9a9a"


def short_reason(reason: str) -> str:
    """A reportability reason shortened for a figure label (the report tables keep the long one)."""
    import re

    out = re.sub(r"only (\d+) test trajector(?:y contributes|ies contribute) \(< min_clusters (\d+)\)",
                 r"\1 contributing trajectories < \2", reason)
    out = re.sub(r"only ([\d.]+) effective test trajectories \(Kish[^)]*\) \(< min_clusters ([\d.]+)\)",
                 r"\1 effective trajectories < \2", out)
    out = re.sub(r"only (\d+) of (\d+) bootstrap replicates usable \(< [^)]*\)", r"\1/\2 replicates", out)
    return re.sub(r"degenerate interval \[[^\]]*\] \(every replicate gave the same value\)", "degenerate interval",
                  out)


def _forest_panel(ax, rows, ref: float, xlim):
    n = len(rows)
    ys = np.arange(n)[::-1]
    for y, (label, est, lo, hi, why) in zip(ys, rows):
        ok_ci = not (math.isnan(lo) or math.isnan(hi))
        if why is not None:
            # Not reportable: a hollow grey point, no interval bar (a bar of zero width would look
            # like a precise result), and the reason in words.
            ax.plot([est], [y], "o", mfc="white", mec=GREY, mew=1.5, ms=7, clip_on=False, zorder=3)
            txt = f"{est:.3f}  not reportable: {short_reason(why)}"
            ax.text(1.02, y, txt, transform=ax.get_yaxis_transform(), va="center", fontsize=8,
                    color=GREY, style="italic")
            continue
        colour = "#2ca02c" if ok_ci and lo > ref else ("#d62728" if ok_ci and hi < ref else "#7f7f7f")
        if ok_ci:
            ax.plot([lo, hi], [y, y], color=colour, lw=2, clip_on=False, solid_capstyle="butt")
        ax.plot([est], [y], "o", color=colour, ms=6, clip_on=False, zorder=3)
        txt = f"{est:.3f} [{lo:.3f}, {hi:.3f}]" if ok_ci else f"{est:.3f} [n/a]"
        ax.text(1.02, y, txt, transform=ax.get_yaxis_transform(), va="center", fontsize=8)
    ax.axvline(ref, color="black", ls="--", lw=1)
    ax.set_yticks(ys)
    ax.set_yticklabels([r[0] for r in rows], fontsize=8.5)
    for tick, row in zip(ax.get_yticklabels(), rows):
        if row[4] is not None:
            tick.set_color(GREY)
    ax.set_ylim(-0.7, n - 0.3)
    if xlim is not None:
        ax.set_xlim(*xlim)
    ax.grid(axis="x", alpha=0.3)


@plain_text
def plot_forest(results: Mapping, path: str | os.PathLike, title: str = "") -> Path:
    """Write the forest plot of every estimand with its CI (PROTOCOL.md §5–§6).

    Each estimand a verdict check reads is labelled with that check's number
    (:func:`ipi.evaluation.verdict.read_keys`). Intervals entirely above the reference line are green, entirely below red, across it grey.
    An estimate that is not reportable (:mod:`ipi.evaluation.reportable`: too few test
    trajectories, too few usable replicates, a degenerate interval) is a hollow grey point with
    no interval bar and its reason printed beside it. The AUC axis runs a little past 0 and 1 so
    that points at 1.0 are drawn whole.

    Args:
        results: The dict written to ``results.json``.
        path: Destination PNG.
        title: Figure title.

    Returns:
        The PNG path.

    Raises:
        ValueError: ``results`` holds no estimand.
    """
    aucs, diffs = forest_rows(results, readers=read_keys(results))
    if not aucs:
        raise ValueError("plot_forest: no estimand in results")
    heights = [max(len(aucs), 1), max(len(diffs), 1)] if diffs else [len(aucs)]
    marked = any(r[4] is not None for r in aucs + diffs)
    fig, axes = plt.subplots(len(heights), 1, figsize=(10.5 if marked else 7.5, 0.42 * sum(heights) + 1.6),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    _forest_panel(axes[0, 0], aucs, 0.5, (-0.03, 1.03))
    axes[0, 0].set_xticks(np.linspace(0, 1, 6))
    axes[0, 0].set_xlabel("AUC (0.5 = chance)", fontsize=9)
    if diffs:
        lo = min([r[2] for r in diffs if not math.isnan(r[2])] + [r[1] for r in diffs] + [-0.05])
        hi = max([r[3] for r in diffs if not math.isnan(r[3])] + [r[1] for r in diffs] + [0.05])
        pad = 0.05 * (hi - lo)
        _forest_panel(axes[1, 0], diffs, 0.0, (lo - pad, hi + pad))
        axes[1, 0].set_xlabel("paired difference of AUCs (same bootstrap draws; 0 = no difference)",
                              fontsize=9)
    axes[0, 0].set_title(title or f"Estimands with {ResultsView(results).level:.0%} cluster-bootstrap intervals",
                         fontsize=10)
    n_marked = sum(r[4] is not None for r in aucs + diffs)
    if n_marked:
        fig.text(0.01, 0.005, f"{n_marked} estimate(s) not reportable (hollow grey): the verdict could not "
                 "use them; do not report them as results.", fontsize=8, color="#7a4b00", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03 if n_marked else 0, 1, 1))
    return save_figure(fig, path)


@plain_text
def plot_heatmap(grid: pd.DataFrame, path: str | os.PathLike, title: str,
                 low: pd.DataFrame | None = None, high: pd.DataFrame | None = None) -> Path:
    """Write a heatmap of one estimand over layers (rows) × token groups (columns).

    Args:
        grid: Estimates, index = layer labels, columns = token-group labels; NaN = missing job.
        path: Destination PNG.
        title: Figure title.
        low: Optional CI lower bounds of the same shape (printed under the estimate).
        high: Optional CI upper bounds of the same shape.

    Returns:
        The PNG path.
    """
    vals = grid.to_numpy(dtype=np.float64)
    fig, ax = plt.subplots(figsize=(1.5 * grid.shape[1] + 2.5, 0.8 * grid.shape[0] + 1.8))
    im = ax.imshow(np.ma.masked_invalid(vals), cmap="RdBu_r", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(grid.shape[1]))
    ax.set_xticklabels([str(c) for c in grid.columns], rotation=30, ha="right", fontsize=9)
    ax.set_yticks(range(grid.shape[0]))
    ax.set_yticklabels([str(i) for i in grid.index], fontsize=9)
    ax.set_xlabel("token group")
    ax.set_ylabel("layer")
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            if math.isnan(vals[i, j]):
                ax.text(j, i, "—", ha="center", va="center", fontsize=9)
                continue
            txt = f"{vals[i, j]:.3f}"
            if low is not None and high is not None:
                lo, hi = float(low.iloc[i, j]), float(high.iloc[i, j])
                if not (math.isnan(lo) or math.isnan(hi)):
                    txt += f"\n[{lo:.2f}, {hi:.2f}]"
            dark = abs(vals[i, j] - 0.5) > 0.3
            ax.text(j, i, txt, ha="center", va="center", fontsize=8, color="white" if dark else "black")
    fig.colorbar(im, ax=ax, label="AUC (0.5 = chance)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)
