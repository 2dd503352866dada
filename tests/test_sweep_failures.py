"""A failing job of a ``-m`` sweep does not end the sweep (ipi.run.cli, ipi.run.hydra_callbacks, ipi.reporting.sweep).

Every job runs; each failure is recorded with its reason in the job's folder and listed in
``<sweep>/failed_jobs.json``; the command exits 1 at the end; the sweep report lists the failed
cells and keeps them in the Holm family with p = 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO, SMALL_BACKBONE_OVERRIDES


def _cfg(tmp_path: Path):
    return OmegaConf.create({"task_name": "train", "paths": {"output_dir": str(tmp_path / "job")}})


@pytest.fixture
def in_sweep(monkeypatch):
    from ipi.run import cli

    monkeypatch.setattr(cli, "in_multirun", lambda: True)
    monkeypatch.setattr(cli, "_job_identity", lambda: ("1", ["data.root=/bad", "seed=0"]))


def test_failed_job_in_a_sweep_is_recorded_and_the_sweep_goes_on(tmp_path, in_sweep, capsys):
    from ipi.run.cli import run_entry
    from ipi.data.schema import DataError

    def bad_input(cfg):
        raise DataError("data.root=/bad: no usable trajectory\n  /bad/t0: no usable step")

    assert run_entry(bad_input, _cfg(tmp_path)) is None  # returns: the next job starts
    rec = json.loads((tmp_path / "job" / "failed.json").read_text())
    assert rec["job"] == "1" and rec["overrides"] == ["data.root=/bad", "seed=0"]
    assert rec["error"] == "DataError" and rec["input_error"] is True and rec["traceback"] is None
    assert rec["message"].startswith("data.root=/bad: no usable trajectory")
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"job 1 failed: DataError: data.root=/bad: no usable trajectory (recorded in "
                   f"{tmp_path / 'job' / 'failed.json'}; the sweep goes on)"]


def test_a_bug_in_a_sweep_job_is_recorded_with_its_traceback(tmp_path, in_sweep):
    from ipi.run.cli import run_entry

    def bug(cfg):
        raise KeyError("oops")

    assert run_entry(bug, _cfg(tmp_path)) is None
    rec = json.loads((tmp_path / "job" / "failed.json").read_text())
    assert rec["error"] == "KeyError" and rec["input_error"] is False
    assert "Traceback" in rec["traceback"] and "KeyError: 'oops'" in rec["traceback"]


def test_a_job_that_succeeds_on_rerun_loses_its_old_failure(tmp_path, in_sweep):
    from ipi.run.cli import run_entry

    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "failed.json").write_text("{}")
    assert run_entry(lambda cfg: ({}, {}), _cfg(tmp_path)) == ({}, {})
    assert not (tmp_path / "job" / "failed.json").exists()


def test_a_signal_still_ends_the_whole_sweep(tmp_path, in_sweep):
    import signal

    from ipi.run.cli import run_entry
    from ipi.interrupt import Interrupted

    def stopped(cfg):
        raise Interrupted(signal.SIGINT)

    with pytest.raises(SystemExit) as e:
        run_entry(stopped, _cfg(tmp_path))
    assert e.value.code == 130 and not (tmp_path / "job" / "failed.json").exists()


def test_outside_a_sweep_an_input_error_is_one_line_exit_2_and_a_bug_keeps_its_traceback(tmp_path, capsys):
    from ipi.run.cli import run_entry
    from ipi.data.schema import DataError

    def bad(cfg):
        raise DataError("x.png: step 1: cannot decode")

    with pytest.raises(SystemExit) as e:
        run_entry(bad, _cfg(tmp_path))
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("error: x.png: step 1: cannot decode  (DataError;")
    with pytest.raises(KeyError):
        run_entry(lambda cfg: {}["k"], _cfg(tmp_path))
    assert not (tmp_path / "job" / "failed.json").exists()


def _job(sweep: Path, n: int, overrides: list[str], failure: dict | None) -> None:
    (sweep / str(n) / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), sweep / str(n) / ".hydra" / "overrides.yaml")
    if failure is not None:
        (sweep / str(n) / "failed.json").write_text(json.dumps({"job": str(n), "overrides": overrides, **failure}))


def test_multirun_end_lists_the_failed_jobs_and_exits_1(tmp_path, capsys):
    from ipi.run.hydra_callbacks import ConfigCheck

    sweep = tmp_path / "sweep"
    common = ["seed=0", "quiet=true"]
    _job(sweep, 0, ["data.root=/a", *common], None)
    _job(sweep, 1, ["data.root=/bad", *common], {"error": "DataError", "message": "no usable trajectory\nmore"})
    _job(sweep, 2, ["data.root=/c", *common], {"error": "KeyError", "message": "'oops'"})
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    with pytest.raises(SystemExit) as e:
        ConfigCheck().on_multirun_end(cfg)
    assert e.value.code == 1
    listed = json.loads((sweep / "failed_jobs.json").read_text())
    assert [r["job"] for r in listed] == ["1", "2"]
    assert capsys.readouterr().err.splitlines() == [
        f"sweep: 2 of 3 jobs failed (listed in {sweep / 'failed_jobs.json'}):",
        "  job 1 (data.root=/bad): DataError: no usable trajectory",
        "  job 2 (data.root=/c): KeyError: 'oops'",
    ]
    # a sweep without failures ends normally, and says so in the file
    ok = tmp_path / "ok"
    _job(ok, 0, ["data.root=/a"], None)
    ConfigCheck().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(ok)}}}))
    assert json.loads((ok / "failed_jobs.json").read_text()) == []


def test_failed_cells_stay_in_the_holm_family_with_p_1():
    import pandas as pd

    from ipi.reporting.sweep import familywise

    df = pd.DataFrame({"job": ["0", "2"], "overrides": ["a", "c"], "claim": ["separates", "separates"],
                       "p_separates": [0.01, 0.02], "p_detects": [1.0, 1.0]})
    # by hand, alpha 0.025: two cells: 0.01 <= 0.025/2 and 0.02 <= 0.025/1 -> both rejected
    assert list(familywise(df, 0.025)["claim_familywise"] != "none") == [True, True]
    # three cells (one failed, p = 1): 0.01 > 0.025/3 -> nothing rejected
    assert list(familywise(df, 0.025, n_failed=1)["claim_familywise"]) == ["none", "none"]


@pytest.mark.slow
def test_real_sweep_with_a_failing_middle_job(tmp_path):
    """``train.py -m data.root=A,BAD,C``: jobs 0 and 2 finish, job 1 (no usable trajectory) is
    recorded, the command exits 1 listing it, and the sweep report lists the failed cell."""
    from tests.e2e.test_bad_inputs import messages, task_folder

    actions = ["Type [1]; cats", "ANSWER; done"]
    for name, offset in (("a", 0), ("c", 50)):
        for i in range(6):
            task_folder(tmp_path / name / f"t{i}", messages(actions, task=f"Find thing {i} {name}."),
                        {1: None, 2: None}, seed=i + 1 + offset)
    for i in range(3):  # logs whose screenshots are all missing: nothing usable
        task_folder(tmp_path / "bad" / f"t{i}", messages(actions, task=f"Find {i}."), {}, seed=i + 1)
    sweep = tmp_path / "sweep"
    roots = ",".join(str(tmp_path / n) for n in ("a", "bad", "c"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "train.py", "-m", f"data.root={roots}", "split.test_fraction=0.5", "evaluation.n_boot=50",
         "evaluation.random_twin=false", "evaluation.transfer=false", "evaluation.permutation.m=19", "logger=none",
         "report.plots=false", "report.html=false", "quiet=true", f"extract.cache_dir={tmp_path / 'cache'}",
         f"hydra.sweep.dir={sweep}", *SMALL_BACKBONE_OVERRIDES],
        cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert (sweep / "0" / "results.json").is_file() and (sweep / "2" / "results.json").is_file()
    assert not (sweep / "1" / "results.json").exists()
    rec = json.loads((sweep / "1" / "failed.json").read_text())
    assert rec["error"] == "DataError" and "no usable trajectory" in rec["message"]
    assert [r["job"] for r in json.loads((sweep / "failed_jobs.json").read_text())] == ["1"]
    assert f"sweep: 1 of 3 jobs failed (listed in {sweep / 'failed_jobs.json'}):" in proc.stderr
    assert f"  job 1 (data.root={tmp_path / 'bad'}): DataError: data.root={tmp_path / 'bad'}" in proc.stderr
    assert "Traceback" not in proc.stderr

    rep = subprocess.run([sys.executable, "-m", "ipi.reporting.sweep", str(sweep)], cwd=REPO, capture_output=True,
                         text=True, timeout=300, env=env)
    assert rep.returncode == 0, rep.stderr[-3000:]
    md = (sweep / "sweep_report.md").read_text()
    assert "3 jobs, 1 failed (below)." in md and "## Failed cells" in md
    assert f"| 1 | data.root={tmp_path / 'bad'} | DataError |" in md
    assert "Family: 3 cells (every job of this sweep, 1 of them failed: p = 1)" in md
    import pandas as pd

    failed = pd.read_csv(sweep / "failed_cells.csv", dtype=str)
    assert failed.job.tolist() == ["1"] and failed.cell.tolist() == [f"data.root={tmp_path / 'bad'}"]
    assert sorted(pd.read_csv(sweep / "sweep.csv", dtype={"job": str}).job) == ["0", "2"]
