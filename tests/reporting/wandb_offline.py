"""Read the records of an offline W&B run (``run-<id>.wandb``) without syncing it.

The file is a LevelDB-style log (header ``:W&B``, 32 KiB blocks, records split FULL/FIRST/MIDDLE/
LAST) of ``wandb_internal_pb2.Record`` protobufs. Used by the tests to check what a run logged.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK = 32768


def read_records(path: str | Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    ident, _magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B", f"{path}: not a W&B run file"
    pos, buf, chunks = 7, b"", []
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _crc, n, typ = struct.unpack("<IHB", data[pos:pos + 7])
        if n == 0 and typ == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if typ == 1:
            chunks.append(chunk)
        elif typ == 2:
            buf = chunk
        elif typ == 3:
            buf += chunk
        elif typ == 4:
            chunks.append(buf + chunk)
            buf = b""
    out = []
    for c in chunks:
        r = pb.Record()
        r.ParseFromString(c)
        out.append(r)
    return out


def summarise(run_dir: str | Path, timeout: float = 60.0) -> dict:
    """``{"run_id", "config": {key: value}, "history": {key: value}, "summary": {key: value}}``.

    Values are decoded from their JSON encoding; later records overwrite earlier ones. wandb's
    service may still be writing after ``wandb.finish()`` returns: the file is read again until
    it holds the run's ``exit`` record (at most ``timeout`` seconds).
    """
    run_dir = Path(run_dir)
    (f,) = list(run_dir.glob("run-*.wandb"))
    deadline = time.monotonic() + timeout
    while True:
        records = read_records(f)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    out = {"run_id": f.stem[len("run-"):], "config": {}, "history": {}, "summary": {}}
    for r in records:
        kind = r.WhichOneof("record_type")
        if kind == "config":
            for item in r.config.update:
                out["config"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "history":
            for item in r.history.item:
                out["history"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "summary":
            for item in r.summary.update:
                out["summary"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out
