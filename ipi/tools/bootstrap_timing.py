"""Timing of the vectorised cluster bootstrap against a plain scikit-learn loop (PROTOCOL.md §5).

Called by the benchmark CLI; not a unit test. Both paths compute every estimand of
:func:`ipi.metrics.estimands.estimands` (E1, E2, E3 for three controls) for ``n_boot`` replicates
on the same synthetic score table and the same draws, and must agree.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import numpy as np
import pandas as pd

from ipi.tools.stopwatch import Stopwatch, best_of
from ipi.metrics.bootstrap import make_draws
from ipi.metrics.estimands import estimands
from ipi.metrics.table import ATTACK, CLEAN, step_weights, validate_table
from ipi.protocol import VARIANTS
from ipi.metrics.permutation import permute_within
from ipi.probe import dual
from ipi.probe.fit import fit_sklearn_reference

__all__ = ["bench_bootstrap", "bench_permutation", "synthetic_score_table"]


def synthetic_score_table(n_rows: int = 5000, seed: int = 0):
    """A synthetic score table of about ``n_rows`` rows (PROTOCOL.md §5 layout).

    Trajectories of 10 steps, each step with one clean, one attack and three
    control rows (five variants); scores are Gaussian, attack shifted by +1, rounded to 2
    decimals so that ties occur.

    Args:
        n_rows: Target number of rows (rounded down to whole trajectories, at least one).
        seed: Seed of the score generator.

    Returns:
        DataFrame with ``trajectory_id, step, variant, score``.
    """
    steps_per_trajectory = 10
    per_traj = steps_per_trajectory * len(VARIANTS)
    n_traj = max(1, n_rows // per_traj)
    rng = np.random.default_rng(seed)
    tid = np.repeat([f"traj-{t:05d}" for t in range(n_traj)], per_traj)
    step = np.tile(np.repeat(np.arange(steps_per_trajectory), len(VARIANTS)), n_traj)
    variant = np.tile(np.array(VARIANTS, dtype=object), n_traj * steps_per_trajectory)
    score = rng.normal(size=tid.size) + (variant == ATTACK) * 1.0
    return pd.DataFrame(
        {"trajectory_id": tid, "step": step, "variant": variant, "score": np.round(score, 2)}
    )


@contextmanager
def _single_core():
    """Pin the process to one CPU and BLAS/OpenMP pools to one thread, restoring afterwards."""
    old_aff = None
    if hasattr(os, "sched_getaffinity"):
        old_aff = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(old_aff)})
    try:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
            yield
        else:
            with threadpool_limits(limits=1):
                yield
    finally:
        if old_aff is not None:
            os.sched_setaffinity(0, old_aff)


def _loop_replicates(table: pd.DataFrame, draws) -> dict:
    """Every estimand per replicate with a plain Python loop and ``roc_auc_score``."""
    from sklearn.metrics import roc_auc_score

    t = validate_table(table)
    f = t["score"].to_numpy()
    w = step_weights(t)
    v = t["variant"].to_numpy(dtype=object)
    col = draws.columns(t["trajectory_id"])
    keys = list(zip(col, t["step"].to_numpy(), strict=True))
    m = draws.multiplicity.astype(np.float64)

    def steps_with(variant):
        return {k for k, vv in zip(keys, v, strict=True) if vv == variant}

    attack_steps = steps_with(ATTACK)
    pairs = {"e1": (v == ATTACK, v == CLEAN)}
    for c in sorted({x for x in v if x.startswith("c_")}):
        both = attack_steps & steps_with(c)
        in_both = np.array([k in both for k in keys])
        pairs[f"e3.{c}"] = ((v == ATTACK) & in_both, (v == c) & in_both)

    out = {}
    for name, (p, n) in pairs.items():
        rows = p | n
        y, fs, ws, cs = p[rows].astype(int), f[rows], w[rows], col[rows]
        reps = np.full(draws.n_boot, np.nan)
        for b in range(draws.n_boot):
            sw = m[b, cs] * ws
            if sw[y == 1].sum() > 0 and sw[y == 0].sum() > 0:
                reps[b] = roc_auc_score(y, fs, sample_weight=sw)
        out[name] = reps

    # E2: within-step AUCs are fixed under the cluster bootstrap; compute each with sklearn once.
    step_auc = {}
    groups: dict = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    for k, idx in groups.items():
        idx = np.asarray(idx)
        vi = v[idx]
        sel = idx[(vi == ATTACK) | (vi == CLEAN)]
        y = (v[sel] == ATTACK).astype(int)
        if 0 < y.sum() < y.size:
            step_auc[k] = roc_auc_score(y, f[sel], sample_weight=w[sel])
    reps = np.full(draws.n_boot, np.nan)
    for b in range(draws.n_boot):
        num = sum(m[b, k[0]] * a for k, a in step_auc.items())
        den = sum(m[b, k[0]] for k in step_auc)
        if den > 0:
            reps[b] = num / den
    out["e2"] = reps
    return out


#: The target: all estimands × 1000 replicates on 5,000 rows in under this many seconds
#: on one core.
TARGET_S = 2.0


def bench_bootstrap(n_rows: int = 5000, n_boot: int = 1000, seed: int = 0) -> dict:
    """The ``bootstrap`` section of ``python -m ipi.tools.bench``: all estimands × ``n_boot``
    replicates, vectorised vs a plain sklearn loop, pinned to one CPU and one BLAS/OpenMP thread.

    The vectorised path is :func:`ipi.metrics.estimands.estimands` (best of three runs, table
    validation, point estimates and intervals included); the loop path calls
    ``sklearn.metrics.roc_auc_score(sample_weight=multiplicity · w)`` once per replicate and
    estimand (E2: per-step AUCs once, then a per-replicate weighted mean). Both use the same
    draws; their replicates are compared.

    Args:
        n_rows: Rows of the synthetic table (:func:`synthetic_score_table`).
        n_boot: Bootstrap replicates.
        seed: Seed of the table and of the draws.

    Returns:
        ``{"bench": "bootstrap", "n_rows", "n_trajectories", "n_boot", "vectorised_s", "loop_s",
        "ratio" (loop_s / vectorised_s), "max_abs_diff" (between the two paths' replicates),
        "single_core", "target_s", "meets_target" (vectorised_s < target_s), "agree"
        (max_abs_diff ≤ 1e-9)}``.
    """
    table = synthetic_score_table(n_rows, seed)
    draws = make_draws(table["trajectory_id"], n_boot=n_boot, seed=seed)
    with _single_core():
        vec_s, res = best_of(lambda: estimands(table, draws=draws), 3)
        loop_s, loop = best_of(lambda: _loop_replicates(table, draws), 1)

    vec = {"e1": res.replicates["e1"], "e2": res.replicates["e2"]}
    vec.update({f"e3.{c}": r for c, r in res.replicates["e3"].items()})
    diff = 0.0
    for k, r in vec.items():
        a, b = np.asarray(r), loop[k]
        if not np.array_equal(np.isnan(a), np.isnan(b)):
            diff = float("inf")
            break
        ok = ~np.isnan(a)
        if ok.any():
            diff = max(diff, float(np.max(np.abs(a[ok] - b[ok]))))
    return {
        "bench": "bootstrap",
        "n_rows": int(len(table)),
        "n_trajectories": int(draws.n_clusters),
        "n_boot": int(n_boot),
        "vectorised_s": float(vec_s),
        "loop_s": float(loop_s),
        "ratio": float(loop_s / vec_s) if vec_s > 0 else float("inf"),
        "max_abs_diff": diff,
        "single_core": True,
        "target_s": TARGET_S,
        "meets_target": bool(vec_s < TARGET_S),
        "agree": bool(diff <= 1e-9),
    }


def bench_permutation(n_train: int = 1000, n_test: int = 600, n_features: int = 107_520, m: int = 199,
                      sklearn_fits: int = 2, seed: int = 0, sequential_fits: int = 5) -> dict:
    """Cost of the exact permutation test's refits vs scikit-learn fits (PROTOCOL.md §7.4).

    Synthetic float32 features at the given width (trajectories of 5 steps, one clean and one
    attack row per step, a trajectory effect and an attack shift). Timed:

    * **ours** — :class:`ipi.probe.dual.ReducedDesign` once, then all ``m`` permuted-label refits
      in one :func:`ipi.probe.dual.fit_reduced_batch` call, and the test rows scored;
    * **sequential refits**: ``sequential_fits`` single refits (:func:`ipi.probe.dual.fit_reduced`),
      scaled to ``m``; their coefficients are compared with the batched ones;
    * **scikit-learn**: ``sklearn_fits`` fits of :func:`ipi.probe.fit.fit_sklearn_reference`,
      scaled to 20; their test AUCs are compared with the refits' (``max_auc_diff`` ≤ 1e-4).

    Returns:
        JSON-ready dict with the shapes, ``ours_s`` (design + batched refits), ``design_s``,
        ``refits_s``, ``sequential_refit_s`` (mean of one) and ``sequential_refits_s`` (× ``m``),
        ``batch_speedup``, ``max_batch_vs_sequential_diff``, ``sklearn_fit_s`` (mean),
        ``sklearn_20_fits_s``, ``ratio`` (ours / 20 scikit-learn fits; ≤ 1 is the
        requirement), ``max_auc_diff``, ``threads`` (CPU cores), ``torch_threads``.
"""
    import torch
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(seed)
    n = n_train + n_test
    steps = 5
    n_traj = n // (2 * steps)
    n = n_traj * 2 * steps
    traj = np.repeat(np.arange(n_traj), 2 * steps)
    step = np.tile(np.repeat(np.arange(steps), 2), n_traj)
    y = np.tile(np.array([0, 1]), n_traj * steps)
    direction = rng.standard_normal(n_features).astype(np.float32)
    direction /= np.linalg.norm(direction)
    x = rng.standard_normal((n, n_features), dtype=np.float32)
    x += 0.5 * rng.standard_normal((n_traj, n_features), dtype=np.float32)[traj]
    x += (3.0 * y)[:, None].astype(np.float32) * direction
    n_train_traj = n_train // (2 * steps)
    tr = traj < n_train_traj
    te = ~tr
    groups = traj[tr] * steps + step[tr]
    perm_rng = np.random.default_rng(seed + 1)
    labels = np.stack([permute_within(groups, y[tr], perm_rng) for _ in range(m)])  # [M, n_train]
    with Stopwatch() as total:
        t_design, design = best_of(lambda: dual.ReducedDesign.build(x[tr], x[te]), 1)
        with Stopwatch() as sw:
            theta = dual.fit_reduced_batch(design.phi, labels, C=1.0)
            scores = theta[:, :-1] @ design.phi_test.T + theta[:, -1:]  # [M, n_test]
    t_refits, ours = sw.wall_s, total.wall_s
    aucs = [roc_auc_score(y[te], s) for s in scores]
    seq_times, seq_diff = [], 0.0
    for j in range(min(sequential_fits, m)):
        t, th = best_of(lambda: dual.fit_reduced(design.phi, labels[j], C=1.0), 1)
        seq_times.append(t)
        seq_diff = max(seq_diff, float(np.abs(th - theta[j]).max()))
    seq = float(np.mean(seq_times)) if seq_times else float("nan")
    sk_times, diffs = [], []
    for j in range(sklearn_fits):
        t, ref = best_of(lambda: fit_sklearn_reference(x[tr], labels[j], l2=1.0), 1)
        sk_times.append(t)
        diffs.append(abs(roc_auc_score(y[te], ref.decision_function(x[te])) - aucs[j]))
    sk = float(np.mean(sk_times))
    return {
        "n_train": int(tr.sum()), "n_test": int(te.sum()), "n_features": int(n_features), "m": int(m),
        "rank": design.rank, "design_s": round(t_design, 2), "refits_s": round(t_refits, 4),
        "ours_s": round(ours, 2), "sequential_refit_s": round(seq, 4),
        "sequential_refits_s": round(m * seq, 4), "batch_speedup": round(m * seq / t_refits, 2),
        "max_batch_vs_sequential_diff": seq_diff,
        "sklearn_fits_timed": int(sklearn_fits), "sklearn_fit_s": round(sk, 4),
        "sklearn_20_fits_s": round(20 * sk, 1), "ratio": round(ours / (20 * sk), 4),
        "max_auc_diff": float(max(diffs)) if diffs else None,
        "null_mean": round(float(np.mean(aucs)), 4), "threads": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
