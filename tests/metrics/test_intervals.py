"""Interval methods (percentile, BCa) and one-sided bootstrap p-values (docs/estimands.md)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from ipi.metrics import (
    bca_interval,
    estimands,
    expanded_percentile_interval,
    compare_tables,
    percentile_interval,
    plus_one_p,
    step_weights,
)
from tests.metrics.test_estimands import CASES


def _random_table(rng, n_traj=12, max_steps=5):
    rows = []
    for t in range(n_traj):
        for s in range(int(rng.integers(1, max_steps + 1))):
            base = rng.normal(0, 1)
            rows.append((f"t{t:02d}", s, "clean", base + rng.normal(0, 1)))
            rows.append((f"t{t:02d}", s, "attack", base + 0.8 + rng.normal(0, 1)))
            if rng.random() < 0.8:
                rows.append((f"t{t:02d}", s, "c_scrambled", base + 0.5 + rng.normal(0, 1)))
    return pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])


def test_bca_matches_scipy_on_a_skewed_mean():
    """Same formula as scipy.stats.bootstrap(method='BCa') on i.i.d. data: bounds agree to MC error."""
    rng = np.random.default_rng(3)
    x = rng.exponential(1.0, size=40)
    B = 40000
    reps = x[rng.integers(0, x.size, size=(B, x.size))].mean(axis=1)
    jack = (x.sum() - x) / (x.size - 1)
    ours = bca_interval(x.mean(), reps, jack, 0.95)
    ref = stats.bootstrap((x,), np.mean, method="BCa", n_resamples=B, rng=np.random.default_rng(4)).confidence_interval
    se = x.std(ddof=1) / np.sqrt(x.size)
    assert abs(ours.ci_low - ref.low) < 0.05 * se and abs(ours.ci_high - ref.high) < 0.05 * se
    pct = percentile_interval(x.mean(), reps, 0.95)
    assert ours.ci_low > pct.ci_low and ours.ci_high > pct.ci_high  # right skew shifts BCa up


def test_bca_equals_percentile_when_unbiased_and_symmetric():
    reps = np.concatenate([np.linspace(-1, 1, 1001)])
    jack = np.array([-1.0, 0.0, 1.0])  # symmetric: acceleration 0
    b = bca_interval(0.0, reps, jack, 0.9)
    p = percentile_interval(0.0, reps, 0.9)
    assert b.ci_low == pytest.approx(p.ci_low) and b.ci_high == pytest.approx(p.ci_high)


def test_jackknife_values_are_leave_one_trajectory_out_aucs():
    """The vectorised jackknife rows equal E1/E3 recomputed with scikit-learn without each trajectory."""
    rng = np.random.default_rng(0)
    t = _random_table(rng)
    res = estimands(t, n_boot=200, seed=1, interval="bca")
    ids = sorted(t.trajectory_id.unique())
    for k, tid in enumerate(ids):
        sub = t[t.trajectory_id != tid].reset_index(drop=True)
        w = step_weights(sub)
        ac = sub.variant.isin(["attack", "clean"]).to_numpy()
        e1 = roc_auc_score(sub.variant[ac] == "attack", sub.score[ac], sample_weight=w[ac])
        assert res.jackknife["e1"][k] == pytest.approx(e1, abs=1e-12)
    # the bootstrap replicates are those of the percentile run (same draws), only the bounds differ
    pct = estimands(t, n_boot=200, seed=1)
    np.testing.assert_array_equal(pct.replicates["e1"], res.replicates["e1"])
    assert res.e1.estimate == pct.e1.estimate
    assert res.e1.ci_low <= res.e1.estimate <= res.e1.ci_high


def test_p_values_are_one_plus_the_replicates_at_or_below_the_null_over_b_plus_one():
    rng = np.random.default_rng(1)
    t = _random_table(rng, n_traj=10)
    out = compare_tables(t, {"c1": t.assign(score=rng.normal(size=len(t)))}, n_boot=500, seed=2,
                          interval="percentile").to_dict()
    res = estimands(t, n_boot=500, seed=2)
    assert out["p_values"]["e1"] == pytest.approx((1 + np.sum(res.replicates["e1"] <= 0.5)) / 501)
    assert out["p_values"]["e3"]["c_scrambled"] == pytest.approx(
        (1 + np.sum(res.replicates["e3"]["c_scrambled"] <= 0.5)) / 501)
    assert 1 / 501 <= out["p_values"]["e1_minus_c1_e1"] <= 1.0
    # consistency with the percentile CI check: CI low > 0.5 => p below (1 - level)/2 (+ interpolation slack)
    if out["e1"]["ci_low"] > 0.5:
        assert out["p_values"]["e1"] <= 0.025 + 2 / 500
    # never 0: a Holm threshold alpha/N is reachable only with B + 1 >= N/alpha
    reps = np.linspace(0.6, 0.9, 999)
    assert plus_one_p(reps, 0.5) == pytest.approx(1 / 1000)
    assert plus_one_p(np.r_[reps, np.nan], 0.5) == pytest.approx(1 / 1000)  # dropped replicates
    assert plus_one_p(np.full(9, 0.4), 0.5) == 1.0 and plus_one_p([np.nan], 0.5) is None
    assert out["bootstrap"]["interval"] == "percentile"


def test_expanded_interval_is_the_percentile_interval_at_a_wider_tail():
    """Hesterberg (2015): tail Φ(−sqrt(n/(n−1)) t_{n−1, 0.975}); hand-checked for n = 5 and n = 200."""
    from scipy.stats import norm, t as student_t

    reps = np.random.default_rng(9).normal(0.7, 0.05, 4000)
    for n in (5, 200):
        tail = norm.cdf(-np.sqrt(n / (n - 1)) * student_t.ppf(0.975, n - 1))
        iv = expanded_percentile_interval(0.7, reps, n)
        assert (iv.ci_low, iv.ci_high) == pytest.approx(tuple(np.quantile(reps, [tail, 1 - tail])), abs=1e-12)
    wide, narrow = expanded_percentile_interval(0.7, reps, 5), expanded_percentile_interval(0.7, reps, 200)
    assert wide.ci_low < narrow.ci_low < 0.7 - 1.9 * 0.05
    assert expanded_percentile_interval(0.7, reps, 1) == percentile_interval(0.7, reps)  # n < 2: percentile


def test_unknown_interval_is_refused():
    with pytest.raises(ValueError, match="expanded, percentile, bca"):
        estimands(_random_table(np.random.default_rng(0)), n_boot=10, interval="studentised")


@pytest.mark.skipif(not CASES, reason="no protocol cases")
def test_protocol_cases_stay_within_their_tolerance_with_the_default_expanded_interval(tmp_path):
    """evaluate.py's default is the expanded percentile interval; every case bound stays within the
    ±0.03 PROTOCOL.md §9 allows; percentile reproduces the reference stream; bca is opt-in and differs."""
    from ipi.evaluation import evaluate_score_table

    for case in CASES:
        expected = json.loads(case.with_suffix(".expected.json").read_text())
        res = evaluate_score_table(case, n_boot=1000, seed=0)
        assert res["bootstrap"]["interval"] == "expanded"
        flat = {"e1": res["e1"], "e2": res["e2"], **{f"e3.{c}": iv for c, iv in res["e3"].items()}}
        for key, (low, high) in expected["ci"].items():
            assert abs(flat[key]["ci_low"] - low) <= 0.03 and abs(flat[key]["ci_high"] - high) <= 0.03, (case, key)
            assert flat[key]["ci_low"] <= low + 1e-12 and flat[key]["ci_high"] >= high - 1e-12  # wider
    case = CASES[0]
    expected = json.loads(case.with_suffix(".expected.json").read_text())
    res = evaluate_score_table(case, n_boot=1000, seed=0)
    pct = evaluate_score_table(case, n_boot=1000, seed=0, interval="percentile")
    assert pct["e1"]["ci_low"] == pytest.approx(expected["ci"]["e1"][0], abs=1e-9)
    bca = evaluate_score_table(case, n_boot=1000, seed=0, interval="bca")
    assert bca["e1"]["estimate"] == res["e1"]["estimate"]
