"""Identical rows in a score table are valid input (PROTOCOL.md §2, §5): a warning, estimands as by hand.

Several attack rows at one step are allowed, and a detector with discrete or saturated scores
ties often, so two rows of a table can be identical. The table below has a repeated attack row
(t1), a repeated control row (t2) and ties between variants; its estimands are worked out by
hand from PROTOCOL.md §5 (step weights ``1 / rows of the (trajectory, step, variant)``;
``H(0) = 1/2``).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from tests.conftest import REPO

TABLE = """trajectory_id,step,variant,score
t1,0,clean,0.2
t1,0,attack,0.9
t1,0,attack,0.9
t1,0,c_scrambled,0.5
t2,0,clean,0.5
t2,0,attack,0.5
t2,0,c_scrambled,0.5
t2,0,c_scrambled,0.5
t3,0,clean,0.1
t3,0,attack,0.3
t3,0,c_scrambled,0.4
"""

# By hand. The two t1 attack rows weigh 1/2 each (one step), the two t2 c_scrambled rows too.
# E1: attack {0.9 (t1), 0.5 (t2), 0.3 (t3)} vs clean {0.2, 0.5, 0.1}, each step weight 1:
#     0.9 beats all three (3); 0.5 beats 0.2 and 0.1, ties 0.5 (2.5); 0.3 beats 0.2 and 0.1 (2) -> 7.5 / 9.
E1 = 7.5 / 9
# E2: within-step AUCs t1: 0.9 > 0.2 -> 1; t2: 0.5 = 0.5 -> 1/2; t3: 0.3 > 0.1 -> 1; mean 2.5 / 3.
E2 = 2.5 / 3
# E3[c_scrambled]: every step has both; attack {0.9, 0.5, 0.3} vs c {0.5 (t1), 0.5 (t2, two rows of
#     weight 1/2), 0.4 (t3)}: 0.9 beats all (3); 0.5 ties 0.5 and 0.5, beats 0.4 (2); 0.3 loses all (0) -> 5 / 9.
E3 = 5 / 9


def test_tied_duplicate_rows_are_kept_with_a_warning_and_give_the_hand_computed_estimands(tmp_path, caplog):
    from ipi.evaluation.scoretable import read_score_table
    from ipi.metrics.estimands import estimands

    p = tmp_path / "scores.csv"
    p.write_text(TABLE)
    with caplog.at_level(logging.WARNING, logger="ipi.evaluation.scoretable"):
        table = read_score_table(p)
    assert len(table) == 11  # nothing dropped
    (msg,) = [r.getMessage() for r in caplog.records if "repeat an earlier row" in r.getMessage()]
    assert "2 row(s)" in msg and "row 2 (line 4) = row 1 (line 3)" in msg and str(p) in msg
    got = estimands(table, n_boot=200, seed=0)
    assert got.e1.estimate == pytest.approx(E1, abs=1e-12)
    assert got.e2.estimate == pytest.approx(E2, abs=1e-12)
    assert got.e3["c_scrambled"].estimate == pytest.approx(E3, abs=1e-12)


def test_a_table_without_repeats_gives_no_warning(tmp_path, caplog):
    from ipi.evaluation.scoretable import read_score_table

    p = tmp_path / "scores.csv"
    lines = TABLE.splitlines()
    p.write_text("\n".join(lines[:3] + lines[4:8] + lines[9:]) + "\n")  # each repeat removed
    with caplog.at_level(logging.WARNING, logger="ipi.evaluation.scoretable"):
        read_score_table(p)
    assert not [r for r in caplog.records if "repeat an earlier row" in r.getMessage()]


def test_evaluate_entry_point_accepts_tied_duplicate_rows(tmp_path):
    p = tmp_path / "scores.csv"
    p.write_text(TABLE)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "evaluate.py", f"scores={p}", f"hydra.run.dir={out}",
                           "evaluation.n_boot=50"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "repeat an earlier row exactly" in proc.stderr + proc.stdout
    res = json.loads((out / "results.json").read_text())
    assert res["e1"]["estimate"] == pytest.approx(E1, abs=1e-12)
    assert res["e2"]["estimate"] == pytest.approx(E2, abs=1e-12)
    assert res["e3"]["c_scrambled"]["estimate"] == pytest.approx(E3, abs=1e-12)
    assert res["counts"]["rows"] == 11
