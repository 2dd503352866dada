"""Tests of trajectory splits and the linear probe (PROTOCOL.md §4)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from ipi.probe import (
    LeakageError,
    LinearProbe,
    assert_rows_disjoint,
    assert_trajectory_disjoint,
    fit_probe,
    fit_sklearn_reference,
    grouped_kfold,
    holdout_split,
    score,
)
from tests.conftest import probe_config

IDS = [f"traj-{i:03d}" for i in range(23)]


# --------------------------------------------------------------------------- splits
@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5, 0.9])
def test_holdout_disjoint_covering_sizes(fraction):
    train, test = holdout_split(IDS, test_fraction=fraction, seed=3)
    assert train.isdisjoint(test)
    assert train | test == set(IDS)
    assert len(test) == min(max(round(fraction * len(IDS)), 1), len(IDS) - 1)
    assert_trajectory_disjoint(train, test)


def test_holdout_deterministic_and_seed_dependent():
    rows = [t for t in IDS for _ in range(4)]  # a per-row column with repeats
    a = holdout_split(rows, 0.3, seed=0)
    b = holdout_split(list(reversed(rows)), 0.3, seed=0)  # order of input does not matter
    assert a == b
    assert holdout_split(IDS, 0.3, seed=1) != a
    assert a == holdout_split(IDS, 0.3, seed=0)


def test_holdout_minimum_sizes_and_errors():
    train, test = holdout_split(["a", "b"], test_fraction=0.01, seed=0)
    assert len(train) == 1 and len(test) == 1
    train, test = holdout_split(["a", "b", "c"], test_fraction=0.99, seed=0)
    assert len(train) == 1 and len(test) == 2
    with pytest.raises(ValueError, match="got 1"):
        holdout_split(["a", "a", "a"], 0.5, seed=0)
    with pytest.raises(ValueError, match="got 0"):
        holdout_split([], 0.5, seed=0)
    with pytest.raises(ValueError, match="test_fraction"):
        holdout_split(IDS, test_fraction=1.0, seed=0)


@pytest.mark.parametrize("k", [2, 5, 23])
def test_grouped_kfold_partition(k):
    folds = grouped_kfold(IDS + IDS, k=k, seed=0)
    assert len(folds) == k
    tests = [test for _, test in folds]
    assert set().union(*tests) == set(IDS)
    assert sum(len(t) for t in tests) == len(IDS)  # each id in exactly one test fold
    sizes = [len(t) for t in tests]
    assert max(sizes) - min(sizes) <= 1
    for train, test in folds:
        assert train.isdisjoint(test) and train | test == set(IDS)


def test_grouped_kfold_deterministic_and_seed_dependent():
    assert grouped_kfold(IDS, 5, seed=0) == grouped_kfold(list(reversed(IDS)), 5, seed=0)
    assert grouped_kfold(IDS, 5, seed=0) != grouped_kfold(IDS, 5, seed=1)
    with pytest.raises(ValueError):
        grouped_kfold(IDS, k=1, seed=0)
    with pytest.raises(ValueError, match="24"):
        grouped_kfold(IDS, k=24, seed=0)


def test_leakage_error_names_planted_trajectory():
    train, test = holdout_split(IDS, 0.3, seed=0)
    planted = sorted(test)[0]
    with pytest.raises(LeakageError, match=planted):
        assert_trajectory_disjoint(train | {planted}, test)
    with pytest.raises(AssertionError):  # LeakageError is an AssertionError
        assert_trajectory_disjoint(train | {planted}, test)
    train_rows = [t for t in sorted(train) for _ in range(3)] + [planted]
    test_rows = [t for t in sorted(test) for _ in range(3)]
    with pytest.raises(LeakageError, match=planted):
        assert_rows_disjoint(train_rows, test_rows)
    assert_rows_disjoint([t for t in sorted(train)], test_rows)  # no leak: no error


def test_leakage_error_lists_at_most_five():
    shared = [f"s{i}" for i in range(8)]
    with pytest.raises(LeakageError) as info:
        assert_trajectory_disjoint(shared + ["a"], shared + ["b"])
    msg = str(info.value)
    assert "8 trajectory id(s)" in msg and "3 more" in msg
    assert sum(f"'s{i}'" in msg for i in range(8)) == 5


# --------------------------------------------------------------------------- probe
def grouped_data(seed: int = 0, n_traj: int = 40, steps: int = 6, d: int = 200):
    """Synthetic grouped rows: per-trajectory offset + weak signal direction + noise.

    About 30% positives; a few features are on very different scales / offsets so that
    standardisation matters.
    """
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=d)
    direction /= np.linalg.norm(direction)
    xs, ys, ts = [], [], []
    for i in range(n_traj):
        offset = rng.normal(size=d)
        for _ in range(steps):
            y = int(rng.random() < 0.3)
            xs.append(offset + rng.normal(size=d) + 1.5 * y * direction)
            ys.append(y)
            ts.append(f"traj-{i:02d}")
    x = np.asarray(xs, dtype=np.float32)
    x[:, :5] *= 50.0
    x[:, 5:10] += 100.0
    return x, np.asarray(ys), np.asarray(ts)


@pytest.fixture(scope="module")
def split_data():
    x, y, t = grouped_data()
    train, test = holdout_split(t, 0.3, seed=0)
    tr = np.isin(t, sorted(train))
    assert_rows_disjoint(t[tr], t[~tr])
    return x[tr], y[tr], x[~tr], y[~tr]


@pytest.mark.parametrize("l2", [1.0, 0.01])
def test_probe_agrees_with_sklearn(split_data, l2):
    x_tr, y_tr, x_te, y_te = split_data
    probe = fit_probe(x_tr, y_tr, probe_config(l2=l2))
    ref = fit_sklearn_reference(x_tr, y_tr, l2)
    s_probe, s_ref = score(probe, x_te), ref.decision_function(x_te)
    auc_probe, auc_ref = roc_auc_score(y_te, s_probe), roc_auc_score(y_te, s_ref)
    print(f"l2={l2}: AUC probe={auc_probe:.6f} sklearn={auc_ref:.6f} "
          f"diff={auc_probe - auc_ref:+.2e}")
    assert abs(auc_probe - auc_ref) < 0.01
    assert auc_ref > 0.55  # the synthetic signal is weak but present
    assert np.corrcoef(probe.coef_, ref[-1].coef_[0])[0, 1] > 0.99
    assert np.corrcoef(s_probe, s_ref)[0, 1] > 0.99
    # Same objective, same minimiser: the scores agree closely, not just in rank.
    assert np.max(np.abs(s_probe - s_ref)) < 1e-3 * max(1.0, np.max(np.abs(s_ref)))
    assert probe.intercept_ == pytest.approx(ref[-1].intercept_[0], abs=1e-3)
    # Standardisation used the train rows only (as StandardScaler did).
    np.testing.assert_allclose(probe.mean.numpy(), ref[0].mean_, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(probe.std.numpy(), ref[0].scale_, rtol=1e-10)


def test_forward_predict_step_and_score_agree(split_data):
    x_tr, y_tr, x_te, _ = split_data
    probe = fit_probe(x_tr, y_tr, probe_config(l2=0.1))
    xt = torch.from_numpy(x_te)
    via_forward = probe(xt).detach().numpy()
    via_predict = probe.predict_step((xt,), 0).detach().numpy()
    standardised = (x_te.astype(np.float64) - probe.mean.numpy()) / probe.std.numpy()
    explicit = standardised @ probe.coef_ + probe.intercept_
    s = score(probe, x_te, chunk_rows=7)
    assert s.dtype == np.float64 and s.shape == (x_te.shape[0],)
    np.testing.assert_allclose(s, via_forward, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(s, via_predict, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(s, explicit, rtol=1e-9, atol=1e-9)
    # float16 input accepted
    assert score(probe, x_te.astype(np.float16)).shape == s.shape


def test_hparams_are_scalars_only(split_data):
    x_tr, y_tr, _, _ = split_data
    probe = fit_probe(x_tr, y_tr, probe_config(l2=0.5, max_iter=300))
    hp = dict(probe.hparams)
    assert hp["n_features"] == x_tr.shape[1] and hp["l2"] == 0.5 and hp["max_iter"] == 300
    assert all(isinstance(v, (int, float, bool, str)) for v in hp.values())
    restored = LinearProbe(**hp)
    restored.load_state_dict(probe.state_dict())
    np.testing.assert_array_equal(score(restored, x_tr), score(probe, x_tr))


def test_logged_auroc_equals_sklearn(split_data, tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    x_tr, y_tr, x_te, y_te = split_data
    logger = CSVLogger(save_dir=str(tmp_path), name="probe", version=0)
    probe = fit_probe(x_tr, y_tr, probe_config(l2=0.01), logger=logger, x_val=x_te, y_val=y_te)
    train_auc = roc_auc_score(y_tr, score(probe, x_tr))
    val_auc = roc_auc_score(y_te, score(probe, x_te))
    assert train_auc < 1.0  # strong regularisation: not a trivially perfect fit
    assert probe.fit_metrics["train/auroc"] == pytest.approx(train_auc, abs=1e-12)
    assert probe.fit_metrics["val/auroc"] == pytest.approx(val_auc, abs=1e-12)
    rows = list(csv.DictReader(open(Path(logger.log_dir) / "metrics.csv")))
    logged = [float(r["train/auroc"]) for r in rows if r.get("train/auroc")]
    assert logged and logged[-1] == pytest.approx(train_auc, abs=1e-12)
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert losses and math.isfinite(losses[-1])
    assert probe.fit_metrics["newton/n_iter"] >= 1
    assert probe.fit_metrics["train/grad_max"] < 1e-8


def test_determinism_same_seed_identical_scores(split_data):
    x_tr, y_tr, x_te, _ = split_data
    cfg = probe_config(l2=1.0, seed=7)
    a = score(fit_probe(x_tr, y_tr, cfg), x_te)
    b = score(fit_probe(x_tr, y_tr, cfg), x_te)
    np.testing.assert_array_equal(a, b)


def test_errors_single_class_and_nonfinite(split_data):
    x_tr, y_tr, _, _ = split_data
    with pytest.raises(ValueError, match="single class"):
        fit_probe(x_tr, np.zeros_like(y_tr), probe_config())
    with pytest.raises(ValueError, match="single class"):
        fit_sklearn_reference(x_tr, np.ones_like(y_tr))
    bad = x_tr.copy()
    bad[3, 0] = np.nan
    bad[10, 5] = np.inf
    with pytest.raises(ValueError, match=r"NaN/inf values in 2 of"):
        fit_probe(bad, y_tr, probe_config())
    with pytest.raises(ValueError, match=r"NaN/inf"):
        fit_sklearn_reference(bad, y_tr)
    probe = fit_probe(x_tr, y_tr, probe_config(l2=0.01))
    with pytest.raises(ValueError, match=r"NaN/inf values in 2 of"):
        score(probe, bad)
    with pytest.raises(ValueError, match="0 and 1"):
        fit_probe(x_tr, y_tr * 2, probe_config())
    with pytest.raises(ValueError, match="rows"):
        fit_probe(x_tr, y_tr[:-1], probe_config())
    with pytest.raises(ValueError, match="features"):
        score(probe, x_tr[:, :-1])


def test_constant_feature_handled_like_standard_scaler(split_data):
    x_tr, y_tr, x_te, _ = split_data
    x_tr = x_tr.copy()
    x_te = x_te.copy()
    x_tr[:, 0] = 3.0
    x_te[:, 0] = 4.0
    probe = fit_probe(x_tr, y_tr, probe_config(l2=0.1))
    ref = fit_sklearn_reference(x_tr, y_tr, 0.1)
    assert probe.std[0].item() == 1.0 == ref[0].scale_[0]
    np.testing.assert_allclose(score(probe, x_te), ref.decision_function(x_te), atol=1e-4)


@pytest.mark.parametrize("width", [200, 12])  # d > n: Gram (dual) route; d <= n: primal Newton
def test_newton_and_lbfgs_reach_the_same_minimiser(split_data, width):
    """Both solvers of the module minimise the same strictly convex objective: same scores as
    each other and as scikit-learn (far tighter than the protocol's AUC-within-0.01)."""
    x_tr, y_tr, x_te, y_te = split_data
    x_tr, x_te = x_tr[:, :width], x_te[:, :width]
    newton = fit_probe(x_tr, y_tr, probe_config(l2=0.5, solver="newton"))
    lbfgs = fit_probe(x_tr, y_tr, probe_config(l2=0.5, solver="lbfgs"))
    ref = fit_sklearn_reference(x_tr, y_tr, 0.5)
    s_n, s_l, s_r = score(newton, x_te), score(lbfgs, x_te), ref.decision_function(x_te)
    scale = max(1.0, np.max(np.abs(s_r)))
    assert np.max(np.abs(s_n - s_r)) < 1e-5 * scale
    assert np.max(np.abs(s_n - s_l)) < 1e-4 * scale
    assert roc_auc_score(y_te, s_n) == pytest.approx(roc_auc_score(y_te, s_r), abs=1e-9)
    assert newton.fit_metrics["train/grad_max"] < 1e-8 and "lbfgs/n_iter" in lbfgs.fit_metrics
    assert 1 <= newton.fit_metrics["newton/n_iter"] <= 30
    with pytest.raises(ValueError, match="solver"):
        LinearProbe(n_features=3, solver="adam")
