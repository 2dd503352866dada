"""Family-wise error control of sweep claims (ipi.reporting.sweep; PROTOCOL.md §7; docs/sweeps.md)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from ipi.reporting.sweep import CLAIM_DETECTS, CLAIM_SEPARATES, claim_p_values, holm, main


def test_holm_hand_worked():
    # N = 4, alpha = 0.05: thresholds 0.0125, 0.01667, 0.025, 0.05 in sorted order.
    assert holm([0.001, 0.04, 0.02, 0.005], 0.05) == [True, True, True, True]
    # sorted 0.005 <= 0.0125, 0.01 <= 0.0167, then 0.03 > 0.025 stops
    assert holm([0.01, 0.04, 0.03, 0.005], 0.05) == [True, False, False, True]
    assert holm([0.01, 0.04, 0.03, 0.02], 0.05) == [True, False, False, False]
    # second smallest 0.02 > 0.0167 stops the procedure: only the smallest is rejected
    assert holm([0.01, 0.04, 0.03, 0.0125 + 1e-9, 0.02], 0.05) == [True, False, False, False, False]
    assert holm([0.2, 0.3], 0.05) == [False, False]
    assert holm([], 0.05) == []


def _res(claim, p_e1, p_c1=0.0, p_e3=0.0, check1="PASS", perm=None):
    res = {"e1": {"estimate": 0.8, "ci_low": 0.7, "ci_high": 0.9, "n_boot_used": 100},
           "e3": {"c_scrambled": {"estimate": 0.7, "ci_low": 0.6, "ci_high": 0.8, "n_boot_used": 100}},
           "verdict": {"claim": claim, "checks": [{"id": 1, "status": check1}]},
           "p_values": {"e1": p_e1, "e1_minus_c1_e1": p_c1, "e3": {"c_scrambled": p_e3}},
           "bootstrap": {"level": 0.95}}
    if perm is not None:
        res["permutation"] = {"p_value": perm}
    return res


def test_claim_p_values_is_the_intersection_union_max():
    assert claim_p_values(_res(CLAIM_DETECTS, 0.001, 0.004, 0.002)) == (0.001, 0.004)
    # check 4's permutation p is a condition of the cell's own verdict, not part of the max
    assert claim_p_values(_res(CLAIM_DETECTS, 0.001, 0.004, 0.002, perm=0.01)) == (0.001, 0.004)
    # a cell whose own verdict does not license the claim gets p = 1 for it
    assert claim_p_values(_res(CLAIM_SEPARATES, 0.001)) == (0.001, 1.0)
    assert claim_p_values(_res("none", 0.3, check1="FAIL")) == (1.0, 1.0)
    # results.json without p-values (older runs): nothing licensed
    r = _res(CLAIM_DETECTS, 0.0)
    del r["p_values"]
    assert claim_p_values(r) == (1.0, 1.0)


def _sweep(root, cells, prereg=None):
    from omegaconf import OmegaConf

    for n, (layers, group, res) in enumerate(cells):
        job = root / str(n)
        (job / ".hydra").mkdir(parents=True)
        res = {**res, "run": {"surface": "i_vis", "backbone": "tiny", "layers_config": layers, "layers": [n],
                              "token_groups": [group]}}
        (job / "results.json").write_text(json.dumps(res))
        OmegaConf.save(OmegaConf.create({"token_group": {"name": group}, "evaluation": {"preregistered": prereg}}),
                       job / ".hydra" / "config.yaml")
        OmegaConf.save(OmegaConf.create([f"layers={layers}", f"token_group={group}"]), job / ".hydra" / "overrides.yaml")


CELLS = [  # N = 6 cells, alpha = 0.025: Holm thresholds 0.00417, 0.005, 0.00625, 0.00833, 0.0125, 0.025
    ("six_1", "task", _res(CLAIM_DETECTS, 0.0, 0.0, 0.001)),          # p_detects 0.001: licensed
    ("six_2", "task", _res(CLAIM_DETECTS, 0.0, 0.0, 0.02)),           # nominal detects, p 0.02: not family-wise
    ("six_3", "task", _res(CLAIM_SEPARATES, 0.0)),                    # separates (p_e1 0)
    ("six_1", "last_prompt", _res(CLAIM_SEPARATES, 0.02)),            # separates nominally only
    ("six_2", "last_prompt", _res("none", 0.4, check1="FAIL")),
    ("six_3", "last_prompt", _res("none", 0.5, check1="FAIL")),
]


def test_sweep_report_licenses_claims_under_holm(tmp_path, capsys):
    _sweep(tmp_path, CELLS)
    assert main([str(tmp_path)]) == 0
    df = pd.read_csv(tmp_path / "sweep.csv")
    assert df["claim_familywise"].fillna("none").tolist() == [
        CLAIM_DETECTS, CLAIM_SEPARATES, CLAIM_SEPARATES, "none", "none", "none"]
    assert df["claim"].tolist()[:2] == [CLAIM_DETECTS, CLAIM_DETECTS]
    md = (tmp_path / "sweep_report.md").read_text()
    assert "Family: 6 cells" in md and "alpha = 0.025" in md and "no cell was pre-registered" in md
    assert "Family: 6 cells" in (tmp_path / "sweep_report.html").read_text()
    out = capsys.readouterr().out
    assert f"family: 6 cells; claims licensed family-wise (Holm): {CLAIM_DETECTS}: 1" in out


def test_preregistered_cell_keeps_its_nominal_claim(tmp_path, capsys):
    _sweep(tmp_path, CELLS, prereg="layers=six_2 token_group=task")
    assert main([str(tmp_path)]) == 0
    df = pd.read_csv(tmp_path / "sweep.csv")
    assert df.loc[1, "claim_familywise"] == CLAIM_DETECTS and bool(df.loc[1, "preregistered"])
    assert df.loc[0, "claim_familywise"] == CLAIM_DETECTS and not df.loc[0, "preregistered"]
    assert df.loc[3, "claim_familywise"] == "none"
    assert "Pre-registered cell: layers=six_2 token_group=task" in (tmp_path / "sweep_report.md").read_text()
    # a pre-registration naming no cell (or several) is an error, not a silent Holm
    _sweep(tmp_path / "bad", CELLS, prereg="layers=six_9")
    assert main([str(tmp_path / "bad")]) == 2
    assert "matches 0" in capsys.readouterr().err
    _sweep(tmp_path / "many", CELLS, prereg="token_group=task")
    assert main([str(tmp_path / "many")]) == 2
    assert "matches 3 (jobs: 0, 1, 2)" in capsys.readouterr().err


def test_preregistered_is_a_config_field(tmp_path):
    from tests.conftest import compose_train

    cfg = compose_train(tmp_path, ['evaluation.preregistered="layers=six_3 token_group=task"'])
    assert cfg.evaluation.preregistered == "layers=six_3 token_group=task"
    assert compose_train(tmp_path).evaluation.preregistered is None
    with pytest.raises(Exception, match="preregister"):
        compose_train(tmp_path, ["evaluation.preregister=x"])
