"""probe.l2=auto (grouped inner CV on training trajectories) and split.repeats (split spread)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import GroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from ipi.evaluation.spread import split_spread
from ipi.detectors.crossfit import cross_fit
from ipi.probe.folds import make_folds, select_l2
from tests.conftest import logistic_detector, compose_train


def _data(seed=0, n_traj=20, d=200):
    rng = np.random.default_rng(seed)
    rows, xs = [], []
    w = np.zeros(d)
    w[0] = 1.0
    for t in range(n_traj):
        for s in range(4):
            for v in ("clean", "attack", "c_scrambled"):
                rows.append({"trajectory_id": f"t{t:02d}", "step": s, "variant": v})
                xs.append(rng.normal(size=d) + (0.8 * w if v == "attack" else 0))
    return pd.DataFrame(rows), np.array(xs)


def test_select_l2_is_the_grouped_inner_cv_argmax():
    meta, x = _data()
    lab = meta.variant.isin(["clean", "attack"]).to_numpy()
    y = (meta.variant[lab] == "attack").to_numpy().astype(int)
    groups = meta.trajectory_id[lab].to_numpy()
    grid = [0.001, 0.1, 10.0]
    best, cv = select_l2(x[lab], y, groups, grid, seed=0)
    # independent recomputation with scikit-learn (same trajectory shuffle)
    uniq = np.unique(groups)
    relabel = {g: i for i, g in enumerate(np.random.default_rng(0).permutation(uniq))}
    g = np.array([relabel[v] for v in groups])
    ref = {}
    for c in grid:
        aucs = []
        for tr, va in GroupKFold(5).split(x[lab], y, g):
            m = make_pipeline(StandardScaler(), LogisticRegression(C=c, class_weight="balanced", max_iter=5000,
                                                                   tol=1e-10)).fit(x[lab][tr], y[tr])
            aucs.append(roc_auc_score(y[va], m.decision_function(x[lab][va])))
        ref[str(c)] = np.mean(aucs)
    for c in grid:
        assert cv[str(c)] == pytest.approx(ref[str(c)], abs=1e-9)
    assert best == max(grid, key=lambda c: ref[str(c)])
    # one signal dimension among 200 noisy ones: strong regularisation wins the inner CV
    assert best < 10.0
    with pytest.raises(ValueError, match="positive"):
        select_l2(x[lab], y, groups, [0.0, 1.0], seed=0)


def test_auto_l2_sees_training_trajectories_only(monkeypatch):
    import ipi.detectors.linear as cf

    meta, x = _data(n_traj=12, d=20)
    folds = make_folds(meta.trajectory_id.unique(), "kfold", k=3, seed=0)
    seen = []
    real = cf.select_l2

    def spy(xx, yy, groups, grid, **kw):
        seen.append(set(groups))
        return real(xx, yy, groups, grid, **kw)

    monkeypatch.setattr(cf, "select_l2", spy)
    fits = cross_fit(logistic_detector(l2_grid=(0.01, 1.0)), meta, x, folds)
    assert len(seen) == 3
    for (train, test), groups, info in zip(folds, seen, fits.per_fold):
        assert groups == set(train) and not groups & set(test)
        assert info["l2"] in (0.01, 1.0) and set(info["l2_inner_cv_auc"]) == {"0.01", "1.0"}


def test_probe_l2_config_values(tmp_path):
    from ipi.run.validation import validate

    validate(compose_train(tmp_path, ["probe.l2=auto"]))
    with pytest.raises(ValueError, match="probe.l2"):
        validate(compose_train(tmp_path, ["probe.l2=-1"]))
    with pytest.raises(ValueError, match="probe.l2"):
        validate(compose_train(tmp_path, ["probe.l2=often"]))
    with pytest.raises(ValueError, match="split.repeats"):
        validate(compose_train(tmp_path, ["split.repeats=0"]))


def _res(e1, claim):
    return {"e1": {"estimate": e1}, "e2": {"estimate": e1 + 0.1}, "e3": {"c_scrambled": {"estimate": e1 - 0.2}},
            "verdict": {"claim": claim}}


def test_split_spread_counts_claims_and_ranges():
    det, sep = "detects malicious content", "separates clean steps from this attack surface on this split"
    sp = split_spread(_res(0.8, det), [_res(0.7, sep), _res(0.9, "none"), _res(0.75, det)], [0, 1, 2, 3])
    assert sp["n_splits"] == 4 and sp["preregistered_seed"] == 0
    assert sp["estimands"]["e1"]["min"] == 0.7 and sp["estimands"]["e1"]["max"] == 0.9
    assert sp["estimands"]["e1"]["median"] == pytest.approx(0.775)
    assert sp["estimands"]["e3.c_scrambled"]["values"] == pytest.approx([0.6, 0.5, 0.7, 0.55])
    assert sp["claims"] == {det: 2, sep: 3}
    with pytest.raises(ValueError):
        split_spread(_res(0.8, det), [], [0, 1])


@pytest.mark.needs_shared
@pytest.mark.slow
def test_split_repeats_end_to_end(tmp_path):
    from ipi.run.tasks import train

    ov = ["data.max_trajectories=6", "split.test_fraction=0.5", "evaluation.n_boot=100", "evaluation.min_clusters=2",
          "evaluation.transfer=false", "split.repeats=3", "probe.l2=auto", "probe.l2_grid=[0.1,1.0]",
          "report.gallery=false", "report.plots=false"]
    results, _ = train(compose_train(tmp_path, ov))
    on_disk = json.loads((tmp_path / "run" / "results.json").read_text())
    sp = on_disk["split_spread"]
    assert sp["seeds"] == [0, 1, 2] and sp["n_splits"] == 3
    assert sp["estimands"]["e1"]["values"][0] == pytest.approx(on_disk["e1"]["estimate"])
    assert sp["claim_by_seed"]["0"] == on_disk["verdict"]["claim"]
    assert on_disk["counts"]["folds"][0]["l2"] in (0.1, 1.0)
    md = (tmp_path / "run" / "report.md").read_text()
    assert "## Split spread (3 splits" in md and md.index("## Verdict") < md.index("## Split spread")
    assert "Split spread" in (tmp_path / "run" / "report.html").read_text()
