"""Importer for browser-use agent histories (github.com/browser-use/browser-use).

One trajectory per ``AgentHistoryList.save_to_file`` JSON file, one step per action; the mapping
onto the native schema is in ``docs/data.md`` ("browser-use histories")."""

from __future__ import annotations

import base64
import binascii
import os
import tempfile
from pathlib import Path

from ipi.data.discover import Problem, bad_step, check_options, data_root, import_each, read_json, walk
from ipi.data.images import DEFAULT_LIMITS, ImageLimits, root_image_dir, screenshot_problem, write_image_bytes
from ipi.data.schema import Skip, Step, Trajectory
from ipi.data.text import clean_trajectory

__all__ = ["SOURCE", "browser_use_action", "browser_use_action_type", "import_browser_use_report"]

SOURCE = "browser_use"
NO_PREVIOUS_ACTION = "No previous action."
NOT_A_HISTORY = "not a browser-use history (no 'history' list of steps)"
NO_TASK = ("no task (browser-use does not store it in the history: add a top-level \"task\" or a "
           "task.txt beside the file)")

_ACTION_TYPES = {
    "click_element_by_index": "click", "click_element": "click", "click": "click",
    "input_text": "type", "type": "type", "input": "type",
    "scroll_down": "scroll", "scroll_up": "scroll", "scroll": "scroll", "scroll_to_text": "scroll",
    "go_back": "goback", "search_google": "google", "search": "google",
    "go_to_url": "navigate", "navigate": "navigate", "open_tab": "navigate",
    "send_keys": "press", "wait": "wait", "done": "answer",
    "select_dropdown_option": "select", "get_dropdown_options": "unknown",
}


def browser_use_action(action: dict) -> tuple[str, str]:
    """``(name, call)`` of one browser-use action: ``{"input_text": {"index": 3, "text": "x"}}`` →
    ``("input_text", "input_text(index=3, text='x')")``."""
    if not isinstance(action, dict) or not action:
        raise ValueError(f"action is not an object with one action name: {action!r}")
    (name, params), *rest = action.items()
    if rest:  # an exclude_none dump keeps one key per action; extra keys are params of none
        params = {k: v for k, v in action.items()}
        name = "+".join(action)
    if isinstance(params, dict):
        args = ", ".join(f"{k}={v!r}" for k, v in params.items())
    elif params is None:
        args = ""
    else:
        args = repr(params)
    return name, f"{name}({args})"


def browser_use_action_type(name: str) -> str:
    """WebVoyager-style verb of a browser-use action name (``"unknown"`` if none fits)."""
    return _ACTION_TYPES.get(name, "unknown")


def _thought(out: dict) -> str:
    state = out.get("current_state") if isinstance(out.get("current_state"), dict) else out
    parts = []
    if isinstance(out.get("thinking"), str) and out["thinking"].strip():
        parts.append(out["thinking"].strip())
    for key, label in (("evaluation_previous_goal", "Evaluation"), ("memory", "Memory"), ("next_goal", "Next goal")):
        v = state.get(key)
        if isinstance(v, str) and v.strip():
            parts.append(f"{label}: {v.strip()}")
    return "\n".join(parts)


def _result_text(results) -> str:
    lines = []
    for r in results if isinstance(results, list) else []:
        if not isinstance(r, dict):
            continue
        for key in ("error", "extracted_content", "long_term_memory"):
            v = r.get(key)
            if isinstance(v, str) and v.strip():
                lines.append(f"Error: {v.strip()}" if key == "error" else v.strip())
                break
    return "\n".join(lines)


def _screenshot(state: dict, file: Path, image_dir: Path, trajectory_id: str, k: int) -> Path | None:
    path = state.get("screenshot_path")
    if isinstance(path, str) and path:
        p = Path(path)
        for cand in ((p,) if p.is_absolute() else ()) + (file.parent / p, file.parent / p.name):
            if cand.is_file():
                return cand
        return p if p.is_absolute() else file.parent / p
    data = state.get("screenshot")
    if isinstance(data, str) and data:
        if data.startswith("data:") and "," in data:
            data = data.split(",", 1)[1]
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            return image_dir / trajectory_id / f"{k}.invalid-base64"
        return write_image_bytes(image_dir / trajectory_id / f"{k}.png", raw)
    return None


def _import_file(file: Path, trajectory_id: str, image_dir: Path, on_bad_step: str, unknown_action: str,
                 limits: ImageLimits | None) -> Trajectory:
    data = read_json(file)
    if not isinstance(data, dict) or not isinstance(data.get("history"), list):
        raise Problem(file, NOT_A_HISTORY)
    task = data.get("task")
    if not (isinstance(task, str) and task.strip()) and (file.parent / "task.txt").is_file():
        task = (file.parent / "task.txt").read_text(encoding="utf-8").strip()
    if not (isinstance(task, str) and task.strip()):
        raise Problem(file, NO_TASK)
    steps: list[Step] = []
    skipped: list[Skip] = []
    history: list[str] = []
    k = 0
    prev_result = ""
    for i, item in enumerate(data["history"]):
        if not isinstance(item, dict):
            raise Problem(file, f"history[{i}] is not an object")
        out = item.get("model_output")
        state = item.get("state") if isinstance(item.get("state"), dict) else {}
        if isinstance(out, dict) and isinstance(out.get("action"), list) and out["action"]:
            thought = _thought(out)
            shot = _screenshot(state, file, image_dir, trajectory_id, i)
            results = item.get("result") if isinstance(item.get("result"), list) else []
            for j, action in enumerate(out["action"]):
                try:
                    name, call = browser_use_action(action)
                except ValueError as e:
                    raise Problem(file, f"history[{i}]: {e}") from e
                verb = browser_use_action_type(name)
                tool_result = (prev_result or f"Action executed: {history[-1]}") if history else NO_PREVIOUS_ACTION
                if shot is None or not shot.is_file():
                    skipped.append(Skip(k, "missing screenshot", str(shot or file)))
                elif (problem := screenshot_problem(shot, limits=limits)) is not None:
                    bad_step(skipped, on_bad_step, k, f"unreadable screenshot: {problem}", shot)
                elif verb == "unknown" and unknown_action != "keep":
                    bad_step(skipped, unknown_action, k, f"unknown action {call!r}", file)
                else:
                    steps.append(Step(step=k, screenshot=str(shot), element_text="", element_text_omitted=True,
                                      tool_result=tool_result, thought=thought, action=call, action_type=verb,
                                      history=tuple(history)))
                history.append(call)
                # browser-use keeps one result per executed action: the next action's feedback.
                prev_result = _result_text(results[j: j + 1]) if j < len(results) else ""
                k += 1
        else:  # a failed model call: its result (an error) is feedback for the next action
            prev_result = _result_text(item.get("result")) or prev_result
    if k == 0:
        raise Problem(file, "no action in the history (every step lacks model output)")
    meta = {"file": file.name}
    return clean_trajectory(Trajectory(trajectory_id, task.strip(), SOURCE, k, tuple(steps), tuple(skipped), meta),
                            str(file), on_bad_step)


def import_browser_use_report(
    root: str | os.PathLike,
    *,
    on_bad_step: str = "skip",
    max_element_chars: int | None = None,
    unknown_action: str = "keep",
    limit: int | None = None,
    image_limits: ImageLimits | None = DEFAULT_LIMITS,
    image_dir: str | os.PathLike | None = None,
) -> tuple[list[Trajectory], list[dict]]:
    """Import every browser-use history file (``*.json`` with a ``history`` list) under ``root``.

    Args:
        root: A folder searched recursively (symlinks followed once each), or one ``.json`` file.
        on_bad_step: ``"skip"``: unusable files are reported and unreadable screenshots are
            counted skips; ``"error"``: both raise :class:`DataError` naming the file.
        max_element_chars: Accepted for a uniform importer signature (no page text recorded).
        unknown_action: ``"keep"``, ``"skip"`` or ``"error"`` for actions none of the verbs fit.
        limit: Stop after this many usable trajectories, in id order (``data.max_trajectories``).
        image_limits: The backbone's image limits (:func:`ipi.data.images.screenshot_problem`).
        image_dir: Where base64 screenshots are written (default: a folder in the system's
            temporary directory).

    Returns:
        ``(trajectories sorted by id, [{"path", "reason"} per file left out])``.

    Raises:
        ValueError: Bad ``on_bad_step`` or ``unknown_action``.
        FileNotFoundError: ``root`` does not exist.
        DataError: Malformed input under ``on_bad_step="error"`` (or ``unknown_action="error"``).
    """
    check_options(on_bad_step, unknown_action)
    root = data_root(root, "browser-use")
    # one folder per data root: two roots with equal trajectory ids never share a file
    image_dir = root_image_dir(Path(image_dir) if image_dir is not None
                               else Path(tempfile.gettempdir()) / "ipi_browser_use", root)
    skipped: list[dict] = []
    files: list[tuple[str, Path]] = []
    if root.is_file():
        files.append((root.stem, root))
    else:
        for folder, names, left_out in walk(root):
            skipped.extend(left_out)
            for n in names:
                if n.lower().endswith(".json"):
                    f = folder / n
                    files.append((f.relative_to(root).as_posix()[: -len(".json")], f))
    files.sort()
    return import_each(files, lambda tid, f: _import_file(f, tid, image_dir, on_bad_step, unknown_action,
                                                          image_limits), on_bad_step, limit, SOURCE, skipped)
