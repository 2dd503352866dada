"""Family-wise error control of sweep claims (ipi.reporting.sweep; PROTOCOL.md §7; docs/sweeps.md)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import numpy as np

from ipi.reporting.sweep import (
    CLAIM_DETECTS,
    CLAIM_SEPARATES,
    claim_p_values,
    family_sentence,
    familywise_rank,
    holm,
    main,
)


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
    iv = {"estimate": 0.7, "ci_low": 0.6, "ci_high": 0.8, "n_boot_used": 100}
    res = {"e1": {"estimate": 0.8, "ci_low": 0.7, "ci_high": 0.9, "n_boot_used": 100}, "e1_paired": iv,
           "c1": {"e1": iv, "e3": {"c_scrambled": iv}},
           "differences": {"e3_minus_c1_e3": {"c_scrambled": iv}},
           "e3": {"c_scrambled": {"estimate": 0.7, "ci_low": 0.6, "ci_high": 0.8, "n_boot_used": 100}},
           "verdict": {"claim": claim, "checks": [{"id": 1, "status": check1}]},
           "p_values": {"e1": p_e1, "e1_paired": p_e1, "e1_minus_c1_e1": 0.9, "e3_minus_c1_e3": {"c_scrambled": p_c1},
                        "e3": {"c_scrambled": p_e3}},
           "bootstrap": {"level": 0.95, "n_boot": 1999}}
    if perm is not None:
        res["permutation"] = {"p_value": perm}
    return res


def test_claim_p_values_is_the_intersection_union_max():
    # check 2 is judged on E3[c] - C1 E3[c] (its p 0.004 enters); the E1 form (p 0.9) decides nothing
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


def test_family_sentence_says_whether_a_claim_can_survive_at_b_and_s():
    few = family_sentence(30, 0.025, 999, 3)
    assert "1/(B+1) = 0.00100, above Holm's first threshold alpha/N = 0.00083" in few
    assert "n_boot >= 1199 is needed for 30 cells" in few and "level 1/(S+1) = 0.250" in few
    assert "more twin seeds are needed" in few
    ok = family_sentence(30, 0.025, 1999, 19)
    assert "so a cell's claim can survive" in ok and "level 1/(S+1) = 0.050" in ok and "more twin" not in ok


def test_familywise_rank_over_cells_holds_its_level():
    rng = np.random.default_rng(8)
    s, k, n_sim = 19, 30, 400
    any_hit = sum(any(familywise_rank(rng.normal(size=(s + 1, k, 3)))["cells"]) for _ in range(n_sim))
    assert any_hit / n_sim < 0.05 + 0.03  # <= 1/(S+1) for the family, not 30/(S+1)
    e3 = rng.normal(size=(s + 1, k, 3))
    e3[0, 4] += 10.0  # the trained network far ahead in one cell
    r = familywise_rank(e3)
    assert r["cells"][4] and sum(r["cells"]) == 1 and r["p_family"] == pytest.approx(1 / (s + 1))
    # exchangeable networks with a skewed, control-dependent seed distribution: passes ~1/(S+1)
    s, n_sim = 4, 2000
    hits = 0
    for _ in range(n_sim):
        e3 = rng.lognormal(0.0, 1.0, size=(s + 1, 1, 2))
        e3[:, :, 1] = e3[:, :, 0] + 0.01 * rng.normal(size=(s + 1, 1))
        hits += familywise_rank(e3)["cells"][0]
    assert abs(hits / n_sim - 1 / (s + 1)) < 0.03


def test_kfold_cell_separates_family_wise_only_with_its_permutation_p():
    """Under K-fold check 1 reads the bootstrap and the exact permutation test: a cell's p_separates
    is the larger of the two, and the family sentence says when 1/(M+1) cannot clear Holm."""
    from ipi.reporting.sweep import claim_p_values, family_sentence

    def res(split, perm_p):
        return {"p_values": {"e1_paired": 0.001}, "verdict": {"claim": "separates", "checks": [
            {"id": 1, "status": "PASS", "numbers": {"split": split, "permutation_p": perm_p}}]}}

    assert claim_p_values(res("holdout", None))[0] == 0.001
    assert claim_p_values(res("kfold", 0.005))[0] == 0.005
    assert claim_p_values(res("kfold", None))[0] == 1.0  # no permutation test: nothing licensed
    text = family_sentence(30, 0.025, 1999, None, kfold_m=199)
    assert "no K-fold cell's \"separates\" can survive Holm" in text and "permutation.m >= 1199" in text


def test_claim_p_values_reads_the_intervals_the_checks_declare():
    from ipi.evaluation.verdict import read_keys

    r = _res(CLAIM_DETECTS, 0.001, 0.004, 0.002)
    iv = r["e1_paired"]
    # check 6's paired interval (E3 - mean twin E3) and check 5's collapse-only E3 (no p-value: a ceiling)
    r["random_twin"] = {"seeds": [1, 2], "by_seed": {"1": {"e3": {"c_scrambled": iv}}, "2": {"e3": {"c_scrambled": iv}}}}
    r["differences"]["e3_minus_mean_twin_e3"] = {"c_scrambled": iv}
    r["collapse_only"] = {"e1": iv, "e3": {"c_scrambled": iv}}
    r["p_values"]["e3_minus_mean_twin_e3"] = {"c_scrambled": 0.03}
    declared = read_keys(r, points=False)
    assert declared["differences.e3_minus_mean_twin_e3.c_scrambled"] == [6]
    assert declared["collapse_only.e3.c_scrambled"] == [5]
    assert claim_p_values(r) == (0.001, 0.03)
    # a declared interval whose p-value the file lacks counts as 1: nothing is licensed without its test
    del r["p_values"]["e3_minus_mean_twin_e3"]
    assert claim_p_values(r) == (0.001, 1.0)
