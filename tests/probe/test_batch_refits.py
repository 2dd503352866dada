"""Issue 12: the permutation test's M refits of a fold as one batched Newton solve
(:func:`ipi.probe.dual.fit_reduced_batch`) equal the sequential fits (:func:`fit_reduced`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ipi.metrics import compare_tables
from ipi.metrics.permutation import permute_within
from ipi.detectors.crossfit import cross_fit
from ipi.probe.dual import ReducedDesign, fit_reduced, fit_reduced_batch
from ipi.probe.folds import make_folds
from tests.conftest import logistic_detector


def _design(n, d, m_test=40, seed=0, shift=0.7, balanced=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n + m_test, d)).astype(np.float32) * rng.uniform(0.3, 2.0, d).astype(np.float32)
    y = (rng.random(n + m_test) < 0.4).astype(np.int64)
    if balanced:  # one clean and one attack row per step, as the pipeline's training rows
        y = np.tile([0, 1], (n + m_test) // 2 + 1)[: n + m_test]
    x[y == 1, :3] += shift
    return ReducedDesign.build(x[:n], x[n:]), y[:n], rng


# n=120: d=30 primal (direct Hessians), d=400 dual rank n-1 (Woodbury through [n, n]);
# C=50 on the dual design is (nearly) separable: long damped-Newton paths.
# balanced: every problem's first Newton matrix is the same (factored once for the block)
@pytest.mark.parametrize(("n", "d", "C", "balanced"), [(120, 30, 1.0, False), (120, 400, 1.0, False),
                                                       (100, 300, 50.0, False), (90, 60, 0.05, False),
                                                       (120, 30, 1.0, True), (120, 400, 1.0, True)])
def test_batched_refits_equal_sequential(n, d, C, balanced):
    design, y, rng = _design(n, d, seed=n + d, balanced=balanced)
    ys = np.stack([rng.permutation(y) for _ in range(12)] + [y])
    seq = np.stack([fit_reduced(design.phi, v, C=C) for v in ys])
    # a small block_bytes forces several blocks (and blocks of one problem)
    for block_bytes in (64 * 2**20, 1):
        bat = fit_reduced_batch(design.phi, ys, C=C, block_bytes=block_bytes)
        assert bat.shape == (len(ys), design.rank + 1)
        np.testing.assert_allclose(bat, seq, rtol=0, atol=1e-8 * max(1.0, np.abs(seq).max()))
        s_seq = seq[:, :-1] @ design.phi_test.T + seq[:, -1:]
        s_bat = bat[:, :-1] @ design.phi_test.T + bat[:, -1:]
        np.testing.assert_allclose(s_bat, s_seq, rtol=0, atol=1e-8 * max(1.0, np.abs(s_seq).max()))


def test_batched_refits_errors_match_single_fit():
    design, y, _ = _design(60, 200)
    with pytest.raises(ValueError, match="single class"):
        fit_reduced_batch(design.phi, np.stack([y, np.zeros_like(y)]))
    with pytest.raises(ValueError, match=r"y must be \[M, 60\]"):
        fit_reduced_batch(design.phi, y)
    # a problem that does not converge goes to the single-fit path, which raises as it does alone
    with pytest.raises(RuntimeError, match="did not converge"):
        fit_reduced(design.phi, y, C=50.0, max_iter=1)
    with pytest.raises(RuntimeError, match="did not converge"):
        fit_reduced_batch(design.phi, np.stack([y, y[::-1]]), C=50.0, max_iter=1)
    assert fit_reduced_batch(design.phi, np.zeros((0, 60))).shape == (0, design.rank + 1)


def _dataset(n_traj=14, d=50, shift=0.6, seed=5):
    rng = np.random.default_rng(seed)
    rows, xs = [], []
    direction = rng.standard_normal(d)
    for t in range(n_traj):
        u = rng.standard_normal(d) * 0.5
        for s in range(int(rng.integers(3, 6))):
            for v in ("clean", "attack", "c_scrambled"):
                rows.append({"trajectory_id": f"t{t:02d}", "step": s, "variant": v})
                xs.append(u + rng.standard_normal(d) + (shift * direction / np.linalg.norm(direction)
                                                        if v == "attack" else 0.0))
    return pd.DataFrame(rows), np.array(xs, dtype=np.float32)


@pytest.mark.parametrize(("kind", "d"), [("holdout", 50), ("kfold", 200)])
def test_permutation_p_value_unchanged_by_batching(kind, d):
    """cross_fit's null scores equal the sequential refits (the pre-batching procedure, written
    out here), so the null E1 values and the p-value are the same."""
    meta, x = _dataset(d=d)
    folds = make_folds(meta.trajectory_id.unique(), kind, test_fraction=0.4, k=3, seed=2)
    m, seed = 19, 7
    fits = cross_fit(logistic_detector(l2=1.0), meta, x, folds, permutation_m=m, permutation_seed=seed)
    # sequential: per replicate one within-(trajectory, step) permutation of all labelled rows,
    # per fold fit_reduced on the fold's training rows, scores of its labelled test rows
    lab = np.flatnonzero(meta.variant.isin(["clean", "attack"]).to_numpy())
    tid = meta.trajectory_id.to_numpy()
    y_lab = (meta.variant.to_numpy()[lab] == "attack").astype(np.int64)
    groups, _ = pd.factorize(pd.Series(tid[lab]) + "\x00" + meta.step.to_numpy()[lab].astype(str))
    pos = np.full(len(meta), -1)
    pos[fits.test_index] = np.arange(len(fits.test_index))
    designs = []
    for train_ids, test_ids in folds:
        tr = lab[np.isin(tid[lab], list(train_ids))]
        te = lab[np.isin(tid[lab], list(test_ids))]
        designs.append((np.searchsorted(lab, tr), pos[te], ReducedDesign.build(x[tr], x[te])))
    assert any(d_.dual for _, _, d_ in designs) == (d > 50)
    null = np.full((m, len(fits.test_index)), np.nan)
    rng = np.random.default_rng(seed)
    for j in range(m):
        y_perm = permute_within(groups, y_lab, rng)
        for sel, cols, design in designs:
            theta = fit_reduced(design.phi, y_perm[sel], C=1.0)
            null[j, cols] = design.phi_test @ theta[:-1] + theta[-1]
    both = np.isfinite(null)
    assert np.array_equal(both, np.isfinite(fits.null_scores))
    np.testing.assert_allclose(fits.null_scores[both], null[both], rtol=0,
                               atol=1e-8 * max(1.0, np.abs(null[both]).max()))
    table = fits.score_table(meta)
    batched = compare_tables(table, n_boot=50, permutation=fits.permutation_input()).to_dict()["permutation"]
    sequential = compare_tables(table, n_boot=50, permutation={**fits.permutation_input(),
                                                                 "null_scores": null}).to_dict()["permutation"]
    assert batched["null_e1"] == sequential["null_e1"]
    assert batched["p_value"] == sequential["p_value"] and batched["n_ge"] == sequential["n_ge"]
