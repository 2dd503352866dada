"""Finding task folders under a data root: symlinks followed (loop-safe), one visit per real folder.

Every folder importer walks its root with :func:`walk` (``docs/data.md``, "Discovery"):
symlinked folders are followed; each real folder is visited once (a second path to it, a loop, a
broken link or an unlistable folder is reported). :func:`summarise_skips` turns the
``{"path", "reason"}`` records into counts per reason."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LFS_POINTER_PREFIX", "is_lfs_pointer", "reason_kind", "summarise_skips", "walk"]

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
