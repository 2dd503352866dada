"""What every importer shares: its options, its data root, its walk and its loop over inputs.

Every folder importer walks its root with :func:`walk` (``docs/data.md``, "Discovery"):
symlinked folders are followed; each real folder is visited once (a second path to it, a loop, a
broken link or an unlistable folder is reported). :func:`import_each` reads the inputs found, an
unusable one (:class:`Problem`) reported or an error by ``on_bad_step``. :func:`summarise_skips`
turns the ``{"path", "reason"}`` records into counts per reason."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from ipi.data.schema import DataError, Skip, Trajectory
from ipi.progress import track

__all__ = ["LFS_POINTER_PREFIX", "ON_BAD_STEP", "UNKNOWN_ACTION_POLICIES", "Problem", "bad_step", "check_options",
           "data_root", "import_each", "is_lfs_pointer", "no_usable_step", "read_json", "reason_kind",
           "summarise_skips", "walk"]

#: ``on_bad_step`` values (``data.on_bad_step``): a counted skip, or an error naming the file.
ON_BAD_STEP = ("skip", "error")
#: ``unknown_action`` values (``data.unknown_action``): what an importer does with an action it
#: does not know.
UNKNOWN_ACTION_POLICIES = ("keep", "skip", "error")

#: First bytes of a Git LFS pointer file (a checkout without ``git lfs pull``).
LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/"


def is_lfs_pointer(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a Git LFS pointer file instead of the content it stands for."""
    try:
        with open(path, "rb") as f:
            return f.read(len(LFS_POINTER_PREFIX)) == LFS_POINTER_PREFIX
    except OSError:
        return False


def walk(root: str | os.PathLike) -> Iterator[tuple[Path, list[str], list[dict]]]:
    """Walk ``root`` depth-first in name order, following symlinked folders once each.

    Args:
        root: The data root (a folder).

    Yields:
        ``(folder, file_names, skips)``: a folder as reached from ``root`` (through links, not
        resolved), the names of the plain files in it (sorted; links to files included), and
        ``{"path", "reason"}`` records for what in it was left out: broken links, links to a
        folder already visited (reason ``"symlink to a folder already found: <path>"``), a folder that
        cannot be listed.
    """
    root = Path(os.path.abspath(root))
    seen: dict[str, Path] = {}
    stack = [root]
    while stack:
        folder = stack.pop()
        real = os.path.realpath(folder)
        if real in seen:
            yield folder, [], [{"path": str(folder), "reason": f"symlink to a folder already found: {seen[real]}"}]
            continue
        seen[real] = folder
        skips: list[dict] = []
        files: list[str] = []
        subdirs: list[Path] = []
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            yield folder, [], [{"path": str(folder), "reason": f"cannot list folder ({type(e).__name__}: {e.strerror or e})"}]
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=True):
                    subdirs.append(Path(e.path))
                elif e.is_file(follow_symlinks=True):
                    files.append(e.name)
                elif e.is_symlink():
                    target = os.readlink(e.path)
                    skips.append({"path": e.path, "reason": f"broken symlink (target {target} does not exist)"})
            except OSError as err:
                skips.append({"path": e.path, "reason": f"cannot stat ({type(err).__name__})"})
        yield folder, files, skips
        stack.extend(reversed(subdirs))


class Problem(Exception):
    """A whole input (file or folder) is unusable; ``reason`` says why, without the path."""

    def __init__(self, path: Path, reason: str):
        super().__init__(reason)
        self.path, self.reason = path, reason


def check_options(on_bad_step: str, unknown_action: str = "keep") -> None:
    """Raises ValueError (naming the allowed values) for an unknown importer policy."""
    if on_bad_step not in ON_BAD_STEP:
        raise ValueError(f"on_bad_step must be 'skip' or 'error', not {on_bad_step!r}")
    if unknown_action not in UNKNOWN_ACTION_POLICIES:
        raise ValueError(
            f"unknown_action must be one of {', '.join(UNKNOWN_ACTION_POLICIES)}, not {unknown_action!r}"
        )


def data_root(root: str | os.PathLike, what: str) -> Path:
    """``root`` made absolute; FileNotFoundError naming ``what`` and the path if it does not exist."""
    root = Path(os.path.abspath(root))
    if not root.exists():
        raise FileNotFoundError(f"{what} root {root} does not exist")
    return root


def read_json(path: Path):
    """The JSON value of a UTF-8 file (a byte-order mark allowed); :class:`Problem` if it is not."""
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as e:
        raise Problem(path, f"not valid UTF-8 ({e.reason})") from e
    except json.JSONDecodeError as e:
        raise Problem(path, f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from e


def bad_step(skipped: list[Skip], on_bad_step: str, step: int, reason: str, path, where=None) -> None:
    """Add ``Skip(step, reason, path)``; under ``"error"`` raise DataError ``"<where or path>: step <k>: <reason>"``."""
    if on_bad_step == "error":
        raise DataError(f"{where or path}: step {step}: {reason}")
    skipped.append(Skip(step, reason, str(path)))


def no_usable_step(path, t: Trajectory) -> dict:
    """The report record of a trajectory none of whose steps is usable, with the steps' reasons."""
    reasons = "; ".join(sorted({k.reason for k in t.skipped}))
    return {"path": str(path), "reason": f"no usable step: all {t.horizon} step(s) skipped ({reasons})"}


def import_each(inputs: list, read: Callable[..., Trajectory], on_bad_step: str, limit: int | None, name: str,
                skipped: list[dict]) -> tuple[list[Trajectory], list[dict]]:
    """An importer's loop: ``read(id, path)`` each ``(id, path)`` of ``inputs`` until ``limit`` usable ones.

    Returns:
        ``(trajectories sorted by id, skipped sorted by path)``: ``skipped`` (discovery's records)
        gains each :class:`Problem` and each trajectory with no usable step.

    Raises:
        DataError: ``"<path>: <reason>"`` of a :class:`Problem` under ``on_bad_step="error"``.
    """
    trajectories: list[Trajectory] = []
    for key, path in track(inputs, f"import {name}"):
        if limit is not None and len(trajectories) >= limit:
            break
        try:
            t = read(key, path)
        except Problem as e:
            if on_bad_step == "error":
                raise DataError(f"{e.path}: {e.reason}") from e
            skipped.append({"path": str(e.path), "reason": e.reason})
            continue
        if t.steps:
            trajectories.append(t)
        else:
            skipped.append(no_usable_step(path, t))
    trajectories.sort(key=lambda t: t.trajectory_id)
    skipped.sort(key=lambda d: d["path"])
    return trajectories, skipped


_KIND_CUT = re.compile(r"\s*(?::|\(| of |(?<![A-Za-z_])\d)")


def reason_kind(reason: str) -> str:
    """The reason's kind, without paths, ids and numbers: ``"duplicate of a/b (...)"`` → ``"duplicate"``.

    Step-level reasons inside ``"no usable step: all 3 step(s) skipped (missing screenshot)"``
    are kept: ``"no usable step (missing screenshot)"``.
    """
    if reason.startswith("no usable step"):
        m = re.search(r"skipped \((.*)\)\s*$", reason)
        inner = sorted({reason_kind(r) for r in m.group(1).split("; ")}) if m else []
        return "no usable step" + (f" ({'; '.join(inner)})" if inner else "")
    for prefix in ("unreadable screenshot: ", "unusable screenshot: "):
        if reason.startswith(prefix):
            return prefix + reason_kind(reason[len(prefix):])
    m = _KIND_CUT.search(reason)
    kind = reason[: m.start()] if m and m.start() > 0 else reason
    return kind.strip() or reason.strip()


def summarise_skips(skips: list[dict]) -> list[tuple[str, int]]:
    """``[(reason kind, count)]`` of ``{"path", "reason"}`` records, most frequent first."""
    counts = Counter(reason_kind(d["reason"]) for d in skips)
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
