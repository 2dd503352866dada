"""The native trajectory schema every importer produces.

On disk a dataset in the native schema is one JSON-Lines file, one trajectory per line::

    {"trajectory_id": "examples/taskAmazon--0",
     "task": "Search an Xbox Wireless controller ...",
     "source": "webvoyager",
     "horizon": 3,
     "skipped": [{"step": 4, "reason": "missing screenshot", "path": ".../screenshot5.png"}],
     "steps": [
        {"step": 0,
         "screenshot": "/abs/path/screenshot1.png",
         "element_text": "[0]: \\".us\\", \\"Amazon\\"; ...",
         "element_text_omitted": false,
         "tool_result": "No previous action.",
         "thought": "The task is to search ...",
         "action": "Type [2]; green Xbox Wireless controller 4 stars",
         "action_type": "type",
         "history": []}
     ]}

Image paths are absolute (or relative to the JSONL file's folder) so the file can live anywhere.
``step`` is the 0-based index of the agent turn in the recorded trajectory; ``horizon`` is the
number of agent turns in the trajectory, skipped ones included (PROTOCOL.md §3, metadata).
A new dataset plugs in by writing an importer that returns ``list[Trajectory]``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ipi.io import atomic_write_text


class DataError(ValueError):
    """A recorded trajectory (or one of its files) is malformed.

    Raised by importers with a message naming the offending file (and step, where there is
    one). A subclass of ``ValueError``, so code catching ``ValueError`` keeps working.
    """


@dataclass(frozen=True)
class Step:
    """One agent turn of a recorded trajectory, as the agent saw it.

    Attributes:
        step: 0-based index of the agent turn within its trajectory.
        screenshot: Path of the screenshot the agent acted on.
        element_text: Page text / element list the agent read ("" when the log omitted it).
        element_text_omitted: True when the log replaced the element text by a placeholder.
        tool_result: Text of the tool/environment result block shown before this step
            (feedback on the previous action; see ``docs/data.md``).
        thought: The gold "Thought:" text of the recorded agent turn.
        action: The gold action string, e.g. ``"Click [33]"``.
        action_type: Parsed verb of ``action`` (click, type, scroll, wait, goback, google,
            answer) or ``"unknown"``.
        history: Action strings of all earlier agent turns of the trajectory, oldest first.
    """

    step: int
    screenshot: str
    element_text: str
    element_text_omitted: bool
    tool_result: str
    thought: str
    action: str
    action_type: str
    history: tuple[str, ...] = ()

    @property
    def gold_text(self) -> str:
        """The teacher-forced agent turn: ``"Thought: ...\\n\\nAction: ..."``."""
        return f"Thought: {self.thought}\n\nAction: {self.action}"


@dataclass(frozen=True)
class Skip:
    """A step that could not be used, with the reason (reported, never silently dropped)."""

    step: int
    reason: str
    path: str


@dataclass(frozen=True)
class Trajectory:
    """A recorded web-agent trajectory.

    Attributes:
        trajectory_id: Unique id (the cluster unit of splits and bootstrap).
        task: The task instruction given to the agent.
        source: Name of the importer / dataset.
        horizon: Number of agent turns in the trajectory (skipped ones included).
        steps: Usable steps, ordered by ``step``.
        skipped: Steps left out, each with a reason and the offending file.
        meta: Importer details kept for the record (e.g. Online-Mind2Web's ``task_id`` and
            folder when they differ, the frame layout); not used by replay.
    """

    trajectory_id: str
    task: str
    source: str
    horizon: int
    steps: tuple[Step, ...]
    skipped: tuple[Skip, ...] = field(default=())
    meta: dict = field(default_factory=dict, compare=False, hash=False)


def _to_json(t: Trajectory) -> dict:
    d = asdict(t)
    for s in d["steps"]:
        s["history"] = list(s["history"])
    return d


def _from_json(d: dict, base: Path) -> Trajectory:
    steps = []
    for s in d["steps"]:
        shot = Path(s["screenshot"])
        if not shot.is_absolute():
            shot = base / shot
        steps.append(Step(**{**s, "screenshot": str(shot), "history": tuple(s.get("history", ()))}))
    skipped = tuple(Skip(**k) for k in d.get("skipped", ()))
    return Trajectory(
        trajectory_id=d["trajectory_id"],
        task=d["task"],
        source=d.get("source", "native"),
        horizon=int(d["horizon"]),
        steps=tuple(steps),
        skipped=skipped,
        meta=dict(d.get("meta") or {}),
    )


def write_native(trajectories: list[Trajectory], path: str | os.PathLike) -> Path:
    """Write trajectories to a native-schema JSONL file atomically (temp file, then rename).

    Args:
        trajectories: Trajectories to write.
        path: Destination ``.jsonl`` path.

    Returns:
        The destination path.
    """
    text = "".join(json.dumps(_to_json(t), ensure_ascii=False) + "\n" for t in trajectories)
    return atomic_write_text(path, text)


def read_native(path: str | os.PathLike, limit: int | None = None) -> list[Trajectory]:
    """Read a native-schema JSONL file.

    Args:
        path: A ``.jsonl`` file written by :func:`write_native` or by hand.
        limit: Stop reading after this many trajectories (None: the whole file); a repeated
            id after them is not looked at.

    Returns:
        The trajectories, in file order.

    Raises:
        DataError: A line is not UTF-8, not valid JSON, lacks a required key, or repeats a
            ``trajectory_id`` (message names the file and line); a ``ValueError`` subclass.
    """
    out = []
    for t in iter_native(path):
        if limit is not None and len(out) >= limit:
            break
        out.append(t)
    return out


def iter_native(path: str | os.PathLike):
    """Yield the trajectories of a native-schema JSONL file one line at a time.

    Lines are parsed (and ids checked for repeats) only as far as the caller reads, so a
    consumer that stops early (``data.max_trajectories``) never looks at the rest.

    Raises:
        DataError: As :func:`read_native`, for the lines read.
    """
    path = Path(path)
    first_line: dict[str, int] = {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid UTF-8 (byte {e.start}: {e.reason})") from e
            if not line.strip():
                continue
            try:
                t = _from_json(json.loads(line), path.parent)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise DataError(f"{path}:{lineno}: not a native-schema trajectory ({e})") from e
            if t.trajectory_id in first_line:
                raise DataError(
                    f"{path}:{lineno}: trajectory_id {t.trajectory_id!r} already used on line "
                    f"{first_line[t.trajectory_id]} (ids must be unique: they are the split unit)"
                )
            first_line[t.trajectory_id] = lineno
            yield t
