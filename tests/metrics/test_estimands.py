"""Estimands, cluster bootstrap, pairing, verdict, score tables (PROTOCOL.md §5, §7, §9)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from ipi.evaluation import evaluate_score_table, read_score_table
from ipi.evaluation.verdict import CLAIM_DETECTS, CLAIM_NONE, CLAIM_SEPARATES
from tests.conftest import check_of, run_verdict
from ipi.metrics import (
    Draws,
    bootstrap_weighted_auc,
    draw_multiplicities,
    estimands,
    compare_tables,
    grouped_weighted_auc,
    make_draws,
    paired_difference,
    percentile_interval,
    step_weights,
    weighted_auc,
)

SHARED = Path(os.environ.get("IPI_SHARED", Path(__file__).resolve().parents[2].parent / "shared"))
CASES_DIR = SHARED / "protocol_cases"
CASES = sorted(CASES_DIR.glob("*.csv")) if CASES_DIR.is_dir() else []


def _table(rows):
    return pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])


# ---------------------------------------------------------------------------------------------
# PROTOCOL.md §9 checked cases
# ---------------------------------------------------------------------------------------------


def _flat(res):
    out = {"e1": res.e1, "e2": res.e2}
    out.update({f"e3.{c}": iv for c, iv in res.e3.items()})
    return out


@pytest.mark.skipif(not CASES, reason=f"no protocol cases under {CASES_DIR}")
@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_protocol_case(case):
    expected = json.loads(case.with_suffix(".expected.json").read_text())
    got = _flat(estimands(pd.read_csv(case), n_boot=1000, seed=0))
    point_keys = [k for k in expected if k != "ci"]
    assert sorted(got) == sorted(point_keys)
    for key in point_keys:
        assert got[key].estimate == pytest.approx(expected[key], abs=1e-9), key
        low, high = expected["ci"][key]
        assert abs(got[key].ci_low - low) <= 0.03, key
        assert abs(got[key].ci_high - high) <= 0.03, key
        assert got[key].n_boot_used == 1000


@pytest.mark.skipif(not CASES, reason=f"no protocol cases under {CASES_DIR}")
@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_protocol_case_reference_stream(case):
    """Our draws (default_rng(0).integers over sorted ids) reproduce the reference CIs exactly.

    PROTOCOL.md §9 only promises ±0.03 for another stream; this pins reproducibility of our own
    (with PROTOCOL.md §5's percentile interval; the default expanded one is held to ±0.03 above).
    """
    expected = json.loads(case.with_suffix(".expected.json").read_text())
    got = _flat(estimands(pd.read_csv(case), n_boot=1000, seed=0, interval="percentile"))
    for key, (low, high) in expected["ci"].items():
        assert got[key].ci_low == pytest.approx(low, abs=1e-9), key
        assert got[key].ci_high == pytest.approx(high, abs=1e-9), key


@pytest.mark.skipif(
    not (CASES_DIR / "ties_and_missing.csv").is_file(), reason="ties_and_missing case missing"
)
def test_e1_pools_all_rows_not_only_paired_steps():
    """ties_and_missing has clean-only steps: E1 pools them (PROTOCOL.md §5 "all test steps")."""
    case = CASES_DIR / "ties_and_missing.csv"
    expected = json.loads(case.with_suffix(".expected.json").read_text())
    t = pd.read_csv(case)
    w = step_weights(t)
    a, c = (t.variant == "attack").to_numpy(), (t.variant == "clean").to_numpy()
    pooled = weighted_auc(t.score[a], t.score[c], w[a], w[c])
    keys = list(zip(t.trajectory_id, t.step, strict=True))
    both = {k for k, v in zip(keys, t.variant, strict=True) if v == "attack"} & {
        k for k, v in zip(keys, t.variant, strict=True) if v == "clean"
    }
    inb = np.array([k in both for k in keys])
    paired_only = weighted_auc(t.score[a & inb], t.score[c & inb], w[a & inb], w[c & inb])
    assert pooled == pytest.approx(expected["e1"], abs=1e-12)
    assert abs(paired_only - expected["e1"]) > 1e-3


# ---------------------------------------------------------------------------------------------
# weighted AUC against scikit-learn
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_weighted_auc_matches_sklearn_with_ties(seed):
    rng = np.random.default_rng(seed)
    fp = rng.integers(0, 6, size=rng.integers(1, 40)).astype(float)
    fn = rng.integers(0, 6, size=rng.integers(1, 40)).astype(float) - 1
    wp, wn = rng.uniform(0, 3, fp.size), rng.uniform(0, 3, fn.size)
    y = np.r_[np.ones(fp.size), np.zeros(fn.size)]
    ref = roc_auc_score(y, np.r_[fp, fn], sample_weight=np.r_[wp, wn])
    assert weighted_auc(fp, fn, wp, wn) == pytest.approx(ref, abs=1e-12)
    ref_unw = roc_auc_score(y, np.r_[fp, fn])
    assert weighted_auc(fp, fn) == pytest.approx(ref_unw, abs=1e-12)


def test_weighted_auc_edge_cases():
    assert math.isnan(weighted_auc([], [1.0]))
    assert math.isnan(weighted_auc([1.0], []))
    assert math.isnan(weighted_auc([1.0], [0.0], [0.0], [1.0]))
    assert weighted_auc([1.0], [1.0]) == 0.5
    assert weighted_auc([2.0], [1.0]) == 1.0
    assert weighted_auc([0.0], [1.0]) == 0.0
    with pytest.raises(ValueError):
        weighted_auc([np.nan], [1.0])
    with pytest.raises(ValueError):
        weighted_auc([1.0], [1.0], [-1.0], [1.0])


def test_bootstrap_weighted_auc_equals_loop_on_repeated_rows():
    rng = np.random.default_rng(3)
    n, n_traj, n_boot = 30, 6, 40
    scores = rng.integers(0, 5, n).astype(float)  # many ties
    labels = rng.integers(0, 2, n).astype(bool)
    weights = rng.choice([0.5, 1.0, 1 / 3], n)
    traj = rng.integers(0, n_traj, n)
    m_traj = draw_multiplicities([f"t{k}" for k in range(n_traj)], n_boot, seed=1)
    m_rows = m_traj[:, traj]
    reps = bootstrap_weighted_auc(scores, labels, weights, m_rows)
    reps_clusters = bootstrap_weighted_auc(scores, labels, weights, m_traj, clusters=traj)
    np.testing.assert_array_equal(reps, reps_clusters)
    for b in range(n_boot):
        idx = np.repeat(np.arange(n), m_rows[b])  # a trajectory drawn k times: its rows k times
        y = labels[idx]
        if y.all() or not y.any():
            assert math.isnan(reps[b])
            continue
        ref = roc_auc_score(y, scores[idx], sample_weight=weights[idx])
        assert reps[b] == pytest.approx(ref, abs=1e-12)


def test_bootstrap_weighted_auc_nan_for_one_sided_replicates():
    scores = np.array([0.1, 0.9, 0.4])
    labels = np.array([1, 0, 1])
    m = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 1], [0, 0, 0]])
    reps = bootstrap_weighted_auc(scores, labels, None, m)
    assert math.isnan(reps[0]) and math.isnan(reps[1]) and math.isnan(reps[3])
    assert reps[2] == 0.0


def test_grouped_weighted_auc_matches_per_group_loop():
    rng = np.random.default_rng(7)
    n = 200
    g = rng.integers(0, 25, n)
    f = rng.integers(0, 4, n).astype(float)
    y = rng.integers(0, 2, n).astype(bool)
    w = rng.uniform(0.1, 2, n)
    got = grouped_weighted_auc(g, f, y, w)
    for k in range(g.max() + 1):
        s = g == k
        ref = weighted_auc(f[s & y], f[s & ~y], w[s & y], w[s & ~y])
        if math.isnan(ref):
            assert math.isnan(got[k])
        else:
            assert got[k] == pytest.approx(ref, abs=1e-12)


# ---------------------------------------------------------------------------------------------
# Hand-worked estimands
# ---------------------------------------------------------------------------------------------

# Trajectory A: step 0 clean 0.1, attack 0.9, c_scrambled 0.95
#               step 1 clean 0.5, attack 0.5
# Trajectory B: step 0 clean 0.7, attacks 0.2 and 0.8 (step weight 1/2 each), c_scrambled 0.5
#               step 1 clean 0.3, c_scrambled 0.0 (no attack at this step)
HAND = _table(
    [
        ("A", 0, "clean", 0.1),
        ("A", 0, "attack", 0.9),
        ("A", 0, "c_scrambled", 0.95),
        ("A", 1, "clean", 0.5),
        ("A", 1, "attack", 0.5),
        ("B", 0, "clean", 0.7),
        ("B", 0, "attack", 0.2),
        ("B", 0, "attack", 0.8),
        ("B", 0, "c_scrambled", 0.5),
        ("B", 1, "clean", 0.3),
        ("B", 1, "c_scrambled", 0.0),
    ]
)


def test_step_weights_default_and_override():
    w = step_weights(HAND)
    np.testing.assert_allclose(w, [1, 1, 1, 1, 1, 1, 0.5, 0.5, 1, 1, 1])
    t = HAND.assign(weight=np.arange(1, 12, dtype=float))
    np.testing.assert_array_equal(step_weights(t), np.arange(1, 12, dtype=float))


def test_hand_worked_point_estimates():
    res = estimands(HAND, n_boot=50, seed=0)
    # E1: attacks (weight) 0.9 (1), 0.5 (1), 0.2 (1/2), 0.8 (1/2): Σw = 3;
    #     cleans 0.1, 0.5, 0.7, 0.3 (weight 1 each): Σw = 4.
    #     0.9 beats 4 -> 4; 0.5 beats 0.1, 0.3 and ties 0.5 -> 2.5; 0.2 beats 0.1 -> 1/2 · 1;
    #     0.8 beats all 4 -> 1/2 · 4 = 2.  E1 = (4 + 2.5 + 0.5 + 2) / (3 · 4) = 9/12 = 0.75.
    assert res.e1.estimate == pytest.approx(0.75, abs=1e-15)
    # E2: steps with both: A0 (0.9 > 0.1 -> 1), A1 (0.5 = 0.5 -> 1/2),
    #     B0 (attacks 0.2 < 0.7, 0.8 > 0.7 at 1/2 each -> 1/2); B1 has no attack.
    #     E2 = (1 + 1/2 + 1/2) / 3 = 2/3.
    assert res.e2.estimate == pytest.approx(2 / 3, abs=1e-15)
    # E3[c_scrambled]: steps with both = A0, B0 (B1's control 0.0 is excluded).
    #     attacks 0.9 (1), 0.2 (1/2), 0.8 (1/2); controls 0.95, 0.5 (1 each).
    #     0.9 beats 0.5 -> 1; 0.2 beats none -> 0; 0.8 beats 0.5 -> 1/2 · 1.
    #     E3 = 1.5 / (2 · 2) = 0.375.  (Had B1 been included: 3.5 / 6.)
    assert set(res.e3) == {"c_scrambled"}
    assert res.e3["c_scrambled"].estimate == pytest.approx(0.375, abs=1e-15)


def test_hand_worked_replicates():
    # Replicate 0: A twice, B never.  E1 on A: attacks 0.9, 0.5 vs cleans 0.1, 0.5:
    #   0.9 -> 2, 0.5 -> 1 + 1/2; (3.5 · 2 · 2) / (2 · 2 · 2 · 2) = 3.5 / 4 = 0.875.
    #   E2 = mean(1, 1/2) = 0.75.  E3 on A0: 0.9 vs 0.95 -> 0.
    # Replicate 1: B twice.  E1: attacks 0.2, 0.8 (1/2 each) vs 0.7, 0.3: 0.8 beats both ->
    #   1/2 · 2 = 1; / (1 · 2) = 0.5.  E2 = 1/2.  E3 on B0: 0.2 < 0.5, 0.8 > 0.5 -> 0.5.
    # Replicate 2: A once, B twice.  E2 = (1 + 1/2 + 2 · 1/2) / (2 + 2) = 0.625.
    # Replicate 3: nothing drawn -> every estimand dropped.
    draws = Draws(("A", "B"), np.array([[2, 0], [0, 2], [1, 2], [0, 0]]))
    res = estimands(HAND, draws=draws)
    np.testing.assert_allclose(res.replicates["e1"][:2], [0.875, 0.5], atol=1e-15)
    np.testing.assert_allclose(res.replicates["e2"][:3], [0.75, 0.5, 0.625], atol=1e-15)
    np.testing.assert_allclose(res.replicates["e3"]["c_scrambled"][:2], [0.0, 0.5], atol=1e-15)
    assert np.isnan(res.replicates["e1"][3]) and np.isnan(res.replicates["e2"][3])
    assert res.e1.n_boot_used == res.e2.n_boot_used == 3


def test_replicate_equals_estimand_on_explicitly_resampled_table():
    """A replicate's value = the estimand on the table with drawn trajectories copied."""
    rng = np.random.default_rng(11)
    rows = []
    for t in range(8):
        for s in range(rng.integers(1, 5)):
            for v in ("clean", "attack", "c_scrambled"):
                for _ in range(rng.integers(0, 3)):
                    rows.append((f"t{t}", s, v, float(rng.integers(0, 6))))
    table = _table(rows)
    table = pd.concat([table, _table([("t0", 0, "attack", 1.0), ("t0", 0, "clean", 0.0)])])
    draws = make_draws(table.trajectory_id, n_boot=30, seed=5)
    res = estimands(table, draws=draws)
    for b in range(draws.n_boot):
        parts = []
        for k, tid in enumerate(draws.trajectory_ids):
            for copy in range(draws.multiplicity[b, k]):
                part = table[table.trajectory_id == tid].copy()
                part["trajectory_id"] = f"{tid}#{copy}"  # a copy is its own cluster
                parts.append(part)
        resampled = pd.concat(parts)
        w = step_weights(resampled)
        a = (resampled.variant == "attack").to_numpy()
        c = (resampled.variant == "clean").to_numpy()
        ref = weighted_auc(resampled.score[a], resampled.score[c], w[a], w[c])
        got = res.replicates["e1"][b]
        assert (math.isnan(ref) and math.isnan(got)) or got == pytest.approx(ref, abs=1e-12)
        if {"attack", "clean"} <= set(resampled.variant):
            ref_e2 = estimands(resampled, n_boot=1).e2.estimate
            got_e2 = res.replicates["e2"][b]
            assert (math.isnan(ref_e2) and math.isnan(got_e2)) or got_e2 == pytest.approx(
                ref_e2, abs=1e-12
            )


def test_dropped_replicates_are_counted():
    # X has only attack rows, Y only clean rows, Z both (one step).
    table = _table(
        [
            ("X", 0, "attack", 0.9),
            ("X", 1, "attack", 0.4),
            ("Y", 0, "clean", 0.2),
            ("Y", 1, "clean", 0.6),
            ("Z", 0, "attack", 0.7),
            ("Z", 0, "clean", 0.1),
        ]
    )
    res = estimands(table, n_boot=400, seed=3)
    m = draw_multiplicities(["X", "Y", "Z"], 400, 3)  # columns: X, Y, Z (sorted)
    e1_defined = (m[:, 0] + m[:, 2] > 0) & (m[:, 1] + m[:, 2] > 0)
    e2_defined = m[:, 2] > 0
    assert 0 < e1_defined.sum() < 400 and 0 < e2_defined.sum() < 400
    assert res.e1.n_boot_used == int(e1_defined.sum())
    assert res.e2.n_boot_used == int(e2_defined.sum())
    np.testing.assert_array_equal(np.isfinite(res.replicates["e1"]), e1_defined)
    kept = res.replicates["e1"][e1_defined]
    assert res.e1.ci_low == pytest.approx(np.quantile(kept, 0.025))
    assert res.e1.ci_high == pytest.approx(np.quantile(kept, 0.975))


def test_all_replicates_dropped_gives_undefined_interval():
    iv = percentile_interval(0.7, [np.nan, np.nan])
    assert iv.n_boot_used == 0 and math.isnan(iv.ci_low) and math.isnan(iv.ci_high)
    assert iv.to_dict() == {"estimate": 0.7, "ci_low": None, "ci_high": None, "n_boot_used": 0}


def test_draw_multiplicities_properties():
    ids = ["b", "a", "c", "a"]
    m = draw_multiplicities(ids, 200, seed=4)
    assert m.shape == (200, 3) and m.dtype == np.int64
    assert (m.sum(axis=1) == 3).all()
    np.testing.assert_array_equal(m, draw_multiplicities(["c", "b", "a"], 200, seed=4))
    assert not np.array_equal(m, draw_multiplicities(ids, 200, seed=5))
    # Column k counts how often the k-th sorted id was drawn by integers(0, T, (B, T)).
    idx = np.random.default_rng(4).integers(0, 3, size=(200, 3))
    np.testing.assert_array_equal(m[:, 1], (idx == 1).sum(axis=1))


def test_level_changes_interval_width():
    t = HAND
    wide = estimands(t, n_boot=300, seed=1, level=0.99).e1
    narrow = estimands(t, n_boot=300, seed=1, level=0.5).e1
    assert wide.ci_low <= narrow.ci_low <= narrow.ci_high <= wide.ci_high


def test_weight_column_equals_duplicated_rows():
    # Weight 2 on a row == the row present twice with weight 1 (weight column overrides).
    base = _table([("A", 0, "attack", 0.3), ("A", 0, "clean", 0.5), ("B", 0, "clean", 0.1)])
    weighted = base.assign(weight=[2.0, 1.0, 1.0])
    dup = pd.concat([base.iloc[[0]], base]).assign(weight=1.0)
    extra = _table([("A", 0, "attack", 0.9), ("B", 0, "attack", 0.0)]).assign(weight=1.0)
    a = estimands(pd.concat([weighted, extra]), n_boot=20, seed=0)
    b = estimands(pd.concat([dup, extra]), n_boot=20, seed=0)
    assert a.e1.estimate == pytest.approx(b.e1.estimate)
    np.testing.assert_allclose(a.replicates["e1"], b.replicates["e1"])


# ---------------------------------------------------------------------------------------------
# Paired design
# ---------------------------------------------------------------------------------------------


def _random_table(seed, n_traj=12, shift=1.0, controls=("c_scrambled", "c_imperative")):
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(n_traj):
        for s in range(4):
            for v in ("clean", "attack", *controls):
                rows.append((f"traj-{t:02d}", s, v, rng.normal() + shift * (v == "attack")))
    return _table(rows)


def test_paired_differences_use_same_draws():
    main = _random_table(0)
    c1 = _random_table(1, shift=0.3)
    perm = _random_table(2, shift=0.0, n_traj=8)  # subset of trajectories
    out = compare_tables(main, {"c1": c1, "permuted": perm}, n_boot=200, seed=9, interval="percentile").to_dict()
    json.dumps(out, allow_nan=False)  # JSON-ready: no NaN, no numpy types

    draws = make_draws(set(main.trajectory_id) | set(c1.trajectory_id), n_boot=200, seed=9)
    r_main = estimands(main, draws=draws, interval="percentile")
    r_c1 = estimands(c1, draws=draws, interval="percentile")
    r_perm = estimands(perm, draws=draws, interval="percentile")
    assert out["e1"] == r_main.e1.to_dict()
    assert out["c1"] == {"e1": r_c1.e1.to_dict(), "e1_paired": r_c1.e1_paired.to_dict(), "e2": r_c1.e2.to_dict(),
                         "e3": {c: iv.to_dict() for c, iv in r_c1.e3.items()}}
    assert out["permuted"]["e1"] == r_perm.e1.to_dict()

    iv, diff = paired_difference(
        r_main.e1.estimate, r_main.replicates["e1"], r_c1.e1.estimate, r_c1.replicates["e1"], interval="percentile"
    )
    np.testing.assert_array_equal(diff, r_main.replicates["e1"] - r_c1.replicates["e1"])
    assert out["differences"]["e1_minus_c1_e1"] == iv.to_dict()
    assert iv.estimate == pytest.approx(r_main.e1.estimate - r_c1.e1.estimate)
    assert iv.ci_low == pytest.approx(np.quantile(diff, 0.025))
    for c in ("c_scrambled", "c_imperative"):
        d = r_main.replicates["e1"] - r_main.replicates["e3"][c]
        got = out["differences"]["e1_minus_e3"][c]
        assert got["ci_low"] == pytest.approx(np.quantile(d, 0.025))
        assert got["ci_high"] == pytest.approx(np.quantile(d, 0.975))
        assert got["estimate"] == pytest.approx(r_main.e1.estimate - r_main.e3[c].estimate)
    clusters = out["bootstrap"].pop("clusters_by_estimand")
    effective = out["bootstrap"].pop("effective_clusters_by_estimand")
    assert out["bootstrap"] == {"n_boot": 200, "seed": 9, "level": 0.95, "n_clusters": 12, "interval": "percentile"}
    assert effective["e1"] == r_main.effective["e1"] <= clusters["e1"]
    assert clusters["e1"] == r_main.cluster_counts()["e1"] and clusters["c1"] == r_c1.cluster_counts()
    for v in out["e1"].values():
        assert type(v) in (float, int)


def test_paired_difference_drops_where_either_undefined():
    iv, diff = paired_difference(0.8, [0.7, np.nan, 0.9, 0.6], 0.5, [0.5, 0.4, np.nan, 0.5])
    assert iv.n_boot_used == 2
    np.testing.assert_allclose(diff[[0, 3]], [0.2, 0.1])
    assert iv.estimate == pytest.approx(0.3)


def test_evaluate_tables_rejects_reserved_baseline_name():
    with pytest.raises(ValueError, match="not allowed"):
        compare_tables(HAND, {"e3": HAND}, n_boot=5).to_dict()


def test_estimands_rejects_trajectory_outside_draws():
    with pytest.raises(ValueError, match="not among the bootstrap clusters"):
        estimands(HAND, draws=make_draws(["A"], n_boot=5, seed=0))


# ---------------------------------------------------------------------------------------------
# Verdict (PROTOCOL.md §7)
# ---------------------------------------------------------------------------------------------


def _iv(est, lo, hi):
    return {"estimate": est, "ci_low": lo, "ci_high": hi, "n_boot_used": 1000}


def _perm(mean=0.5, sd=0.04, p=0.005, m=199):
    return {"m": m, "e1": 0.85, "null_mean": mean, "null_sd": sd, "null_q025": mean - 2 * sd,
            "null_q975": mean + 2 * sd, "p_value": p, "alpha": 0.05,
            "tolerance": max(0.02, 3 * sd / m**0.5), "n_ge": 0}


def _passing():
    """Every check passes (the issue-22 layout: tests/evaluation/test_verdict.py), 24 test trajectories."""
    from tests.evaluation.test_verdict import _results

    r = _results()
    r["permuted"] = {"e1": _iv(0.5, 0.45, 0.55), "e2": _iv(0.5, 0.4, 0.6)}
    return r


def _statuses(v):
    return [c["status"] for c in v["checks"]]


def test_verdict_all_pass():
    v = run_verdict(_passing())
    assert _statuses(v) == ["PASS"] * 7
    assert [c["id"] for c in v["checks"]] == [0, 1, 2, 3, 4, 5, 6]
    assert v["claim"] == CLAIM_DETECTS
    assert check_of(v, 1)["detail"] == ("E1 over the steps having attack and clean rows 0.850 CI [0.710, 0.930]: "
                                        "CI low 0.710 > 0.5")
    assert "c_imperative" in check_of(v, 3)["detail"] and "c_scrambled" in check_of(v, 3)["detail"]
    assert "c_scrambled: collapse-only E3 0.520 CI [0.450, 0.580] below ceiling 0.600" in check_of(v, 5)["detail"]


@pytest.mark.parametrize(("n_clusters", "gated"), [(1, True), (4, True), (5, False), (None, False)])
def test_verdict_needs_enough_test_trajectories(n_clusters, gated):
    """One test trajectory gives a zero-width interval: below min_clusters nothing is licensed."""
    r = _passing()
    r["bootstrap"] = {"n_boot": 1000, "seed": 0, "level": 0.95}  # no per-estimand counts: n_clusters gates
    if n_clusters is not None:
        r["bootstrap"]["n_clusters"] = n_clusters
    v = run_verdict(r, min_clusters=5)
    if gated:
        assert _statuses(v) == ["FAIL"] + ["NOT RUN"] * 6 and v["claim"] == CLAIM_NONE
        assert f"only {n_clusters} test trajector" in check_of(v, 1)["detail"]
        assert "not evidence" in check_of(v, 0)["detail"]
    else:
        assert _statuses(v) == ["PASS"] * 7 and v["claim"] == CLAIM_DETECTS


@pytest.mark.parametrize(
    ("check", "mutate"),
    [
        (1, lambda r: r.update(e1_paired=_iv(0.6, 0.48, 0.7))),
        (2, lambda r: r["differences"]["e3_minus_c1_e3"].update(c_scrambled=_iv(0.05, -0.01, 0.1))),
        (2, lambda r: r["c1"]["e3"].update(c_scrambled=_iv(0.96, 0.9, 0.99))),
        (2, lambda r: r["c1"]["e3"].update(c_imperative=_iv(0.95, 0.9, 0.99))),  # "below 0.95" is strict
        (3, lambda r: r["e3"].update(c_scrambled=_iv(0.65, 0.49, 0.8))),
        (4, lambda r: r.update(permutation=_perm(p=0.2))),
        (4, lambda r: r.update(permutation=_perm(mean=0.45))),
        (5, lambda r: r["collapse_only"]["e3"].update(c_scrambled=_iv(0.634, 0.61, 0.69))),
        (6, lambda r: r["differences"]["e3_minus_mean_twin_e3"].update(c_scrambled=_iv(0.03, -0.01, 0.08))),
        (6, lambda r: r["differences"]["e3_minus_mean_twin_e3"].update(c_imperative=_iv(0.05, 0.0, 0.08))),  # strict
    ],
)
def test_verdict_each_failing(check, mutate):
    r = _passing()
    mutate(r)
    v = run_verdict(r)
    expected = ["PASS"] * 7
    expected[check] = "FAIL"
    assert _statuses(v) == expected
    assert v["claim"] == (CLAIM_NONE if check == 1 else CLAIM_SEPARATES)


def test_verdict_failing_details_carry_numbers():
    r = _passing()
    r["e3"]["c_scrambled"] = _iv(0.489, 0.327, 0.647)
    r["collapse_only"]["e3"]["c_scrambled"] = _iv(0.634, 0.61, 0.69)
    v = run_verdict(r)
    assert "c_scrambled: E3 0.489 CI [0.327, 0.647]: CI low 0.327 <= 0.5" in check_of(v, 3)["detail"]
    assert "c_imperative: E3 0.750 CI [0.650, 0.850]: CI low 0.650 > 0.5" in check_of(v, 3)["detail"]
    assert "c_scrambled: collapse-only E3 0.634 CI [0.610, 0.690] above ceiling 0.600" in check_of(v, 5)["detail"]


@pytest.mark.parametrize("missing", ["c1", "e3", "permutation", "collapse_only", "random_twin"])
def test_verdict_not_run(missing):
    r = _passing()
    del r[missing]
    if missing == "c1":
        del r["differences"]["e1_minus_c1_e1"], r["differences"]["e3_minus_c1_e3"]
    if missing == "random_twin":
        del r["differences"]["e3_minus_mean_twin_e3"]
    v = run_verdict(r)
    check = {"c1": 2, "e3": 3, "permutation": 4, "collapse_only": 5, "random_twin": 6}[missing]
    assert check_of(v, check)["status"] == "NOT RUN"
    assert v["claim"] == CLAIM_SEPARATES


def test_verdict_empty_and_undefined_inputs():
    v = run_verdict({})
    assert _statuses(v) == ["PASS"] + ["NOT RUN"] * 6 and v["claim"] == CLAIM_NONE
    r = _passing()
    r["e3"]["c_occlusion"] = _iv(None, None, None)  # every replicate dropped
    assert check_of(run_verdict(r), 3)["status"] == "NOT RUN"
    r["e3"]["c_scrambled"] = _iv(0.45, 0.4, 0.5)  # a defined failure wins over NOT RUN
    assert check_of(run_verdict(r), 3)["status"] == "FAIL"


def test_verdict_c2_alias_and_thresholds():
    r = _passing()
    r["c2"] = r.pop("collapse_only")
    assert check_of(run_verdict(r), 5)["status"] == "PASS"
    assert check_of(run_verdict(r, collapse_ceiling=0.44), 5)["status"] == "FAIL"
    assert check_of(run_verdict(r, collapse_ceiling=0.55), 5)["status"] == "INCONCLUSIVE"
    assert check_of(run_verdict(r, c1_max=0.45), 2)["status"] == "FAIL"  # C1 E3[c] 0.5 >= 0.45


def test_verdict_on_evaluate_tables_output():
    main = _random_table(0, shift=2.0)
    out = compare_tables(
        main,
        {
            "c1": _random_table(1, shift=0.2),
            "permuted": _random_table(2, shift=0.0),
            "collapse_only": _random_table(3, shift=0.0),
        },
        n_boot=200,
        twins={1: _random_table(4, shift=0.0), 2: _random_table(5, shift=0.0)},
    ).to_dict()
    v = run_verdict(out)
    assert check_of(v, 1)["status"] == "PASS" and check_of(v, 2)["status"] == "PASS"
    assert check_of(v, 4)["status"] == "NOT RUN"  # no refits: a score table cannot be permuted
    assert all(c["status"] in ("PASS", "FAIL", "INCONCLUSIVE") for c in v["checks"] if c["id"] not in (4, 6))
    assert check_of(v, 6)["status"] == "NOT RUN" and "needs at least 19 twins" in check_of(v, 6)["detail"]
    assert out["bootstrap"]["clusters_by_estimand"]["c1"]["e1"] == out["bootstrap"]["n_clusters"]


# ---------------------------------------------------------------------------------------------
# Score tables on disk
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_read_and_evaluate_score_table(tmp_path, suffix):
    path = tmp_path / f"scores{suffix}"
    if suffix == ".csv":
        HAND.to_csv(path, index=False)
    else:
        HAND.to_parquet(path, index=False)
    t = read_score_table(path)
    assert list(t.columns) == ["trajectory_id", "step", "variant", "score"]
    out = evaluate_score_table(path, n_boot=50)
    assert out["counts"] == {
        "trajectories": 2,
        "steps": 4,
        "rows": 11,
        "rows_by_variant": {"attack": 4, "c_scrambled": 3, "clean": 4},
    }
    assert out["e1"]["estimate"] == pytest.approx(0.75)
    statuses = [c["status"] for c in out["verdict"]["checks"]]
    assert [statuses[1], statuses[3], statuses[4]] == ["NOT RUN"] * 3  # no baselines given
    assert out["verdict"]["claim"] != CLAIM_DETECTS
    json.dumps(out, allow_nan=False)


def _write(tmp_path, text, name="t.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


HEADER = "trajectory_id,step,variant,score\n"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("trajectory_id,step,variant\na,0,clean\n", r"missing column\(s\) 'score'"),
        (HEADER + "a,0,clean,0.1\na,0,attack,\n", r"'score' row 1 \(line 3\): NaN"),
        (HEADER + "a,0,clean,0.1\na,0,attack,x\n", r"'score' row 1 \(line 3\): not a number"),
        (HEADER + "a,0,clean,0.1\na,0,attack,inf\n", r"'score' .*infinite"),
        (HEADER + "a,0,clean,0.1\na,0.5,attack,1\n", r"'step' row 1"),
        (HEADER + "a,0,clean,0.1\na,0,atack,1\n", r"'variant' row 1 .*'atack'"),
        (HEADER + "a,0,clean,0.1\na,0,clean,1\n", r"no 'attack' rows"),
        (HEADER + "a,0,attack,0.1\n", r"no 'clean' rows"),
        (
            "trajectory_id,step,variant,score,weight\na,0,clean,0.1,1\na,0,attack,1,-1\n",
            r"'weight' row 1.*negative",
        ),
        (HEADER + ",0,clean,0.1\na,0,attack,1\n", r"'trajectory_id' row 0"),
    ],
)
def test_read_score_table_errors(tmp_path, text, match):
    p = _write(tmp_path, text)
    with pytest.raises(ValueError, match=match) as err:
        read_score_table(p)
    msg = str(err.value)
    assert str(p) in msg and "\n" not in msg


def test_read_score_table_bad_path(tmp_path):
    with pytest.raises(ValueError, match="unsupported"):
        read_score_table(tmp_path / "x.json")
    with pytest.raises(ValueError, match="no such file"):
        read_score_table(tmp_path / "x.csv")


def test_read_score_table_keeps_literal_ids(tmp_path):
    p = _write(tmp_path, "trajectory_id,step,variant,score\nNA,0,clean,0.1\nNA,0,attack,1\n")
    assert list(read_score_table(p).trajectory_id) == ["NA", "NA"]
