"""TPR at a fixed FPR with cluster-bootstrap intervals (ipi.metrics.operating_point; issue 25)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_curve

from ipi.metrics.bootstrap import make_draws
from ipi.metrics.operating_point import operating_points
from ipi.metrics.table import step_weights


def tpr_at_fpr(pos, neg, fpr, wp=None, wn=None):
    """The estimate of ``operating_points`` on a table of one row per trajectory."""
    pos, neg = np.asarray(pos, dtype=float), np.asarray(neg, dtype=float)
    t = pd.DataFrame({"trajectory_id": [f"r{i:04d}" for i in range(pos.size + neg.size)], "step": 0,
                      "variant": ["attack"] * pos.size + ["clean"] * neg.size, "score": np.r_[pos, neg]})
    if wp is not None:
        t["weight"] = np.r_[wp, wn]
    return operating_points(t, fpr, n_boot=20, seed=0)["vs"]["clean"]["estimate"]


def sk_tpr_at_fpr(pos, neg, fpr, wp=None, wn=None):
    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    w = None if wp is None else np.r_[wp, wn]
    f, t, _ = roc_curve(y, np.r_[pos, neg], sample_weight=w, drop_intermediate=False)
    return float(t[f <= fpr + 1e-12].max())


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fpr", [0.0, 0.01, 0.05, 0.2])
def test_equals_sklearn_roc_curve_with_ties_and_weights(seed, fpr):
    rng = np.random.default_rng(seed)
    pos = np.round(rng.normal(1.0, 1.0, 80), 1)  # rounded: ties within and across classes
    neg = np.round(rng.normal(0.0, 1.0, 120), 1)
    assert tpr_at_fpr(pos, neg, fpr) == pytest.approx(sk_tpr_at_fpr(pos, neg, fpr))
    wp, wn = rng.uniform(0.2, 2.0, 80), rng.uniform(0.2, 2.0, 120)
    assert tpr_at_fpr(pos, neg, fpr, wp, wn) == pytest.approx(sk_tpr_at_fpr(pos, neg, fpr, wp, wn))


def test_hand_worked_cases():
    # 10 negatives 0..9, positives 5, 9.5, 10, 11: at FPR 0 flag only scores above 9 -> 3 of 4
    neg, pos = np.arange(10.0), np.array([5.0, 9.5, 10.0, 11.0])
    assert tpr_at_fpr(pos, neg, 0.0) == 0.75
    assert tpr_at_fpr(pos, neg, 0.1) == 0.75  # >= 9 flags negative 9 too: FPR 0.1, still 3 of 4
    assert tpr_at_fpr(pos, neg, 0.5) == 1.0  # >= 5: FPR 0.5 (5..9), every positive
    # a positive tied with the top negative is not bought at FPR 0 (>= would flag the negative)
    assert tpr_at_fpr(np.array([9.0]), neg, 0.0) == 0.0
    assert tpr_at_fpr(np.array([9.0]), neg, 0.1) == 1.0
    with pytest.raises(ValueError, match="fpr"):
        tpr_at_fpr(pos, neg, 1.0)


def _table(rng, n_traj=20):
    rows = []
    for i in range(n_traj):
        for s in range(3):
            rows += [(f"t{i}", s, "clean", rng.normal()), (f"t{i}", s, "attack", rng.normal() + 1.5),
                     (f"t{i}", s, "c_scrambled", rng.normal() + 1.0)]
    return pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])


def test_operating_points_and_their_replicates():
    rng = np.random.default_rng(3)
    t = _table(rng)
    out = operating_points(t, 0.05, n_boot=300, seed=1)
    assert out["fpr"] == 0.05 and list(out["vs"]) == ["clean", "c_scrambled"]
    for neg, rec in out["vs"].items():
        a, n = t[t.variant == "attack"], t[t.variant == neg]
        assert rec["estimate"] == pytest.approx(sk_tpr_at_fpr(a.score, n.score, 0.05))
        assert rec["ci_low"] <= rec["estimate"] <= rec["ci_high"] and rec["n_boot_used"] == 300
        assert rec["n_negative_steps"] == 60
    # attack vs the near control is harder than vs clean
    assert out["vs"]["c_scrambled"]["estimate"] < out["vs"]["clean"]["estimate"]
    # replicate b by hand: rows reweighted by their trajectory's draw count, threshold re-chosen
    draws = make_draws(t["trajectory_id"], n_boot=5, seed=2)
    m = draws.multiplicity[4][draws.columns(t["trajectory_id"])] * step_weights(t)
    sel = t.variant.isin(["attack", "clean"]).to_numpy()
    a = (t.variant == "attack").to_numpy()
    want = sk_tpr_at_fpr(t.score[a], t.score[sel & ~a], 0.05, m[a], m[sel & ~a])
    from ipi.metrics.operating_point import _tpr_at_fpr_rows

    got = _tpr_at_fpr_rows(t.score[sel].to_numpy(), a[sel], (m[sel])[None, :], 0.05)[0]
    assert got == pytest.approx(want)
    bca = operating_points(t, 0.05, n_boot=200, seed=1, interval="bca")
    assert bca["vs"]["clean"]["estimate"] == out["vs"]["clean"]["estimate"]


def test_operating_point_is_in_results_and_configurable(tmp_path):
    from ipi.evaluation.assess import ScoreTables, assess
    from ipi.evaluation.results import Settings

    t = _table(np.random.default_rng(0))
    assert "operating_point" not in assess(ScoreTables(t), Settings(n_boot=50)).to_dict()
    res = assess(ScoreTables(t), Settings(n_boot=50, operating_fpr=0.1)).to_dict()
    assert res["operating_point"]["fpr"] == 0.1 and set(res["operating_point"]["vs"]) == {"clean", "c_scrambled"}
