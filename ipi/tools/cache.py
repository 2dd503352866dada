"""List and prune activation-cache entries: ``python -m ipi.tools.cache list|prune``.

Each entry of the cache folder (``extract.cache_dir``) is a folder named by the first 24 hex
digits of its key (:mod:`ipi.extraction.activation_cache`)::

    python -m ipi.tools.cache list [--cache-dir DIR] [--verify]
    python -m ipi.tools.cache prune [--older-than DAYS] [--key PREFIX] [--incomplete] [--invalid]
                              [--all] [--dry-run] [--cache-dir DIR]

Status: ``ok`` (manifest matches its shards; with ``--verify`` also every shard's sha256),
``incomplete`` (no manifest: an interrupted extraction) or ``invalid: <why>``. Only folders named
like cache entries are ever deleted. See ``docs/reliability.md``."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ipi.extraction.activation_cache import ActivationCache, CacheError, file_sha256
from ipi.io import text_lines

REPO_ROOT = Path(__file__).resolve().parents[2]
_ENTRY = re.compile(r"[0-9a-f]{24}")


def default_cache_dir() -> Path:
    """``$IPI_CACHE_DIR``, or ``outputs/cache`` in the repository (conf/extract/default.yaml)."""
    return Path(os.environ.get("IPI_CACHE_DIR") or REPO_ROOT / "outputs" / "cache")


@dataclass
class Entry:
    """One cache entry as found on disk.

    Attributes:
        path: The entry folder.
        status: ``ok``, ``incomplete`` or ``invalid: <reason>``.
        rows: Rows the manifest lists (None without a readable manifest).
        bytes: Bytes of every file in the folder (shards, manifest, leftover temporary files).
        layers: Extracted decoder-block indices (None without a readable manifest).
        backbone: Backbone name (None without a readable manifest).
        created: Modification time (epoch seconds) of the manifest, or of the newest file for
            an incomplete entry.
    """

    path: Path
    status: str
    rows: int | None
    bytes: int
    layers: list | None
    backbone: str | None
    created: float

    @property
    def key(self) -> str:
        return self.path.name


def _check(path: Path, manifest: dict, verify: bool) -> str:
    key = manifest.get("key") or ""
    if not key.startswith(path.name):
        return f"invalid: manifest key {key[:24]!r} is not the folder's"
    try:
        ActivationCache(path.parent, key, {}).read_manifest()
    except CacheError as e:
        return f"invalid: {str(e).split(': ', 1)[-1]}"
    if verify:
        for s in manifest["shards"]:
            if file_sha256(path / s["name"]) != s["sha256"]:
                return f"invalid: shard {s['name']} sha256 differs from the manifest"
    return "ok"


def scan(cache_dir: str | os.PathLike, verify: bool = False) -> list[Entry]:
    """Every cache entry under ``cache_dir``, sorted by creation time (oldest first).

    Args:
        cache_dir: The cache folder.
        verify: Also recompute every shard's sha256 (reads all bytes).

    Returns:
        The entries; folders not named like an entry are ignored.
    """
    root = Path(cache_dir)
    out = []
    if not root.is_dir():
        return out
    for path in sorted(p for p in root.iterdir() if p.is_dir() and _ENTRY.fullmatch(p.name)):
        files = [f for f in path.rglob("*") if f.is_file()]
        size = sum(f.stat().st_size for f in files)
        newest = max((f.stat().st_mtime for f in files), default=path.stat().st_mtime)
        mpath = path / "manifest.json"
        if not mpath.exists():
            lock = root / f"{path.name}.lock"
            status = "incomplete"
            if lock.exists():  # a run is writing it (or crashed holding the lock: docs/extraction.md)
                lines = text_lines(lock, errors="replace")
                status = f"writing (lock: pid {lines[0]} on {lines[1]})" if len(lines) >= 2 else "writing (locked)"
            out.append(Entry(path, status, None, size, None, None, newest))
            continue
        try:
            manifest = json.loads(mpath.read_text())
            status = _check(path, manifest, verify)
        except (OSError, ValueError, KeyError, TypeError) as e:
            out.append(Entry(path, f"invalid: manifest unreadable ({e})", None, size, None, None,
                             mpath.stat().st_mtime))
            continue
        out.append(Entry(path, status, manifest.get("n_rows"), size, manifest.get("layers"),
                         (manifest.get("backbone") or {}).get("name"), mpath.stat().st_mtime))
    return sorted(out, key=lambda e: (e.created, e.key))


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def format_table(entries: list[Entry]) -> str:
    """The ``list`` output: one line per entry and a total."""
    head = ("key", "status", "rows", "bytes", "layers", "backbone", "created")
    rows = [head] + [
        (e.key, e.status, "-" if e.rows is None else str(e.rows), _human(e.bytes),
         "-" if e.layers is None else ",".join(map(str, e.layers)), e.backbone or "-", _stamp(e.created))
        for e in entries
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows]
    lines.append(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, "
                 f"{_human(sum(e.bytes for e in entries))}")
    return "\n".join(lines)


def select(entries: list[Entry], *, older_than_days: float | None = None, key: str | None = None,
           incomplete: bool = False, invalid: bool = False, all_entries: bool = False) -> list[Entry]:
    """Entries a ``prune`` with these options removes (an entry matching any selector).

    Raises:
        ValueError: No selector given (prune never removes everything by default).
    """
    if not (all_entries or older_than_days is not None or key or incomplete or invalid):
        raise ValueError("prune needs --all, --older-than DAYS, --key PREFIX, --incomplete or --invalid")
    now = time.time()
    chosen = []
    for e in entries:
        if (all_entries
                or (older_than_days is not None and now - e.created > older_than_days * 86400)
                or (key and e.key.startswith(key[:24]))
                or (incomplete and e.status == "incomplete")
                or (invalid and e.status.startswith("invalid"))):
            chosen.append(e)
    return chosen


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m ipi.tools.cache", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", default=None, help="cache folder (default: $IPI_CACHE_DIR or outputs/cache)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="show every entry")
    ls.add_argument("--verify", action="store_true", help="recompute every shard's sha256")
    pr = sub.add_parser("prune", help="delete entries")
    pr.add_argument("--older-than", type=float, metavar="DAYS", help="created more than DAYS ago")
    pr.add_argument("--key", metavar="PREFIX", help="entries whose key starts with PREFIX")
    pr.add_argument("--incomplete", action="store_true", help="entries without a manifest")
    pr.add_argument("--invalid", action="store_true", help="entries whose manifest and shards disagree")
    pr.add_argument("--all", action="store_true", help="every entry")
    pr.add_argument("--dry-run", action="store_true", help="only print what would be removed")
    pr.add_argument("--verify", action="store_true", help="recompute sha256 to find invalid entries")
    args = ap.parse_args(argv)
    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    entries = scan(cache_dir, verify=args.verify)
    if args.cmd == "list":
        print(f"cache: {cache_dir}")
        print(format_table(entries))
        return 0
    try:
        chosen = select(entries, older_than_days=args.older_than, key=args.key, incomplete=args.incomplete,
                        invalid=args.invalid, all_entries=args.all)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    verb = "would remove" if args.dry_run else "removed"
    for e in chosen:
        if not args.dry_run:
            shutil.rmtree(e.path)
        print(f"{verb} {e.key} ({e.status}, {_human(e.bytes)})")
    print(f"{verb} {len(chosen)} of {len(entries)} entries, {_human(sum(e.bytes for e in chosen))}")
    return 0


def _main_quiet_on_broken_pipe() -> int:
    """:func:`main`, ending quietly when the reader of stdout goes away (``... list | head``)."""
    try:
        rc = main()
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        # Python's recipe: point stdout at devnull so the interpreter's final flush is silent.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell tool killed by the broken pipe would


if __name__ == "__main__":
    raise SystemExit(_main_quiet_on_broken_pipe())
