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

from tests.conftest import REPO, SHARED, SMALL_BACKBONE_OVERRIDES, compose_train

pytestmark = pytest.mark.needs_shared

INTERVAL_KEYS = {"estimate", "ci_low", "ci_high", "n_boot_used"}


def _check_interval(iv):
    assert set(iv) == INTERVAL_KEYS
    assert iv["ci_low"] <= iv["estimate"] + 1e-12 and iv["estimate"] <= iv["ci_high"] + 1e-12


def test_train_end_to_end_and_cache_reuse(tmp_path):
    from ipi.tasks import train

    ov = ["data.max_trajectories=4", "split.test_fraction=0.5", "evaluation.n_boot=200"]
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
    assert [c["id"] for c in on_disk["verdict"]["checks"]] == [1, 2, 3, 4, 5]
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

    # Second identical run: the cache is reused (no forward pass) and results are identical.
    results2, objs2 = train(compose_train(tmp_path, ov))
    info2 = json.loads((run / "run_info.json").read_text())["extraction"]
    assert info2["cache_hit"] is True and info2["rows_forwarded"] == 0
    assert info2["cache_key"] == info1["cache_key"]
    assert json.loads((run / "results.json").read_text()) == on_disk


@pytest.mark.parametrize("case", ["basic", "ties_and_missing", "two_attacks_per_step"])
def test_evaluate_entry_point_matches_protocol_cases(tmp_path, case):
    out = tmp_path / case
    proc = subprocess.run(
        [sys.executable, "evaluate.py", f"scores={SHARED / 'protocol_cases' / f'{case}.csv'}",
         f"hydra.run.dir={out}"],
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


def test_multirun_over_surfaces(tmp_path):
    sweep = tmp_path / "sweep"
    env = {**os.environ, "IPI_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "train.py", "-m", "surface=i_vis,i_dom,i_tool", "data.max_trajectories=2",
         "evaluation.n_boot=50", "quiet=true", f"hydra.sweep.dir={sweep}", *SMALL_BACKBONE_OVERRIDES],
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
