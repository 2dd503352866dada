"""Cross-fitting the logistic probe (:func:`ipi.detectors.crossfit.cross_fit`), K-fold out-of-fold scores,
leakage, and the transfer probe (PROTOCOL.md §4, §6)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from ipi.probe import LeakageError, fit_probe
from ipi.detectors.crossfit import cross_fit
from ipi.probe.folds import FoldedProbe, TransferSource, check_folds, make_folds
from ipi.probe.fit import score
from tests.conftest import logistic_detector, probe_config

SURFACE_CODE = {"i_vis": 0.0, "i_dom": 1.0, "i_tool": 2.0}


def _rows(n_traj=12, steps=4, surface="i_vis", variants=("clean", "attack", "c_scrambled"), seed=0):
    """Rows whose features 0 and 1 encode the surface and the trajectory (for provenance checks)."""
    rng = np.random.default_rng(seed)
    recs, xs = [], []
    for t in range(n_traj):
        for s in range(steps):
            for v in variants:
                recs.append({"trajectory_id": f"t{t:02d}", "step": s, "variant": v, "surface": surface})
                signal = 1.5 if v == "attack" else 0.8 if v.startswith("c_") else 0.0
                xs.append(np.r_[SURFACE_CODE[surface], t, signal + rng.normal(size=6)])
    return pd.DataFrame(recs), np.asarray(xs)


class Recorder:
    """Wraps fit_probe and records the feature rows of every fit."""

    def __init__(self):
        self.calls = []

    def __call__(self, x, y, cfg=None, **kw):
        self.calls.append((np.asarray(x).copy(), np.asarray(y).copy()))
        return fit_probe(x, y, cfg, **kw)


def test_kfold_scores_every_trajectory_exactly_once_out_of_fold():
    meta, x = _rows(n_traj=10)
    md = np.c_[meta.step, meta.step + 3, 100 + meta.step, np.zeros(len(meta))].astype(float)
    folds = make_folds(meta.trajectory_id, "kfold", k=3, seed=1)
    rec = Recorder()
    fits = cross_fit(logistic_detector(fit_fn=rec), meta, x, folds, metadata=md, collapse=x[:, 2:4], permuted=True)
    # Every row is scored exactly once, by the fold whose test set holds its trajectory.
    assert np.array_equal(fits.test_index, np.arange(len(meta)))
    test_of = {t: k for k, (_, te) in enumerate(folds) for t in te}
    assert [test_of[t] for t in meta.trajectory_id] == fits.fold_of_row.tolist()
    assert sorted(t for _, te in folds for t in te) == sorted(meta.trajectory_id.unique())
    # Each fold's probe (call 2k; 2k+1 is the permuted probe) saw only the other folds'
    # trajectories (feature 1 encodes the trajectory) and only clean/attack rows.
    for k, (train_ids, test_ids) in enumerate(folds):
        seen = {f"t{int(t):02d}" for t in rec.calls[2 * k][0][:, 1]}
        assert seen == set(train_ids) and not seen & set(test_ids)
        assert len(rec.calls[2 * k][0]) == 2 * 4 * len(train_ids)
    # Out-of-fold probe scores equal scoring each row with its own fold's probe.
    oof = fits.test_scores
    probes = [d.probe_ for d in fits.fitted]
    for k, probe in enumerate(probes):
        sel = fits.fold_of_row == k
        assert np.allclose(oof[sel], score(probe, x[sel]), atol=0, rtol=0)
    # FoldedProbe (the module train.py predicts with) gives the same scores.
    import torch

    folded = FoldedProbe(probes)
    with torch.no_grad():
        got = folded(torch.from_numpy(x), torch.from_numpy(fits.fold_of_row)).numpy()
    assert np.allclose(got, oof, rtol=0, atol=1e-12)
    # Baselines are refitted per fold and cover every row.
    for name in ("c1", "collapse_only", "permuted"):
        assert len(fits.baselines[name]) == len(meta)
    c1 = fits.baselines["c1"]
    # C1 of fold 0 recomputed with scikit-learn on that fold's training rows.
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    train0, test0 = folds[0]
    fit_rows = meta.trajectory_id.isin(train0) & meta.variant.isin(["clean", "attack"])
    ref = make_pipeline(StandardScaler(), LogisticRegression(class_weight="balanced", max_iter=5000, tol=1e-10))
    ref.fit(md[fit_rows], (meta.variant[fit_rows] == "attack").astype(int))
    te0 = meta.trajectory_id.isin(test0).to_numpy()
    assert np.allclose(c1.score[te0], ref.decision_function(md[te0]), atol=1e-6)


def test_planted_leak_raises():
    meta, x = _rows(n_traj=6)
    folds = make_folds(meta.trajectory_id, "kfold", k=3, seed=0)
    # A trajectory of fold 1's test set planted into fold 0's training set.
    leaked = next(iter(folds[0][1]))
    bad = [(folds[0][0] | {leaked}, folds[0][1])] + folds[1:]
    with pytest.raises(LeakageError, match=leaked):
        cross_fit(logistic_detector(), meta, x, bad)
    # A trajectory in two test folds.
    t = next(iter(folds[1][1]))
    bad2 = [(folds[0][0] - {t}, folds[0][1] | {t})] + folds[1:]
    with pytest.raises(LeakageError, match="test sets of folds"):
        check_folds(bad2, meta.trajectory_id, "kfold")
    # A trajectory in no test fold.
    with pytest.raises(ValueError, match="no test fold"):
        check_folds(folds[:2], meta.trajectory_id, "kfold")


def test_transfer_trains_on_other_surfaces_train_rows_and_scores_run_surface_test_rows():
    vis, x_vis = _rows(n_traj=10, surface="i_vis", variants=("clean", "attack", "c_scrambled", "c_occlusion"))
    parts = [_rows(n_traj=10, surface=s, variants=("clean", "attack"), seed=i + 1) for i, s in enumerate(("i_dom", "i_tool"))]
    src = TransferSource.from_rows(pd.concat([p[0] for p in parts], ignore_index=True),
                                   np.concatenate([p[1] for p in parts]))
    folds = make_folds(vis.trajectory_id, "holdout", test_fraction=0.3, seed=3)
    train_ids, test_ids = folds[0]
    rec = Recorder()
    fits = cross_fit(logistic_detector(fit_fn=rec), vis, x_vis, folds, transfer=src)
    probe_x, _ = rec.calls[0]
    transfer_x, transfer_y = rec.calls[1]
    # The probe trains on i_vis rows of training trajectories; the transfer probe only on
    # i_dom/i_tool clean/attack rows of training trajectories.
    assert set(probe_x[:, 0]) == {SURFACE_CODE["i_vis"]}
    assert set(transfer_x[:, 0]) == {SURFACE_CODE["i_dom"], SURFACE_CODE["i_tool"]}
    assert {f"t{int(t):02d}" for t in transfer_x[:, 1]} == train_ids
    assert len(transfer_x) == 2 * 2 * 4 * len(train_ids) and set(transfer_y) == {0, 1}
    # Its score table: exactly the clean/attack i_vis rows of the test trajectories, scored by it.
    tab = fits.baselines["transfer"]
    want = vis[vis.trajectory_id.isin(test_ids) & vis.variant.isin(["clean", "attack"])]
    assert tab[["trajectory_id", "step", "variant"]].values.tolist() == \
        want[["trajectory_id", "step", "variant"]].values.tolist()
    ref = fit_probe(transfer_x, transfer_y, probe_config())
    assert np.allclose(tab.score, score(ref, x_vis[want.index]), atol=1e-9)
    # Its E1 through compare_tables equals sklearn's AUC on those rows.
    from ipi.metrics import compare_tables

    main = fits.score_table(vis)
    res = compare_tables(main, fits.baselines, n_boot=50, seed=0).to_dict()
    assert res["transfer"]["e1"]["estimate"] == pytest.approx(
        roc_auc_score((tab.variant == "attack").astype(int), tab.score), abs=1e-12)
    assert "e1_minus_transfer_e1" in res["differences"]


def test_transfer_source_surfaces():
    from ipi.protocol import transfer_source_surfaces

    assert transfer_source_surfaces("i_vis", True) == ["i_dom", "i_tool"]
    assert transfer_source_surfaces("i_dom", True) == ["i_vis", "i_tool"]
    assert transfer_source_surfaces("i_dom", False) == ["i_tool"]


def test_holdout_permuted_matches_previous_seeding():
    """The holdout permuted-label probe uses default_rng(seed).permutation of the training labels."""
    meta, x = _rows(n_traj=8)
    folds = make_folds(meta.trajectory_id, "holdout", test_fraction=0.25, seed=0)
    rec = Recorder()
    fits = cross_fit(logistic_detector(fit_fn=rec), meta, x, folds, permuted=True, permute_seed=7)
    y = rec.calls[0][1]
    assert np.array_equal(rec.calls[1][1], np.random.default_rng(7).permutation(y))
    tr = meta.trajectory_id.isin(folds[0][0]) & meta.variant.isin(["clean", "attack"])
    ref = fit_probe(x[tr], np.random.default_rng(7).permutation(y), probe_config())
    te = meta.trajectory_id.isin(folds[0][1]).to_numpy()
    assert np.allclose(fits.baselines["permuted"].score, score(ref, x[te]), atol=1e-12)
