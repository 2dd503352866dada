"""A composed train run with logger=wandb: the run folder a researcher gets."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from tests.conftest import compose_train
from tests.reporting.wandb_offline import summarise

pytestmark = pytest.mark.needs_shared


def test_train_run_folder_with_wandb_offline(tmp_path, monkeypatch):
    from ipi.reporting.plots import roc_curves
    from ipi.run.tasks import train

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose_train(tmp_path, ["data.max_trajectories=4", "split.test_fraction=0.5", "evaluation.n_boot=100",
                                   "logger=wandb", "layers=last"])
    results, _ = train(cfg)
    run = tmp_path / "run"
    for f in ("results.json", "report.md", "report.html", "roc.png", "forest.png", "gallery.png", "scores.csv"):
        assert (run / f).is_file(), f
    html = (run / "report.html").read_text()
    assert all(s.startswith("data:image/png;base64,") for s in re.findall(r'src="([^"]+)"', html))
    assert "Resolved config" in html and "backbone:" in html
    # ROC legend AUC = E1 recomputed from the written score table.
    curves = roc_curves(pd.read_csv(run / "scores.csv"))
    assert curves["clean"]["auc"] == pytest.approx(results["e1"]["estimate"], abs=1e-12)

    # One offline W&B run in the run folder, holding the config, every estimand and the plots.
    (wb,) = list((run / "wandb").glob("offline-run-*"))
    s = summarise(wb)
    assert s["config"]["surface"]["name"] == "i_vis" and s["config"]["layers"]["name"] == "last"
    on_disk = json.loads((run / "results.json").read_text())
    assert s["history"]["test/e1"] == pytest.approx(on_disk["e1"]["estimate"])
    assert s["history"]["test/e1_ci_high"] == pytest.approx(on_disk["e1"]["ci_high"])
    for c, iv in on_disk["e3"].items():
        assert s["history"][f"test/e3_{c}"] == pytest.approx(iv["estimate"])
    assert s["history"]["test/c1_e1"] == pytest.approx(on_disk["c1"]["e1"]["estimate"])
    assert s["summary"]["verdict/claim"] == on_disk["verdict"]["claim"]
    (table,) = list(wb.glob("files/media/table/estimands_*.table.json"))
    assert len(json.loads(table.read_text())["data"]) >= 10
    images = {p.name.split("_")[0] for p in wb.glob("files/media/images/**/*.png")}
    assert images == {"roc", "forest"}  # the gallery shows screenshots: not uploaded by default
    import wandb

    assert wandb.run is None  # finished by the task wrapper


def test_evaluate_writes_html_and_plots(tmp_path):
    from hydra import compose, initialize_config_dir

    from ipi.run.schemas import register_configs
    from ipi.run.tasks import evaluate
    from tests.conftest import REPO, SHARED

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=[
            f"scores={SHARED / 'protocol_cases' / 'basic.csv'}", f"paths.output_dir={tmp_path}",
            "evaluation.n_boot=100"])
    evaluate(cfg)
    for f in ("results.json", "report.md", "report.html", "roc.png", "forest.png"):
        assert (tmp_path / f).is_file(), f
