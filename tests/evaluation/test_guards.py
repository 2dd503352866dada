"""The verdict's guards of issue 22, one test per kind, each with the input that would pass wrongly
and the input that should pass (twin guards: tests/evaluation/test_check6.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ipi.evaluation.verdict import FAIL, NOT_RUN, PASS
from tests.conftest import check_of, run_verdict
from ipi.metrics.compare import compare_tables
from ipi.metrics.estimands import estimands, kish
from ipi.metrics.table import check_id_collisions, validate_table
from tests.evaluation.test_verdict import _iv, _results
from tests.metrics.test_estimands import CASES

# --- check 3 needs c_scrambled (and c_imperative) ---------------------------------------------


def test_check3_needs_the_required_controls():
    r = _results()
    assert check_of(run_verdict(r), 3)["status"] == PASS  # both required controls present: judged
    # what control=occlusion produces: only c_occlusion, with a fine interval
    r["e3"] = {"c_occlusion": _iv(0.8, 0.7, 0.9)}
    r["bootstrap"]["clusters_by_estimand"]["e3"] = {"c_occlusion": 24}
    c3 = check_of(run_verdict(r), 3)
    assert c3["status"] == NOT_RUN
    assert "check 3 needs c_scrambled and c_imperative" in c3["detail"] and "lacks c_scrambled, c_imperative" in c3["detail"]
    assert run_verdict(r)["claim"] != "detects malicious content"
    # a surface that requires c_scrambled only (its own required_controls) is judged without c_imperative
    r = _results()
    del r["e3"]["c_imperative"]
    assert check_of(run_verdict(r), 3)["status"] == NOT_RUN  # unknown surface: both required
    assert check_of(run_verdict(r, required_controls=("c_scrambled",)), 3)["status"] == PASS


# --- check 3 is judged only on held-out wording (PROTOCOL.md §7.3) -------------------------------


def test_check3_needs_heldout_wording():
    r = _results()
    # the run says its wording was held out (train.py's default) or says nothing (a score table): judged
    assert check_of(run_verdict(r, heldout_wording=True), 3)["status"] == PASS
    assert check_of(run_verdict(r), 3)["status"] == PASS
    # the same E3 lines from a run with evaluation.heldout_wording=false (what walked the planted
    # lexical backbone of issue 23 into "detects"): remembered wording, so check 3 is NOT RUN
    c3 = check_of(run_verdict(r, heldout_wording=False), 3)
    assert c3["status"] == NOT_RUN and "held-out wording is off" in c3["detail"]
    assert c3["numbers"]["heldout_wording"] is False
    assert run_verdict(r, heldout_wording=False, pretrained=True)["claim"] != "detects malicious content"


# --- an interval that is not reportable cannot pass a check ------------------------------------


@pytest.mark.parametrize(("bad", "reason"), [
    (_iv(1.0, 1.0, 1.0), "degenerate interval [1.000, 1.000]"),
    ({"estimate": 0.8, "ci_low": 0.7, "ci_high": 0.9, "n_boot_used": 600}, "only 600 of 1000 bootstrap replicates usable"),
    ({"estimate": 0.8, "ci_low": None, "ci_high": None, "n_boot_used": 0}, "undefined interval"),
])
def test_non_reportable_interval_cannot_pass(bad, reason):
    r = _results()
    assert check_of(run_verdict(r), 3)["status"] == PASS
    r["e3"]["c_scrambled"] = bad  # [1.000, 1.000] from 5 within-step pairs would have PASSED check 3
    c3 = check_of(run_verdict(r), 3)
    assert c3["status"] == NOT_RUN and reason in c3["detail"]


# --- the gate counts effective clusters (Kish), not trajectories -------------------------------


def _table(rng, n_traj=29, controls=("c_scrambled", "c_imperative")):
    rows = []
    for t in range(n_traj):
        for s in range(int(rng.integers(3, 8))):
            base = rng.normal(0, 1)
            rows.append((f"t{t:02d}", s, "clean", base + rng.normal(0, 1)))
            rows.append((f"t{t:02d}", s, "attack", base + 2.0 + rng.normal(0, 1)))
            for c in controls:
                rows.append((f"t{t:02d}", s, c, base + 0.5 + rng.normal(0, 1)))
    return pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])


def test_gate_counts_effective_clusters_not_trajectories():
    rng = np.random.default_rng(3)
    t = _table(rng)
    heavy = t.trajectory_id.isin(["t00", "t01", "t02"])
    res = estimands(t.assign(weight=np.where(heavy, 1.0, 1e-9)), n_boot=50)
    assert res.cluster_counts()["e1"] == 29  # what the old gate counted
    # hand-worked Kish of the attack side: W_t = sum of the trajectory's row weights
    w = t.assign(weight=np.where(heavy, 1.0, 1e-9))
    per = w[w.variant == "attack"].groupby("trajectory_id")["weight"].sum().to_numpy()
    per_c = w[w.variant == "clean"].groupby("trajectory_id")["weight"].sum().to_numpy()
    assert res.effective["e1"] == pytest.approx(min(per.sum() ** 2 / np.sum(per**2), per_c.sum() ** 2 / np.sum(per_c**2)))
    assert res.effective["e1"] < 3.5
    out = compare_tables(t.assign(weight=np.where(heavy, 1.0, 1e-9)), n_boot=200).to_dict()
    v = run_verdict(out)
    assert check_of(v, 1)["status"] == NOT_RUN and "effective test trajectories" in check_of(v, 1)["detail"]
    # equal weights: Kish close to the 29 trajectories (horizons vary), the checks are judged
    out = compare_tables(t, n_boot=200).to_dict()
    assert out["bootstrap"]["effective_clusters_by_estimand"]["e1"] > 20
    assert check_of(run_verdict(out), 1)["status"] == PASS
    assert kish([1, 1, 1, 1]) == 4.0 and kish([1, 0, 0]) == 1.0


# --- trajectory ids equal after normalisation are an error -------------------------------------


def test_ids_equal_after_normalisation_are_an_error():
    check_id_collisions(["traj-1", "traj-2", "Traj-3"])  # distinct: fine
    for a, b in (("traj-1", "TRAJ-1"), ("traj-1", " traj-1"), ("traj-1", "ｔｒａｊ-1")):
        with pytest.raises(ValueError, match=f"trajectory ids .* are the same after normalisation"):
            check_id_collisions([a, b, "other"])
    rng = np.random.default_rng(4)
    t = _table(rng, n_traj=3)
    validate_table(t)  # three distinct trajectories
    twice = pd.concat([t, t.assign(trajectory_id=t.trajectory_id.str.upper())], ignore_index=True)
    with pytest.raises(ValueError, match="scores.csv: trajectory ids 'T00' and 't00' are the same"):
        validate_table(twice, "scores.csv")  # the same 3 exported twice: would count as 6


# --- E1 from never-attacked trajectories cannot license "separates" ----------------------------


def _sites_table(seed=3, n_att=18, n_clean=90, site_att=2.4, delta=0.1):
    """Attacked trajectories on high-scoring sites among clean-only ones; within a step attack ≈ clean."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(n_att + n_clean):
        attacked = t < n_att
        site = (site_att if attacked else 0.0) + rng.normal(0, 0.3)
        for s in range(int(rng.integers(6, 11))):
            base = site + rng.normal(0, 0.5)
            rows.append((f"x{t:03d}", s, "clean", base + rng.normal(0, 1)))
            if attacked:
                rows.append((f"x{t:03d}", s, "attack", base + delta + rng.normal(0, 1)))
    return pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])


def test_e1_from_never_attacked_trajectories_does_not_separate():
    out = compare_tables(_sites_table(), n_boot=500).to_dict()
    assert out["e1"]["ci_low"] > 0.5 and out["e1"]["estimate"] > 0.8  # pooled E1 would PASS check 1
    c1 = check_of(run_verdict(out), 1)
    assert c1["status"] == FAIL and c1["detail"].startswith("E1 over the steps having attack and clean rows 0.5")
    assert "pooled E1, the headline" in c1["detail"]
    # the mirror: a real within-step signal on low-scoring sites; pooled E1 would refuse it
    mirror = _sites_table(site_att=-3.5, delta=2.0)
    out = compare_tables(mirror, n_boot=500).to_dict()
    assert out["e1"]["ci_high"] < 0.5  # pooled E1 would FAIL check 1
    assert check_of(run_verdict(out), 1)["status"] == PASS


@pytest.mark.skipif(not CASES, reason="no protocol cases")
def test_e1_paired_equals_e1_on_ordinary_tables():
    rng = np.random.default_rng(5)
    t = _table(rng)
    res = estimands(t, n_boot=50)
    assert res.e1_paired.estimate == res.e1.estimate and res.e1_paired.ci_low == res.e1.ci_low
    for case in CASES:
        tbl = pd.read_csv(case)
        r = estimands(tbl, n_boot=10)
        if case.stem == "ties_and_missing":  # 38 clean-only steps: the two readings differ (docs/estimands.md)
            assert r.e1_paired.estimate == pytest.approx(0.8330898466033602, abs=1e-12)
        else:
            assert r.e1_paired.estimate == pytest.approx(r.e1.estimate, abs=1e-15)


# --- the same trajectories under new ids (two exports concatenated) ------------------------------


def _copies(t: pd.DataFrame, times: int, noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    parts = [t.assign(trajectory_id=t.trajectory_id + f"-export{k}",
                      score=t.score + (rng.normal(0, noise * t.score.std(), len(t)) if k and noise else 0.0))
             for k in range(times)]
    return pd.concat(parts, ignore_index=True)


def test_trajectories_counted_twice_are_refused_naming_both_ids(tmp_path):
    from ipi.evaluation.scoretable import evaluate_score_table

    t = _table(np.random.default_rng(6), n_traj=6)
    tripled = _copies(t, 3)
    # what the guard stops: 6 trajectories as 18 clusters pass the Kish gate and "separate" with an
    # interval 18 clusters would give
    out = compare_tables(tripled, n_boot=300).to_dict()
    assert check_of(run_verdict(out), 1)["status"] == PASS
    assert check_of(run_verdict(compare_tables(t, n_boot=300).to_dict()), 1)["status"] == NOT_RUN  # 6 < 12
    path = tmp_path / "scores.csv"
    tripled.to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"scores.csv: trajectories 't00-export0' and 't00-export1' have the "
                                         r"same \d+ rows .* would count as two clusters"):
        evaluate_score_table(path, n_boot=50)


@pytest.mark.parametrize("noise", [1e-9, 1e-5, 1e-3])
def test_copies_with_numeric_noise_or_rounding_are_refused(noise, tmp_path):
    from ipi.evaluation.scoretable import read_score_table

    t = _table(np.random.default_rng(7), n_traj=8)
    path = tmp_path / "rounded.csv"
    _copies(t, 2, noise=noise).round(4).to_csv(path, index=False)  # noise, then 4 decimals in the CSV
    with pytest.raises(ValueError, match="'t00-export0' and 't00-export1'"):
        read_score_table(path)


def test_distinct_trajectories_of_the_same_shape_are_kept():
    from ipi.metrics.table import check_copied_trajectories

    rng = np.random.default_rng(8)
    t = pd.DataFrame([(f"t{k:02d}", s, v, rng.normal() + (v == "attack"))
                      for k in range(40) for s in range(2) for v in ("clean", "attack", "c_scrambled")],
                     columns=["trajectory_id", "step", "variant", "score"])
    assert check_copied_trajectories(t) == []  # 40 trajectories of one shape: 780 pairs, none a copy
    # two trajectories that share one step exactly (the same page) but not the other are distinct
    t.loc[(t.trajectory_id == "t01") & (t.step == 0), "score"] = t.loc[(t.trajectory_id == "t00") & (t.step == 0),
                                                                        "score"].to_numpy()
    assert check_copied_trajectories(t) == []


def test_tied_scores_agree_by_chance_and_are_kept_with_a_warning():
    from ipi.metrics.table import check_copied_trajectories

    # a binary detector: one-step trajectories (clean 0, attack 1) agree by chance, so they are kept
    t = pd.DataFrame([(f"t{k:02d}", 0, v, float(v == "attack")) for k in range(20) for v in ("clean", "attack")],
                     columns=["trajectory_id", "step", "variant", "score"])
    t.loc[t.index[-1], "score"] = 0.0  # not every attack scores 1: the values carry a little information
    warnings = check_copied_trajectories(t, "binary.csv")
    assert warnings and all("kept as two trajectories" in w for w in warnings)
    # the same binary detector on long trajectories copied under new ids: no coincidence, refused
    rng = np.random.default_rng(9)
    long = pd.DataFrame([(f"t{k:02d}", s, v, float(rng.random() < (0.8 if v == "attack" else 0.3)))
                         for k in range(6) for s in range(12) for v in ("clean", "attack")],
                        columns=["trajectory_id", "step", "variant", "score"])
    with pytest.raises(ValueError, match="agreement by chance about"):
        check_copied_trajectories(_copies(long, 2), "binary.csv")


# --- attacks on the copy guard: copies that are not row-for-row equal ------------------------------


@pytest.mark.parametrize("how", ["drop_steps", "renumber_steps", "drop_a_variant"])
def test_partial_copies_are_refused_naming_both_ids(how, tmp_path):
    """A copy with steps dropped or renumbered has other rows than its source, so the same-rows test
    never compares the two; its exact continuous scores give it away."""
    from ipi.evaluation.scoretable import read_score_table

    t = _table(np.random.default_rng(11), n_traj=8)
    src = t[t.trajectory_id == "t03"].copy()
    if how == "drop_steps":
        src = src[src.step > src.step.min() + 1]
    elif how == "renumber_steps":
        src["step"] = src["step"] + 100
    else:
        src = src[src.variant != "c_imperative"]
    path = tmp_path / "concatenated.csv"
    pd.concat([t, src.assign(trajectory_id="renamed-07")], ignore_index=True).to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"concatenated.csv: trajectories 'renamed-07' and 't03' share \d+ of \d+ "
                                         r"distinct scores \(equal to \d+ decimals"):
        read_score_table(path)


def test_partial_copy_guard_leaves_distinct_and_discrete_tables_alone():
    from ipi.metrics.table import check_copied_trajectories

    rng = np.random.default_rng(12)
    t = _table(rng, n_traj=30)
    assert check_copied_trajectories(t) == []  # continuous, distinct: nothing shared
    # a detector with 2-decimal scores: values recur across trajectories by chance, never a copy
    coarse = t.assign(score=np.round(rng.random(len(t)), 2))
    check_copied_trajectories(coarse.head(60))
    check_copied_trajectories(coarse)
    # two trajectories sharing two exact values (one shared page) stay below the minimum of three
    t2 = t.copy()
    a, b = t2.trajectory_id == "t00", t2.trajectory_id == "t01"
    t2.loc[t2.index[b][:2], "score"] = t2.loc[t2.index[a][:2], "score"].to_numpy()
    t2.loc[t2.index[b][:2], "variant"] = t2.loc[t2.index[a][:2], "variant"].to_numpy()
    assert check_copied_trajectories(t2) == []


def _partial(t: pd.DataFrame, tid: str, new: str) -> pd.DataFrame:
    src = t[t.trajectory_id == tid]
    return src[src.step > src.step.min() + 1].assign(trajectory_id=new)


@pytest.mark.parametrize("how", ["both_rounded_4", "copy_rounded_4", "copy_rounded_6", "copy_float32",
                                 "tripled_each_dropping_a_step", "beside_an_integer_scored_trajectory"])
def test_partial_copies_rounded_or_float32_are_refused(how):
    """Exact equality let a partial copy through when either export was rounded (a CSV written with
    %.4f), stored as float32, or when one integer-scored trajectory coarsened the table's grid."""
    from ipi.metrics.table import check_copied_trajectories

    t = _table(np.random.default_rng(11), n_traj=8)
    copy = _partial(t, "t03", "renamed")
    if how == "both_rounded_4":
        tab = pd.concat([t, copy]).round(4)
    elif how == "copy_rounded_4":
        tab = pd.concat([t, copy.round(4)])
    elif how == "copy_rounded_6":
        tab = pd.concat([t, copy.round(6)])
    elif how == "copy_float32":
        tab = pd.concat([t, copy.assign(score=copy.score.astype(np.float32).astype(np.float64))])
    elif how == "tripled_each_dropping_a_step":
        tab = pd.concat([t.assign(trajectory_id=t.trajectory_id + f"-x{k}")[t.step % 3 != k] for k in range(3)]).round(4)
    else:
        z = t[t.trajectory_id == "t00"]
        z = z.assign(trajectory_id="integer", score=(z.score > z.score.median()).astype(float))
        tab = pd.concat([t, copy, z])
    with pytest.raises(ValueError, match=r"share \d+ of \d+ distinct scores \(equal to \d+ decimals"):
        check_copied_trajectories(tab.reset_index(drop=True))


@pytest.mark.parametrize("decimals", [None, 6, 4, 3, 2])
def test_distinct_saturated_probe_scores_at_any_precision_are_kept(decimals):
    """The input that should pass: 42 distinct trajectories of a confident probe (scores crowding 0
    and 1, so rounded values recur across trajectories), at full precision and rounded."""
    from scipy.special import expit

    from ipi.metrics.table import check_copied_trajectories

    for seed in range(8):
        rng = np.random.default_rng(seed)
        rows = [(f"t{k}", s, v, float(expit(rng.normal({"clean": -6, "attack": 6}.get(v, 2), 2.5))))
                for k in range(42) for s in range(int(rng.integers(2, 13)))
                for v in ("clean", "attack", "c_scrambled", "c_imperative", "c_occlusion")]
        t = pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])
        assert check_copied_trajectories(t if decimals is None else t.round(decimals)) == []


# --- out-of-fold K-fold scores given to evaluate.py as if from a holdout -----------------------


def _separating_table(n_traj: int = 30, n_steps: int = 4, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [{"trajectory_id": f"t{t}", "step": s, "variant": v, "score": rng.normal(1.5 if v == "attack" else 0.0, 1.0)}
            for t in range(n_traj) for s in range(n_steps) for v in ("clean", "attack")]
    return pd.DataFrame(rows)


def test_kfold_scores_are_judged_as_kfold_whatever_the_split_given(tmp_path, caplog):
    """A table whose fold column shows several folds (train.py split=kfold writes it) is
    out-of-fold K-fold scores: given as a holdout (evaluate.py's default split), check 1 would
    pass on the bootstrap alone, which is anti-conservative under K-fold (PROTOCOL.md §7.1)."""
    from ipi.evaluation.scoretable import evaluate_score_table

    table = _separating_table()
    flat = tmp_path / "holdout.csv"
    table.to_csv(flat, index=False)
    # the input that should pass: one probe's scores (no fold column, or a single fold)
    for path in (flat,):
        r = evaluate_score_table(path, n_boot=200, split="holdout")
        assert check_of(r["verdict"], 1)["status"] == PASS and r["verdict"]["claim"].startswith("separates")
    one = tmp_path / "one_fold.csv"
    table.assign(fold=0).to_csv(one, index=False)
    assert check_of(evaluate_score_table(one, n_boot=200, split="holdout")["verdict"], 1)["status"] == PASS
    # the input that would pass wrongly: five folds' out-of-fold scores, split left at holdout
    kfold = tmp_path / "kfold.csv"
    table.assign(fold=table.trajectory_id.str[1:].astype(int) % 5).to_csv(kfold, index=False)
    with caplog.at_level("WARNING"):
        r = evaluate_score_table(kfold, n_boot=200, split="holdout")
    one_ = check_of(r["verdict"], 1)
    assert one_["status"] == NOT_RUN and "K-fold" in one_["detail"] and "permutation" in one_["detail"]
    assert "permutation p <=" in one_["rule"] and r["verdict"]["claim"] == "none"
    assert "holds 5 folds" in caplog.text and "kfold.csv" in caplog.text
