"""Content-addressed activation cache (safetensors shards + a manifest).

Layout of one cache entry ``<cache_dir>/<key>/``::

    shard-r<rank>-<seq>.safetensors   features [n, L, G, H], collapse [n, L], prompt_len [n],
                                      seq_len [n]; row ids in the safetensors metadata
    manifest.json                     written last: key, versions, dtype, layers, token groups,
                                      row count, shard names with byte sizes and sha256

The key hashes everything that changes the numbers (backbone identity, layers, token groups,
cache dtype, the system prompt, every row's content) and nothing that does not (device, batch
size, workers). Shards are written atomically, so a killed run leaves only whole shards and a
rerun forwards only the rows they lack. Only safetensors is ever read: no pickle.

One writer per entry: :meth:`ActivationCache.writer_lock` holds ``<cache_dir>/<key>.lock`` while
a run forwards rows and writes the manifest; a second run waits, then reads. Stale locks on the
same host are broken; on another host they are reported (docs/extraction.md, *Several runs, one
cache*)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ipi.io import atomic_path, atomic_write_text, content_addressed, text_lines

CACHE_FORMAT = 1
MANIFEST = "manifest.json"

log = logging.getLogger(__name__)


class CacheError(RuntimeError):
    """A cache entry is inconsistent (manifest and shards disagree)."""


class NonFiniteFeatures(CacheError):
    """Features are inf or NaN (a float16 overflow): refused before a shard or manifest is written."""


def _nonfinite_shard(path: Path) -> str | None:
    """Why a shard's features are not all finite (the first row), or None."""
    with safe_open(str(path), framework="pt") as f:
        feats = f.get_tensor("features")
        ids = json.loads(f.metadata()["row_ids"])
    bad = ~torch.isfinite(feats)
    if not bool(bad.any()):
        return None
    r, li = (int(x) for x in bad.nonzero()[0][:2])
    return f"{path.name} holds inf/NaN ({str(feats.dtype).removeprefix('torch.')}; row {ids[r]}, layer axis {li})"


def stable_hash(obj) -> str:
    """SHA-256 hex digest of a JSON-serialisable object (sorted keys)."""
    # surrogatepass: the same bytes as before for every valid string; a path that is not UTF-8 (read
    # back with surrogate escapes) hashes instead of raising
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str)
                          .encode("utf-8", "surrogatepass")).hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 hex digest of a file's bytes."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


#: Spec fields whose local paths enter the cache key by content (:func:`content_addressed`): the
#: backbone node (processor files, a GGUF folder, a local checkpoint).
CONTENT_ADDRESSED_FIELDS: tuple[str, ...] = ("backbone",)


def keyed_form(spec: dict) -> dict:
    """``spec`` as the cache key hashes it: :data:`CONTENT_ADDRESSED_FIELDS` by content, the rest as given."""
    return {k: content_addressed(v) if k in CONTENT_ADDRESSED_FIELDS else v for k, v in spec.items()}


@dataclass
class FeatureSet:
    """Features of all rows of one cache entry, ordered by ``row_ids``.

    Attributes:
        row_ids: Row ids, length N.
        features: ``[N, L, G, H]`` float tensor (layers × token groups × hidden).
        collapse: ``[N, L]`` collapse statistic per row and extracted layer.
        prompt_len: ``[N]`` prompt length in tokens.
        layers: Extracted decoder-block indices (length L).
        token_groups: Token-group names (length G).
    """

    row_ids: list[str]
    features: torch.Tensor
    collapse: torch.Tensor
    prompt_len: torch.Tensor
    layers: list[int]
    token_groups: list[str]


class ActivationCache:
    """One cache entry, addressed by a key.

    Args:
        root: Cache folder holding all entries.
        key: Hex key of this entry (see module docstring).
        spec: JSON-able description stored in the manifest (layers, groups, dtype, ...).
    """

    def __init__(self, root: str | os.PathLike, key: str, spec: dict):
        self.root = Path(root)
        self.key = key
        self.spec = spec
        self.dir = self.root / key[:24]

    @property
    def manifest_path(self) -> Path:
        """Path of the manifest (exists only for a complete entry)."""
        return self.dir / MANIFEST

    @property
    def lock_path(self) -> Path:
        """The entry's lock file, beside the entry folder (``<cache_dir>/<key>.lock``)."""
        return self.root / f"{self.key[:24]}.lock"

    def lock_holder(self) -> str | None:
        """``"pid N on host H"`` of the run holding the lock, or None (free or unreadable)."""
        try:
            lines = text_lines(self.lock_path, errors="replace")
        except OSError:
            return None
        return f"pid {lines[0]} on host {lines[1]}" if len(lines) >= 2 else "a run that recorded no pid"

    @contextmanager
    def writer_lock(self) -> Iterator[float]:
        """Hold the entry's writer lock while the block runs (one writer per entry).

        Waits (trying every 0.5 s; a signal ends the wait) while another live run holds it,
        logging the holder at once and every 60 s. A lock file whose holder died on this host is
        broken (``filelock.SoftFileLock`` checks pid, host and the process start time). The lock
        is released when the block ends, whatever the reason.

        Yields:
            Seconds spent waiting for the lock.
        """
        from filelock import SoftFileLock, Timeout

        self.root.mkdir(parents=True, exist_ok=True)
        lock = SoftFileLock(str(self.lock_path))
        t0 = last = time.monotonic()
        reported = False
        while True:
            try:
                lock.acquire(timeout=0.5, poll_interval=0.05)
                break
            except Timeout:
                now = time.monotonic()
                if not reported or now - last >= 60.0:
                    log.warning("cache entry %s is being written by %s (lock file %s); waiting, then "
                                "reading it (delete the lock file if that run is gone)",
                                self.dir, self.lock_holder(), self.lock_path)
                    reported, last = True, now
        try:
            yield time.monotonic() - t0
        finally:
            lock.release()

    def is_complete(self) -> bool:
        """Whether a manifest for this key exists."""
        return self.manifest_path.exists()

    def shard_paths(self) -> list[Path]:
        """Finished shards present in the entry folder (any rank), sorted by name."""
        return sorted(self.dir.glob("shard-*.safetensors")) if self.dir.exists() else []

    def finished_row_ids(self) -> set[str]:
        """Row ids held by finished shards (for resuming an interrupted extraction)."""
        done: set[str] = set()
        for p in self.shard_paths():
            with safe_open(str(p), framework="pt") as f:
                done.update(json.loads(f.metadata()["row_ids"]))
        return done

    def write_shard(self, name: str, tensors: dict[str, torch.Tensor], row_ids: list[str]) -> Path:
        """Write one shard atomically (temporary name, then rename).

        Args:
            name: Shard stem, e.g. ``shard-r0-00003``.
            tensors: ``features`` [n, L, G, H], ``collapse`` [n, L], ``prompt_len`` [n], ``seq_len`` [n].
            row_ids: The n row ids, in tensor order.

        Returns:
            Path of the written shard.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{name}.safetensors"
        with atomic_path(path) as tmp:
            save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(tmp),
                      metadata={"row_ids": json.dumps(row_ids), "key": self.key})
        return path

    def finalize(self, expected_row_ids: list[str]) -> dict:
        """Check the shards hold every expected row exactly once and write the manifest.

        Duplicate rows (e.g. DistributedSampler's padding repeats) are allowed across shards
        only if identical in id; they are counted and ignored when loading.

        Args:
            expected_row_ids: All row ids the entry must hold.

        Returns:
            The manifest dict.

        Raises:
            CacheError: Rows are missing or unexpected rows are present.
            NonFiniteFeatures: A shard holds inf or NaN features (no manifest is written).
        """
        seen: dict[str, int] = {}
        shards = []
        for p in self.shard_paths():
            with safe_open(str(p), framework="pt") as f:
                ids = json.loads(f.metadata()["row_ids"])
            for r in ids:
                seen[r] = seen.get(r, 0) + 1
            shards.append({"name": p.name, "rows": len(ids), "bytes": p.stat().st_size, "sha256": file_sha256(p)})
            if (why := _nonfinite_shard(p)) is not None:  # a shard written before the finite check
                raise NonFiniteFeatures(
                    f"cache {self.dir}: {why}; not finalised. Delete the entry (extract.force=true "
                    "rebuilds it) and use backbone.cache_dtype=bfloat16 or float32")
        expected = set(expected_row_ids)
        missing = expected - seen.keys()
        extra = seen.keys() - expected
        if missing or extra:
            raise CacheError(
                f"cache {self.dir}: {len(missing)} rows missing, {len(extra)} unexpected rows "
                f"(e.g. {sorted(missing or extra)[:3]})"
            )
        manifest = {
            "format": CACHE_FORMAT,
            "key": self.key,
            "n_rows": len(expected),
            "duplicates_ignored": sum(v - 1 for v in seen.values()),
            "shards": shards,
            **self.spec,
            # what the key hashes of the fields that hold local paths (the fields above keep the
            # paths as given, for people); read_manifest compares this form
            "content": {k: v for k, v in keyed_form(self.spec).items() if k in CONTENT_ADDRESSED_FIELDS},
        }
        atomic_write_text(self.manifest_path, json.dumps(manifest, indent=1, sort_keys=True))
        return manifest

    def read_manifest(self) -> dict:
        """Read and check the manifest against the shards on disk.

        Raises:
            CacheError: Key mismatch, a shard missing, extra or of another size, a row count that
                does not add up, or a manifest field (layers, token groups, backbone, dtype, ...)
                that differs from this entry's spec.
        """
        try:
            manifest = json.loads(self.manifest_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CacheError(f"cache manifest {self.manifest_path} unreadable: {e}") from e
        if manifest.get("key") != self.key:
            raise CacheError(f"cache manifest {self.manifest_path} is for another key; refusing to read")
        on_disk = {p.name: p for p in self.shard_paths()}
        for s in manifest["shards"]:
            p = on_disk.get(s["name"])
            if p is None or p.stat().st_size != s["bytes"]:
                raise CacheError(
                    f"cache {self.dir}: shard {s['name']} missing or changed since the manifest was "
                    "written; delete the entry (python -m ipi.tools.cache prune) and rerun"
                )
        if set(on_disk) != {s["name"] for s in manifest["shards"]}:
            raise CacheError(f"cache {self.dir}: shards on disk do not match the manifest; refusing to read")
        # An edited manifest: rows that do not add up, or a description that is not this key's.
        held = sum(int(s["rows"]) for s in manifest["shards"]) - int(manifest.get("duplicates_ignored", 0))
        if held != manifest.get("n_rows"):
            raise CacheError(
                f"cache {self.dir}: manifest says {manifest.get('n_rows')} rows, its shards hold {held}; "
                "refusing to read"
            )
        for field_name, expected in keyed_form(self.spec).items():
            if field_name == "versions":
                continue
            if field_name in CONTENT_ADDRESSED_FIELDS:
                # Compared by content, as the key hashes it: the same files reached through another
                # path (another checkout, a moved folder) are this entry. A manifest written before
                # the "content" record is read through its paths where they still exist.
                got = manifest.get("content", {}).get(field_name, None)
                if got is None:
                    got = content_addressed(manifest.get(field_name))
            else:
                got = manifest.get(field_name)
            if got != expected:
                raise CacheError(
                    f"cache {self.dir}: manifest field {field_name!r} does not match this entry's "
                    "key; refusing to read"
                )
        return manifest

    def load(self, row_ids: list[str]) -> FeatureSet:
        """Load the features of ``row_ids`` (in that order) from a complete entry.

        Raises:
            CacheError: The entry is incomplete or inconsistent, or a row is absent.
            NonFiniteFeatures: The entry holds inf or NaN features (written before the check).
        """
        manifest = self.read_manifest()
        index = {r: i for i, r in enumerate(row_ids)}
        feats = collapse = plen = None
        filled = np.zeros(len(row_ids), dtype=bool)
        for s in manifest["shards"]:
            with safe_open(str(self.dir / s["name"]), framework="pt") as f:
                ids = json.loads(f.metadata()["row_ids"])
                t = {k: f.get_tensor(k) for k in ("features", "collapse", "prompt_len")}
            if feats is None:
                feats = torch.empty((len(row_ids), *t["features"].shape[1:]), dtype=t["features"].dtype)
                collapse = torch.empty((len(row_ids), t["collapse"].shape[1]), dtype=t["collapse"].dtype)
                plen = torch.empty(len(row_ids), dtype=torch.long)
            for j, r in enumerate(ids):
                i = index.get(r)
                if i is None or filled[i]:
                    continue
                feats[i] = t["features"][j]
                collapse[i] = t["collapse"][j]
                plen[i] = t["prompt_len"][j]
                filled[i] = True
        if feats is None or not filled.all():
            raise CacheError(f"cache {self.dir}: {int((~filled).sum())} requested rows absent")
        if not bool(torch.isfinite(feats).all()):  # an entry finished by a version without the check
            r = int((~torch.isfinite(feats)).flatten(1).any(1).nonzero()[0, 0])
            raise NonFiniteFeatures(
                f"cache {self.dir}: a finished entry holds inf/NaN features (dtype "
                f"{str(feats.dtype).removeprefix('torch.')}, row {row_ids[r]}); refusing to read it. "
                "Rerun with extract.force=true (rebuilds the entry) and backbone.cache_dtype=bfloat16 or float32")
        return FeatureSet(row_ids=list(row_ids), features=feats, collapse=collapse, prompt_len=plen,
                          layers=list(manifest["layers"]), token_groups=list(manifest["token_groups"]))
