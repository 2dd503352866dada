"""Importer for Online-Mind2Web result folders (github.com/OSU-NLP-Group/Online-Mind2Web).

Online-Mind2Web stores one folder per task, named by its ``task_id``::

    <root>/<task_id>/result.json
    <root>/<task_id>/trajectory/0_full_screenshot.png
    <root>/<task_id>/trajectory/1_full_screenshot.png
    ...

``result.json`` (format v1, what the benchmark's agents write) holds ``task_id``, ``task`` (the
instruction), ``action_history`` (one string per action, e.g. ``"<button> Search -> CLICK"``),
``thoughts`` (one string per action; optional) and ``final_result_response``. Format v2
(``"schema_version": "online-mind2web-v2"``) holds ``action_history`` as a list of objects
``{"action", "thought", "screenshot"}`` with ``screenshot`` relative to ``trajectory/``.

Mapping onto the native schema (see ``docs/data.md``):

* step ``k`` (0-based) is ``action_history[k]``; its screenshot is the page the action was taken
  on: ``trajectory/<k>_full_screenshot.png`` (v1; a file whose name starts with the integer
  ``k`` otherwise) or the step's ``screenshot`` (v2). A missing screenshot is a counted skip.
  Screenshots beyond the last action (the final page) are not steps.
* ``thought`` is ``thoughts[k]`` (``""`` when the log has no ``thoughts``; a ``thoughts`` list
  whose length differs from ``action_history`` makes the trajectory unusable: the alignment of
  thoughts to actions would be a guess).
* Online-Mind2Web records no page text: ``element_text = ""``, ``element_text_omitted = True``.
* ``tool_result`` follows the WebVoyager convention for logs without environment feedback:
  ``"No previous action."`` at step 0, ``"Action executed: <previous action>"`` later.
* ``trajectory_id`` is ``task_id`` (the folder name when absent); ``horizon`` =
  ``len(action_history)``; ``source = "online_mind2web"``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from PIL import Image

from ipi.data.schema import DataError, Skip, Step, Trajectory
from ipi.progress import track

__all__ = ["RESULT_NAME", "SOURCE", "import_online_mind2web_report", "mind2web_action_type"]

RESULT_NAME = "result.json"
SOURCE = "online_mind2web"
V2 = "online-mind2web-v2"
NO_PREVIOUS_ACTION = "No previous action."
MISSING_SCREENSHOT = "missing screenshot"

_OPS = ("click", "type", "select", "hover", "enter", "scroll", "goback", "wait", "answer", "press")
_FIRST_INT = re.compile(r"^(\d+)")


def mind2web_action_type(action: str) -> str:
    """Verb of a Mind2Web-style action string, lower case.

    ``"[combobox]  Pick up -> TYPE: Brooklyn"`` → ``"type"``; ``"<button> Search -> CLICK"`` →
    ``"click"``; an action starting with a known verb (``"click [12]"``, ``"scroll down"``) →
    that verb; anything else → ``"unknown"``. Known verbs: click, type, select, hover, enter,
    scroll, goback, wait, answer, press.
    """
    text = action.strip()
    if "->" in text:
        text = text.rsplit("->", 1)[1].strip()
    m = re.match(r"[A-Za-z_]+", text)
    verb = m.group(0).lower() if m else ""
    verb = {"go_back": "goback", "type_text": "type", "click_element": "click"}.get(verb, verb)
    return verb if verb in _OPS else "unknown"


class _Problem(Exception):
    def __init__(self, path: Path, reason: str):
        super().__init__(reason)
        self.path, self.reason = path, reason


def _screenshot_index(folder: Path) -> dict[int, Path]:
    """``{k: path}`` of ``trajectory/``: ``<k>_full_screenshot.png`` first, else any ``<k>...`` image."""
    out: dict[int, Path] = {}
    if not folder.is_dir():
        return out
    exact = re.compile(r"^(\d+)_full_screenshot\.(?:png|jpe?g)$", re.IGNORECASE)
    files = sorted(p for p in folder.iterdir() if p.is_file())
    for p in files:
        m = exact.match(p.name)
        if m:
            out.setdefault(int(m.group(1)), p)
    for p in files:
        m = _FIRST_INT.match(p.name)
        if m and p.suffix.lower() in (".png", ".jpg", ".jpeg"):
            out.setdefault(int(m.group(1)), p)
    return out


def _check_image(path: Path, step: int, on_bad_step: str) -> str | None:
    """``None`` if Pillow can verify the image, else the skip reason (or raise under "error")."""
    try:
        with Image.open(path) as im:
            im.verify()
        return None
    except Exception as e:
        if on_bad_step == "error":
            raise DataError(f"{path}: step {step}: unreadable screenshot ({type(e).__name__}: {e})") from e
        return f"unreadable screenshot: {type(e).__name__}"


def _load_result(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as e:
        raise _Problem(path, f"not valid UTF-8 ({e.reason})") from e
    except json.JSONDecodeError as e:
        raise _Problem(path, f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from e
    if not isinstance(data, dict):
        raise _Problem(path, f"not a JSON object (got {type(data).__name__})")
    return data


def _import_task(folder: Path, on_bad_step: str) -> Trajectory:
    res_path = folder / RESULT_NAME
    data = _load_result(res_path)
    task = data.get("task") or data.get("confirmed_task")
    if not isinstance(task, str) or not task.strip():
        raise _Problem(res_path, "no 'task' string")
    history = data.get("action_history")
    if not isinstance(history, list) or not history:
        raise _Problem(res_path, "no non-empty 'action_history' list")
    traj_dir = folder / "trajectory"
    if data.get("schema_version") == V2:
        actions, thoughts, shots = [], [], []
        for k, item in enumerate(history):
            if not isinstance(item, dict) or not isinstance(item.get("action"), str):
                raise _Problem(res_path, f"action_history[{k}] is not an object with an 'action' string")
            actions.append(item["action"])
            thoughts.append(str(item.get("thought") or ""))
            shots.append(traj_dir / item["screenshot"] if item.get("screenshot") else None)
    else:
        if not all(isinstance(a, str) for a in history):
            raise _Problem(res_path, "'action_history' holds a non-string entry")
        actions = list(history)
        raw = data.get("thoughts")
        if raw is None:
            thoughts = [""] * len(actions)
        elif not isinstance(raw, list) or len(raw) != len(actions):
            n = len(raw) if isinstance(raw, list) else type(raw).__name__
            raise _Problem(res_path, f"'thoughts' has {n} entries for {len(actions)} actions")
        else:
            thoughts = [str(t or "") for t in raw]
        index = _screenshot_index(traj_dir)
        shots = [index.get(k) for k in range(len(actions))]
    trajectory_id = str(data.get("task_id") or folder.name)
    steps, skipped = [], []
    for k, (action, thought, shot) in enumerate(zip(actions, thoughts, shots)):
        expected = shot or traj_dir / f"{k}_full_screenshot.png"
        if shot is None or not shot.is_file():
            skipped.append(Skip(k, MISSING_SCREENSHOT, str(expected)))
            continue
        bad = _check_image(shot, k, on_bad_step)
        if bad:
            skipped.append(Skip(k, bad, str(shot)))
            continue
        steps.append(Step(
            step=k, screenshot=str(shot), element_text="", element_text_omitted=True,
            tool_result=NO_PREVIOUS_ACTION if k == 0 else f"Action executed: {actions[k - 1]}",
            thought=thought.strip(), action=action.strip(), action_type=mind2web_action_type(action),
            history=tuple(a.strip() for a in actions[:k]),
        ))
    return Trajectory(trajectory_id, task.strip(), SOURCE, len(actions), tuple(steps), tuple(skipped))


def import_online_mind2web_report(
    root: str | os.PathLike,
    *,
    on_bad_step: str = "skip",
    max_element_chars: int | None = None,
) -> tuple[list[Trajectory], list[dict]]:
    """Import every Online-Mind2Web task folder (a folder with ``result.json``) under ``root``.

    Args:
        root: A folder searched recursively for ``result.json`` files, or one task folder.
        on_bad_step: ``"skip"``: unusable task folders are reported and unreadable screenshots
            are counted skips; ``"error"``: both raise :class:`DataError` naming the file.
            Missing screenshots are always counted skips.
        max_element_chars: Accepted for a uniform importer signature (the logs have no page
            text).

    Returns:
        ``(trajectories sorted by id, [{"path", "reason"} per folder left out])``.

    Raises:
        ValueError: Bad ``on_bad_step``.
        FileNotFoundError: ``root`` does not exist.
        DataError: Malformed input under ``on_bad_step="error"``, or two folders with the same
            ``task_id``.
    """
    if on_bad_step not in ("skip", "error"):
        raise ValueError(f"on_bad_step must be 'skip' or 'error', not {on_bad_step!r}")
    root = Path(os.path.abspath(root))
    if not root.exists():
        raise FileNotFoundError(f"Online-Mind2Web root {root} does not exist")
    folders = sorted({p.parent for p in root.rglob(RESULT_NAME)})
    trajectories: list[Trajectory] = []
    skipped: list[dict] = []
    for folder in track(folders, "import online_mind2web"):
        try:
            trajectories.append(_import_task(folder, on_bad_step))
        except _Problem as e:
            if on_bad_step == "error":
                raise DataError(f"{e.path}: {e.reason}") from e
            skipped.append({"path": str(e.path), "reason": e.reason})
    ids = [t.trajectory_id for t in trajectories]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise DataError(f"{root}: duplicate task_id(s) {', '.join(dup[:5])}")
    trajectories.sort(key=lambda t: t.trajectory_id)
    return trajectories, skipped
