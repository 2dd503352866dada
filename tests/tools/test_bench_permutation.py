"""``python -m ipi.tools.bench --only permutation`` times the batched refits train.py runs."""

from __future__ import annotations

import numpy as np


def test_bench_permutation_times_the_batched_refits_and_agrees_with_sequential_and_sklearn(monkeypatch):
    from ipi.tools.bootstrap_timing import bench_permutation
    from ipi.probe import dual

    batch_calls = []
    real = dual.fit_reduced_batch

    def counting(phi, y, **k):
        batch_calls.append(np.asarray(y).shape)
        return real(phi, y, **k)

    monkeypatch.setattr(dual, "fit_reduced_batch", counting)
    out = bench_permutation(n_train=60, n_test=40, n_features=300, m=9, sklearn_fits=1, sequential_fits=2)
    assert batch_calls == [(9, 60)]  # all M refits in one batched call, as cross_fit runs them
    assert out["m"] == 9 and out["n_train"] == 60 and out["rank"] <= 60
    assert out["max_batch_vs_sequential_diff"] < 1e-8
    assert out["max_auc_diff"] <= 1e-4
    assert out["refits_s"] > 0 and out["sequential_refits_s"] > 0 and out["sklearn_fit_s"] > 0
