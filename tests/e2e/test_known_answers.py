"""Known answers end to end (issue 23): train.py on constructed backbones reaches the planted verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.needs_shared
def test_semantic_detects_and_lexical_does_not(tmp_path):
    """One split of the real shared trajectories through train.py (a subprocess, as a user runs it):
    the backbone that reads intent (one direction on every attacker-goal token, held-out wording)
    is licensed "detects malicious content"; the one that reads token identity only (loud random
    directions on each bank entry's own words) is not."""
    from ipi.tools.known_answers import claim_kind, main

    out = tmp_path / "ka"
    res = main(["--repeats", "1", "--cells", "semantic:i_dom,lexical:i_dom", "--out", str(out),
                f"extract.cache_dir={tmp_path / 'cache'}"])
    by = {r["cell"]: r for r in res["runs"]}
    assert by["semantic:i_dom"]["claim_kind"] == "detects", by["semantic:i_dom"]
    assert by["lexical:i_dom"]["claim_kind"] != "detects", by["lexical:i_dom"]
    # the table is written and says the same
    table = json.loads((out / "known_answers.json").read_text())
    assert {s["cell"]: s["met"] for s in table["summary"]} == {"semantic:i_dom": True, "lexical:i_dom": True}
    # the runs are train.py's own: results.json marks the backbone constructed, never pretrained
    for r in res["runs"]:
        run = json.loads((Path(r["run"]) / "results.json").read_text())
        assert run["run"]["random_twin"]["backbone_pretrained"] is False
        assert run["run"]["wording"]["heldout"] is True and run["run"]["wording"]["overlap"] == 0
    assert claim_kind("detects malicious content ...") == "detects"


def test_table_reading_is_generic():
    """The tool reads claims and checks from results.json as any reader would (hand-made verdicts)."""
    from ipi.tools.known_answers import CELLS, claim_kind, stopping_checks, summarise

    assert claim_kind("separates clean steps from this attack surface on this split") == "separates"
    assert claim_kind(None) == claim_kind("no claim is licensed") == "none"
    v = {"checks": [{"id": 1, "status": "PASS"}, {"id": 3, "status": "FAIL"}, {"id": 6, "status": "NOT RUN"}]}
    assert stopping_checks(v) == ["3 FAIL", "6 NOT RUN"]
    sem = next(c for c in CELLS if c.name == "semantic:i_dom")
    lex = next(c for c in CELLS if c.name == "lexical:i_dom:shared_wording")
    recs = ([{"cell": sem.name, "claim_kind": "detects", "stopped_by": []}] * 9
            + [{"cell": sem.name, "claim_kind": "separates", "stopped_by": ["6 FAIL"]}]
            + [{"cell": lex.name, "claim_kind": "separates", "stopped_by": ["3 FAIL"]}] * 9
            + [{"cell": lex.name, "claim_kind": "detects", "stopped_by": []}])
    s = {x["cell"]: x for x in summarise(recs, [sem, lex])}
    assert s[sem.name]["met"] and s[sem.name]["detects"] == 9 and s[sem.name]["stopped_by"] == {"6 FAIL": 1}
    assert not s[lex.name]["met"] and s[lex.name]["stopped_by"] == {"3 FAIL": 9}  # one "detects" is one too many
    s8 = summarise(recs[1:], [sem])[0]  # 8 of 9
    assert not s8["met"]


def test_jobs_never_run_two_groups_of_one_surface_at_once(tmp_path, monkeypatch):
    """--jobs runs one chain per surface (its groups in order, so a later group reads the earlier
    one's cache entries); a failed chain does not stop the others and is named at the end."""
    import threading
    import time

    import ipi.tools.known_answers as ka

    assert ka.chains([("i_dom", True), ("i_tool", True), ("i_dom", False), ("i_vis", True), ("i_tool", False)]) == [
        [("i_vis", True)], [("i_dom", True), ("i_dom", False)], [("i_tool", True), ("i_tool", False)]]
    running: dict[str, int] = {}
    seen: list[tuple[str, bool]] = []
    peak = {"all": 0}
    lock = threading.Lock()

    def fake_group(cells, seeds, out, extra, python, collect=False):
        s, h = cells[0].surface, cells[0].heldout
        with lock:
            running[s] = running.get(s, 0) + 1
            assert running[s] == 1, f"two groups of {s} at once"
            peak["all"] = max(peak["all"], sum(running.values()))
            seen.append((s, h))
        time.sleep(0.05)
        with lock:
            running[s] -= 1
        if s == "i_vis":
            raise RuntimeError("known answers: train.py failed (exit 1) for i_vis_heldout; see log")
        return [{"cell": c.name, "claim_kind": "separates", "stopped_by": ["6 FAIL"]} for c in cells for _ in seeds], 1.0

    monkeypatch.setattr(ka, "run_group", fake_group)
    with pytest.raises(SystemExit, match="i_vis_heldout"):
        ka.main(["--repeats", "2", "--jobs", "2", "--out", str(tmp_path)])
    assert peak["all"] == 2
    assert seen.index(("i_dom", True)) < seen.index(("i_dom", False))
    assert seen.index(("i_tool", True)) < seen.index(("i_tool", False))
    table = json.loads((tmp_path / "known_answers.json").read_text())
    assert table["meta"]["groups_done"] == 4 and table["runs"] and all(r["cell"] != "surface:i_vis" for r in table["runs"])


#: A stand-in for ``python train.py -m ...`` (the tool's ``--python``): expands the sweep
#: (backbone x split.seed), writes each job's ``.hydra/overrides.yaml`` and a ``results.json`` whose
#: verdict is the cell's known answer, and counts its calls.
FAKE_TRAIN = '''
import itertools, json, sys
from pathlib import Path
args = sys.argv[3:]  # train.py, -m
calls = Path(__file__).with_suffix(".calls")
calls.write_text(str(int(calls.read_text() or 0) + 1) if calls.exists() else "1")
sweep = Path(next(a.split("=", 1)[1] for a in args if a.startswith("hydra.sweep.dir=")))
task = [a for a in args if not a.startswith("hydra.")]
swept = {k: a.split("=", 1)[1].split(",") for a in task for k in ("backbone", "split.seed") if a.startswith(k + "=")}
for num, (bb, seed) in enumerate(itertools.product(swept["backbone"], swept["split.seed"])):
    job = sweep / str(num)
    (job / ".hydra").mkdir(parents=True, exist_ok=True)
    ov = [f"backbone={bb}" if a.startswith("backbone=") else f"split.seed={seed}" if a.startswith("split.seed=") else a
          for a in task]
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\\n" for o in ov))
    detects = bb.startswith("planted_semantic")
    checks = [{"id": 1, "name": "separates", "status": "PASS"},
              {"id": 6, "name": "selective vs a random-weight twin", "status": "PASS" if detects else "FAIL"}]
    claim = "detects malicious content" if detects else "separates clean steps from this attack surface on this split"
    (job / "results.json").write_text(json.dumps({"verdict": {"claim": claim, "checks": checks}}))
'''

CELLS2 = ["--cells", "semantic:i_tool,random:i_tool"]


def _fake_python(tmp_path):
    import sys

    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    exe.chmod(0o755)
    return str(exe), script.with_suffix(".calls")


def _by_cell(res):
    return {s["cell"]: s for s in res["summary"]}


def test_a_reused_out_folder_counts_only_this_commands_runs(tmp_path):
    """--out reused with fewer repeats and another override: the earlier invocation's runs (split
    seed 1, made without the override) are not counted beside the new ones (before: 2 repeats per
    cell, one of them stale); the same command again reads its finished runs without rerunning;
    --collect asking for a seed no run has says the cell is not met."""
    from ipi.tools.known_answers import main

    py, calls = _fake_python(tmp_path)
    out = str(tmp_path / "ka")
    first = main(["--repeats", "2", *CELLS2, "--out", out, "--python", py])
    assert {c: (s["repeats"], s["detects"], s["met"]) for c, s in _by_cell(first).items()} == {
        "semantic:i_tool": (2, 2, True), "random:i_tool": (2, 0, True)}
    second = main(["--repeats", "1", *CELLS2, "--out", out, "--python", py, "evaluation.n_boot=500"])
    assert {c: s["repeats"] for c, s in _by_cell(second).items()} == {"semantic:i_tool": 1, "random:i_tool": 1}
    assert sorted((r["cell"], r["split_seed"]) for r in second["runs"]) == [("random:i_tool", 0), ("semantic:i_tool", 0)]
    assert calls.read_text() == "2"
    again = main(["--repeats", "1", *CELLS2, "--out", out, "--python", py, "evaluation.n_boot=500"])
    assert calls.read_text() == "2" and again["summary"] == second["summary"]  # read, not rerun
    part = main(["--collect", "--repeats", "2", *CELLS2, "--out", out, "--python", py, "evaluation.n_boot=500"])
    assert {c: (s["repeats"], s["missing_seeds"], s["met"]) for c, s in _by_cell(part).items()} == {
        "semantic:i_tool": (1, [1], False), "random:i_tool": (1, [1], False)}
    assert part["all_met"] is False
    md = (tmp_path / "ka" / "known_answers.md").read_text()
    assert "**NO** (no run on split seed 1)" in md
    assert "6 selective vs a random-weight twin" in md  # the table names the checks it counts


def test_collect_on_an_empty_folder_is_not_met(tmp_path):
    """A cell without a single run is a row that says so and is not met (before: no row, all_met true)."""
    from ipi.tools.known_answers import main

    res = main(["--collect", "--cells", "semantic:i_tool", "--repeats", "1", "--out", str(tmp_path / "empty")])
    assert [(s["cell"], s["repeats"], s["met"]) for s in res["summary"]] == [("semantic:i_tool", 0, False)]
    assert res["all_met"] is False
    assert json.loads((tmp_path / "empty" / "known_answers.json").read_text())["all_met"] is False


@pytest.mark.parametrize("args, message", [
    (["--cells", "semantic:i_tool,lexcal:i_tool"], "no such cell 'lexcal:i_tool'"),
    (["--cells", "semantic:i_tool,"], "no such cell ''"),
    (["--repeats", "0"], None),
    (["--repeats", "-1"], None),
    (["--jobs", "0"], None),
    (["backbone=smollm2_135m"], None),
    (["backbone.loader.plant.gain=0"], None),
    (["split.seed=3"], None),
    (["+hydra.sweep.dir=/tmp/elsewhere"], None),
])
def test_bad_arguments_fail_before_any_run(tmp_path, capsys, args, message):
    """A misspelt cell (before: dropped, the others run), no repeats or jobs, or an override of what
    the tool sets per cell (before: Hydra keeps the last value, so every cell ran the other backbone
    under its own name) stop before train.py starts, naming the argument."""
    from ipi.tools.known_answers import main

    py, calls = _fake_python(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["--repeats", "1", *CELLS2, "--out", str(tmp_path / "ka"), "--python", py, *args])
    said = str(e.value.code) + capsys.readouterr().err
    assert (message or args[-1]) in said
    assert not calls.exists() and not (tmp_path / "ka" / "known_answers.json").exists()


def test_merge_refuses_missing_parts_duplicated_splits_and_other_overrides(tmp_path):
    """--merge of the same split twice would count it twice (before: repeats 2, met); of a folder
    without known_answers.json (before: a FileNotFoundError traceback); of parts run with different
    train.py overrides (not repeats of one cell)."""
    import shutil

    from ipi.tools.known_answers import main

    py, _ = _fake_python(tmp_path)
    a, b, c = (str(tmp_path / n) for n in "abc")
    main(["--repeats", "1", *CELLS2, "--out", a, "--python", py])
    shutil.copytree(a, b)
    with pytest.raises(SystemExit, match="semantic:i_tool split seed 0.*more than one part"):
        main(["--merge", a, b, "--out", str(tmp_path / "m")])
    with pytest.raises(SystemExit, match=f"{tmp_path / 'nowhere'}/known_answers.json does not exist"):
        main(["--merge", a, str(tmp_path / "nowhere"), "--out", str(tmp_path / "m")])
    main(["--repeats", "2", "--cells", "semantic:i_tool", "--out", c, "--python", py, "evaluation.n_boot=500"])
    with pytest.raises(SystemExit, match="different extra overrides"):
        main(["--merge", a, c, "--out", str(tmp_path / "m")])


def test_every_split_counts_once_and_a_run_needs_a_verdict(tmp_path):
    """Two runs of one cell on one split seed never count as two repeats; a results.json without a
    verdict is an error, not a "none" claim (which would meet every "never detects" cell)."""
    from ipi.tools.known_answers import CELLS, run_record, summarise

    sem = next(c for c in CELLS if c.name == "semantic:i_tool")
    rec = {"cell": sem.name, "claim_kind": "detects", "stopped_by": [], "split_seed": 0}
    with pytest.raises(ValueError, match="more than one run on split seed"):
        summarise([rec, dict(rec)], [sem])
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"e1": {}}))
    with pytest.raises(ValueError, match="has no verdict"):
        run_record(path, sem, 0)
