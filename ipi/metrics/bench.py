"""Timing of the vectorised cluster bootstrap against a plain scikit-learn loop (PROTOCOL.md §5).

Called by the benchmark CLI; not a unit test. Both paths compute every estimand of
:func:`ipi.metrics.estimands.estimands` (E1, E2, E3 for three controls) for ``n_boot`` replicates
on the same synthetic score table and the same draws, and must agree.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import numpy as np
import pandas as pd

from ipi.metrics.estimands import (
    ATTACK,
    CLEAN,
    estimands,
    make_draws,
    step_weights,
    validate_table,
)

__all__ = ["bench_bootstrap", "bootstrap_benchmark", "synthetic_score_table"]

_VARIANTS = (CLEAN, ATTACK, "c_scrambled", "c_imperative", "c_occlusion")


def synthetic_score_table(n_rows: int = 5000, seed: int = 0, steps_per_trajectory: int = 10):
    """A synthetic score table of about ``n_rows`` rows (PROTOCOL.md §5 layout).

    Trajectories of ``steps_per_trajectory`` steps, each step with one clean, one attack and three
    control rows (five variants); scores are Gaussian, attack shifted by +1, rounded to 2
    decimals so that ties occur.

    Args:
        n_rows: Target number of rows (rounded down to whole trajectories, at least one).
        seed: Seed of the score generator.
        steps_per_trajectory: Steps per trajectory.

    Returns:
        DataFrame with ``trajectory_id, step, variant, score``.
    """
    per_traj = steps_per_trajectory * len(_VARIANTS)
    n_traj = max(1, n_rows // per_traj)
    rng = np.random.default_rng(seed)
    tid = np.repeat([f"traj-{t:05d}" for t in range(n_traj)], per_traj)
    step = np.tile(np.repeat(np.arange(steps_per_trajectory), len(_VARIANTS)), n_traj)
    variant = np.tile(np.array(_VARIANTS, dtype=object), n_traj * steps_per_trajectory)
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


def bootstrap_benchmark(
    n_rows: int = 5000, n_boot: int = 1000, seed: int = 0, *, single_core: bool = True
) -> dict:
    """Time all estimands × ``n_boot`` replicates: vectorised vs a plain sklearn loop.

    The vectorised path is :func:`ipi.metrics.estimands.estimands` (best of three runs, table
    validation, point estimates and intervals included); the loop path calls
    ``sklearn.metrics.roc_auc_score(sample_weight=multiplicity · w)`` once per replicate and
    estimand (E2: per-step AUCs once, then a per-replicate weighted mean). Both use the same
    draws; their replicates are compared.

    Args:
        n_rows: Rows of the synthetic table (:func:`synthetic_score_table`).
        n_boot: Bootstrap replicates.
        seed: Seed of the table and of the draws.
        single_core: Pin to one CPU and one BLAS/OpenMP thread while timing.

    Returns:
        ``{"n_rows", "n_trajectories", "n_boot", "vectorised_s", "loop_s", "ratio"
        (loop_s / vectorised_s), "max_abs_diff" (between the two paths' replicates),
        "single_core"}``.
    """
    table = synthetic_score_table(n_rows, seed)
    draws = make_draws(table["trajectory_id"], n_boot=n_boot, seed=seed)
    with _single_core() if single_core else _nullcontext():
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            res = estimands(table, draws=draws)
            times.append(time.perf_counter() - t0)
        vec_s = min(times)
        t0 = time.perf_counter()
        loop = _loop_replicates(table, draws)
        loop_s = time.perf_counter() - t0

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
        "n_rows": int(len(table)),
        "n_trajectories": int(draws.n_clusters),
        "n_boot": int(n_boot),
        "vectorised_s": float(vec_s),
        "loop_s": float(loop_s),
        "ratio": float(loop_s / vec_s) if vec_s > 0 else float("inf"),
        "max_abs_diff": diff,
        "single_core": bool(single_core),
    }


@contextmanager
def _nullcontext():
    yield


#: The issue's target: all estimands × 1000 replicates on 5,000 rows in under this many seconds
#: on one core.
TARGET_S = 2.0


def bench_bootstrap(n_rows: int = 5000, n_boot: int = 1000, seed: int = 0) -> dict:
    """The ``bootstrap`` section of ``python -m ipi.bench``: one JSON-ready record.

    Runs :func:`bootstrap_benchmark` pinned to one core and adds ``"bench": "bootstrap"``, the
    target (``target_s`` = 2 s for the vectorised path) and whether it was met
    (``meets_target``), and whether both paths' replicates agree (``agree``: max abs difference
    ≤ 1e-9).

    Args:
        n_rows: Rows of the synthetic score table.
        n_boot: Bootstrap replicates.
        seed: Seed of the table and the draws.

    Returns:
        The record (see :func:`bootstrap_benchmark`) plus ``bench``, ``target_s``,
        ``meets_target``, ``agree``.
    """
    res = bootstrap_benchmark(n_rows=n_rows, n_boot=n_boot, seed=seed, single_core=True)
    return {
        "bench": "bootstrap",
        **res,
        "target_s": TARGET_S,
        "meets_target": bool(res["vectorised_s"] < TARGET_S),
        "agree": bool(res["max_abs_diff"] <= 1e-9),
    }
