"""Importer for Online-Mind2Web result folders (github.com/OSU-NLP-Group/Online-Mind2Web).

One trajectory per task folder (``<root>/<task_id>/result.json`` and its ``trajectory/`` frames),
schemas v1 and v2; how each action is paired with a frame (the ``frames`` and ``batches``
options) and the other rules are in ``docs/data.md`` ("Online-Mind2Web result folders")."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ipi.data.discover import Problem, bad_step, check_options, data_root, import_each, read_json, walk
from ipi.data.images import DEFAULT_LIMITS, ImageLimits, screenshot_problem
from ipi.data.schema import Skip, Step, Trajectory
from ipi.data.text import clean_trajectory

__all__ = ["FRAME_LAYOUTS", "RESULT_NAME", "SOURCE", "import_online_mind2web_report", "mind2web_action_type"]

RESULT_NAME = "result.json"
SOURCE = "online_mind2web"
V2 = "online-mind2web-v2"
NO_PREVIOUS_ACTION = "No previous action."
MISSING_SCREENSHOT = "missing screenshot"
NO_FIRST_FRAME = "no frame before the first action (frames are taken after each action)"
NO_ACTION_HISTORY = "no action history"
#: ``options.frames`` values.
FRAME_LAYOUTS = ("auto", "before", "after")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")

_OPS = ("click", "type", "select", "hover", "enter", "scroll", "goback", "goforward", "refresh",
        "navigate", "wait", "answer", "press")
_VERBS = {"go_back": "goback", "go_forward": "goforward", "type_text": "type", "click_element": "click",
          "click_at": "click", "type_at": "type", "type_text_at": "type", "press_key": "press",
          "key_press": "press", "hover_at": "hover", "scroll_at": "scroll", "scroll_document": "scroll",
          "navigate_to": "navigate", "goto": "navigate", "open_url": "navigate", "go_to_url": "navigate",
          "reload": "refresh", "task_complete": "answer", "done": "answer", "select_option": "select"}
_FIRST_INT = re.compile(r"\d+")


def mind2web_action_type(action: str) -> str:
    """Verb of a Mind2Web-style action string, lower case.

    ``"[combobox]  Pick up -> TYPE: Brooklyn"`` → ``"type"``; ``"<button> Search -> CLICK"`` →
    ``"click"``; v2 verbs ``"-> NAVIGATE: url"``, ``PRESS_KEY``, ``GO_BACK``, ``GO_FORWARD``,
    ``REFRESH``; compact calls ``click_at(412, 88)`` → ``"click"``, ``type_at(...)`` → ``"type"``,
    ``press_key("Enter")`` → ``"press"``, ``navigate("https://...")`` → ``"navigate"``; an action
    starting with a known verb (``"click [12]"``, ``"scroll down"``) → that verb;
    ``"TASK_COMPLETE -> ANSWER: ..."`` → ``"answer"``; anything else → ``"unknown"``. Known verbs:
    click, type, select, hover, enter, scroll, goback, goforward, refresh, navigate, wait, answer,
    press.
    """
    text = action.strip()
    call = re.match(r"([A-Za-z_]+)\s*\(", text)
    if call:
        verb = _VERBS.get(call.group(1).lower(), call.group(1).lower())
        return verb if verb in _OPS else "unknown"
    if "->" in text:
        text = text.split("->", 1)[1].strip() if text.upper().startswith("TASK_COMPLETE") else text.rsplit("->", 1)[1].strip()
    m = re.match(r"[A-Za-z_]+", text)
    verb = m.group(0).lower() if m else ""
    verb = _VERBS.get(verb, verb)
    return verb if verb in _OPS else "unknown"


def _frames(folder: Path) -> dict[int, Path]:
    """``{n: path}`` of ``trajectory/`` by the first integer in each image name (the reader's order)."""
    out: dict[int, Path] = {}
    if not folder.is_dir():
        return out
    exact = re.compile(r"^(\d+)_full_screenshot\.", re.IGNORECASE)
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    for p in files:
        if (m := exact.match(p.name)):
            out.setdefault(int(m.group(1)), p)
    for p in files:
        if (m := _FIRST_INT.search(p.name)):
            out.setdefault(int(m.group(0)), p)
    return out


def _load_result(path: Path) -> dict:
    try:
        data = read_json(path)
    except OSError as e:
        raise Problem(path, f"cannot read ({type(e).__name__})") from e
    if not isinstance(data, dict):
        raise Problem(path, f"not a JSON object (got {type(data).__name__})")
    return data


def _batches(thoughts: list[str]) -> list[int]:
    """Model-call index of each action: consecutive actions repeating one non-empty thought share a call."""
    out, b = [], -1
    for k, t in enumerate(thoughts):
        if k == 0 or not t.strip() or t != thoughts[k - 1]:
            b += 1
        out.append(b)
    return out


def _import_task(folder: Path, rel: str, on_bad_step: str, frames: str, batches: bool,
                 limits: ImageLimits | None) -> Trajectory:
    res_path = folder / RESULT_NAME
    data = _load_result(res_path)
    task = data.get("task") or data.get("confirmed_task")
    if not isinstance(task, str) or not task.strip():
        raise Problem(res_path, "no 'task' string")
    history = data.get("action_history")
    if history is None or history == []:
        keys = ", ".join(sorted(data)) or "none"
        raise Problem(res_path, f"{NO_ACTION_HISTORY} (an evaluation record, not a trajectory; keys: {keys})")
    if not isinstance(history, list):
        raise Problem(res_path, f"'action_history' is {type(history).__name__}, not a list")
    traj_dir = folder / "trajectory"
    layout = "v2"
    if data.get("schema_version") == V2:
        for k, item in enumerate(history):
            if not isinstance(item, dict) or not isinstance(item.get("action"), str):
                raise Problem(res_path, f"action_history[{k}] is not an object with an 'action' string")
        steps_v2 = history[:-1]  # the last entry is the agent's answer; the official reader drops it
        if not steps_v2:
            raise Problem(res_path, f"{NO_ACTION_HISTORY} (v2: only the final answer step)")
        actions = [it["action"] for it in steps_v2]
        thoughts = [str(it.get("thought") or "") for it in steps_v2]
        shots = [traj_dir / it["screenshot"] if it.get("screenshot") else None for it in steps_v2]
        expected = [s or traj_dir / f"<no screenshot for step {k}>" for k, s in enumerate(shots)]
    else:
        if not all(isinstance(a, str) for a in history):
            raise Problem(res_path, "'action_history' holds a non-string entry")
        actions = list(history)
        raw = data.get("thoughts")
        if raw is None:
            thoughts = [""] * len(actions)
        elif not isinstance(raw, list) or len(raw) != len(actions):
            n = len(raw) if isinstance(raw, list) else type(raw).__name__
            raise Problem(res_path, f"'thoughts' has {n} entries for {len(actions)} actions")
        else:
            thoughts = [str(t or "") for t in raw]
        index = _frames(traj_dir)
        layout = frames
        if layout == "auto":
            layout = "after" if index and min(index) >= 1 else "before"
        call = _batches(thoughts) if batches else list(range(len(actions)))
        # Call b acted on frame b: before-frames count from 0, after-frames from 1 (frame b is the
        # page after call b-1, numbered b), so the first call has no after-frame.
        shots = [index.get(b) for b in call]
        expected = [traj_dir / (f"{b}_full_screenshot.png" if layout == "before" or b > 0 else NO_FIRST_FRAME)
                    for b in call]
        layout = f"v1 {layout}-action frames" + (", batched" if call and call[-1] + 1 < len(call) else "")
    task_id = data.get("task_id")
    if task_id is not None and str(task_id) != folder.name:
        trajectory_id = rel
    else:
        trajectory_id = str(task_id) if task_id is not None else rel
    steps, skipped = [], []
    for k, (action, thought, shot) in enumerate(zip(actions, thoughts, shots)):
        if shot is None or not shot.is_file():
            reason = NO_FIRST_FRAME if expected[k].name == NO_FIRST_FRAME else MISSING_SCREENSHOT
            skipped.append(Skip(k, reason, str(expected[k] if reason == MISSING_SCREENSHOT else traj_dir)))
            continue
        if (problem := screenshot_problem(shot, limits=limits)) is not None:
            bad_step(skipped, on_bad_step, k, f"unreadable screenshot: {problem}", shot)
            continue
        steps.append(Step(
            step=k, screenshot=str(shot), element_text="", element_text_omitted=True,
            tool_result=NO_PREVIOUS_ACTION if k == 0 else f"Action executed: {actions[k - 1].strip()}",
            thought=thought.strip(), action=action.strip(), action_type=mind2web_action_type(action),
            history=tuple(a.strip() for a in actions[:k]),
        ))
    meta = {"task_id": None if task_id is None else str(task_id), "folder": rel, "layout": layout}
    return clean_trajectory(Trajectory(trajectory_id, task.strip(), SOURCE, len(actions), tuple(steps),
                                       tuple(skipped), meta), str(res_path), on_bad_step)


def import_online_mind2web_report(
    root: str | os.PathLike,
    *,
    on_bad_step: str = "skip",
    max_element_chars: int | None = None,
    limit: int | None = None,
    image_limits: ImageLimits | None = DEFAULT_LIMITS,
    frames: str = "auto",
    batches: bool = True,
) -> tuple[list[Trajectory], list[dict]]:
    """Import every Online-Mind2Web task folder (a folder with ``result.json``) under ``root``.

    Args:
        root: A folder searched recursively (symlinks followed once each) for ``result.json``
            files, or one task folder.
        on_bad_step: ``"skip"``: unusable task folders are reported and unreadable screenshots
            are counted skips; ``"error"``: both raise :class:`DataError` naming the file.
            Missing screenshots are always counted skips.
        max_element_chars: Accepted for a uniform importer signature (the logs have no page
            text).
        limit: Stop after this many usable trajectories, in folder-path order
            (``data.max_trajectories``); later folders are not read.
        image_limits: The backbone's image limits (:func:`ipi.data.images.screenshot_problem`).
        frames: v1 frame layout: ``"auto"`` (numbered from 0: before-action; from 1:
            after-action), ``"before"`` or ``"after"`` (module docstring).
        batches: Whether consecutive v1 actions repeating one thought share a frame.

    Returns:
        ``(trajectories sorted by id, [{"path", "reason"} per folder left out])``; a folder whose
        id was already imported is left out with reason ``"duplicate trajectory id ..."``.

    Raises:
        ValueError: Bad ``on_bad_step`` or ``frames``.
        FileNotFoundError: ``root`` does not exist.
        DataError: Malformed input under ``on_bad_step="error"``.
    """
    check_options(on_bad_step)
    if frames not in FRAME_LAYOUTS:
        raise ValueError(f"frames must be one of {', '.join(FRAME_LAYOUTS)}, not {frames!r}")
    root = data_root(root, "Online-Mind2Web")
    skipped: list[dict] = []
    folders: list[tuple[str, Path]] = []
    for folder, files, left_out in walk(root):
        skipped.extend(left_out)
        if RESULT_NAME in files:
            rel = folder.relative_to(root).as_posix()
            folders.append((root.name if rel == "." else rel, folder))
    folders.sort()
    first: dict[str, Path] = {}

    def read(rel: str, folder: Path) -> Trajectory:
        t = _import_task(folder, rel, on_bad_step, frames, batches, image_limits)
        if t.trajectory_id in first:
            raise Problem(folder / RESULT_NAME, f"duplicate trajectory id {t.trajectory_id!r} "
                                                f"(already imported from {first[t.trajectory_id]})")
        first[t.trajectory_id] = folder
        return t

    return import_each(folders, read, on_bad_step, limit, SOURCE, skipped)
