"""W&B offline: what a run logs, screenshot gating, one run per job (finish in a finally)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.reporting.wandb_offline import summarise


@pytest.fixture()
def offline(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    yield
    from ipi.reporting.tracking import finish_wandb

    finish_wandb()


def _results():
    from ipi.evaluation.assess import ScoreTables, Settings, assess

    rng = np.random.default_rng(0)
    rows = [(f"t{t}", s, v, float(rng.normal() + (v == "attack")))
            for t in range(6) for s in range(3) for v in ("clean", "attack", "c_scrambled")]
    table = pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])
    res = assess(ScoreTables(table, {"c1": table.assign(score=0.0)}), Settings(n_boot=50, seed=0, min_clusters=5)).to_dict()
    res["counts"] = {"trajectories": 6, "rows": len(table), "skipped_steps": []}
    res["run"] = {"surface": "i_dom", "backbone": "test"}
    return res, table


def _png(path, colour):
    from PIL import Image

    Image.new("RGB", (8, 8), colour).save(path)
    return path


@pytest.mark.parametrize("allow", [False, True])
def test_log_run_offline_holds_keys_and_gates_screenshots(tmp_path, offline, allow):
    from ipi.reporting.tracking import finish_wandb, log_run, wandb_logger

    res, _ = _results()
    lg = wandb_logger(save_dir=str(tmp_path / "run"), project="ipi-test", name="t", upload_screenshots=allow)
    figs = {"roc": _png(tmp_path / "roc.png", "red"), "forest": _png(tmp_path / "forest.png", "blue"),
            "gallery": _png(tmp_path / "gallery.png", "green")}
    lg.log_metrics({"test/e1": res["e1"]["estimate"], "test/e1_ci_low": res["e1"]["ci_low"]}, step=0)
    keys = log_run(lg, res, figs, config={"surface": {"name": "i_dom"}, "seed": 3})
    assert finish_wandb() is True

    (run_dir,) = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    s = summarise(run_dir)
    assert s["config"]["seed"] == 3 and s["config"]["surface"] == {"name": "i_dom"}
    assert s["history"]["test/e1"] == pytest.approx(res["e1"]["estimate"])
    assert s["history"]["test/e1_ci_low"] == pytest.approx(res["e1"]["ci_low"])
    assert s["summary"]["verdict/claim"] == res["verdict"]["claim"]
    assert s["summary"]["counts/rows"] == 54
    # The estimands table: one row per estimand, values equal to results.json.
    (table_file,) = list(run_dir.glob("files/media/table/estimands_*.table.json"))
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["estimand", "estimate", "ci_low", "ci_high", "n_boot_used", "reportable",
                                "not_reportable_because", "read_by_checks"]
    by_name = {r[0]: r for r in table["data"]}
    # C1 scores every row 0: its E1 is 0.5 [0.5, 0.5], a degenerate interval, marked as such.
    assert by_name["C1 metadata baseline E1"][5:] == [
        False, "degenerate interval [0.500, 0.500] (every replicate gave the same value)", ""]
    assert by_name["E1 attack vs clean"][5:] == [True, "", ""]  # the headline: it decides nothing
    assert s["summary"]["reportable/c1.e1"] is False and s["summary"]["reportable/e1"] is True
    assert by_name["E1 attack vs clean"][1:4] == pytest.approx(
        [res["e1"]["estimate"], res["e1"]["ci_low"], res["e1"]["ci_high"]])
    assert by_name["E3 attack vs c_scrambled"][1] == pytest.approx(res["e3"]["c_scrambled"]["estimate"])
    images = {p.name.split("_")[0] for p in run_dir.glob("files/media/images/**/*.png")}
    assert {"roc", "forest"} <= images
    assert ("gallery" in images) is allow and ("gallery" in keys) is allow


def test_task_wrapper_one_run_per_job_even_on_failure(tmp_path, offline):
    from ipi.reporting.tracking import task_wrapper, wandb_logger

    @task_wrapper
    def job(cfg):
        lg = wandb_logger(save_dir=str(tmp_path / cfg["name"]), project="ipi-test", name=cfg["name"])
        lg.log_metrics({"test/e1": cfg["e1"]}, step=0)
        if cfg.get("fail"):
            raise RuntimeError("boom")
        return cfg["e1"], {}

    job({"name": "a", "e1": 0.25})
    with pytest.raises(RuntimeError, match="boom"):
        job({"name": "b", "e1": 0.5, "fail": True})
    job({"name": "c", "e1": 0.75})
    seen = {}
    for name in "abc":
        (run_dir,) = list((tmp_path / name / "wandb").glob("offline-run-*"))
        s = summarise(run_dir)
        seen[name] = s["run_id"]
        assert s["history"]["test/e1"] == {"a": 0.25, "b": 0.5, "c": 0.75}[name]
    assert len(set(seen.values())) == 3  # three jobs, three runs: nothing merged


def test_wandb_logger_modes(monkeypatch, tmp_path):
    from ipi.reporting.tracking import wandb_logger

    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert wandb_logger(mode="disabled", save_dir=str(tmp_path)) is None
    with pytest.raises(ValueError, match="expected offline, online or disabled"):
        wandb_logger(mode="cloud", save_dir=str(tmp_path))
    lg = wandb_logger(save_dir=str(tmp_path))
    assert lg._offline is True and lg.upload_screenshots is False


def test_logged_metrics_are_what_the_checks_declare():
    """Every estimand a check reads is a logged metric (C1 E3, collapse-only E3, E3 - mean twin E3
    included) beside the headline; nothing else about the twins is."""
    from ipi.evaluation.assess import ScoreTables, Settings, assess
    from ipi.evaluation.callbacks import flat_metrics
    from ipi.evaluation.verdict import read_keys

    rng = np.random.default_rng(1)
    rows = [(f"t{t}", s, v, float(rng.normal() + (v == "attack")))
            for t in range(8) for s in range(3) for v in ("clean", "attack", "c_scrambled")]
    table = pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])
    noise = {seed: table.assign(score=np.random.default_rng(seed).normal(size=len(table))) for seed in (1, 2)}
    res = assess(ScoreTables(table, {"c1": noise[1], "collapse_only": noise[2]}, twins=noise),
                 Settings(n_boot=50, seed=0, min_clusters=5, pretrained=True)).to_dict()
    logged = flat_metrics(res)
    for name in ("test/c1_e3_c_scrambled", "test/collapse_only_e3_c_scrambled",
                 "test/differences_e3_minus_mean_twin_e3_c_scrambled", "test/random_twin_by_seed_1_e3_c_scrambled"):
        assert name in logged, name
    assert logged["test/differences_e3_minus_mean_twin_e3_c_scrambled_ci_low"] == pytest.approx(
        res["differences"]["e3_minus_mean_twin_e3"]["c_scrambled"]["ci_low"])
    declared = {f"test/{k.replace('.', '_')}" for k in read_keys(res)}
    headline = {"test/e1", "test/e1_paired", "test/e2", "test/e3_c_scrambled", "test/c1_e1", "test/collapse_only_e1"}
    point_names = {n for n in logged if not n.endswith(("_ci_low", "_ci_high")) and not n.startswith("test/permutation")}
    assert point_names == declared | headline
    assert not any(("twin" in n and n.split("/")[1].split("_ci_")[0] not in {d.split("/")[1] for d in declared})
                   for n in logged)
