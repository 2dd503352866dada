"""A token group empty on clean rows only: counted by variant, and warned about in results.json, the log and the report.

An empty group pools to zeros; when clean rows have an empty observation (an empty element list)
and attack rows do not (the injected entry), a probe on that group can separate the two by
emptiness alone. The counts are checked against the token groups the replay itself gives each
row (:func:`ipi.replay.tokenise`).
"""

from __future__ import annotations

import json
import logging

import pytest

from tests.conftest import PROCESSOR, compose_train
from tests.e2e.test_bad_inputs import png_bytes

pytestmark = [pytest.mark.needs_shared, pytest.mark.slow]

N_TRAJ = 10


def _root(tmp_path, empty_every: int):
    """A native-schema JSONL of one-step trajectories; every ``empty_every``-th one (0: none) shows an
    empty element list and an empty tool result (its observation group has no token)."""
    root = tmp_path / "data"
    root.mkdir(parents=True)
    with (root / "trajectories.jsonl").open("w", encoding="utf-8") as f:
        for i in range(N_TRAJ):
            empty = bool(empty_every) and i % empty_every == 0
            shot = root / f"shot{i}.png"
            shot.write_bytes(png_bytes(i + 1))
            f.write(json.dumps({
                "trajectory_id": f"t{i}", "task": f"Find thing {i}.", "source": "native", "horizon": 1,
                "steps": [{"step": 0, "screenshot": str(shot),
                           "element_text": "" if empty else '[0]: "Home";\t[1]: <input> "q";',
                           "element_text_omitted": False, "tool_result": "" if empty else "No previous action.",
                           "thought": f"Look for thing {i}.", "action": "ANSWER; done", "action_type": "answer",
                           "history": []}]}) + "\n")
    return root / "trajectories.jsonl"


def _run(tmp_path, root, tag: str):
    from ipi.run import tasks

    cfg = compose_train(tmp_path / tag, [
        "backbone=tiny_qwen2_text", "data=native", "surface=i_dom", "token_group=observation", "layers=last",
        f"data.root={root}", "split.test_fraction=0.5", "evaluation.n_boot=20", "evaluation.permutation.m=0",
        "evaluation.transfer=false", "logger=none", "report.plots=false", "report.html=false",
        "report.gallery=false", "backbone.loader.text.num_hidden_layers=2", "backbone.n_layers=2"], small=False)
    results, _ = tasks.train(cfg)
    return cfg, results


def _expected_counts(cfg) -> dict:
    """Rows and rows with an empty token group per variant, from the replay's own token groups."""
    from ipi.backbone import load_processor
    from ipi.backbone_text import TextChatProcessor
    from ipi.protocol import TOKEN_GROUPS
    from ipi.replay import tokenise
    from ipi.run import stages

    proc = TextChatProcessor(load_processor(str(PROCESSOR)).tokenizer)  # the text backbone's processor
    trajs, _, _ = stages.load_data(cfg)
    folds, plan = stages.split_folds(cfg, trajs)
    rows = stages.make_rows(cfg, trajs, "i_dom", wording=plan)
    out: dict = {}
    for r in rows:
        t = tokenise(proc, r.parts(str(cfg.backbone.system_prompt), False))
        c = out.setdefault(r.variant.variant, {"rows": 0, **{g: 0 for g in TOKEN_GROUPS}})
        c["rows"] += 1
        for g in TOKEN_GROUPS:
            c[g] += int(t.groups[g].numel() == 0)
    return out


def test_empty_observation_on_clean_rows_only_is_counted_and_warned(tmp_path, caplog):
    root = _root(tmp_path, empty_every=2)  # half the trajectories show an empty element list
    with caplog.at_level(logging.WARNING):
        cfg, results = _run(tmp_path, root, "empty")
    counts = results["counts"]["empty_token_groups"]
    assert counts == _expected_counts(cfg)
    # clean rows: the empty lists (5 of 10); attack and every control: the injected text is there
    assert counts["clean"]["observation"] == N_TRAJ // 2 and counts["attack"]["observation"] == 0
    warnings = results["warnings"]
    assert len(warnings) == 1 and "token group observation" in warnings[0]
    assert "clean 50.0% vs attack 0.0% (can drive E1, E2)" in warnings[0]
    assert any("token group observation" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    out = tmp_path / "empty" / "run"
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["warnings"] == warnings and on_disk["counts"]["empty_token_groups"] == counts
    report = (out / "report.md").read_text()
    assert "Warnings" in report and "can drive E1, E2" in report
    assert "empty_token_groups" in report  # the counts, in the data counts section


def test_no_empty_group_no_warning(tmp_path):
    cfg, results = _run(tmp_path, _root(tmp_path, empty_every=0), "full")
    counts = results["counts"]["empty_token_groups"]
    assert all(c["observation"] == 0 for c in counts.values())
    assert results["warnings"] == []
