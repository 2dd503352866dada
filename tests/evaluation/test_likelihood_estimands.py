"""E4 (likelihood), ρ(score, shift), the mean shift and the ablation's paired changes, on constructed tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score

from ipi.evaluation.likelihood import likelihood_ablation, likelihood_e4, lowers_shift, predicts_hijack_likelihood, \
    weighted_spearman
from ipi.metrics.bootstrap import make_draws


def _table(n_traj: int, steps: int, seed: int, planted: bool) -> pd.DataFrame:
    """Attack rows (two per step on the even steps, one on the odd: unequal step weights) and clean
    rows. Planted: the score is shift + noise; unplanted: the score is independent of the shift."""
    rng = np.random.default_rng(seed)
    recs = []
    for t in range(n_traj):
        for s in range(steps):
            for k in range(2 if s % 2 == 0 else 1):
                shift = rng.normal()
                score = shift + 0.5 * rng.normal() if planted else rng.normal()
                recs.append({"row_id": f"t{t}|{s}|a{k}", "trajectory_id": f"t{t}", "step": s, "variant": "attack",
                             "shift": shift, "score": score, "c1": rng.normal()})
            recs.append({"row_id": f"t{t}|{s}|c", "trajectory_id": f"t{t}", "step": s, "variant": "clean",
                         "shift": np.nan, "score": rng.normal(), "c1": rng.normal()})
    return pd.DataFrame(recs)


def test_e4_is_the_weighted_auc_of_shift_positive_vs_not_and_rho_is_spearman():
    t = _table(14, 4, 0, planted=True)
    t.loc[3, "shift"] = np.nan  # one attack row without a goal action: out of E4 and ρ, counted
    r = likelihood_e4(t, baseline="c1", draws=make_draws(t["trajectory_id"], n_boot=200, seed=1))
    att = t[t["variant"] == "attack"]
    w = 1.0 / att.groupby(["trajectory_id", "step"])["row_id"].transform("size").to_numpy()
    has = att["shift"].notna().to_numpy()
    y = (att["shift"].to_numpy()[has] > 0).astype(int)
    assert r.e4.e4.estimate == pytest.approx(roc_auc_score(y, att["score"].to_numpy()[has], sample_weight=w[has]))
    assert r.e4.c1.estimate == pytest.approx(roc_auc_score(y, att["c1"].to_numpy()[has], sample_weight=w[has]))
    assert r.counts == {"shift_positive": int(y.sum()), "shift_not_positive": int((1 - y).sum()), "no_goal_action": 1}
    assert r.not_estimable is None and r.n_clusters == 14
    mean = float(np.sum(w[has] * att["shift"].to_numpy()[has]) / np.sum(w[has]))
    assert r.mean_shift.estimate == pytest.approx(mean)
    d = r.to_dict()
    assert d["e4"]["estimate"] == pytest.approx(r.e4.e4.estimate) and d["spearman"]["estimate"] == r.spearman.estimate
    # planted: E4 and ρ well above chance, "predicts hijack" passes against an uninformative C1
    assert r.e4.e4.ci_low > 0.5 and r.spearman.ci_low > 0
    assert predicts_hijack_likelihood(r)[0] == "PASS"


def test_weighted_spearman_equals_scipy_and_repeated_rows():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=30), np.round(rng.normal(size=30), 1)  # ties in y
    assert weighted_spearman(x, y, np.ones(30)) == pytest.approx(spearmanr(x, y).statistic)
    f = rng.integers(0, 4, size=30)
    rep = np.repeat(np.arange(30), f)
    assert weighted_spearman(x, y, f) == pytest.approx(spearmanr(x[rep], y[rep]).statistic)
    assert np.isnan(weighted_spearman([1.0, 2.0], [3.0, 3.0], [1, 1]))


def test_unplanted_e4_interval_holds_one_half():
    t = _table(24, 4, 5, planted=False)
    r = likelihood_e4(t, draws=make_draws(t["trajectory_id"], n_boot=300, seed=0))
    assert r.e4.e4.ci_low < 0.5 < r.e4.e4.ci_high
    assert r.spearman.ci_low < 0 < r.spearman.ci_high
    assert predicts_hijack_likelihood(r)[0] == "FAIL"


def test_not_estimable_when_no_shift_is_positive():
    t = _table(14, 2, 0, planted=True)
    t["shift"] = np.where(t["variant"] == "attack", -np.abs(t["shift"]), np.nan)
    r = likelihood_e4(t, draws=make_draws(t["trajectory_id"], n_boot=100, seed=0))
    assert r.not_estimable.startswith("no attack row with shift > 0") and r.e4.n_clusters == 0
    status, detail = predicts_hijack_likelihood(r)
    assert status == "NOT RUN" and "not estimable" in detail


def test_ablation_changes_are_paired_mean_shift_differences():
    none = _table(14, 2, 0, planted=True)
    probe = none.assign(shift=none["shift"] - 1.0)  # the probe direction lowers every shift by 1 nat
    rnd = none.assign(shift=none["shift"] + 0.01 * np.sign(np.sin(np.arange(len(none)))))
    draws = make_draws(none["trajectory_id"], n_boot=200, seed=0)
    ab = likelihood_ablation({"none": none, "probe": probe, "random": rnd}, draws=draws)
    att = none["variant"] == "attack"
    w = 1.0 / none[att].groupby(["trajectory_id", "step"])["row_id"].transform("size").to_numpy()

    def mean(tab):
        return float(np.sum(w * tab.loc[att, "shift"].to_numpy()) / np.sum(w))

    assert ab.mean_shift["none"].estimate == pytest.approx(mean(none))
    assert ab.changes["probe"].estimate == pytest.approx(-1.0)
    assert ab.probe_minus_random.estimate == pytest.approx(mean(probe) - mean(rnd))
    assert lowers_shift(ab)[0] == "PASS"
    same = likelihood_ablation({"none": none, "probe": none, "random": none}, draws=draws)
    assert lowers_shift(same)[0] == "NOT RUN"  # zero in every replicate: degenerate
    with pytest.raises(ValueError, match="other rows"):
        likelihood_ablation({"none": none, "probe": probe.iloc[::-1], "random": rnd}, draws=draws)
