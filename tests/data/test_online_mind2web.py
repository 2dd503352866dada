"""Online-Mind2Web result folders in every published layout, built here from the documented schema.

Layouts (docs/data.md, "Online-Mind2Web"): v1 with 0-based before-action frames, v1 with 1-based
after-action frames (published agents), batched actions sharing a frame, v2 with per-step
screenshots and a final answer step; plus the folder-level cases (task_id vs folder, nested
duplicates, Git LFS pointers, evaluation-only records, symlinks, refused images).
"""

from __future__ import annotations

import io
import json
import os

import pytest
from PIL import Image

from ipi.data import DataError, import_online_mind2web_report, read_native, write_native
from ipi.data.images import LFS_POINTER_REASON
from ipi.data.online_mind2web import NO_FIRST_FRAME


def _img(fmt="PNG", size=(64, 48), colour=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format=fmt)
    return buf.getvalue()


def _v1(root, name, actions, thoughts=None, frames=(), task_id=None, fmt="PNG", ext="png"):
    folder = root / name
    (folder / "trajectory").mkdir(parents=True)
    result = {"task_id": task_id or name, "task": f"Task of {name}", "final_result_response": "done",
              "action_history": actions}
    if thoughts is not None:
        result["thoughts"] = thoughts
    (folder / "result.json").write_text(json.dumps(result))
    for k in frames:
        (folder / "trajectory" / f"{k}_full_screenshot.{ext}").write_bytes(_img(fmt))
    return folder


def _frame_of(step) -> int:
    return int(os.path.basename(step.screenshot).split("_")[0])


A = ["<input> Search -> TYPE: boots", "<button> Go -> CLICK", "<a> Boots size 9 -> CLICK"]


def test_v1_before_action_frames_from_zero(tmp_path):
    _v1(tmp_path, "t0", A, thoughts=["type", "submit", "open"], frames=[0, 2, 3])  # 3 = final page
    (t,), skipped = import_online_mind2web_report(tmp_path)
    assert skipped == [] and t.horizon == 3 and t.meta["layout"] == "v1 before-action frames"
    assert [(s.step, _frame_of(s)) for s in t.steps] == [(0, 0), (2, 2)]
    assert [(k.step, k.reason) for k in t.skipped] == [(1, "missing screenshot")]
    s0, s2 = t.steps
    assert (s0.thought, s0.action, s0.action_type, s0.tool_result) == ("type", A[0], "type", "No previous action.")
    assert s2.tool_result == f"Action executed: {A[1]}" and s2.history == tuple(A[:2])
    assert s0.element_text == "" and s0.element_text_omitted


def test_v1_after_action_frames_from_one(tmp_path):
    """Published agents number frames from 1, each taken after an action: action k saw frame k."""
    _v1(tmp_path, "t1", A, thoughts=["type", "submit", "open"], frames=[1, 2, 3])
    (t,), _ = import_online_mind2web_report(tmp_path)
    assert t.meta["layout"] == "v1 after-action frames"
    assert [(s.step, _frame_of(s)) for s in t.steps] == [(1, 1), (2, 2)]
    assert [(k.step, k.reason) for k in t.skipped] == [(0, NO_FIRST_FRAME)]
    # Forcing the other layout pairs by number from 0 (frame 0 missing, step 1 gets frame 1).
    (f,), _ = import_online_mind2web_report(tmp_path, frames="before")
    assert [(s.step, _frame_of(s)) for s in f.steps] == [(1, 1), (2, 2)]
    assert [(k.step, k.reason) for k in f.skipped] == [(0, "missing screenshot")]


def test_v1_batched_actions_share_a_frame(tmp_path):
    acts = ["<input> From -> TYPE: NYC", "<input> To -> TYPE: LA", "<button> Search -> CLICK", "<a> 9am -> CLICK"]
    thoughts = ["fill the form", "fill the form", "search", "pick the first flight"]
    _v1(tmp_path, "after", acts, thoughts=thoughts, frames=[1, 2, 3])
    _v1(tmp_path, "before", acts, thoughts=thoughts, frames=[0, 1, 2, 3])
    a, b = import_online_mind2web_report(tmp_path)[0]
    assert a.meta["layout"] == "v1 after-action frames, batched"
    assert [(s.step, _frame_of(s)) for s in a.steps] == [(2, 1), (3, 2)]
    assert [(k.step, k.reason) for k in a.skipped] == [(0, NO_FIRST_FRAME), (1, NO_FIRST_FRAME)]
    assert [(s.step, _frame_of(s)) for s in b.steps] == [(0, 0), (1, 0), (2, 1), (3, 2)]
    assert b.steps[1].history == (acts[0],)  # the second action of the call still sees the first
    (u,), _ = import_online_mind2web_report(tmp_path / "before", batches=False)
    assert [(s.step, _frame_of(s)) for s in u.steps] == [(0, 0), (1, 1), (2, 2), (3, 3)]


def test_v2_schema_webp_verbs_and_final_answer_dropped(tmp_path):
    folder = tmp_path / "v2task"
    (folder / "trajectory").mkdir(parents=True)
    for n in ("s0.webp", "s1.webp", "s2.png"):
        (folder / "trajectory" / n).write_bytes(_img("WEBP" if n.endswith("webp") else "PNG"))
    steps = [{"action": "-> NAVIGATE: https://www.united.com", "thought": "open the site", "screenshot": "s0.webp"},
             {"action": "click_at(412, 88)", "thought": "open menu", "screenshot": "s1.webp"},
             {"action": 'press_key("Enter")', "thought": "submit", "screenshot": "s1.webp"},
             {"action": "-> GO_BACK", "thought": "back", "screenshot": "s2.png"},
             {"action": "TASK_COMPLETE -> ANSWER: 3 flights", "thought": "done", "screenshot": "s2.png"}]
    (folder / "result.json").write_text(json.dumps({
        "schema_version": "online-mind2web-v2", "task_id": "v2task", "task": "Find a flight",
        "action_history": steps, "agent_final_answer": "3 flights"}))
    (t,), skipped = import_online_mind2web_report(tmp_path)
    assert skipped == [] and t.horizon == 4 and t.meta["layout"] == "v2"
    assert [(s.action_type, os.path.basename(s.screenshot)) for s in t.steps] == [
        ("navigate", "s0.webp"), ("click", "s1.webp"), ("press", "s1.webp"), ("goback", "s2.png")]
    assert all("TASK_COMPLETE" not in s.action for s in t.steps)


def test_folder_id_nested_duplicates_and_max_trajectories(tmp_path):
    _v1(tmp_path, "renamed", A, frames=[0, 1, 2], task_id="abc123")
    _v1(tmp_path, "x", A, frames=[0, 1, 2])
    _v1(tmp_path / "x" / "copy", "x", A, frames=[0, 1, 2])  # a task folder nested inside another
    trajs, skipped = import_online_mind2web_report(tmp_path)
    assert [t.trajectory_id for t in trajs] == ["renamed", "x"]
    assert trajs[0].meta["task_id"] == "abc123" and trajs[0].meta["folder"] == "renamed"
    (dup,) = skipped
    assert dup["path"].endswith("x/copy/x/result.json") and dup["reason"].startswith("duplicate trajectory id 'x'")
    with pytest.raises(DataError, match="duplicate trajectory id"):
        import_online_mind2web_report(tmp_path, on_bad_step="error")
    # max_trajectories is applied first: the nested copy is never read.
    trajs, skipped = import_online_mind2web_report(tmp_path, limit=2)
    assert [t.trajectory_id for t in trajs] == ["renamed", "x"] and skipped == []
    import_online_mind2web_report(tmp_path, on_bad_step="error", limit=2)  # no error
    write_native(trajs, tmp_path / "n.jsonl")
    assert [t.meta for t in read_native(tmp_path / "n.jsonl")] == [t.meta for t in trajs]


def test_lfs_pointers_evaluation_records_symlinks_and_refused_images(tmp_path):
    root = tmp_path / "root"
    lfs = _v1(root, "lfs", A, frames=[])
    for k in range(3):
        (lfs / "trajectory" / f"{k}_full_screenshot.png").write_text(
            "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 84977\n")
    ev = root / "evalonly"
    ev.mkdir()
    (ev / "result.json").write_text(json.dumps(
        {"task_id": "evalonly", "task": "Buy socks", "final_result_response": "done", "judge": "success"}))
    thin = _v1(root, "thin", A[:1], frames=[])
    (thin / "trajectory" / "0_full_screenshot.png").write_bytes(_img(size=(32, 7000)))
    elsewhere = _v1(tmp_path / "other_disk", "linked", A, frames=[0, 1, 2])
    (root / "linked").symlink_to(elsewhere, target_is_directory=True)
    (root / "linked_again").symlink_to(elsewhere, target_is_directory=True)
    (root / "dangling").symlink_to(tmp_path / "nowhere", target_is_directory=True)
    trajs, skipped = import_online_mind2web_report(root)
    assert [t.trajectory_id for t in trajs] == ["linked"]
    reasons = {os.path.relpath(d["path"], root).split(os.sep)[0]: d["reason"] for d in skipped}
    assert set(reasons) == {"lfs", "evalonly", "thin", "linked_again", "dangling"}
    assert LFS_POINTER_REASON in reasons["lfs"] and reasons["lfs"].startswith("no usable step: all 3")
    assert reasons["evalonly"].startswith("no action history (an evaluation record")
    assert "judge" in reasons["evalonly"]
    assert "refused by the image processor (32x7000: absolute aspect ratio must be smaller than 200" in reasons["thin"]
    assert reasons["linked_again"] == f"symlink to a folder already found: {root / 'linked'}"
    assert reasons["dangling"].startswith("broken symlink")
