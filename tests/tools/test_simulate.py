"""The planted-truth simulator (ipi.tools.simulate): structure, the analytic truth, the verdict under its truths."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ipi.metrics import weighted_auc
from ipi.protocol import CONTROLS, VARIANTS
from ipi.tools.simulate import (
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
    # Directions are orthonormal; template directions are unit vectors orthogonal to the four.
    q = np.stack([dirs[k] for k in ("content", "box", "text", "pos")])
    assert np.allclose(q @ q.T, np.eye(4), atol=1e-12)
    assert np.allclose(q @ dirs["templates"], 0, atol=1e-12)
    assert np.allclose(np.linalg.norm(dirs["templates"], axis=0), 1)
    # Attack rows carry their template (the real chooser), other rows -1.
    assert (meta.template[meta.variant == "attack"] >= 0).all() and (meta.template[meta.variant != "attack"] == -1).all()


def test_truth_b_has_no_content_signal():
    p = SimParams(n_trajectories=10, n_features=8)
    pa, pb, pc = p.for_truth("a"), p.for_truth("b"), p.for_truth("c")
    assert pa.content > 0 and pb.content == 0 and pb.box == pa.box and pb.text == pa.text
    assert pa.wording == 0 and pb.wording == 0 and pc.wording > 0 and pc.content == 0
    for t in ("twin_token", "twin_seed"):  # token identity only, shared by the twins
        pt = p.for_truth(t)
        assert pt.content == 0 and pt.wording == 0 and pt.lexical > 0
    assert pa.lexical == pb.lexical == pc.lexical == 0
    assert pa.twin().content == 0 and p.twin(2.0).lexical == 2.0 * p.lexical  # a twin keeps token identity


def test_truth_c_attack_rows_carry_their_templates_direction():
    p = SimParams(n_trajectories=30, n_features=64, sigma_traj=0, sigma_step=0, sigma_row=1e-9, pos=0).for_truth("c")
    meta, x, _, dirs = simulate_dataset(p, np.random.default_rng(0))
    att = (meta.variant == "attack").to_numpy()
    scr = (meta.variant == "c_scrambled").to_numpy()
    diff = x[att] - x[scr]  # same step: only the wording direction differs
    np.testing.assert_allclose(diff, p.wording * dirs["templates"][:, meta.template[att].to_numpy()].T, atol=1e-6)


@pytest.mark.parametrize("truth", ["a", "b", "c", "twin_token"])
def test_analytic_truth_matches_a_large_monte_carlo_sample(truth):
    """The CI's target, computed analytically, equals the estimands on 4,000 fresh trajectories."""
    p = SimParams(n_features=32).for_truth(truth)
    rng = np.random.default_rng(1)
    _, _, _, dirs = simulate_dataset(SimParams(n_trajectories=2, n_features=32, lexical=0.9), rng)
    # An arbitrary fixed linear score with weight on every planted direction and on noise ones
    # (and, for truth (c), on some template directions: a probe that learned those templates).
    w = 0.7 * dirs["box"] + 0.5 * dirs["text"] + 0.9 * dirs["content"] + 0.8 * dirs["pos"] \
        + 0.3 * rng.standard_normal(32) + 0.2 * dirs["templates"][:, :5].sum(axis=1) + 0.6 * dirs["lex"]
    family = (0, 1, 2, 3, 9, 17)  # the target population's templates (a held-out family)
    truth_vals = true_estimands(w, p, dirs, family)
    meta, x, _, _ = simulate_dataset(p, rng, dirs=dirs, n_trajectories=4000,
                                     template_of=lambda tid, st: family[hash((tid, st)) % len(family)])
    f = x @ w
    v = meta.variant.to_numpy()
    mc = {"e1": weighted_auc(f[v == "attack"], f[v == "clean"])}
    for c in CONTROLS:
        mc[f"e3.{c}"] = weighted_auc(f[v == "attack"], f[v == c])
    # E2 with one attack and one clean row per step: the share of steps the attack wins.
    mc["e2"] = float(np.mean(f[v == "attack"] > f[v == "clean"]))
    for k, val in mc.items():
        assert truth_vals[k] == pytest.approx(val, abs=0.01), k
    if truth == "c":
        assert truth_vals["e3.c_scrambled"] > 0.55  # the probe reads the family's wording
    if truth == "twin_token":
        assert truth_vals["e3.c_scrambled"] > 0.55  # the probe reads token identity
    if truth == "b":
        assert truth_vals["e3.c_scrambled"] == pytest.approx(0.5, abs=1e-12)
        assert truth_vals["e3.c_imperative"] == pytest.approx(0.5, abs=1e-12)


def test_verdict_licenses_the_claim_under_strong_signal_only():
    """Real pipeline on small datasets: strong content signal -> claim; surface only -> no claim."""
    # 19 twins: fewer leave check 6 NOT RUN (rank level 1/(S+1) above 0.05)
    # 12 test trajectories (Kish about 10): the gate is lowered to 5 to judge them here
    p = SimParams(n_trajectories=40, n_features=64, content=2.0, n_boot=200, n_twins=19, min_clusters=5)
    for i in range(2):
        ra = run_dataset(p, "a", i, seed=0)
        # 12 test trajectories: the collapse-only interval may straddle the 0.60 ceiling
        # (check 5 INCONCLUSIVE), which alone withholds the claim
        assert [ra["checks"][k] for k in "01234"] == ["PASS"] * 5, ra["checks"]
        assert ra["checks"]["5"] in ("PASS", "INCONCLUSIVE")
        assert ra["checks"]["6"] == "PASS"  # content the twin lacks
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
          "--workers", "1", "--twins", "2", "--out", str(out)])
    data = json.loads(out.read_text())
    runs = [r for r in data["records"] if "truth" in r and r.get("kind") != "null"]
    nulls = [r for r in data["records"] if r.get("kind") == "null"]
    # the "separates" table: 2 null datasets and 2 of truth (a) at each default holdout size (14, 24)
    assert sorted(r["n_test_trajectories"] for r in nulls if r["truth"] == "null") == [14, 14, 24, 24]
    assert sorted(r["n_test_trajectories"] for r in nulls if r["truth"] == "a") == [14, 14, 24, 24]
    assert data["summary"]["a/separates-holdout/14"]["claim_separates_or_more"]["n"] == 2
    assert data["summary"]["null/holdout/24"]["claim_separates_or_more"]["n"] == 2
    assert len(runs) == 10 and {r["truth"] for r in runs} == {"a", "b", "c", "twin_token", "twin_seed"}
    assert all(r["n_twins"] == 2 and r["checks"]["6"] in ("NOT RUN", "FAIL") for r in runs)  # S = 2 < 19
    s = data["summary"]
    assert s["twin_seed"]["true_beats_every_twin"]["n"] == 2 and "diff.e3.c_scrambled" in s["a"]["coverage"]
    assert set(s["twin_seed"]["candidates"]) == {"rank", "t_prediction"}
    for truth in ("a", "b", "c", "twin_token", "twin_seed"):
        assert set(s[truth]["claim_detects"]) >= {"rate", "k", "n"}
        assert s[truth]["coverage"]["e1"]["n"] == 2
        k = sum(r["estimands"]["e1"]["covered"] for r in runs if r["truth"] == truth)
        assert s[truth]["coverage"]["e1"]["k"] == k
    # the coverage table (2 datasets per size here) and the 30-cell sweep (default n // 4 = 0 sweeps)
    cov = s["coverage_by_n_test"]
    assert set(cov) == {"expanded", "percentile"} and set(cov["percentile"]) == {"5", "10", "24", "50"}
    assert cov["expanded"]["24"]["e1"]["n"] == 2 and "sweep_b" not in s
    printed = capsys.readouterr().out
    assert "coverage of the 95% CI of E1" in printed and "detects malicious content" in printed
    assert "claim_detects.rate:" in printed and "| expanded | 50 |" in printed
    assert "twin_token: token identity shared by the twins" in printed and "check 6 (selective" in printed
    assert "permutation null" in printed and "permutation" in s["a"]
    # Same seed -> same records, whatever the worker count.
    out2 = tmp_path / "st2.json"
    main(["--n-datasets", "2", "--trajectories", "20", "--features", "8", "--n-boot", "50",
          "--workers", "1", "--twins", "2", "--truths", "b", "--coverage-datasets", "0", "--out", str(out2)])
    again = [r for r in json.loads(out2.read_text())["records"] if r.get("kind") != "null"]
    first_b = [r for r in runs if r["truth"] == "b"]
    for a, b in zip(first_b, again, strict=True):
        assert a["estimands"] == b["estimands"] and a["claim"] == b["claim"]


def test_token_identity_shared_by_the_twins_is_not_licensed():
    """Truth twin_token: attacks differ from controls by token identity the random twins carry too.

    Check 3 passes (E3 > 0.5 by a wide margin), yet the trained E3 does not beat every twin with
    the paired E3 − mean twin E3 interval above 0, so check 6 fails and "detects" is withheld; the
    difference's true value is about 0. (12 test trajectories: the gate is lowered to 5.)
    """
    p = SimParams(n_trajectories=40, n_features=64, lexical=2.0, n_boot=200, n_twins=19, min_clusters=5)
    for i in range(2):
        r = run_dataset(p, "twin_token", i, seed=0)
        assert r["checks"]["3"] == "PASS" and r["estimands"]["e3.c_scrambled"]["estimate"] > 0.7
        assert min(r["twin_e3"][1]["c_scrambled"][1:]) > 0.7  # every twin reads the token identity too
        assert r["checks"]["6"] == "FAIL" and r["claim"] != "detects malicious content"
        assert abs(r["estimands"]["diff.e3.c_scrambled"]["true"]) < 0.02  # coverage is a rate: selftest.md
        assert r["twin_guards"] == [] and r["twin_rank_correlation_max"] < 0.99  # distinct networks
    # Truth (a) with the same twins: content the twins lack passes check 6.
    ra = run_dataset(SimParams(n_trajectories=40, n_features=64, content=2.0, n_boot=200, n_twins=19,
                               min_clusters=5), "a", 0, seed=0)
    assert ra["checks"]["6"] == "PASS" and ra["estimands"]["diff.e3.c_scrambled"]["true"] > 0.1


def test_seed_variance_truth_trained_is_another_random_draw():
    """Truth twin_seed: every network has its own token-identity gain, the trained one included.

    The trained features are generated exactly like a twin's (same law, own generator), so the
    trained probe's population E3 beats all S twins with probability 1/(S+1); with the CI on
    top the claim is rarer still. On a few datasets: the gains differ, check 3 passes through
    token identity alone, and "detects" is never licensed here.
    """
    p = SimParams(n_trajectories=30, n_features=32, lexical=1.5, seed_sd=0.5, n_boot=200, n_twins=2,
                  permutation_m=0, min_clusters=5)
    recs = [run_dataset(p, "twin_seed", i, seed=1) for i in range(3)]
    for r in recs:
        assert len(r["gains"]) == 3 and len(set(r["gains"])) == 3
        assert r["checks"]["3"] == "PASS" and r["checks"]["6"] == "NOT RUN"  # S = 2 < 19
        assert r["claim"] != "detects malicious content"


def test_twins_do_not_change_the_trained_features():
    """Each twin draws from its own generator: the trained features are the same with or without twins."""
    p = SimParams(n_trajectories=6, n_features=8).for_truth("a")
    m1, x1, c1, _ = simulate_dataset(p, np.random.default_rng(5))
    m2, x2, c2, _, xt, dt = simulate_dataset(p, np.random.default_rng(5), twins=[(np.random.default_rng(9), 1.0),
                                                                                 (np.random.default_rng(10), 1.0)])
    assert m1.equals(m2) and np.array_equal(x1, x2) and np.array_equal(c1, c2)
    assert len(xt) == 2 and xt[0].shape == x1.shape and not np.allclose(xt[0], x1) and not np.allclose(xt[0], xt[1])
    # A twin is a rotation of the same process without the content term: norms of mean shifts match.
    assert np.allclose(np.linalg.norm(dt[0]["box"]), 1.0) and np.allclose(dt[0]["box"] @ dt[0]["text"], 0, atol=1e-12)


def test_permutation_test_can_be_switched_off():
    p = SimParams(n_trajectories=20, n_features=8, n_boot=50, permutation_m=0, n_twins=3)
    r = run_dataset(p, "a", 0, seed=0)
    assert r["checks"]["4"] == "NOT RUN" and r["permutation"] is None


def test_truth_c_false_claim_only_when_wording_is_shared():
    """A probe that reads the bank's template wording: held-out wording removes its E3 edge."""
    from ipi.tools.simulate import run_dataset as run

    p = SimParams(n_trajectories=60, n_features=64, wording=6.0, n_boot=200, n_twins=3)
    held = [run(p, "c", i, seed=3) for i in range(2)]
    shared = [run(p, "c_shared", i, seed=3) for i in range(2)]
    for r in held:
        assert r["checks"]["3"] == "FAIL" and r["estimands"]["e3.c_scrambled"]["true"] < 0.53
    for r in shared:  # same truth, bank shared by train and test: the probe's wording edge shows
        assert r["estimands"]["e3.c_scrambled"]["true"] > 0.6


def test_coverage_dataset_has_the_requested_test_size_and_both_intervals():
    from ipi.tools.simulate.runner import coverage_dataset

    for n_test in (5, 10, 24, 50):
        r = coverage_dataset(SimParams(n_features=32, n_boot=100), n_test, 0, seed=0)
        assert r["n_test"] == n_test
        assert set(r["covered"]) == {"expanded", "percentile"} and set(r["covered"]["expanded"]) == {
            "e1", "e2", "e3.c_scrambled", "e3.c_imperative", "e3.c_occlusion"}


def test_sweep_dataset_controls_the_family():
    from ipi.tools.simulate.runner import sweep_dataset

    r = sweep_dataset(SimParams(n_trajectories=30, n_features=32, n_boot=100, n_twins=2), 0, seed=0, n_cells=3)
    assert r["n_cells"] == 3 and isinstance(r["familywise_any_detects"], bool)
    # Holm never licenses more than the nominal verdicts do
    assert r["familywise_any_detects"] <= r["nominal_any_detects"]
    # with twins the family-wise rank part of check 6 is applied, as the sweep report does
    assert isinstance(r["rank_familywise_any"], bool)
    assert r["familywise_any_detects"] <= r["rank_familywise_any"]


def test_null_truth_draws_attack_rows_as_clean_rows():
    """Truth "null": the attack mean is the clean mean (nothing separates them), controls unchanged."""
    from ipi.tools.simulate.truths import variant_means

    p = SimParams(n_features=32)
    rng = np.random.default_rng(0)
    _, _, _, dirs = simulate_dataset(p.for_truth("null"), rng)
    mu = variant_means(p.for_truth("null"), dirs)
    assert np.array_equal(mu["attack"], mu["clean"]) and not np.allclose(mu["c_scrambled"], mu["clean"])
    assert true_estimands(rng.standard_normal(32), p.for_truth("null"), dirs)["e1"] == pytest.approx(0.5, abs=1e-12)


def test_kfold_and_null_designs_test_every_trajectory_and_carry_no_single_probe_truth():
    from dataclasses import replace

    from ipi.tools.simulate.runner import null_params
    from ipi.tools.simulate.truths import NULL_KFOLD_TRAJECTORIES

    r = run_dataset(replace(SimParams(n_trajectories=20, n_features=8, n_boot=50, permutation_m=0, n_twins=2),
                            split="kfold", k=4), "a", 0, seed=0, key=(0, 0, 2))
    assert r["split"] == "kfold" and r["n_test_trajectories"] == 20 and r["n_twins"] == 2
    assert r["estimands"]["e1"]["true"] is None and r["estimands"]["e1"]["covered"] is None
    pn = null_params(SimParams(n_features=8, n_boot=50), "holdout", 14)
    assert (pn.n_twins, pn.permutation_m, pn.split) == (0, 0, "holdout") and round(pn.test_fraction * pn.n_trajectories) == 14
    # K-fold: every trajectory tested, and check 4's refits run (check 1 needs them under K-fold)
    assert NULL_KFOLD_TRAJECTORIES == (14, 42)
    pk = null_params(SimParams(), "kfold", 14)
    assert (pk.n_trajectories, pk.permutation_m, pk.n_twins) == (14, 199, 0)
    rn = run_dataset(pn, "null", 0, seed=0, key=(40, 0, 14, 0))
    assert rn["n_test_trajectories"] == 14 and rn["estimands"]["e1"]["true"] == pytest.approx(0.5, abs=1e-12)


def test_journal_resumes_without_rerunning(tmp_path, capsys):
    """Each finished job is appended to --records; a rerun reads them and gives the same summary."""
    args = ["--n-datasets", "1", "--truths", "b", "--splits", "holdout", "--null-datasets", "1", "--null-sizes", "6",
            "--coverage-datasets", "0", "--sweep-datasets", "0", "--separates-power", "0", "--trajectories", "20",
            "--features", "8",
            "--twins", "1", "--permutations", "0", "--n-boot", "50", "--workers", "1",
            "--records", str(tmp_path / "j.jsonl"), "--out", str(tmp_path / "s.json"), "--summary-only"]
    first = main(args)
    lines = (tmp_path / "j.jsonl").read_text().splitlines()
    assert len(lines) == 2 and {json.loads(x)["job_id"] for x in lines} == {"run/holdout/b/0/0", "null/holdout/6/0/0"}
    # A line cut by a kill at the end is rerun, not fatal.
    (tmp_path / "j.jsonl").write_text("\n".join(lines[:1]) + "\n" + lines[1][:20])
    again = main(args)
    def timeless(summary):  # the rerun job's wall time differs, nothing else
        return {g: {k: v for k, v in d.items() if k != "seconds_per_dataset"} for g, d in summary.items()}

    assert again["jobs_resumed"] == 1 and "records" not in again
    assert timeless(again["summary"]) == timeless(first["summary"])
    assert set(first["summary"]) == {"b", "null/holdout/6"}
    # --journal-only runs nothing and summarises every job of the journal
    only = main(["--records", str(tmp_path / "j.jsonl"), "--journal-only", "--out", str(tmp_path / "o.json")])
    assert only["jobs"] == 2 and timeless(only["summary"]) == timeless(again["summary"])
