"""The planted-truth simulator (ipi.simulate): structure, the analytic truth, the verdict under both truths."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ipi.metrics import weighted_auc
from ipi.simulate import (
    CONTROLS,
    VARIANTS,
    SimParams,
    main,
    run_dataset,
    simulate_dataset,
    true_estimands,
)


def test_dataset_structure():
    p = SimParams(n_trajectories=15, n_features=8)
    meta, x, collapse, dirs = simulate_dataset(p, np.random.default_rng(0))
    assert x.shape == (len(meta), 8) and collapse.shape == (len(meta), 2)
    assert meta.trajectory_id.nunique() == 15
    # Every (trajectory, step) has exactly one row of each variant.
    per_step = meta.groupby(["trajectory_id", "step"]).variant.apply(lambda v: tuple(sorted(v)))
    assert set(per_step) == {tuple(sorted(VARIANTS))}
    # Horizons vary within [h_min, h_max]; steps are 0..H-1; metadata as on i_vis (Δ length 0).
    h = meta.groupby("trajectory_id").horizon.first()
    assert h.between(p.h_min, p.h_max).all() and h.nunique() > 1
    steps = meta.groupby("trajectory_id").step.agg(["min", "max"])
    assert (steps["min"] == 0).all() and (steps["max"] == h - 1).all()
    assert (meta.delta_prompt_len == 0).all()
    assert meta.groupby(["trajectory_id", "step"]).prompt_len.nunique().eq(1).all()
    # Directions are orthonormal.
    q = np.stack(list(dirs.values()))
    assert np.allclose(q @ q.T, np.eye(len(q)), atol=1e-12)
    assert set(dirs) == {"content", "box", "text", "pos", "lex"}  # lex: token identity (truth c)


def test_truth_b_has_no_content_signal():
    p = SimParams(n_trajectories=10, n_features=8)
    pa, pb = p.for_truth("a"), p.for_truth("b")
    assert pa.content > 0 and pb.content == 0 and pb.box == pa.box and pb.text == pa.text
    pc = p.for_truth("c")
    assert pc.content == 0 and pc.lexical > 0 and pa.lexical == 0 and pb.lexical == 0
    assert pa.twin().content == 0 and pc.twin().lexical == pc.lexical  # the twin keeps token identity


@pytest.mark.parametrize("truth", ["a", "b", "c"])
def test_analytic_truth_matches_a_large_monte_carlo_sample(truth):
    """The CI's target, computed analytically, equals the estimands on 4,000 fresh trajectories."""
    p = SimParams(n_features=16).for_truth(truth)
    rng = np.random.default_rng(1)
    _, _, _, dirs = simulate_dataset(SimParams(n_trajectories=2, n_features=16), rng)
    # An arbitrary fixed linear score with weight on every planted direction and on noise ones.
    w = 0.7 * dirs["box"] + 0.5 * dirs["text"] + 0.9 * dirs["content"] + 0.8 * dirs["pos"] \
        + 0.3 * rng.standard_normal(16)
    truth_vals = true_estimands(w, p, dirs)
    meta, x, _, _ = simulate_dataset(p, rng, dirs=dirs, n_trajectories=4000)
    f = x @ w
    v = meta.variant.to_numpy()
    mc = {"e1": weighted_auc(f[v == "attack"], f[v == "clean"])}
    for c in CONTROLS:
        mc[f"e3.{c}"] = weighted_auc(f[v == "attack"], f[v == c])
    # E2 with one attack and one clean row per step: the share of steps the attack wins.
    mc["e2"] = float(np.mean(f[v == "attack"] > f[v == "clean"]))
    for k, val in mc.items():
        assert truth_vals[k] == pytest.approx(val, abs=0.01), k
    if truth == "b":
        assert truth_vals["e3.c_scrambled"] == pytest.approx(0.5, abs=1e-12)
        assert truth_vals["e3.c_imperative"] == pytest.approx(0.5, abs=1e-12)


def test_verdict_licenses_the_claim_under_strong_signal_only():
    """Real pipeline on small datasets: strong content signal -> claim; surface only -> no claim."""
    p = SimParams(n_trajectories=40, n_features=64, content=2.0, n_boot=200)
    for i in range(2):
        ra = run_dataset(p, "a", i, seed=0)
        # 12 test trajectories: the collapse-only interval may straddle the 0.60 ceiling
        # (check 5 INCONCLUSIVE), which alone withholds the claim
        assert [ra["checks"][k] for k in "1234"] == ["PASS"] * 4, ra["checks"]
        assert ra["checks"]["5"] in ("PASS", "INCONCLUSIVE")
        assert (ra["claim"] == "detects malicious content") == (ra["checks"]["5"] == "PASS"), ra["checks"]
        rb = run_dataset(p, "b", i, seed=0)
        assert rb["claim"] != "detects malicious content"
        assert rb["checks"]["3"] == "FAIL" and rb["checks"]["1"] == "PASS"
        assert rb["estimands"]["e3.c_scrambled"]["true"] == pytest.approx(0.5, abs=1e-12)
        for r in (ra, rb):
            assert r["n_test_trajectories"] == 12
            # the exact permutation test ran on M = 199 refits: significant, null centred
            assert r["checks"]["4"] == "PASS" and r["permutation"]["p_value"] == pytest.approx(1 / 200)
            assert abs(r["permutation"]["null_mean"] - 0.5) <= 0.02
            assert r["permutation"]["e1_refit"] == pytest.approx(r["estimands"]["e1"]["estimate"], abs=1e-4)
            for iv in r["estimands"].values():
                assert iv["ci_low"] <= iv["estimate"] <= iv["ci_high"]


def test_cli_writes_records_and_summary(tmp_path, capsys):
    out = tmp_path / "st.json"
    main(["--n-datasets", "2", "--trajectories", "20", "--features", "8", "--n-boot", "50",
          "--workers", "1", "--out", str(out)])
    data = json.loads(out.read_text())
    assert len(data["records"]) == 6 and {r["truth"] for r in data["records"]} == {"a", "b", "c"}
    s = data["summary"]
    printed = capsys.readouterr().out
    assert "truth (c): token identity shared by the twin" in printed
    for truth in ("a", "b", "c"):
        assert s[truth]["coverage"]["e1"]["n"] == 2
        k = sum(r["estimands"]["e1"]["covered"] for r in data["records"] if r["truth"] == truth)
        assert s[truth]["coverage"]["e1"]["k"] == k
    assert "coverage of the 95% CI of E1" in printed and "detects malicious content" in printed
    assert "permutation null" in printed and "permutation" in s["a"]
    # Same seed -> same records, whatever the worker count.
    out2 = tmp_path / "st2.json"
    main(["--n-datasets", "2", "--trajectories", "20", "--features", "8", "--n-boot", "50",
          "--workers", "1", "--truths", "b", "--out", str(out2)])
    again = [r for r in json.loads(out2.read_text())["records"]]
    first_b = [r for r in data["records"] if r["truth"] == "b"]
    for a, b in zip(first_b, again, strict=True):
        assert a["estimands"] == b["estimands"] and a["claim"] == b["claim"]


def test_token_identity_shared_by_the_twin_is_not_licensed():
    """Truth (c): attacks differ from controls by token identity the random twin carries as well.

    Check 3 passes (E3 > 0.5 by a wide margin), yet the paired E3 − twin E3 interval is not above 0,
    so check 6 fails and "detects" is withheld; the difference's true value is ~0.
    """
    p = SimParams(n_trajectories=40, n_features=64, lexical=2.0, n_boot=200)
    for i in range(2):
        r = run_dataset(p, "c", i, seed=0)
        assert r["checks"]["3"] == "PASS" and r["estimands"]["e3.c_scrambled"]["estimate"] > 0.7
        assert r["estimands"]["twin.e3.c_scrambled"]["estimate"] > 0.7
        assert r["checks"]["6"] == "FAIL" and r["claim"] != "detects malicious content"
        assert abs(r["estimands"]["diff.e3.c_scrambled"]["true"]) < 0.05  # coverage is a rate: selftest.md
    # Truth (a) with the same twin: content the twin lacks passes check 6.
    ra = run_dataset(SimParams(n_trajectories=40, n_features=64, content=2.0, n_boot=200), "a", 0, seed=0)
    assert ra["checks"]["6"] == "PASS" and ra["estimands"]["twin.e3.c_scrambled"]["true"] == pytest.approx(0.5, abs=1e-9)


def test_twin_features_do_not_change_the_trained_features():
    """The twin draws from its own generator: the trained-feature dataset is the same with or without it."""
    p = SimParams(n_trajectories=6, n_features=8).for_truth("a")
    m1, x1, c1, _ = simulate_dataset(p, np.random.default_rng(5))
    m2, x2, c2, _, x_twin, dirs_twin = simulate_dataset(p, np.random.default_rng(5), twin_rng=np.random.default_rng(9))
    assert m1.equals(m2) and np.array_equal(x1, x2) and np.array_equal(c1, c2)
    assert x_twin.shape == x1.shape and not np.allclose(x_twin, x1)
    assert set(dirs_twin) == {"content", "box", "text", "pos", "lex"}


def test_permutation_test_can_be_switched_off():
    p = SimParams(n_trajectories=20, n_features=8, n_boot=50, permutation_m=0)
    r = run_dataset(p, "a", 0, seed=0)
    assert r["checks"]["4"] == "NOT RUN" and r["permutation"] is None
