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
