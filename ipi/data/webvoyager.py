"""Importer for WebVoyager run logs (github.com/MinorJerry/WebVoyager, ``results/``).

A WebVoyager *task folder* holds ``interact_messages.json`` (the chat the agent had) and
``screenshot{k}.png`` for the page the k-th assistant turn acted on. This module turns every
task folder under a root into a :class:`~ipi.data.schema.Trajectory` of the native schema
(see ``docs/data.md`` for the full mapping and ``PROTOCOL.md`` §1–§3 for how steps are used).

Mapping, in short:

* step ``k - 1`` (0-based) is the k-th assistant turn; its screenshot is ``screenshot{k}.png``
  (``screenshot{k}_no_box.png`` files are ignored). WebVoyager saves no screenshot for a turn
  that follows a failed action, so a missing file is recorded in ``Trajectory.skipped``.
* ``element_text`` is the element list of the observation that precedes the turn, verbatim,
  after the fixed "... refer to the textual information.\\n" preamble. WebVoyager keeps the
  element text of only the last three observations; earlier ones, and turns whose observation
  was replaced by environment feedback, get ``element_text=""`` and
  ``element_text_omitted=True``.
* ``tool_result`` is the environment feedback the agent received about its previous action:
  every feedback message and every warning attached to an observation between the previous
  assistant turn and this one, stripped and joined by ``"\\n"``; without any,
  ``"No previous action."`` at step 0 and ``"Action executed: <previous action>"`` later.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from ipi.data.schema import DataError, Skip, Step, Trajectory
from ipi.progress import track

__all__ = [
    "ACTION_TYPES",
    "LOG_NAME",
    "SOURCE",
    "import_webvoyager",
    "import_webvoyager_report",
]

#: Name of the chat log that marks a folder as a WebVoyager task folder.
LOG_NAME = "interact_messages.json"
#: ``Trajectory.source`` of imported trajectories.
SOURCE = "webvoyager"
#: Action verbs WebVoyager's system prompt defines (``action_type`` values besides "unknown").
ACTION_TYPES = ("click", "type", "scroll", "wait", "goback", "google", "answer")

NO_PREVIOUS_ACTION = "No previous action."
MISSING_SCREENSHOT = "missing screenshot"
NO_LOG = f"screenshots but no {LOG_NAME}"

_TASK_PREFIX = "Now given a task:"
_TASK_END = "  Please interact with"
_OBSERVATION = "Observation:"
# End of the fixed preamble that precedes the element list in a kept observation.
_PREAMBLE_END = "refer to the textual information.\n"
# Start of that preamble; anything between "Observation:" and it is a warning (``warn_obs``) or
# the PDF/assistant-file response (``pdf_obs``) of WebVoyager's ``format_msg``.
_PREAMBLE_START = re.compile(
    r"\s*(?:please analyze the attached screenshot|please analyze the response given by assistant)",
    re.IGNORECASE,
)
_OMITTED = "A screenshot and some texts. (Omitted in context.)"
_SCREENSHOT_FILE = re.compile(r"screenshot\d+(?:_no_box)?\.png")


class _TrajectoryProblem(Exception):
    """A whole task folder is unusable; ``reason`` says why (without the path)."""

    def __init__(self, path: Path, reason: str):
        super().__init__(reason)
        self.path = path
        self.reason = reason


@dataclass
class _Observation:
    element_text: str
    omitted: bool


@dataclass
class _Turn:
    observation: _Observation | None
    feedback: list[str]
    text: str


def _text_of(content: object, log: Path, index: int) -> str:
    """Text of a chat message's content (a string, or OpenAI-style list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict):
                raise _TrajectoryProblem(log, f"message {index}: content part is not an object")
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise _TrajectoryProblem(log, f"message {index}: text part without text")
                parts.append(text)
        return "".join(parts)
    raise _TrajectoryProblem(
        log, f"message {index}: content is {type(content).__name__}, not a string or list"
    )


def _load_messages(log: Path) -> list[dict]:
    try:
        raw = log.read_bytes()
    except OSError as e:
        raise _TrajectoryProblem(log, f"cannot read ({e})") from e
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise _TrajectoryProblem(log, f"not valid UTF-8 (byte {e.start}: {e.reason})") from e
    try:
        messages = json.loads(text)
    except json.JSONDecodeError as e:
        raise _TrajectoryProblem(
            log, f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
        ) from e
    if not isinstance(messages, list):
        kind = type(messages).__name__
        raise _TrajectoryProblem(log, f"not a list of chat messages (got {kind})")
    if not messages:
        raise _TrajectoryProblem(log, "empty list of chat messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise _TrajectoryProblem(log, f"message {i} is not an object with 'role' and 'content'")
    return messages


def _parse_task(text: str, log: Path) -> tuple[str, int]:
    """Task of the first user turn and the offset where its observation part may start."""
    start = text.find(_TASK_PREFIX)
    if start < 0:
        raise _TrajectoryProblem(log, f"no task in the first user turn (no {_TASK_PREFIX!r})")
    start += len(_TASK_PREFIX)
    end = text.find(_TASK_END, start)
    if end < 0:
        end = text.find("\n" + _OBSERVATION, start)
    if end < 0:
        end = text.find(_OBSERVATION, start)
    if end < 0:
        end = len(text)
    task = text[start:end].strip()
    if not task:
        raise _TrajectoryProblem(log, "no task in the first user turn (empty task text)")
    return task, end


def _parse_user(text: str) -> tuple[_Observation | None, list[str]]:
    """Split a user message into its observation (if any) and feedback/warning texts."""
    body = text.lstrip()
    if not body.startswith(_OBSERVATION):
        # Environment feedback replacing the observation: failed action, format error,
        # reflection prompt, ...
        return None, ([text.strip()] if text.strip() else [])
    rest = body[len(_OBSERVATION):]
    cut = rest.find(_PREAMBLE_END)
    if cut >= 0:
        head, elements = rest[:cut], rest[cut + len(_PREAMBLE_END):]
        m = _PREAMBLE_START.search(head)
        warning = head[: m.start()].strip() if m else ""
        return _Observation(elements, False), ([warning] if warning else [])
    rest = rest.strip()
    if rest.startswith(_OMITTED):
        warning = rest[len(_OMITTED):].strip()
        return _Observation("", True), ([warning] if warning else [])
    # An observation of an unknown form: no element list to recover; keep its text as feedback.
    return _Observation("", True), ([rest] if rest else [])


def _parse_agent(text: str) -> tuple[str, str]:
    """``(thought, action)`` of an assistant turn, split on its last ``"Action:"``."""
    if "Action:" in text:
        before, action = text.rsplit("Action:", 1)
        action = action.strip()
    else:
        before, action = text, ""
    t = before.find("Thought:")
    thought = before[t + len("Thought:"):] if t >= 0 else before
    return thought.strip(), action


def _action_type(action: str) -> str:
    low = action.lower()
    for verb in ACTION_TYPES:
        if low.startswith(verb):
            return verb
    return "unknown"


def _screenshot_problem(path: Path) -> str | None:
    """Why an existing screenshot cannot be used, or None (cheap check: no pixel decoding)."""
    try:
        if path.stat().st_size == 0:
            return "empty file (0 bytes)"
        with Image.open(path) as im:
            im.verify()
    except Exception as e:  # PIL raises OSError, SyntaxError, struct.error, ValueError, ...
        return f"{type(e).__name__}: {e}"
    return None


def _read_turns(log: Path) -> tuple[str, list[_Turn]]:
    messages = _load_messages(log)
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    if first_user is None:
        raise _TrajectoryProblem(log, "no user turn (no task)")
    turns: list[_Turn] = []
    observation: _Observation | None = None
    feedback: list[str] = []
    task = ""
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "system":
            continue
        text = _text_of(m["content"], log, i)
        if role == "user":
            if i == first_user:
                task, end = _parse_task(text, log)
                obs_at = text.find(_OBSERVATION, end)
                if obs_at < 0:
                    continue
                text = text[obs_at:]
            obs, fb = _parse_user(text)
            if obs is not None:
                observation = obs
            feedback.extend(fb)
        elif role == "assistant":
            turns.append(_Turn(observation, feedback, text))
            observation, feedback = None, []
        else:
            raise _TrajectoryProblem(log, f"message {i}: unknown role {role!r}")
    if not turns:
        raise _TrajectoryProblem(log, "no assistant turn")
    return task, turns


def _import_task(
    folder: Path,
    trajectory_id: str,
    on_bad_step: str,
    max_element_chars: int | None,
) -> Trajectory:
    log = folder / LOG_NAME
    task, turns = _read_turns(log)
    steps: list[Step] = []
    skipped: list[Skip] = []
    history: list[str] = []
    for step, turn in enumerate(turns):
        thought, action = _parse_agent(turn.text)
        shot = folder / f"screenshot{step + 1}.png"
        if not shot.is_file():
            skipped.append(Skip(step, MISSING_SCREENSHOT, str(shot)))
        elif (problem := _screenshot_problem(shot)) is not None:
            if on_bad_step == "error":
                raise DataError(f"{shot}: step {step}: unreadable screenshot ({problem})")
            skipped.append(Skip(step, f"unreadable screenshot: {problem}", str(shot)))
        else:
            if turn.feedback:
                tool_result = "\n".join(turn.feedback)
            elif step == 0:
                tool_result = NO_PREVIOUS_ACTION
            else:
                tool_result = f"Action executed: {history[-1]}"
            obs = turn.observation
            omitted = obs is None or obs.omitted
            element_text = "" if omitted else obs.element_text
            if max_element_chars is not None:
                element_text = element_text[:max_element_chars]
            steps.append(
                Step(
                    step=step,
                    screenshot=str(shot),
                    element_text=element_text,
                    element_text_omitted=omitted,
                    tool_result=tool_result,
                    thought=thought,
                    action=action,
                    action_type=_action_type(action),
                    history=tuple(history),
                )
            )
        history.append(action)
    return Trajectory(
        trajectory_id=trajectory_id,
        task=task,
        source=SOURCE,
        horizon=len(turns),
        steps=tuple(steps),
        skipped=tuple(skipped),
    )


def _discover(root: Path) -> tuple[list[Path], list[Path]]:
    """Task folders (holding the log) and screenshot folders without a log, under ``root``."""
    tasks, orphans = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if LOG_NAME in filenames:
            tasks.append(Path(dirpath))
        elif any(_SCREENSHOT_FILE.fullmatch(f) for f in filenames):
            orphans.append(Path(dirpath))
    return tasks, orphans


def import_webvoyager_report(
    root: str | os.PathLike,
    *,
    on_bad_step: str = "skip",
    max_element_chars: int | None = None,
) -> tuple[list[Trajectory], list[dict]]:
    """Import every WebVoyager task folder under ``root``, reporting what was left out.

    A task folder is any folder (``root`` itself or one below it, found recursively) that holds
    ``interact_messages.json``. The mapping of the log onto :class:`Step` fields is described in
    the module docstring and ``docs/data.md``; ``step`` and ``horizon`` are the metadata of
    PROTOCOL.md §3, and each trajectory is the cluster unit of §4–§5.

    Args:
        root: A folder of task folders (searched recursively) or one task folder.
        on_bad_step: What to do with a screenshot that exists but cannot be opened by Pillow,
            and with a whole unusable task folder. ``"skip"``: record the step in
            ``Trajectory.skipped`` (reason names the problem) and the folder in the report.
            ``"error"``: raise :class:`DataError`. Missing screenshots are always recorded
            as ``Skip(step, "missing screenshot", path)`` in either mode.
        max_element_chars: If not None, truncate every ``element_text`` to this many
            characters (keeps prompts bounded on small machines). None keeps it whole.

    Returns:
        ``(trajectories, skipped)``: the trajectories sorted by ``trajectory_id`` (the task
        folder's path relative to ``root`` in posix form, or the folder's own name when
        ``root`` is a task folder), and one ``{"path": ..., "reason": ...}`` dict per folder
        left out: unusable task folders (``on_bad_step="skip"`` only) and folders that hold
        screenshots but no ``interact_messages.json`` (reason
        ``"screenshots but no interact_messages.json"``; these are never task folders).

    Raises:
        ValueError: ``on_bad_step`` is not "skip"/"error", or ``max_element_chars`` < 0.
        FileNotFoundError: ``root`` does not exist.
        NotADirectoryError: ``root`` is not a folder.
        DataError: With ``on_bad_step="error"``: a log that is unreadable, not UTF-8, not
            JSON (message gives line and column), not a non-empty list of messages, without a
            task in its first user turn or without an assistant turn (message names the file);
            or a screenshot Pillow cannot verify (message names the file and step).
    """
    if on_bad_step not in ("skip", "error"):
        raise ValueError(f"on_bad_step must be 'skip' or 'error', not {on_bad_step!r}")
    if max_element_chars is not None and max_element_chars < 0:
        raise ValueError(f"max_element_chars must be >= 0 or None, not {max_element_chars}")
    root = Path(os.path.abspath(root))
    if not root.exists():
        raise FileNotFoundError(f"WebVoyager root {root} does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"WebVoyager root {root} is not a folder")

    tasks, orphans = _discover(root)
    trajectories: list[Trajectory] = []
    skipped: list[dict] = [{"path": str(p), "reason": NO_LOG} for p in orphans]
    for folder in track(tasks, "import webvoyager"):
        rel = folder.relative_to(root).as_posix()
        trajectory_id = root.name if rel == "." else rel
        try:
            trajectories.append(_import_task(folder, trajectory_id, on_bad_step, max_element_chars))
        except _TrajectoryProblem as e:
            if on_bad_step == "error":
                raise DataError(f"{e.path}: {e.reason}") from e.__cause__
            skipped.append({"path": str(e.path), "reason": e.reason})
    trajectories.sort(key=lambda t: t.trajectory_id)
    skipped.sort(key=lambda d: d["path"])
    return trajectories, skipped


def import_webvoyager(
    root: str | os.PathLike,
    *,
    on_bad_step: str = "skip",
    max_element_chars: int | None = None,
) -> list[Trajectory]:
    """Import WebVoyager task folders under ``root`` into native-schema trajectories.

    Same as :func:`import_webvoyager_report` but returns only the trajectories; when any folder
    was left out it emits one ``UserWarning`` summarising how many and which (call
    :func:`import_webvoyager_report` for the reasons). Step skips inside a trajectory are not
    warned about: they are in ``Trajectory.skipped``.

    Args:
        root: A folder of task folders (searched recursively) or one task folder.
        on_bad_step: ``"skip"`` (default) or ``"error"``; see :func:`import_webvoyager_report`.
        max_element_chars: Truncate ``element_text`` to this many characters (None: keep).

    Returns:
        The trajectories, sorted by ``trajectory_id`` (PROTOCOL.md §4: the split/cluster unit).

    Raises:
        ValueError: Bad ``on_bad_step`` or ``max_element_chars``.
        FileNotFoundError: ``root`` does not exist.
        NotADirectoryError: ``root`` is not a folder.
        DataError: Malformed input under ``on_bad_step="error"`` (see
            :func:`import_webvoyager_report`).
    """
    trajectories, skipped = import_webvoyager_report(
        root, on_bad_step=on_bad_step, max_element_chars=max_element_chars
    )
    if skipped:
        names = [
            Path(d["path"]).parent.name if d["path"].endswith(LOG_NAME) else Path(d["path"]).name
            for d in skipped
        ]
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        warnings.warn(
            f"import_webvoyager: left out {len(skipped)} folder(s) under {os.fspath(root)} "
            f"({shown}); see import_webvoyager_report for reasons",
            UserWarning,
            stacklevel=2,
        )
    return trajectories
