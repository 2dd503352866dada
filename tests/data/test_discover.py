"""Discovery and WebVoyager variants: symlinks, max_trajectories first, exclusion report, split check.

Fixtures are WebVoyager task folders built here in the layout WebVoyager and its forks write
(tests/data/test_webvoyager.py helpers), plus the real shared folders linked into a data root.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

import ipi.data.webvoyager as wv
from ipi.data import DataError, import_webvoyager_report
from ipi.data.discover import reason_kind, summarise_skips
from tests.conftest import WEBVOYAGER, compose_train
from tests.data.test_webvoyager import OMITTED, PREAMBLE, _messages, _png, _task

# ------------------------------------------------------------------ WebVoyager variants


def test_site_infix_screenshot_names(tmp_path):
    """Forks name screenshots ``screenshot_<site>__<k>.png``; ``_no_box`` copies are not steps."""
    folder = tmp_path / "taskAmazon--3"
    folder.mkdir()
    (folder / "interact_messages.json").write_text(json.dumps(_messages(["Click [1]", "ANSWER; x"])))
    _png(folder / "screenshot_Amazon__1.png")
    _png(folder / "screenshot_Amazon__2.png")
    _png(folder / "screenshot_Amazon__2_no_box.png")
    (t,), skipped = import_webvoyager_report(tmp_path)
    assert skipped == [] and t.skipped == ()
    assert [os.path.basename(s.screenshot) for s in t.steps] == ["screenshot_Amazon__1.png", "screenshot_Amazon__2.png"]


def test_reflection_before_observation_keeps_the_element_list(tmp_path):
    msgs = _messages(["Click [1]", "ANSWER; x"])
    reflection = "Reflection: the last click opened the wrong page; go back to the results."
    msgs[3]["content"] = f"{reflection}\nObservation: {PREAMBLE}[0]: \"Results\";\t[1]: \"Next\";"
    _task(tmp_path / "t", msgs)
    (t,), _ = import_webvoyager_report(tmp_path)
    s1 = t.steps[1]
    assert s1.element_text == '[0]: "Results";\t[1]: "Next";' and not s1.element_text_omitted
    assert s1.tool_result == reflection
    # Without a reflection the same log keeps the usual feedback.
    assert t.steps[0].tool_result == "No previous action."


def test_reply_inventing_the_next_turn_is_cut(tmp_path):
    msgs = _messages(["x", "y"])
    msgs[2]["content"] = ("Thought: open the first result.\nAction: Click [38]\nuser: Observation: "
                          "the page shows ...\nassistant: Thought: done\nAction: ANSWER; 12")
    msgs[4]["content"] = "Thought: type it.\nAction: Type [2]; cats\n\nObservation: [0]: \"Home\""
    _task(tmp_path / "t", msgs)
    (t,), _ = import_webvoyager_report(tmp_path)
    s0, s1 = t.steps
    assert (s0.thought, s0.action, s0.action_type) == ("open the first result.", "Click [38]", "click")
    assert s1.action == "Type [2]; cats" and s1.history == ("Click [38]",)


# ------------------------------------------------------------------ discovery


def test_symlinked_task_folders_followed_once_and_loop_safe(tmp_path):
    store = tmp_path / "store"
    a = _task(store / "a", _messages(["Click [1]"]))
    b = _task(store / "b", _messages(["Click [2]"]))
    root = tmp_path / "root"
    root.mkdir()
    _task(root / "plain", _messages(["Click [3]"]))
    (root / "la").symlink_to(a, target_is_directory=True)
    (root / "lb").symlink_to(b, target_is_directory=True)
    (root / "la_again").symlink_to(a, target_is_directory=True)
    (root / "loop").symlink_to(root, target_is_directory=True)  # a link to an ancestor
    (root / "broken").symlink_to(tmp_path / "gone", target_is_directory=True)
    trajs, skipped = import_webvoyager_report(root)
    assert [t.trajectory_id for t in trajs] == ["la", "lb", "plain"]
    reasons = {os.path.basename(d["path"]): d["reason"] for d in skipped}
    assert reasons == {"la_again": f"symlink to a folder already found: {root / 'la'}",
                       "loop": f"symlink to a folder already found: {root}",
                       "broken": f"broken symlink (target {tmp_path / 'gone'} does not exist)"}
    assert summarise_skips(skipped) == [("symlink to a folder already found", 2), ("broken symlink", 1)]


@pytest.mark.needs_shared
def test_max_trajectories_reads_only_what_it_needs(tmp_path, monkeypatch):
    calls = []
    real = wv._import_task
    monkeypatch.setattr(wv, "_import_task", lambda folder, *a, **k: calls.append(folder) or real(folder, *a, **k))
    trajs, _ = import_webvoyager_report(WEBVOYAGER, limit=6)
    n_read = len(calls)
    all_ids = sorted(t.trajectory_id for t in import_webvoyager_report(WEBVOYAGER)[0])
    assert len(trajs) == 6 and [t.trajectory_id for t in trajs] == all_ids[:6]
    assert n_read == 6 and len(calls) == 6 + 42  # not 42 for the first


def test_max_trajectories_applies_before_the_duplicate_check(tmp_path):
    _task(tmp_path / "a", _messages(["Click [1]"]))
    _task(tmp_path / "b", _messages(["Click [2]"]))
    shutil.copytree(tmp_path / "a", tmp_path / "z_copy_of_a")
    _, skipped = import_webvoyager_report(tmp_path)
    assert [reason_kind(d["reason"]) for d in skipped] == ["duplicate"]
    with pytest.raises(DataError, match="duplicate of a"):
        import_webvoyager_report(tmp_path, on_bad_step="error")
    trajs, skipped = import_webvoyager_report(tmp_path, on_bad_step="error", limit=2)
    assert [t.trajectory_id for t in trajs] == ["a", "b"] and skipped == []


# ------------------------------------------------------------------ load_data: report and split check


def _mixed_root(tmp_path):
    root = tmp_path / "mixed"
    root.mkdir()
    _task(root / "ok1", _messages(["Click [1]"]))
    (root / "lfs").mkdir()
    (root / "lfs" / "interact_messages.json").write_text(json.dumps(_messages(["Click [1]", "Click [2]"])))
    for k in (1, 2):
        (root / "lfs" / f"screenshot{k}.png").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 9\n")
    (root / "badjson").mkdir()
    (root / "badjson" / "interact_messages.json").write_text("{nope")
    (root / "shots_only").mkdir()
    _png(root / "shots_only" / "screenshot1.png")
    (root / "dangling").symlink_to(tmp_path / "nowhere", target_is_directory=True)
    (root / "om2w").mkdir()
    (root / "om2w" / "result.json").write_text("{}")
    return root


def test_nothing_usable_is_reported_per_reason_before_any_rendering(tmp_path, monkeypatch):
    import ipi.run.tasks as tasks

    root = _mixed_root(tmp_path)
    shutil.rmtree(root / "ok1")
    cfg = compose_train(tmp_path, [f"data.root={root}", "logger=none", "report.gallery=false"])
    monkeypatch.setattr(tasks, "make_rows", lambda *a, **k: pytest.fail("rendered before the data check"))
    with pytest.raises(DataError) as e:
        tasks.train(cfg)
    msg = str(e.value)
    assert "no usable trajectory; left out 5: " in msg
    for part in ("1 × broken symlink", "1 × no usable step (unreadable screenshot: Git LFS pointer file",
                 "1 × not valid JSON", "1 × screenshots but no interact_messages.json",
                 "1 × an Online-Mind2Web result folder, not a WebVoyager task folder"):
        assert part in msg
    assert str(root / "lfs") in msg and str(root / "badjson" / "interact_messages.json") in msg


def test_split_feasibility_checked_before_any_rendering(tmp_path, monkeypatch):
    import ipi.run.tasks as tasks

    root = _mixed_root(tmp_path)
    for i, name in enumerate(("ok2", "ok3"), 2):
        _task(root / name, _messages([f"Click [{i}]"]))
    monkeypatch.setattr(tasks, "make_rows", lambda *a, **k: pytest.fail("rendered before the split check"))
    cfg = compose_train(tmp_path, [f"data.root={root}", "logger=none"])
    trajs, traj_skips, _ = tasks.load_data(cfg)
    assert [t.trajectory_id for t in trajs] == ["ok1", "ok2", "ok3"] and len(traj_skips) == 5
    with pytest.raises(ValueError, match=r"3 usable trajectories: split=holdout test_fraction=0.5 gives "
                                         r"fold 0 1 training and 2 test trajectories; each side of each fold needs >= 2 \(split.min_per_side\)"):
        tasks.train(cfg)
    cfg = compose_train(tmp_path, [f"data.root={root}", "logger=none", "split=kfold", "split.k=2"])
    with pytest.raises(ValueError, match="fold 0 1 training and 2 test|fold 0 2 training and 1 test"):
        tasks.train(cfg)
    tasks.check_split_feasible(cfg, [f"ok{i}" for i in range(1, 7)])  # 3 + 3 per fold: fine
    cfg = compose_train(tmp_path, [f"data.root={root}", "logger=none", "split.min_per_side=1"])
    tasks.check_split_feasible(cfg, ["ok1", "ok2", "ok3"])  # 2 + 1: allowed when asked for
    with pytest.raises(ValueError, match="split.min_per_side must be >= 1"):
        from ipi.run.validation import validate

        validate(compose_train(tmp_path, [f"data.root={root}", "split.min_per_side=0"]))


def test_exclusion_report_counts(tmp_path):
    from ipi.run.stages import exclusion_report

    root = _mixed_root(tmp_path)
    _, skipped = import_webvoyager_report(root)
    text = exclusion_report(skipped)
    assert text.splitlines()[0].startswith("left out 5: 1 × an Online-Mind2Web result folder")
    assert OMITTED  # the shared helpers are the WebVoyager layout
