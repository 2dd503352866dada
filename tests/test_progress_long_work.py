"""Long work says what it does, how far along it is and its ETA (the free run, the benchmark, the lines of a log).

The progress display is :mod:`ipi.progress`; under pytest stderr is not a terminal, so each bar
writes plain lines (``<what>: done/total (share), elapsed h:mm:ss, ETA h:mm:ss``).
"""

from __future__ import annotations

import re
import time

import pytest

from ipi import progress

LINE = re.compile(r"^(?P<what>.+): (?P<done>\d+)/(?P<total>\d+|\?)(?: \(\d+ %\))?, elapsed \d+:\d\d:\d\d, "
                  r"ETA (?:\d+:\d\d:\d\d|\?)$")


@pytest.fixture(autouse=True)
def _shown(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("IPI_QUIET", raising=False)
    progress.set_quiet(False)
    yield
    progress.set_quiet(None)


def _lines(err: str, what: str) -> list[tuple[int, str]]:
    """``(done, total)`` of every progress line whose description starts with ``what``."""
    out = []
    for line in err.splitlines():
        m = LINE.match(line)
        if m and m["what"].startswith(what):
            out.append((int(m["done"]), m["total"]))
    return out


def test_a_log_hears_from_a_stage_while_one_unit_runs_long(capsys, monkeypatch):
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.05)
    with progress.progress_bar("slow stage", 2) as bar:
        time.sleep(0.4)  # one unit of work far longer than LINE_EVERY_S, no advance yet
        during = _lines(capsys.readouterr().err, "slow stage")
        bar.advance(2)
    # a line at the start and several while the first unit runs, all at 0/2; then the end, 2/2
    assert len(during) >= 3 and set(during) == {(0, "2")}
    assert _lines(capsys.readouterr().err, "slow stage")[-1] == (2, "2")


def test_bench_names_each_stage_with_stages_done_and_eta(capsys, monkeypatch):
    from ipi.tools import bench

    ran = []

    def stage(name, result):
        def run(*a, **k):
            ran.append(name)
            return {"stage": name, **result}
        return run

    monkeypatch.setattr(bench, "extraction_benchmark", stage("extraction", {}))
    monkeypatch.setattr(bench, "entry_timings", stage("timings", {}))
    monkeypatch.setattr(bench, "twin_benchmark", stage("twins", {}))
    monkeypatch.setattr(bench, "bench_bootstrap", stage("bootstrap", {}))
    monkeypatch.setattr(bench, "bench_permutation", stage("permutation", {}))
    bench.main(["--only", "all"])
    out, err = capsys.readouterr()
    assert ran == ["extraction", "timings", "twins", "bootstrap", "permutation"]
    for i, name in enumerate(ran, 1):
        assert (i - 1, "5") in _lines(err, f"bench: {name} ({i}/5)"), err
    assert _lines(err, "bench: permutation (5/5)")[-1] == (5, "5")
    assert '"permutation": {"stage": "permutation"}' in out


def test_bench_entry_timings_report_each_subprocess(capsys, monkeypatch, tmp_path):
    from ipi.tools import extraction_timing

    cmds = []

    def fake_run(cmd, cwd, env):
        cmds.append(cmd)
        return {"wall_s": 1.0, "cpu_s": 1.0}

    monkeypatch.setattr(extraction_timing, "_timed_run", fake_run)
    extraction_timing.entry_timings(tmp_path, tmp_path, sweep=True)
    err = capsys.readouterr().err
    assert len(cmds) == 4
    assert (0, "4") in _lines(err, "entry scripts: extract.py")
    assert (3, "4") in _lines(err, "entry scripts: train.py -m (30 jobs)")
    assert _lines(err, "entry scripts")[-1] == (4, "4")


def test_known_answers_reports_groups_done(capsys, monkeypatch, tmp_path):
    import ipi.tools.known_answers as ka

    def fake_group(cells, seeds, out, extra, python, collect=False):
        return [{"cell": c.name, "claim_kind": "separates", "stopped_by": ["6 FAIL"]} for c in cells for _ in seeds], 1.0

    monkeypatch.setattr(ka, "run_group", fake_group)
    ka.main(["--repeats", "1", "--cells", "semantic:i_dom,lexical:i_tool", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert (0, "2") in _lines(err, "known answers")
    assert _lines(err, "known answers")[-1] == (2, "2")
    assert any(what.startswith("known answers: i_tool:") for what in
               (LINE.match(line)["what"] for line in err.splitlines() if LINE.match(line)))
