"""Figures, the HTML report and the sweep report, checked against independent computations."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from sklearn.metrics import roc_auc_score


def _table(seed=0, n_traj=8, two_attacks=True):
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(n_traj):
        for s in range(3):
            rows.append((f"t{t}", s, "clean", rng.normal()))
            for _ in range(2 if (two_attacks and s == 0) else 1):
                rows.append((f"t{t}", s, "attack", rng.normal() + 0.8))
            if s != 2:  # c_scrambled missing at step 2: E3 pools only steps having both
                rows.append((f"t{t}", s, "c_scrambled", rng.normal() + 0.3))
    return pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])


def _results(table):
    from ipi.evaluation.assess import ScoreTables, Settings, assess

    res = assess(ScoreTables(table, {"c1": table.assign(score=table.step.astype(float))}),
                 Settings(n_boot=100, seed=0)).to_dict()
    res["counts"] = {"trajectories": 8, "rows": len(table), "skipped_steps": [{"step": 1, "reason": "x"}]}
    res["run"] = {"surface": "i_dom", "backbone": "b", "layers_config": "six", "token_groups": ["task"]}
    return res


def test_roc_curves_weighted_like_the_estimands():
    from ipi.reporting.plots import roc_curves

    table = _table()
    res = _results(table)
    curves = roc_curves(table)
    assert list(curves) == ["clean", "c_scrambled"]
    assert curves["clean"]["auc"] == pytest.approx(res["e1"]["estimate"], abs=1e-12)
    assert curves["c_scrambled"]["auc"] == pytest.approx(res["e3"]["c_scrambled"]["estimate"], abs=1e-12)
    # Independently: step 0 has two attack rows of weight 1/2; E3 drops step 2 (no control row).
    ac = table[table.variant.isin(["attack", "clean"])]
    w = np.where((ac.variant == "attack") & (ac.step == 0), 0.5, 1.0)
    assert curves["clean"]["auc"] == pytest.approx(
        roc_auc_score(ac.variant == "attack", ac.score, sample_weight=w), abs=1e-12)
    sc = table[table.variant.isin(["attack", "c_scrambled"]) & (table.step != 2)]
    w = np.where((sc.variant == "attack") & (sc.step == 0), 0.5, 1.0)
    assert curves["c_scrambled"]["auc"] == pytest.approx(
        roc_auc_score(sc.variant == "attack", sc.score, sample_weight=w), abs=1e-12)
    # Unweighted would differ here, so the weights matter.
    assert curves["clean"]["auc"] != pytest.approx(roc_auc_score(ac.variant == "attack", ac.score), abs=1e-9)
    c = curves["clean"]
    assert c["fpr"][0] == 0 and c["tpr"][-1] == pytest.approx(1.0) and np.all(np.diff(c["fpr"]) >= 0)


def test_forest_rows_cover_every_estimand():
    from ipi.reporting.plots import forest_rows

    res = _results(_table())
    aucs, diffs = forest_rows(res)
    labels = [a[0] for a in aucs]
    assert labels == ["E1 attack vs clean", "E1 over steps having attack and clean", "E2 paired step",
                      "E3 attack vs c_scrambled",
                      "C1 metadata baseline E1", "C1 metadata baseline E2",
                      "C1 metadata baseline E3 attack vs c_scrambled"]  # the same rows as the table
    assert aucs[0][1:4] == (res["e1"]["estimate"], res["e1"]["ci_low"], res["e1"]["ci_high"])
    assert {d[0] for d in diffs} == {"e1 − c1 e1", "e3 − c1 e3[c_scrambled]", "e1 − e3[c_scrambled]"}


def test_write_run_report_files_and_self_contained_html(tmp_path):
    from ipi.reporting.report import write_run_report

    table = _table()
    res = _results(table)
    gallery = tmp_path / "gallery.png"
    Image.new("RGB", (30, 20), (1, 2, 3)).save(gallery)
    paths = write_run_report(res, tmp_path, scores=table, config={"seed": 0, "surface": {"name": "i_dom"}},
                             gallery=gallery)
    assert set(paths) == {"results", "roc", "forest", "gallery", "report_md", "report_html"}
    for name in ("roc", "forest"):
        with Image.open(paths[name]) as im:
            assert im.format == "PNG" and im.width > 300
    md = (tmp_path / "report.md").read_text()
    assert (md.index("## Verdict") < md.index("## Estimands E1, E2, E3") < md.index("## Figures")
            < md.index("## Data counts") < md.index("## Run") < md.index("## Resolved config"))
    assert "![roc](roc.png)" in md and "![forest](forest.png)" in md
    html = (tmp_path / "report.html").read_text()
    order = [html.index(s) for s in ("<h2>Verdict", "<h2>Estimands E1, E2, E3", "<h2>Figures", "<h2>Data counts",
                                     "<h2>Run", "<h2>Resolved config")]
    assert order == sorted(order)
    # Self-contained: every image is a data URI holding exactly the PNG on disk.
    srcs = re.findall(r'src="([^"]+)"', html)
    assert len(srcs) == 3 and all(s.startswith("data:image/png;base64,") for s in srcs)
    embedded = {base64.b64decode(s.split(",", 1)[1]) for s in srcs}
    assert embedded == {paths[n].read_bytes() for n in ("roc", "forest", "gallery")}
    hrefs = re.findall(r'href="([^"]*)"', html)  # the contents line: anchors in the page, no other file
    assert hrefs and all(h.startswith("#") and f'id="{h[1:]}"' in html for h in hrefs)
    assert f"{res['e1']['estimate']:.3f}" in html and res["verdict"]["claim"] in html
    assert "surface:\n  name: i_dom" in html  # the resolved config as YAML
    assert json.loads((tmp_path / "results.json").read_text())["e1"] == res["e1"]


def _fake_sweep(root, cells, dup=False):
    from omegaconf import OmegaConf

    jobs = []
    for n, (layers, idx, group, e1) in enumerate(cells + ([cells[0]] if dup else [])):
        job = root / str(n)
        (job / ".hydra").mkdir(parents=True)
        res = {"e1": {"estimate": e1, "ci_low": e1 - 0.1, "ci_high": e1 + 0.05, "n_boot_used": 100},
               "e3": {"c_scrambled": {"estimate": e1 / 2, "ci_low": 0.1, "ci_high": 0.9, "n_boot_used": 100}},
               "verdict": {"claim": "none", "checks": []},
               "run": {"surface": "i_vis", "backbone": "tiny", "layers_config": layers, "layers": [idx],
                       "token_groups": [group]}}
        (job / "results.json").write_text(json.dumps(res))
        OmegaConf.save(OmegaConf.create({"token_group": {"name": group}}), job / ".hydra" / "config.yaml")
        OmegaConf.save(OmegaConf.create([f"layers={layers}", f"token_group={group}"]), job / ".hydra" / "overrides.yaml")
        jobs.append(job)
    (root / "multirun.yaml").write_text("{}")
    return jobs


def test_sweep_report_grid_and_files(tmp_path):
    from ipi.reporting.sweep import _grid, collect, main

    cells = [("six_6", 7, "task", 0.61), ("six_1", 1, "task", 0.52), ("six_1", 1, "last_prompt", 0.93),
             ("six_6", 7, "last_prompt", 0.88)]
    _fake_sweep(tmp_path, cells)
    df = collect(tmp_path)
    assert list(df.job) == ["0", "1", "2", "3"]
    assert df.loc[df.job == "2", "overrides"].item() == "layers=six_1 token_group=last_prompt"
    g = _grid(df, "e1")
    assert list(g.index) == ["six_1 [1]", "six_6 [7]"] and list(g.columns) == ["last_prompt", "task"]
    np.testing.assert_allclose(g.to_numpy(), [[0.93, 0.52], [0.88, 0.61]])
    np.testing.assert_allclose(_grid(df, "e3.c_scrambled").to_numpy(), [[0.465, 0.26], [0.44, 0.305]])
    assert main([str(tmp_path)]) == 0
    for f in ("sweep.csv", "heatmap_e1.png", "heatmap_e3_c_scrambled.png", "sweep_report.md", "sweep_report.html"):
        assert (tmp_path / f).is_file(), f
    assert pd.read_csv(tmp_path / "sweep.csv")["e1"].tolist() == [0.61, 0.52, 0.93, 0.88]


def test_sweep_report_errors(tmp_path, capsys):
    from ipi.reporting.sweep import main

    assert main([str(tmp_path / "nope")]) == 2
    assert "no such sweep folder" in capsys.readouterr().err
    _fake_sweep(tmp_path / "s", [("six_1", 1, "task", 0.5), ("six_6", 7, "task", 0.6)], dup=True)
    assert main([str(tmp_path / "s")]) == 2
    assert "jobs 0, 2 share layers='six_1 [1]' token_group='task'" in capsys.readouterr().err
