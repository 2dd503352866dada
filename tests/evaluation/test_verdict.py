"""Issue 10, core half: per-estimand cluster gate, exact permutation test with cheap dual refits,
check 5 with its interval, C1's E3 per control (PROTOCOL.md §7)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from ipi.evaluation.verdict import (
    CHECKS,
    CLAIM_DETECTS,
    CLAIM_SEPARATES,
    FAIL,
    INCONCLUSIVE,
    NOT_RUN,
    PASS,
)
from ipi.evaluation.reportable import cluster_count, reportability
from ipi.metrics.auc import weighted_auc
from ipi.metrics import estimands, compare_tables
from ipi.metrics.permutation import null_tolerance, permutation_summary, permute_within
from ipi.detectors.crossfit import cross_fit
from ipi.probe.folds import make_folds
from ipi.probe.dual import ReducedDesign, fit_reduced
from ipi.probe.fit import fit_probe, fit_sklearn_reference, score
from tests.conftest import probe_config, logistic_detector, REPO, check_of, run_verdict

# ---------------------------------------------------------------------------------------------
# Cheap refits equal scikit-learn's (item 3)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "d"), [(150, 12), (150, 600)])  # primal (d <= n) and dual routes
@pytest.mark.parametrize("C", [1.0, 0.05])
def test_reduced_refit_equals_sklearn(n, d, C):
    rng = np.random.default_rng(n + d)
    x = rng.standard_normal((n + 90, d)).astype(np.float32) * rng.uniform(0.2, 3.0, d).astype(np.float32)
    y = (rng.random(n + 90) < 0.35).astype(np.int64)  # unbalanced: class weights matter
    x[y == 1, :4] += 0.6
    design = ReducedDesign.build(x[:n], x[n:])
    assert design.dual == (d > n) and design.rank <= min(n, d)
    theta = fit_reduced(design.phi, y[:n], C=C)
    ours = design.phi_test @ theta[:-1] + theta[-1]
    ref = fit_sklearn_reference(x[:n], y[:n], l2=C).decision_function(x[n:])
    np.testing.assert_allclose(ours, ref, atol=1e-5 * max(1.0, np.abs(ref).max()))
    assert abs(roc_auc_score(y[n:], ours) - roc_auc_score(y[n:], ref)) <= 1e-4
    # and on a permuted labelling (the refits of the test), against a fresh scikit-learn fit
    y_perm = rng.permutation(y[:n])
    theta = fit_reduced(design.phi, y_perm, C=C)
    ours = design.phi_test @ theta[:-1] + theta[-1]
    ref = fit_sklearn_reference(x[:n], y_perm, l2=C).decision_function(x[n:])
    assert abs(roc_auc_score(y[n:], ours) - roc_auc_score(y[n:], ref)) <= 1e-4


def test_reduced_refit_rejects_one_class():
    with pytest.raises(ValueError, match="single class"):
        fit_reduced(np.ones((4, 2)), np.zeros(4))


# ---------------------------------------------------------------------------------------------
# The randomisation unit and the summary (item 2)
# ---------------------------------------------------------------------------------------------


def test_permute_within_keeps_each_step_and_swaps_fairly():
    groups = np.array([0, 0, 1, 1, 1, 2, 3, 3])
    y = np.array([1, 0, 1, 0, 0, 1, 0, 1])
    rng = np.random.default_rng(0)
    swapped = 0
    for _ in range(2000):
        out = permute_within(groups, y, rng)
        for g in np.unique(groups):
            assert sorted(out[groups == g]) == sorted(y[groups == g])
        assert out[5] == 1  # a one-row step has nothing to swap
        swapped += out[0] != y[0]
    assert 0.45 < swapped / 2000 < 0.55  # a fair coin per (trajectory, step)


def test_permutation_summary_hand_worked():
    table = pd.DataFrame({"trajectory_id": ["a", "a", "b", "b", "b"], "step": [0, 0, 0, 0, 0],
                          "variant": ["attack", "clean", "attack", "clean", "c_scrambled"],
                          "score": [2.0, 1.0, 3.0, 0.0, 9.0]})
    # three replicates: E1 = 1.0, 0.5, 0.0 (attack rows 0, 2 vs clean rows 1, 3)
    null = np.array([[2, 1, 3, 0, np.nan], [1, 1, 1, 1, np.nan], [0, 1, 0, 2, np.nan]], dtype=float)
    s = permutation_summary(table, null, e1=1.0, seed=7)
    assert s.null_e1 == [1.0, 0.5, 0.0]
    assert s.n_ge == 1 and s.p_value == pytest.approx(2 / 4)
    assert s.null_mean == pytest.approx(0.5) and s.null_sd == pytest.approx(0.5)
    assert s.tolerance == pytest.approx(max(0.02, 3 * 0.5 / np.sqrt(3)))
    assert s.to_dict()["seed"] == 7 and "unit" not in s.to_dict()
    assert null_tolerance(0.01, 199) == 0.02
    with pytest.raises(ValueError, match="unscored"):
        permutation_summary(table, np.full((2, 5), np.nan), e1=1.0)


# ---------------------------------------------------------------------------------------------
# The refits inside cross_fit (items 2, 3)
# ---------------------------------------------------------------------------------------------


def _dataset(n_traj=16, d=40, shift=0.8, seed=0):
    rng = np.random.default_rng(seed)
    rows, xs = [], []
    direction = rng.standard_normal(d)
    direction /= np.linalg.norm(direction)
    for t in range(n_traj):
        u = rng.standard_normal(d) * 0.5
        for s in range(int(rng.integers(3, 6))):
            for v in ("clean", "attack", "c_scrambled"):
                rows.append({"trajectory_id": f"t{t:02d}", "step": s, "variant": v})
                xs.append(u + rng.standard_normal(d) + (shift * direction if v == "attack" else 0.0))
    return pd.DataFrame(rows), np.array(xs, dtype=np.float32)


def _e1(table_meta, scores):
    v = table_meta["variant"].to_numpy()
    pos, neg = v == "attack", v == "clean"
    return weighted_auc(scores[pos], scores[neg], np.ones(pos.sum()), np.ones(neg.sum()))


@pytest.mark.parametrize("kind", ["holdout", "kfold"])
def test_cross_fit_permutation_refits_are_exact(kind):
    meta, x = _dataset()
    folds = make_folds(meta.trajectory_id.unique(), kind, test_fraction=0.4, k=3, seed=1)
    probe = logistic_detector(l2=1.0)
    fits = cross_fit(probe, meta, x, folds, permutation_m=5, permutation_seed=3)
    te = meta.iloc[fits.test_index].reset_index(drop=True)
    assert fits.null_scores.shape == (5, len(te))
    labelled = te.variant.isin(["clean", "attack"]).to_numpy()
    assert np.isfinite(fits.null_scores[:, labelled]).all() and np.isnan(fits.null_scores[:, ~labelled]).all()
    # the refit on true labels reproduces the Lightning probe
    assert abs(_e1(te, fits.permutation["refit_scores"]) - _e1(te, fits.test_scores)) <= 1e-4
    # replicate 0 is a scikit-learn refit of every fold on the within-step permuted labels
    lab = meta.variant.isin(["clean", "attack"]).to_numpy()
    lm = meta[lab]
    groups, _ = pd.factorize(lm.trajectory_id.astype(str) + "\x00" + lm.step.astype(str))
    y_perm = permute_within(groups, (lm.variant == "attack").to_numpy().astype(int), np.random.default_rng(3))
    expected = np.full(len(meta), np.nan)
    for train_ids, test_ids in folds:
        tr = lm.trajectory_id.isin(train_ids).to_numpy()
        ref = fit_sklearn_reference(x[lab][tr], y_perm[tr], l2=1.0)
        te_rows = np.flatnonzero(lab & meta.trajectory_id.isin(test_ids).to_numpy())
        expected[te_rows] = ref.decision_function(x[te_rows])
    exp = expected[fits.test_index]
    assert abs(_e1(te, fits.null_scores[0]) - _e1(te, exp)) <= 1e-4
    np.testing.assert_allclose(fits.null_scores[0][labelled], exp[labelled], atol=1e-5)
    # seeded: the same seed gives the same null
    again = cross_fit(probe, meta, x, folds, permutation_m=5, permutation_seed=3)
    np.testing.assert_array_equal(again.null_scores, fits.null_scores)


def test_permutation_null_is_centred_and_detects_signal():
    meta, x = _dataset(n_traj=20, shift=3.0, seed=4)
    folds = make_folds(meta.trajectory_id.unique(), "holdout", test_fraction=0.4, seed=0)
    fits = cross_fit(logistic_detector(), meta, x, folds, permutation_m=99, permutation_seed=0)
    table = fits.score_table(meta)
    res = compare_tables(table, n_boot=100, permutation=fits.permutation_input()).to_dict()
    perm = res["permutation"]
    assert res["bootstrap"]["n_clusters"] == 8
    assert perm["m"] == 99 and len(perm["null_e1"]) == 99
    assert abs(perm["null_mean"] - 0.5) <= perm["tolerance"]
    assert perm["p_value"] == pytest.approx(0.01) and perm["e1"] > 0.8
    assert perm["e1_refit"] == pytest.approx(perm["e1"], abs=1e-4)
    assert check_of(run_verdict(res), 4)["status"] == NOT_RUN  # 8 test trajectories: Kish < 12
    v = run_verdict(res, min_clusters=5)
    c4 = check_of(v, 4)
    assert c4["status"] == PASS and "M=99" in c4["detail"] and "p = 0.010" in c4["detail"]
    assert c4["numbers"]["p_value"] == pytest.approx(0.01)
    json.dumps(res, allow_nan=False)


# ---------------------------------------------------------------------------------------------
# Per-estimand cluster counts (item 1) and baseline E3 (item 7)
# ---------------------------------------------------------------------------------------------


def _one_trajectory_table(n_other=6):
    """Attack and control rows all in ONE of 1 + n_other test trajectories (issue 10)."""
    rows = []
    for s in range(4):
        rows += [("t0", s, "clean", 0.1 * s), ("t0", s, "attack", 1.0 + 0.1 * s), ("t0", s, "c_scrambled", 0.6 + 0.1 * s)]
    for t in range(1, n_other + 1):
        for s in range(3):
            rows.append((f"t{t}", s, "clean", 0.05 * t + 0.01 * s))
    return pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])


def test_clusters_by_estimand_counts_both_sides():
    table = _one_trajectory_table()
    table = pd.concat([table, pd.DataFrame([("t1", 0, "attack", 2.0), ("t2", 5, "attack", 2.0)],
                                           columns=table.columns)], ignore_index=True)
    res = estimands(table, n_boot=20)
    # E1: t0, t1 have attack and clean rows (t2's attack row is at a step without clean, but t2
    # has clean rows); E2: steps with both in t0, t1; E3: only t0 has a step with attack and c
    assert res.contributors["e1"] == {"t0", "t1", "t2"}
    assert res.cluster_counts() == {"e1": 3, "e1_paired": 2, "e2": 2, "e3": {"c_scrambled": 1}}
    assert list(res.cluster_counts()) == list(res.effective_counts()) == ["e1", "e1_paired", "e2", "e3"]
    base = table.assign(score=-table.score)
    out = compare_tables(table, {"c1": base}, n_boot=20).to_dict()
    cb = out["bootstrap"]["clusters_by_estimand"]
    assert cb["e1"] == 3 and cb["c1"] == {"e1": 3, "e1_paired": 2, "e2": 2, "e3": {"c_scrambled": 1}}
    assert cb["differences"] == {"e1_minus_c1_e1": 3, "e3_minus_c1_e3": {"c_scrambled": 1},
                                 "e1_minus_e3": {"c_scrambled": 1}}
    assert set(out["c1"]) == {"e1", "e1_paired", "e2", "e3"}  # C1's E3 per control is reported
    assert out["c1"]["e3"]["c_scrambled"]["estimate"] == pytest.approx(1 - out["e3"]["c_scrambled"]["estimate"])
    # Kish (Σw)²/Σw² per side, w = a trajectory's steps on that side: attack t0 4, t1 1, t2 1
    # -> 36/18 = 2.0; clean t0 4, t1..t6 3 each -> 22²/70 = 6.9; the gate reads the poorer side
    eff = out["bootstrap"]["effective_clusters_by_estimand"]
    assert eff["e1"] == pytest.approx(min(6.0**2 / 18.0, 22.0**2 / 70.0)) == pytest.approx(2.0)
    rep = reportability(out, min_clusters=3)
    assert cluster_count(out["bootstrap"], "e1") == (pytest.approx(2.0), 3)
    assert "only 2.0 effective test trajectories" in rep["e1"]  # Kish 2.0: 3 trajectories, less evidence
    assert cluster_count(out["bootstrap"], "e3.c_scrambled") == (1.0, 1) and rep["e3.c_scrambled"] is not None
    assert rep["c1.e3.c_scrambled"] is not None
    assert rep["differences.e1_minus_c1_e1"] is not None  # the smaller Kish of its two E1s


def test_one_trajectory_table_through_evaluate_py(tmp_path):
    """The issue's table: checks 1 and 3 NOT RUN with the counts, through the entry script."""
    path = tmp_path / "one.csv"
    _one_trajectory_table().to_csv(path, index=False)
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(REPO / "evaluate.py"), f"scores={path}", f"paths.output_dir={out}",
         "evaluation.n_boot=200", "report.plots=false"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert res["bootstrap"]["n_clusters"] == 7
    assert res["bootstrap"]["clusters_by_estimand"]["e1"] == 1
    assert res["bootstrap"]["clusters_by_estimand"]["e3"] == {"c_scrambled": 1}
    checks = {c["id"]: c for c in res["verdict"]["checks"]}
    assert checks[1]["status"] == NOT_RUN and "1.0 effective test trajectories" in checks[1]["detail"]
    assert checks[3]["status"] == NOT_RUN
    assert "c_scrambled: E3: only 1.0 effective test trajectories" in checks[3]["detail"]
    assert "degenerate interval" in checks[3]["detail"]
    assert checks[4]["status"] == NOT_RUN and "score table alone cannot be permuted" in checks[4]["detail"]
    assert res["verdict"]["claim"] == "none"
    # the interval the old gate let through is degenerate
    assert res["e3"]["c_scrambled"]["ci_low"] == res["e3"]["c_scrambled"]["ci_high"]
    report = (out / "report.md").read_text()
    assert "effective test trajectories" in report


# ---------------------------------------------------------------------------------------------
# The verdict (items 1, 2, 7)
# ---------------------------------------------------------------------------------------------


def _iv(est, lo, hi):
    return {"estimate": est, "ci_low": lo, "ci_high": hi, "n_boot_used": 1000}


def _perm(e1=0.85, mean=0.5, sd=0.04, p=0.005, m=199):
    return {"m": m, "e1": e1, "null_mean": mean, "null_sd": sd, "null_q025": mean - 2 * sd,
            "null_q975": mean + 2 * sd, "p_value": p, "alpha": 0.05,
            "tolerance": null_tolerance(sd, m), "n_ge": round(p * (m + 1)) - 1}


CONTROLS = ("c_imperative", "c_scrambled")


def _results(n=24, s=19):
    """A hand-built results dict in the issue-22 layout where every check passes (S twins)."""
    seeds = [str(k) for k in range(1, s + 1)]
    by_seed = {k: {"e1": _iv(0.8, 0.7, 0.9), "e2": _iv(0.8, 0.7, 0.9),
                   "e3": {c: _iv(0.5 + 0.005 * int(k), 0.4, 0.65) for c in CONTROLS}} for k in seeds}
    per_c = {c: n for c in CONTROLS}
    return {
        "e1": _iv(0.85, 0.71, 0.93), "e1_paired": _iv(0.85, 0.71, 0.93), "e2": _iv(0.8, 0.7, 0.9),
        "e3": {"c_scrambled": _iv(0.7, 0.6, 0.8), "c_imperative": _iv(0.75, 0.65, 0.85)},
        "c1": {"e1": _iv(0.7, 0.6, 0.8), "e2": _iv(0.7, 0.6, 0.8), "e3": {c: _iv(0.5, 0.4, 0.6) for c in CONTROLS}},
        "collapse_only": {"e1": _iv(0.55, 0.5, 0.58), "e2": _iv(0.55, 0.5, 0.6),
                          "e3": {c: _iv(0.52, 0.45, 0.58) for c in CONTROLS}},
        "differences": {"e1_minus_c1_e1": _iv(0.15, 0.05, 0.25), "e1_minus_e3": {},
                        "e3_minus_c1_e3": {"c_scrambled": _iv(0.2, 0.1, 0.3), "c_imperative": _iv(0.25, 0.15, 0.35)},
                        "e3_minus_mean_twin_e3": {"c_scrambled": _iv(0.15, 0.08, 0.25),
                                                  "c_imperative": _iv(0.2, 0.1, 0.3)}},
        "random_twin": {"e1": _iv(0.8, 0.7, 0.9), "e2": _iv(0.8, 0.7, 0.9), "seeds": seeds, "guards": [],
                        "e3": {c: _iv(0.6, 0.5, 0.7) for c in CONTROLS}, "by_seed": by_seed},
        "permutation": _perm(),
        "bootstrap": {"n_boot": 1000, "n_clusters": n, "clusters_by_estimand": {
            "e1": n, "e1_paired": n, "e2": n, "e3": dict(per_c),
            "c1": {"e1": n, "e2": n, "e3": dict(per_c)}, "collapse_only": {"e1": n, "e2": n, "e3": dict(per_c)},
            "random_twin": {"e1": n, "e2": n, "e3": dict(per_c)},
            "differences": {"e1_minus_c1_e1": n, "e1_minus_e3": {}, "e3_minus_c1_e3": dict(per_c),
                            "e3_minus_mean_twin_e3": dict(per_c)}}},
    }


def _st(v):
    return [c["status"] for c in v["checks"]]


def test_verdict_all_pass_with_numbers():
    v = run_verdict(_results())
    assert _st(v) == [PASS] * 7 and v["claim"] == CLAIM_DETECTS
    assert check_of(v, 4)["detail"].startswith("exact permutation test, M=199: E1 0.850 vs null mean 0.500")
    assert check_of(v, 5)["detail"].startswith(
        "c_imperative: collapse-only E3 0.520 CI [0.450, 0.580] below ceiling 0.600; c_scrambled: ")
    assert check_of(v, 5)["detail"].endswith(
        "note on \"separates\" (decides nothing): collapse-only E1 0.550 CI [0.500, 0.580]")
    assert check_of(v, 1)["detail"].startswith("E1 over the steps having attack and clean rows 0.850 CI")
    assert "(S = 19 twins: rank level 1/(S+1) = 0.050)" in check_of(v, 6)["detail"]
    assert "check 6 at rank level 0.050 (S = 19 twins)" in v["claim_note"]
    assert check_of(v, 3)["numbers"]["c_scrambled"]["e3"]["ci_low"] == 0.6
    assert all(c["rule"] for c in v["checks"]) and "reportability" not in v
    json.dumps(v, allow_nan=False)


@pytest.mark.parametrize(("key", "check"), [
    (("e1_paired",), [1]),
    (("e1",), [4]),
    (("e3", "c_imperative"), [3]),
    (("differences", "e3_minus_c1_e3", "c_imperative"), [2]),
    (("collapse_only", "e3", "c_imperative"), [5]),
    (("differences", "e3_minus_mean_twin_e3", "c_imperative"), [6]),
])
def test_verdict_gates_each_estimand_on_its_own_count(key, check):
    r = _results()
    node = r["bootstrap"]["clusters_by_estimand"]
    for k in key[:-1]:
        node = node[k]
    node[key[-1]] = 3
    v = run_verdict(r, min_clusters=5)
    for c in v["checks"]:
        if c["id"] in check:
            assert c["status"] == NOT_RUN, c
            assert "only 3 test trajectories contribute" in c["detail"] and "< min_clusters 5" in c["detail"]
        elif c["id"] == 0:  # check 0 names what the gate refused (E1 alone is read by no interval)
            assert c["status"] == (PASS if key == ("e1",) else FAIL), c
        else:
            assert c["status"] == PASS, c
    assert v["claim"] == (CLAIM_SEPARATES if 1 not in check else "none")
    assert run_verdict(r, min_clusters=3)["claim"] == CLAIM_DETECTS


def test_verdict_permutation_outcomes():
    r = _results()
    r["permutation"] = _perm(p=0.2)
    c4 = check_of(run_verdict(r), 4)
    assert c4["status"] == FAIL and "p = 0.200 > 0.05" in c4["detail"]
    r["permutation"] = _perm(mean=0.56, sd=0.04)
    c4 = check_of(run_verdict(r), 4)
    assert c4["status"] == FAIL and "leakage or a bug" in c4["detail"]
    r["permutation"] = _perm(mean=0.515, sd=0.04)  # within max(0.02, 3 SD/sqrt M)
    assert check_of(run_verdict(r), 4)["status"] == PASS
    del r["permutation"]
    r["permuted"] = {"e1": _iv(0.49, 0.41, 0.57)}
    c4 = check_of(run_verdict(r), 4)
    assert c4["status"] == NOT_RUN and "single permuted-label fit's E1 0.490" in c4["detail"]


@pytest.mark.parametrize(("ci", "status"), [((0.50, 0.59), PASS), ((0.58, 0.69), INCONCLUSIVE),
                                            ((0.61, 0.69), FAIL)])
def test_verdict_collapse_uses_its_interval(ci, status):
    r = _results()
    r["collapse_only"]["e3"]["c_scrambled"] = _iv(0.6, *ci) if status == INCONCLUSIVE else _iv(sum(ci) / 2, *ci)
    r["collapse_only"]["e1"] = _iv(0.7, 0.65, 0.75)  # the E1 form is only the note: it decides nothing
    v = run_verdict(r)
    assert check_of(v, 5)["status"] == status
    assert v["claim"] == (CLAIM_DETECTS if status == PASS else CLAIM_SEPARATES)
    if status == INCONCLUSIVE:
        assert "straddles ceiling 0.600" in check_of(v, 5)["detail"]
        assert "check 5 INCONCLUSIVE" in v["claim_note"] and "straddles" in v["claim_note"]


def test_config_permutation_schema_and_validation(tmp_path):
    from hydra.errors import ConfigCompositionException

    from ipi.run.validation import validate
    from tests.conftest import compose_train

    cfg = compose_train(tmp_path)
    assert cfg.evaluation.permutation.m == 199 and cfg.evaluation.min_clusters == 12
    for ov, msg in (("evaluation.permutation.m=-1", "permutation.m"),
                    ("evaluation.permutation.alpha=1.5", "permutation.alpha"),
                    ("evaluation.min_clusters=0", "min_clusters")):
        with pytest.raises(ValueError, match=msg):
            validate(compose_train(tmp_path, [ov]))
    with pytest.raises(ConfigCompositionException):
        compose_train(tmp_path, ["evaluation.permutation.mm=3"])


def test_lightning_probe_and_reduced_refit_agree():
    meta, x = _dataset(n_traj=8, d=30)
    lab = meta.variant.isin(["clean", "attack"]).to_numpy()
    y = (meta.variant[lab] == "attack").to_numpy().astype(int)
    probe = fit_probe(x[lab], y, probe_config(l2=0.5))
    design = ReducedDesign.build(x[lab], x)
    theta = fit_reduced(design.phi, y, C=0.5)
    np.testing.assert_allclose(design.phi_test @ theta[:-1] + theta[-1], score(probe, x), atol=1e-4)


def test_kfold_null_is_read_on_the_permuted_labels():
    """Under K-fold every row also trains the other folds' refits, so a replicate's E1 is read on
    the same permuted labels that trained it (the whole procedure on relabelled data); a holdout's
    test rows keep their true labels."""
    meta, x = _dataset()
    kf = cross_fit(logistic_detector(), meta, x, make_folds(meta.trajectory_id.unique(), "kfold", k=3, seed=1),
                   permutation_m=4, permutation_seed=3)
    te = meta.iloc[kf.test_index].reset_index(drop=True)
    lab = meta.variant.isin(["clean", "attack"]).to_numpy()
    lm = meta[lab]
    groups, _ = pd.factorize(lm.trajectory_id.astype(str) + "\x00" + lm.step.astype(str))
    rng = np.random.default_rng(3)
    y_perm = np.stack([permute_within(groups, (lm.variant == "attack").to_numpy().astype(int), rng) for _ in range(4)])
    expect = np.zeros((4, len(meta)), dtype=bool)
    expect[:, lab] = y_perm.astype(bool)
    np.testing.assert_array_equal(kf.permutation["null_attack"], expect[:, kf.test_index])
    # the summary's null E1 of replicate 0 is the AUC of its scores on its own labels
    s = permutation_summary(te, kf.null_scores, 0.7, null_attack=kf.permutation["null_attack"])
    a = kf.permutation["null_attack"][0]
    labelled = te.variant.isin(["clean", "attack"]).to_numpy()
    assert s.null_e1[0] == pytest.approx(roc_auc_score(a[labelled], kf.null_scores[0][labelled]), abs=1e-12)
    ho = cross_fit(logistic_detector(), meta, x, make_folds(meta.trajectory_id.unique(), "holdout", test_fraction=0.4,
                                                            seed=1), permutation_m=4, permutation_seed=3)
    assert "null_attack" not in ho.permutation


def test_kfold_separates_needs_the_permutation_test():
    r = _results()
    assert check_of(run_verdict(r, split="kfold"), 1)["status"] == PASS  # p = 0.005 <= 0.05
    r["permutation"] = _perm(p=0.2)
    c1 = check_of(run_verdict(r, split="kfold"), 1)
    assert c1["status"] == FAIL and "K-fold: exact permutation p = 0.200 > 0.05" in c1["detail"]
    assert check_of(run_verdict(r, split="holdout"), 1)["status"] == PASS  # a holdout reads the bootstrap
    del r["permutation"]
    c1 = check_of(run_verdict(r, split="kfold"), 1)
    assert c1["status"] == NOT_RUN and "permutation test did not run" in c1["detail"]
    v = run_verdict(r, split="kfold")
    assert v["claim"] == "none"  # no "separates" without it
    assert "split design not stated" in check_of(run_verdict(r), 1)["rule"]
