"""End to end: composed runs on real shared trajectories, the evaluate entry point, a multirun."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from ipi.reporting.report import html_escape
from tests.conftest import REPO, SHARED, SMALL_BACKBONE_OVERRIDES, check_of, compose_train

pytestmark = pytest.mark.needs_shared

INTERVAL_KEYS = {"estimate", "ci_low", "ci_high", "n_boot_used"}


def _check_interval(iv):
    assert set(iv) == INTERVAL_KEYS
    assert iv["ci_low"] <= iv["estimate"] + 1e-12 and iv["estimate"] <= iv["ci_high"] + 1e-12


def test_train_end_to_end_and_cache_reuse(tmp_path):
    from ipi.run.tasks import train

    # 2 test trajectories: below the default evaluation.min_clusters=5 the verdict would be NOT RUN
    # (tested in test_estimands); lowered here so all five checks run on this small data.
    ov = ["data.max_trajectories=4", "split.test_fraction=0.5", "evaluation.n_boot=200",
          "evaluation.min_clusters=2", "evaluation.random_twin=true", "evaluation.random_twin_seeds=[1,2]"]
    cfg = compose_train(tmp_path, ov)
    results, objs = train(cfg)
    run = tmp_path / "run"
    on_disk = json.loads((run / "results.json").read_text())
    assert on_disk == json.loads(json.dumps(results))
    for key in ("e1", "e2"):
        _check_interval(on_disk[key])
    assert set(on_disk["e3"]) == {"c_scrambled", "c_imperative", "c_occlusion"}
    for iv in on_disk["e3"].values():
        _check_interval(iv)
    _check_interval(on_disk["c1"]["e1"])
    _check_interval(on_disk["c1"]["e2"])
    assert [c["id"] for c in on_disk["verdict"]["checks"]] == [0, 1, 2, 3, 4, 5, 6]
    assert on_disk["verdict"]["claim"] in {
        "detects malicious content", "separates clean steps from this attack surface on this split", "none"}
    counts = on_disk["counts"]
    assert counts["trajectories"] == 4 and counts["trajectories_test"] == 2
    assert counts["rows"] == 5 * counts["steps"]
    report = (run / "report.md").read_text()
    assert report.index("Verdict") < report.index("Estimands")
    assert (run / "csv" / "metrics.csv").exists()

    # E1 recomputed independently from the written scores (one attack, one clean row per step).
    scores = pd.read_csv(run / "scores.csv")
    assert "fold" not in scores.columns  # one probe scored every row: a holdout's table is unchanged
    ac = scores[scores.variant.isin(["attack", "clean"])]
    e1 = roc_auc_score((ac.variant == "attack").astype(int), ac.score)
    assert on_disk["e1"]["estimate"] == pytest.approx(e1, abs=1e-12)
    for c in ("c_scrambled", "c_occlusion"):
        sub = scores[scores.variant.isin(["attack", c])]
        e3 = roc_auc_score((sub.variant == "attack").astype(int), sub.score)
        assert on_disk["e3"][c]["estimate"] == pytest.approx(e3, abs=1e-12)
    # The test rows are exactly the test trajectories' rows, and no trajectory is on both sides.
    assert scores.trajectory_id.nunique() == 2

    info1 = json.loads((run / "run_info.json").read_text())["extraction"]
    assert info1["cache_hit"] is False and info1["rows_forwarded"] == counts["rows"]

    # The random-weight twins (seeds 1, 2): every estimand on the same test rows, check 6's paired
    # difference E3 − mean twin E3 on the same draws, one cache entry per seed; the tiny backbone's
    # own weights are random, so check 6 FAILs and says why.
    twin = on_disk["random_twin"]
    assert twin["seeds"] == ["1", "2"] and set(twin["by_seed"]) == {"1", "2"} and twin["guards"] == []
    for s in ("1", "2"):
        _check_interval(twin["by_seed"][s]["e1"])
    assert set(on_disk["differences"]["e3_minus_mean_twin_e3"]) == set(on_disk["e3"])
    for c, iv in on_disk["differences"]["e3_minus_mean_twin_e3"].items():
        mean = np.mean([twin["by_seed"][s]["e3"][c]["estimate"] for s in ("1", "2")])
        assert iv["estimate"] == pytest.approx(on_disk["e3"][c]["estimate"] - mean, abs=1e-12)
    tw_run = on_disk["run"]["random_twin"]
    assert tw_run["seeds"] == [1, 2] and tw_run["backbone_pretrained"] is False
    assert len(set(tw_run["cache_keys"].values())) == 2
    assert not set(tw_run["cache_keys"].values()) & set(on_disk["run"]["cache_keys"].values())
    check6 = check_of(on_disk["verdict"], 6)
    assert check6["status"] == "FAIL" and "backbone.pretrained=false" in check6["detail"]
    assert on_disk["verdict"]["claim"] != "detects malicious content"
    assert "Trained vs random-weight twin" in report and "at most" in report
    # report.md and report.html state every check as results.json's verdict applied it: its status,
    # its detail and its rule in the verdict's own words (PROTOCOL.md §7)
    html = (run / "report.html").read_text()
    for c in on_disk["verdict"]["checks"]:
        assert f"- [{c['status']}] {c['id']}. {c['name']}: {c['detail']}" in report
        assert f"  - rule: {c['rule']}" in report
        assert all(html_escape(c[k]) in html for k in ("detail", "rule")), c["id"]
    assert on_disk["verdict"]["claim"] in report and on_disk["verdict"]["claim"] in html
    tw_info = json.loads((run / "run_info.json").read_text())["extraction_random_twin"]
    assert set(tw_info) == {"1", "2"} and all(i["rows_forwarded"] == counts["rows"] for i in tw_info.values())
    # The written score tables re-evaluate to the same paired twin differences (evaluate.py's path).
    from ipi.evaluation.scoretable import evaluate_score_table

    again = evaluate_score_table(run / "scores.csv", twin=run / "scores_twin.csv", n_boot=200, seed=0,
                                 min_clusters=2, pretrained=False)
    assert again["differences"]["e3_minus_mean_twin_e3"] == on_disk["differences"]["e3_minus_mean_twin_e3"]
    assert again["random_twin"] == twin and check_of(again["verdict"], 6) == check6

    # Second identical run: the cache is reused (no forward pass) and results are identical.
    results2, objs2 = train(compose_train(tmp_path, ov))
    info2 = json.loads((run / "run_info.json").read_text())["extraction"]
    assert info2["cache_hit"] is True and info2["rows_forwarded"] == 0
    assert all(i["cache_hit"] for i in json.loads((run / "run_info.json").read_text())["extraction_random_twin"].values())
    assert info2["cache_key"] == info1["cache_key"]
    assert json.loads((run / "results.json").read_text()) == on_disk

    # Auxiliary checks (PROTOCOL.md §6) all ran, each with an interval, and the five verdict lines
    # carry numbers; the transfer probe trained on i_dom ∪ i_tool, each surface under its own
    # cache key (reused by the second run).
    for key in ("permuted", "collapse_only", "transfer"):
        _check_interval(on_disk[key]["e1"])
    # Held-out wording (default on): no bank entry on both sides, families recorded.
    wording = on_disk["run"]["wording"]
    assert wording["heldout"] is True and wording["overlap"] == 0 and wording["scheme"] == "holdout"
    assert not set(wording["train_families"]["templates"]) & set(wording["test_families"]["templates"])
    assert on_disk["run"]["transfer"] == {"train_surfaces": ["i_dom", "i_tool"], "test_surface": "i_vis"}
    assert set(on_disk["run"]["cache_keys"]) == {"i_vis", "i_dom", "i_tool"}
    assert len(set(on_disk["run"]["cache_keys"].values())) == 3
    by_surface = json.loads((run / "run_info.json").read_text())["extraction_by_surface"]
    assert all(i["cache_hit"] for i in by_surface.values())
    assert all(c["status"] != "NOT RUN" for c in on_disk["verdict"]["checks"])
    diffs = on_disk["differences"]
    assert diffs["e1_minus_c1_e1"]["estimate"] == pytest.approx(
        on_disk["e1"]["estimate"] - on_disk["c1"]["e1"]["estimate"], abs=1e-12)
    assert set(diffs["e1_minus_e3"]) == {"c_scrambled", "c_imperative", "c_occlusion"}
    for line in ("E1 - C1 E1", "e1_minus_c1_e1", "e1_minus_e3 c_scrambled", "cross-surface transfer E1"):
        assert line in report

    # K-fold cross-fitting on the cached features: every trajectory scored exactly once out of fold.
    cfg_k = compose_train(tmp_path, [*(o for o in ov if not o.startswith("split.test_fraction")),
                                     "split=kfold", "split.k=2"])
    res_k, objs_k = train(cfg_k)
    scores_k = pd.read_csv(run / "scores.csv")
    assert scores_k.trajectory_id.nunique() == 4 and len(scores_k) == counts["rows"]
    assert not scores_k.duplicated(["trajectory_id", "step", "variant"]).any()
    # the file says which fold scored each row: a trajectory's rows all in the fold that tested it
    test_fold = {t: k for k, (_, te) in enumerate(objs_k["folds"]) for t in te}
    assert (scores_k.fold == scores_k.trajectory_id.map(test_fold)).all() and scores_k.fold.nunique() == 2
    assert len(objs_k["fitted"]) == 2 and res_k["bootstrap"]["n_clusters"] == 4
    assert res_k["counts"]["trajectories_test"] == 4 and len(res_k["counts"]["folds"]) == 2
    assert res_k["run"]["split"].startswith("kfold k=2")
    assert res_k["run"]["wording"]["overlap"] == 0 and len(res_k["run"]["wording"]["per_fold"]) == 2
    for key in ("c1", "permuted", "collapse_only", "transfer"):
        _check_interval(res_k[key]["e1"])
    ac = scores_k[scores_k.variant.isin(["attack", "clean"])]
    assert res_k["e1"]["estimate"] == pytest.approx(
        roc_auc_score((ac.variant == "attack").astype(int), ac.score), abs=1e-12)


@pytest.mark.parametrize("case", ["basic", "ties_and_missing", "two_attacks_per_step"])
def test_evaluate_entry_point_matches_protocol_cases(tmp_path, case):
    out = tmp_path / case
    proc = subprocess.run(
        [sys.executable, "evaluate.py", f"scores={SHARED / 'protocol_cases' / f'{case}.csv'}",
         f"hydra.run.dir={out}", "evaluation.interval=percentile"],  # PROTOCOL.md §5, recomputed below
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads((out / "results.json").read_text())
    expected = json.loads((SHARED / "protocol_cases" / f"{case}.expected.json").read_text())
    flat = {"e1": got["e1"], "e2": got["e2"], **{f"e3.{c}": iv for c, iv in got["e3"].items()}}
    for key, value in expected.items():
        if key == "ci":
            continue
        assert flat[key]["estimate"] == pytest.approx(value, abs=1e-9)
        lo, hi = expected["ci"][key]
        assert flat[key]["ci_low"] == pytest.approx(lo, abs=0.03)
        assert flat[key]["ci_high"] == pytest.approx(hi, abs=0.03)
    assert (out / "report.md").exists()

    # evaluate.py also writes the paired differences E1 − E3[c] (PROTOCOL.md §5) ...
    assert set(got["differences"]["e1_minus_e3"]) == set(got["e3"])
    assert "e1_minus_e3 c_scrambled" in (out / "report.md").read_text()
    if case != "basic":
        return
    # ... recomputed here independently on one case: the documented draws (default_rng(0).integers
    # over sorted trajectory ids), scikit-learn's roc_auc_score per replicate with weights
    # multiplicity × step weight, numpy percentiles of the paired differences.
    table = pd.read_csv(SHARED / "protocol_cases" / f"{case}.csv", dtype={"trajectory_id": str})
    ids = sorted(table.trajectory_id.unique())
    n_boot = got["bootstrap"]["n_boot"]
    idx = np.random.default_rng(got["bootstrap"]["seed"]).integers(0, len(ids), size=(n_boot, len(ids)))
    mult = np.stack([np.bincount(r, minlength=len(ids)) for r in idx])
    col = table.trajectory_id.map({t: i for i, t in enumerate(ids)}).to_numpy()
    w = 1.0 / table.groupby(["trajectory_id", "step", "variant"]).score.transform("size").to_numpy()
    attack_steps = set(map(tuple, table[table.variant == "attack"][["trajectory_id", "step"]].values))
    key = list(map(tuple, table[["trajectory_id", "step"]].values))

    def reps(pos_mask, neg_mask):
        sel = pos_mask | neg_mask
        y = pos_mask[sel].astype(int)
        out_ = np.full(n_boot, np.nan)
        for b in range(n_boot):
            sw = mult[b, col[sel]] * w[sel]
            if sw[y == 1].sum() > 0 and sw[y == 0].sum() > 0:
                out_[b] = roc_auc_score(y, table.score.to_numpy()[sel], sample_weight=sw)
        return out_

    v = table.variant.to_numpy()
    e1_reps = reps(v == "attack", v == "clean")
    for c in got["e3"]:
        c_steps = {k for k, vv in zip(key, v, strict=True) if vv == c}
        both = np.array([k in attack_steps and k in c_steps for k in key])
        d = e1_reps - reps((v == "attack") & both, (v == c) & both)
        d = d[np.isfinite(d)]
        diff = got["differences"]["e1_minus_e3"][c]
        assert diff["estimate"] == pytest.approx(got["e1"]["estimate"] - got["e3"][c]["estimate"], abs=1e-12)
        assert diff["n_boot_used"] == d.size
        lo, hi = np.quantile(d, [0.025, 0.975])
        assert diff["ci_low"] == pytest.approx(lo, abs=1e-9) and diff["ci_high"] == pytest.approx(hi, abs=1e-9)


def test_multirun_over_surfaces(tmp_path):
    sweep = tmp_path / "sweep"
    env = {**os.environ, "IPI_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "train.py", "-m", "surface=i_vis,i_dom,i_tool", "data.max_trajectories=4", "split.test_fraction=0.5",
         "evaluation.n_boot=50", "evaluation.random_twin=false", "quiet=true", f"hydra.sweep.dir={sweep}",
         *SMALL_BACKBONE_OVERRIDES],
        cwd=REPO, capture_output=True, text=True, timeout=900, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    surfaces = []
    for job in sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit()):
        res = json.loads((job / "results.json").read_text())
        surfaces.append(res["run"]["surface"])
        expected_controls = {"c_scrambled", "c_imperative"} | ({"c_occlusion"} if res["run"]["surface"] == "i_vis" else set())
        assert set(res["e3"]) == expected_controls
        assert np.isfinite(res["e1"]["estimate"])
    assert surfaces == ["i_vis", "i_dom", "i_tool"]
