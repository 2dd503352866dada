"""A ``-m`` sweep's jobs reuse the data import, rows and gallery of earlier jobs, with the same results."""

from __future__ import annotations

import json

import pytest

from tests.conftest import compose_train


def _strip(results: dict) -> dict:
    out = json.loads(json.dumps(results, default=str))
    out["run"].pop("data_root", None)
    return out


def test_sweep_memo_is_off_outside_a_multirun_and_bounded_inside(monkeypatch):
    from ipi.run import stages

    calls = []

    def compute(v):
        calls.append(v)
        return [v]

    monkeypatch.setattr(stages, "_SWEEP_MEMO", {})
    assert stages.sweep_memo(("k",), lambda: compute(1), "x") == [1]
    assert stages.sweep_memo(("k",), lambda: compute(2), "x") == [2]  # a single run: always computed
    monkeypatch.setattr(stages, "in_multirun", lambda: True)
    first = stages.sweep_memo(("k",), lambda: compute(3), "x")
    assert stages.sweep_memo(("k",), lambda: compute(4), "x") is first and calls == [1, 2, 3]
    for i in range(stages._SWEEP_MEMO_MAX + 3):
        stages.sweep_memo(("n", i), lambda i=i: compute(i), "x")
    assert len(stages._SWEEP_MEMO) == stages._SWEEP_MEMO_MAX and ("k",) not in stages._SWEEP_MEMO


@pytest.mark.slow
def test_sweep_jobs_reuse_rows_and_give_the_results_of_fresh_runs(tmp_path, monkeypatch):
    from ipi.run import tasks
    from ipi.run import stages

    base = ["data.max_trajectories=4", "split.test_fraction=0.5", "evaluation.n_boot=20", "logger=none",
            "evaluation.permutation.m=19", "report.plots=false", "report.html=false"]
    tasks.extract(compose_train(tmp_path, base))
    assert not stages.in_multirun()  # a single run never reuses: the memo is off

    built: list[str] = []
    real_build = stages.build_rows
    imports = []
    real_importer = stages.importer

    def counting_build(trajectories, surface, *a, **k):
        built.append(surface)
        return real_build(trajectories, surface, *a, **k)

    def counting_importer(*a, **k):
        imports.append(1)
        return real_importer(*a, **k)

    monkeypatch.setattr(stages, "build_rows", counting_build)
    monkeypatch.setattr(stages, "importer", counting_importer)

    def job(cell: str, tag: str) -> dict:
        layers, group = cell.split("|")
        cfg = compose_train(tmp_path, [*base, f"layers={layers}", f"token_group={group}",
                                       f"paths.output_dir={tmp_path / tag}"])
        return _strip(tasks.train(cfg)[0])

    fresh = {c: job(c, f"fresh-{i}") for i, c in enumerate(("six_1|task", "six_6|action"))}
    assert sorted(built) == sorted(["i_vis", "i_dom", "i_tool"] * 2) and len(imports) == 2

    built.clear(), imports.clear()
    monkeypatch.setattr(stages, "_SWEEP_MEMO", {})
    monkeypatch.setattr(stages, "in_multirun", lambda: True)
    swept = {c: job(c, f"sweep-{i}") for i, c in enumerate(("six_1|task", "six_6|action"))}
    # the second job built nothing: rows of all three surfaces and the import came from the first
    assert sorted(built) == ["i_dom", "i_tool", "i_vis"] and len(imports) == 1
    assert swept == fresh
    assert (tmp_path / "sweep-1" / "gallery.png").read_bytes() == (tmp_path / "fresh-1" / "gallery.png").read_bytes()
