"""Atomic file writes: write to a temporary name in the destination folder, then rename.

A reader never sees a half-written file, and a run killed mid-write leaves at most a hidden
``.<name>.*.tmp`` file behind, never a truncated result.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed onto ``path``.

    Args:
        path: Final destination (its folder is created).

    Yields:
        The temporary path to write to. On an exception it is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically and return ``path``.

    A character UTF-8 cannot encode (a lone surrogate: a file name that is not UTF-8, read back with
    surrogate escapes) is written as its backslash escape (``\\udcff``), never an error that
    loses a finished run's files.
    """
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8", errors="backslashreplace")
    return Path(path)


def text_lines(path: str | os.PathLike, errors: str = "strict") -> list[str]:
    """The lines of a UTF-8 text file that ipi wrote, split at ``"\\n"`` only.

    ``str.splitlines`` also splits at U+2028, U+2029, U+0085, ``\\v``, ``\\f`` and ``\\x1c``-``\\x1e``,
    which a JSON string written with ``ensure_ascii=False`` may hold raw; the records ipi writes
    (JSON Lines, journals, lock files) end each line with ``"\\n"`` and nothing else. A trailing
    ``"\\r"`` (a file edited on Windows) is removed; a final empty line is not returned.

    Args:
        path: The file.
        errors: Decoding error handler (``"strict"``, ``"replace"``).

    Returns:
        The lines, without their ``"\\n"``.
    """
    text = Path(path).read_bytes().decode("utf-8", errors)  # bytes: no universal-newline translation
    lines = [x.removesuffix("\r") for x in text.split("\n")]
    return lines[:-1] if lines and lines[-1] == "" else lines


def stat_fingerprint(path: str | os.PathLike) -> tuple:
    """What changes whenever a file's content may have changed: ``(path, device, inode, size,
    mtime_ns, ctime_ns)``.

    An atomic rewrite gives a new inode and an in-place rewrite moves ``ctime``, even with the
    old size and the same clock tick, so a memo keyed by this tuple never serves another
    content's value for a path.
"""
    st = os.stat(path)
    return (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


#: Per-process digest memo of :func:`content_digest` (by fingerprint) and :func:`local_content_digest`.
_DIGESTS: dict[tuple, str] = {}
_DIGESTS_MAX = 65536


def _sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def content_digest(path: str | os.PathLike) -> str:
    """SHA-256 hex digest of a file's bytes, memoised per process by :func:`stat_fingerprint`.

    The memo is keyed by the file's fingerprint, not its path: a path whose content changed
    (another data root writing the same file name, a rewritten screenshot) is hashed again.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    fp = stat_fingerprint(path)
    hit = _DIGESTS.get(fp)
    if hit is None:
        hit = _sha256(path)
        if stat_fingerprint(path) == fp:  # unchanged while it was read: safe to remember
            if len(_DIGESTS) >= _DIGESTS_MAX:
                _DIGESTS.pop(next(iter(_DIGESTS)))
            _DIGESTS[fp] = hit
    return hit


def tree_fingerprint(root: str | os.PathLike) -> str:
    """A digest of :func:`stat_fingerprint` of every file under ``root`` (symlinks followed), or of
    ``root`` itself when it is a file; ``"absent"`` when it does not exist.

    One ``stat`` per file, nothing read; changes whenever a file under ``root`` is added,
    removed, renamed or rewritten.
"""
    root = Path(root)
    h = hashlib.sha256()
    if root.is_file():
        h.update(repr(stat_fingerprint(root)).encode())
        return h.hexdigest()
    if not root.is_dir():
        return "absent"
    seen: set[tuple[int, int]] = set()
    for folder, dirs, files in os.walk(root, followlinks=True):
        st = os.stat(folder)
        if (st.st_dev, st.st_ino) in seen:  # a symlink loop
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs.sort()
        for name in sorted(files):
            try:
                h.update(repr(stat_fingerprint(os.path.join(folder, name))).encode())
            except OSError:  # a dangling link
                h.update(f"{folder}/{name}: unreadable".encode())
    return h.hexdigest()


#: Files up to this size are hashed whole by :func:`local_content_digest` (processor files, a
#: GGUF of a small model); larger ones (checkpoint weights) are identified by location instead.
WHOLE_FILE_BYTES = 256 << 20


def _file_fingerprint(path: Path, size: int, mtime_ns: int) -> str:
    if size > WHOLE_FILE_BYTES:
        # Hashing 16 GB of weights is not a price for a cache hit, and a partial read could miss
        # a fine-tune that left the sampled bytes alone: large files key by where they are.
        return "file:" + json.dumps([str(path.resolve()), size, mtime_ns])
    return _sha256(path)


def local_content_digest(path: str | os.PathLike) -> str:
    """Content digest of a local file or folder, so that a cache key does not depend on where it lies.

    A folder's digest covers the relative name and content of every regular file below it,
    leaving out dot-files and ``__pycache__``. Files up to :data:`WHOLE_FILE_BYTES` enter by
    their bytes; larger ones by resolved path, size and modification time. Memoised per process
    on (path, size, mtime, inode, ctime) of every file.

    Args:
        path: An existing local file or folder.

    Returns:
        ``"sha256:<hex>"``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
"""
    root = Path(path)
    if root.is_file():
        files = [(root.name, root)]
    elif root.is_dir():
        files = sorted(
            (p.relative_to(root).as_posix(), p) for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
            and not any(part.startswith(".") for part in p.relative_to(root).parts))
    else:
        raise FileNotFoundError(f"{path}: no such file or folder")
    # memo key: size and mtime enter the digest of a large file; inode and ctime change on every
    # rewrite (atomic or in place) even when size and mtime do not, so the memo never serves
    # another content's digest (ipi.io.stat_fingerprint)
    stats = tuple((rel, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
                  for rel, p in files for st in (p.stat(),))
    memo_key = (str(root.resolve()), stats)
    if memo_key not in _DIGESTS:
        h = hashlib.sha256()
        for (rel, p), (_, size, mtime_ns, _, _) in zip(files, stats, strict=True):
            h.update(f"{rel}\0{_file_fingerprint(p, size, mtime_ns)}\n".encode())
        _DIGESTS[memo_key] = "sha256:" + h.hexdigest()
    return _DIGESTS[memo_key]


def content_addressed(node):
    """``node`` (a JSON-like config tree) with every local path replaced by its content digest.

    A string holding a ``/`` that names an existing file or folder becomes
    :func:`local_content_digest` of it; hub ids that are not local folders stay as they are. The
    extraction cache key hashes this form of the backbone node, so the same files reached
    through another path find the same entry, and changed files do not.
"""
    if isinstance(node, dict):
        return {k: content_addressed(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [content_addressed(v) for v in node]
    if isinstance(node, str) and "/" in node and os.path.exists(node):
        return local_content_digest(node)
    return node
