"""The report sections of issue 25 (ipi.reporting.attack_sections): operating point, attack source."""

from __future__ import annotations

from ipi.reporting import attack_sections
from ipi.reporting.report import render_html, render_report

IV = {"estimate": 0.42, "ci_low": 0.3, "ci_high": 0.55, "n_boot_used": 1000}
RESULTS = {
    "e1": IV,
    "operating_point": {"fpr": 0.01, "vs": {"clean": {**IV, "n_negative_steps": 80},
                                            "c_scrambled": {**IV, "estimate": 0.1, "n_negative_steps": 80}}},
    "run": {"surface": "i_dom", "attack": {
        "name": "mix", "sources": ["project", "garak"], "benign_from": ["project", "notinject"],
        "pool": {"templates": 47, "goals": 76, "benign": 291}, "heldout_source": True,
        "counts": {"attack_rows": {"garak": 10, "project": 12}, "adapted_rows": {"garak": 7},
                   "banner_overflow_rows": {}, "control_token_mismatches": {"project": 1}},
        "by_source": {"garak": {"n_trajectories": 6, "estimands": {"e1": IV, "e3": {"c_scrambled": IV}}},
                      "project": {"n_trajectories": 3, "estimands": None}},
        "by_goal_family": {"say": {"n_trajectories": 6, "estimands": {"e1": IV, "e3": {}}}},
        "transfer": {"sources": ["garak", "project"], "n_trajectories": {"garak": 6, "project": 3},
                     "e1": {"garak": {"garak": IV, "project": None}, "project": {"garak": IV, "project": IV}}}}},
}


def test_sections_render_every_number():
    secs = attack_sections.sections(RESULTS)
    assert [s.id for s in secs] == ["operating-point", "attack"]
    md = render_report(RESULTS)
    assert "Operating point (TPR at FPR 0.01)" in md
    assert "attack vs clean" in md and "0.420 [0.300, 0.550]" in md and "0.100 [0.300, 0.550]" in md
    for line in ("| garak | 10 | 7 | 0 | 0 |", "| project | 12 | 0 | 0 | 1 |"):
        assert line in md, line
    assert "per held-out source" in md
    assert "Source × source transfer" in md
    assert md.count("operating_point.vs.clean") == 0  # shown in its section, not again under "Other estimands"
    assert "attack.by_source" not in md  # run.attack not dumped under Run
    html = render_html(RESULTS)
    assert "Source × source transfer" in html and "train" in html and "garak" in html


def test_no_section_without_the_records():
    assert attack_sections.sections({"e1": IV, "run": {"surface": "i_vis"}}) == []
    assert "Operating point" not in render_report({"e1": IV, "run": {"surface": "i_vis"}})


def test_sweep_table_has_the_operating_point_and_the_attack(tmp_path):
    import json

    from ipi.reporting.sweep import collect, main
    from tests.reporting.test_report import _fake_sweep

    jobs = _fake_sweep(tmp_path, [("six_1", 1, "task", 0.6), ("six_6", 7, "task", 0.7)])
    for job, attack in zip(jobs, ("garak", None)):
        res = json.loads((job / "results.json").read_text())
        res["operating_point"] = RESULTS["operating_point"]
        if attack:
            res["run"]["attack"] = {"name": attack}
        (job / "results.json").write_text(json.dumps(res))
    df = collect(tmp_path)
    assert df["attack"].tolist() == ["garak", "project"]
    assert df["tpr_at_fpr.clean"].tolist() == [0.42, 0.42] and df["tpr_at_fpr.c_scrambled_ci_high"].tolist() == [0.55, 0.55]
    assert main([str(tmp_path)]) == 0  # one heatmap per attack (two cells of one layer x group grid)
    md = (tmp_path / "sweep_report.md").read_text()
    assert "tpr_at_fpr.clean" in md and "| garak |" in md
