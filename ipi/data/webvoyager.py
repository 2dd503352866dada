"""Importer for WebVoyager run logs (github.com/MinorJerry/WebVoyager, ``results/``).

A *task folder* holds ``interact_messages.json`` (the agent's chat) and ``screenshot{k}.png`` for
the page the k-th assistant turn acted on; the mapping onto the native schema is in
``docs/data.md`` ("How the log maps to steps")."""

from __future__ import annotations

import filecmp
import hashlib
import json
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from ipi.data.discover import Problem, bad_step, check_options, data_root, import_each, walk
from ipi.data.images import DEFAULT_LIMITS, ImageLimits, screenshot_problem
from ipi.data.schema import DataError, Skip, Step, Trajectory
from ipi.data.text import clean_trajectory

__all__ = ["ACTION_TYPES", "LOG_NAME", "SOURCE", "import_webvoyager", "import_webvoyager_report"]

#: Name of the chat log that marks a folder as a WebVoyager task folder.
LOG_NAME = "interact_messages.json"
#: ``Trajectory.source`` of imported trajectories.
SOURCE = "webvoyager"
#: Action verbs WebVoyager's system prompt defines (``action_type`` values besides "unknown").
ACTION_TYPES = ("click", "type", "scroll", "wait", "goback", "google", "answer")
NO_PREVIOUS_ACTION = "No previous action."
MISSING_SCREENSHOT = "missing screenshot"
#: Reason of a missing screenshot that the log does not explain (WebVoyager saves no screenshot
#: only for a turn whose observation was replaced by feedback on a failed action).
MISSING_SCREENSHOT_UNEXPECTED = "missing screenshot (the log has an observation for this step)"
NO_LOG = f"screenshots but no {LOG_NAME}"
OTHER_LAYOUT = "an Online-Mind2Web result folder, not a WebVoyager task folder (data=online_mind2web reads it)"

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
#: ``screenshot{k}.png`` (WebVoyager) or ``screenshot_<site>__{k}.png`` (forks that put the site
#: in the name); ``..._no_box`` copies (the page without Set-of-Mark boxes) are not steps.
_SCREENSHOT_FILE = re.compile(r"screenshot(?:_(?P<site>.+)__)?(?P<k>\d+)(?P<nobox>_no_box)?\.png")
# Where a reply invents the next turn of the chat ("Action: Click [38]\nuser: Observation: ...").
_INVENTED_TURN = re.compile(r"\n\s*(?:(?:user|human|assistant|system)\s*:|Observation\s*:)", re.IGNORECASE)
# "Observation:" opening a line: text before it in a user message is feedback (a reflection).
_OBSERVATION_AT = re.compile(r"(?:^|\n)[ \t]*Observation:")


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
                raise Problem(log, f"message {index}: content part is not an object")
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise Problem(log, f"message {index}: text part without text")
                parts.append(text)
        return "".join(parts)
    raise Problem(
        log, f"message {index}: content is {type(content).__name__}, not a string or list"
    )


def _load_messages(log: Path, raw: bytes) -> list[dict]:
    if not raw.strip():
        raise Problem(log, f"empty file ({len(raw)} bytes)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise Problem(log, f"not valid UTF-8 (byte {e.start}: {e.reason})") from e
    try:
        messages = json.loads(text)
    except json.JSONDecodeError as e:
        raise Problem(
            log, f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
        ) from e
    if not isinstance(messages, list):
        kind = type(messages).__name__
        raise Problem(log, f"not a list of chat messages (got {kind})")
    if not messages:
        raise Problem(log, "empty list of chat messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise Problem(log, f"message {i} is not an object with 'role' and 'content'")
    return messages


def _parse_task(text: str, log: Path) -> tuple[str, int]:
    """Task of the first user turn and the offset where its observation part may start."""
    start = text.find(_TASK_PREFIX)
    if start < 0:
        raise Problem(log, f"no task in the first user turn (no {_TASK_PREFIX!r})")
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
        raise Problem(log, "no task in the first user turn (empty task text)")
    return task, end


def _parse_user(text: str) -> tuple[_Observation | None, list[str]]:
    """Split a user message into its observation (if any) and feedback/warning texts."""
    m = _OBSERVATION_AT.search(text)
    if m is None:
        # Environment feedback replacing the observation: failed action, format error,
        # reflection prompt, ...
        return None, ([text.strip()] if text.strip() else [])
    # Text before "Observation:" (a reflection paragraph some forks add) is feedback too.
    before = text[: m.start()].strip()
    obs, fb = _parse_observation(text[m.end() - len(_OBSERVATION):].lstrip())
    return obs, ([before] if before else []) + fb


def _parse_observation(body: str) -> tuple[_Observation | None, list[str]]:
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
    """``(thought, action)`` of an assistant turn, split on its last ``"Action:"``.

    A reply that goes on to invent the next turn of the chat (``"Action: Click [38]\nuser:
    Observation: ..."``) is cut where the invented turn starts (after its first ``Action:``).
    """
    first = text.find("Action:")
    if first >= 0:
        m = _INVENTED_TURN.search(text, first)
        if m:
            text = text[: m.start()]
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


def _read_turns(log: Path, raw: bytes | None = None) -> tuple[str, list[_Turn]]:
    if raw is None:
        try:
            raw = log.read_bytes()
        except OSError as e:
            raise Problem(log, f"cannot read ({e})") from e
    messages = _load_messages(log, raw)
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    if first_user is None:
        raise Problem(log, "no user turn (no task)")
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
            raise Problem(log, f"message {i}: unknown role {role!r}")
    if not turns:
        raise Problem(log, "no assistant turn")
    return task, turns


def _import_task(
    folder: Path,
    trajectory_id: str,
    on_bad_step: str,
    max_element_chars: int | None,
    unknown_action: str = "keep",
    raw: bytes | None = None,
    limits: ImageLimits | None = DEFAULT_LIMITS,
) -> Trajectory:
    log = folder / LOG_NAME
    task, turns = _read_turns(log, raw)
    shots = _screenshot_index(folder)
    steps: list[Step] = []
    skipped: list[Skip] = []
    history: list[str] = []

    for step, turn in enumerate(turns):
        thought, action = _parse_agent(turn.text)
        action_type = _action_type(action)
        shot = shots.get(step + 1, folder / f"screenshot{step + 1}.png")
        if not shot.is_file():
            if turn.observation is None:
                # WebVoyager saves no screenshot after a failed action: expected, always a skip.
                skipped.append(Skip(step, MISSING_SCREENSHOT, str(shot)))
            else:
                bad_step(skipped, on_bad_step, step, MISSING_SCREENSHOT_UNEXPECTED, shot)
        elif (problem := screenshot_problem(shot, limits=limits)) is not None:
            bad_step(skipped, on_bad_step, step, f"unreadable screenshot: {problem}", shot)
        elif action_type == "unknown" and unknown_action != "keep":
            what = f"unknown action {action!r}" if action else "no action in the agent turn"
            if unknown_action == "error":
                raise DataError(
                    f"{log}: step {step}: {what}; known: {', '.join(ACTION_TYPES)} "
                    "(data.unknown_action=keep|skip|error)"
                )
            skipped.append(Skip(step, what, str(log)))
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
                    action_type=action_type,
                    history=tuple(history),
                )
            )
        history.append(action)
    return clean_trajectory(Trajectory(
        trajectory_id=trajectory_id,
        task=task,
        source=SOURCE,
        horizon=len(turns),
        steps=tuple(steps),
        skipped=tuple(skipped),
    ), str(log), on_bad_step)


def _screenshot_index(folder: Path) -> dict[int, Path]:
    """``{k: path}`` of the step screenshots of a task folder (``screenshot{k}.png`` first)."""
    out: dict[int, Path] = {}
    for name in sorted(os.listdir(folder), key=lambda n: (not n.startswith("screenshot1"), n)):
        m = _SCREENSHOT_FILE.fullmatch(name)
        if m and not m.group("nobox"):
            k = int(m.group("k"))
            if m.group("site") is None or k not in out:
                out[k] = folder / name
    return out


def _same_files(a: Path, b: Path) -> bool:
    """Whether two task folders hold the same screenshot names with byte-identical contents."""
    names = sorted(f for f in os.listdir(a) if _SCREENSHOT_FILE.fullmatch(f))
    if names != sorted(f for f in os.listdir(b) if _SCREENSHOT_FILE.fullmatch(f)):
        return False
    return all(filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def _discover(root: Path) -> tuple[list[Path], list[Path], list[dict]]:
    """Task folders (holding the log), screenshot folders without a log, and discovery skips.

    Symlinked folders are followed, each real folder once (:func:`ipi.data.discover.walk`).
    """
    tasks, orphans, skips = [], [], []
    for folder, files, left_out in walk(root):
        skips.extend(left_out)
        if LOG_NAME in files:
            tasks.append(folder)
        elif any(_SCREENSHOT_FILE.fullmatch(f) for f in files):
            orphans.append(folder)
        elif "result.json" in files:
            skips.append({"path": str(folder / "result.json"), "reason": OTHER_LAYOUT})
    return tasks, orphans, skips


def import_webvoyager_report(
    root: str | os.PathLike,
    *,
    on_bad_step: str = "skip",
    max_element_chars: int | None = None,
    unknown_action: str = "keep",
    limit: int | None = None,
    image_limits: ImageLimits | None = DEFAULT_LIMITS,
) -> tuple[list[Trajectory], list[dict]]:
    """Import every WebVoyager task folder under ``root``, reporting what was left out.

    A task folder is any folder (``root`` itself or one below it) that holds
    ``interact_messages.json``. What happens to each kind of bad input is listed in
    ``docs/reliability.md``.

    Args:
        root: A folder of task folders (searched recursively) or one task folder.
        on_bad_step: What to do with a bad step (a screenshot that is empty, truncated,
            corrupt, not an image, larger than :data:`ipi.data.images.MAX_SCREENSHOT_PIXELS`, or missing
            although the log shows an observation) and with a whole unusable task folder.
            ``"skip"``: record the step in ``Trajectory.skipped`` and the folder in the report.
            ``"error"``: raise :class:`DataError` naming the file (and step). A screenshot
            missing after a failed action is always recorded as
            ``Skip(step, "missing screenshot", path)``.
        max_element_chars: If not None, truncate every ``element_text`` to this many characters.
        unknown_action: What to do with a step whose action is none of :data:`ACTION_TYPES`:
            ``"keep"`` it with ``action_type="unknown"`` (default), ``"skip"`` it (reason
            ``unknown action '...'``), or raise :class:`DataError`.
        limit: Stop after this many usable trajectories, in ``trajectory_id`` order
            (``data.max_trajectories``); later folders are not read. None reads everything.
        image_limits: The backbone's image limits (:func:`ipi.data.images.screenshot_problem`);
            None checks only that the file is a readable image.

    Returns:
        ``(trajectories, skipped)``: the trajectories sorted by ``trajectory_id`` (the task
        folder's posix path relative to ``root``, or its own name when ``root`` is a task
        folder), and one ``{"path": ..., "reason": ...}`` dict per folder left out: unusable
        task folders (``on_bad_step="skip"`` only), folders with screenshots but no
        ``interact_messages.json``, task folders with no usable step (reason starts
        ``"no usable step"``) and byte-identical copies of an earlier folder (reason starts
        ``"duplicate of <id>"``).

    Raises:
        ValueError: ``on_bad_step`` is not "skip"/"error", ``unknown_action`` is not
            "keep"/"skip"/"error", or ``max_element_chars`` < 0.
        FileNotFoundError: ``root`` does not exist.
        NotADirectoryError: ``root`` is not a folder.
        DataError: With ``on_bad_step="error"``: an unreadable or malformed log (message names
            the file, and line and column for bad JSON), a duplicate, or a bad screenshot;
            with ``unknown_action="error"``: an unknown action (message names log and step).
"""
    check_options(on_bad_step, unknown_action)
    if max_element_chars is not None and max_element_chars < 0:
        raise ValueError(f"max_element_chars must be >= 0 or None, not {max_element_chars}")
    root = data_root(root, "WebVoyager")
    if not root.is_dir():
        raise NotADirectoryError(f"WebVoyager root {root} is not a folder")

    tasks, orphans, skipped = _discover(root)
    skipped += [{"path": str(p), "reason": NO_LOG} for p in orphans]
    ids = {}
    for folder in tasks:
        rel = folder.relative_to(root).as_posix()
        ids[folder] = root.name if rel == "." else rel
    seen: dict[str, tuple[str, Path]] = {}  # sha256 of the log -> (first id, folder)

    def read(trajectory_id: str, folder: Path) -> Trajectory:
        log = folder / LOG_NAME
        try:
            raw = log.read_bytes()
        except OSError as e:
            raise Problem(log, f"cannot read ({e})") from e
        digest = hashlib.sha256(raw).hexdigest()
        if raw.strip() and digest in seen and _same_files(seen[digest][1], folder):
            raise Problem(log, f"duplicate of {seen[digest][0]} (identical log and screenshots)")
        seen.setdefault(digest, (trajectory_id, folder))
        return _import_task(folder, trajectory_id, on_bad_step, max_element_chars, unknown_action, raw,
                            image_limits)

    return import_each(sorted((ids[f], f) for f in tasks), read, on_bad_step, limit, SOURCE, skipped)


def import_webvoyager(
    root: str | os.PathLike,
    *,
    on_bad_step: str = "skip",
    max_element_chars: int | None = None,
    unknown_action: str = "keep",
) -> list[Trajectory]:
    """Import WebVoyager task folders under ``root`` into native-schema trajectories.

    :func:`import_webvoyager_report` without the report: when any folder was left out it emits
    one ``UserWarning`` summarising how many and which. Step skips stay in
    ``Trajectory.skipped``.

    Args:
        root: A folder of task folders (searched recursively) or one task folder.
        on_bad_step: ``"skip"`` (default) or ``"error"``; see :func:`import_webvoyager_report`.
        max_element_chars: Truncate ``element_text`` to this many characters (None: keep).
        unknown_action: ``"keep"`` (default), ``"skip"`` or ``"error"``.

    Returns:
        The trajectories, sorted by ``trajectory_id`` (PROTOCOL.md §4: the split/cluster unit).

    Raises:
        As :func:`import_webvoyager_report`.
"""
    trajectories, skipped = import_webvoyager_report(
        root, on_bad_step=on_bad_step, max_element_chars=max_element_chars,
        unknown_action=unknown_action,
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
