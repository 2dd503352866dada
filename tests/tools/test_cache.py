"""The cache CLI (python -m ipi.tools.cache): list, verify, prune, a closed pipe."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.conftest import (
    N_ROWS,
    PY,
    REPO,
    _cache_copy,
    _env,
)


def test_cache_list_into_a_closed_pipe_is_quiet(tmp_path):
    cache = tmp_path / "cache"
    for i in range(3000):  # more output than a pipe buffer holds, so `head` closes it mid-write
        (cache / f"{i:024x}").mkdir(parents=True)
    proc = subprocess.run(f"{PY} -m ipi.tools.cache --cache-dir {cache} list | head -2", shell=True, cwd=REPO,
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines()[0] == f"cache: {cache}"
    assert proc.stderr == "", proc.stderr

def _cli_cache(*args, subprocess_run: bool = False) -> subprocess.CompletedProcess:
    """``python -m ipi.tools.cache ARGS``: in a subprocess, or in-process (same ``main``) to save imports."""
    if subprocess_run:
        return subprocess.run([PY, "-m", "ipi.tools.cache", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=120, env=_env())
    import contextlib
    import io

    from ipi.tools.cache import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return subprocess.CompletedProcess(["ipi.tools.cache", *args], rc, out.getvalue(), err.getvalue())


@pytest.mark.needs_shared
def test_cache_cli_lists_and_prunes(tmp_path, reference):
    import shutil

    cache = tmp_path / "cache"
    good = _cache_copy(reference, cache)
    total = sum(p.stat().st_size for p in good.iterdir())
    # An interrupted extraction: shards, a leftover temporary file, no manifest.
    partial = cache / ("0" * 24)
    partial.mkdir()
    shutil.copy(next(good.glob("shard-*.safetensors")), partial / "shard-r0-00000.safetensors")
    (partial / ".shard-r0-00001.safetensors.abc.tmp").write_bytes(b"\0" * 10)
    # A stale entry: manifest written 10 days ago; and a folder that is not an entry.
    old = cache / ("f" * 24)
    shutil.copytree(good, old)
    m = json.loads((old / "manifest.json").read_text())
    m["key"] = "f" * 64
    (old / "manifest.json").write_text(json.dumps(m))
    ten_days = time.time() - 10 * 86400
    os.utime(old / "manifest.json", (ten_days, ten_days))
    (cache / "not-an-entry").mkdir()

    proc = _cli_cache("--cache-dir", str(cache), "list", "--verify", subprocess_run=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"cache: {cache}"
    assert lines[1].split() == ["key", "status", "rows", "bytes", "layers", "backbone", "created"]
    by_key = {ln.split()[0]: ln.split() for ln in lines[2:-1]}
    assert set(by_key) == {good.name, partial.name, old.name}
    assert by_key[good.name][1:3] == ["ok", str(N_ROWS)] and by_key[good.name][5:7] == ["0,1,2,3", "tiny_qwen2_5_vl"]
    assert by_key[partial.name][1:3] == ["incomplete", "-"]
    assert by_key[old.name][1] == "ok"
    assert lines[-1].startswith("3 entries, ")
    from ipi.tools.cache import scan

    sizes = {e.key: e.bytes for e in scan(cache)}
    assert sizes[good.name] == total and sizes[partial.name] == (
        sum(p.stat().st_size for p in partial.iterdir()))

    # prune needs a selector; --dry-run removes nothing.
    assert _cli_cache("--cache-dir", str(cache), "prune").returncode == 2
    proc = _cli_cache("--cache-dir", str(cache), "prune", "--incomplete", "--older-than", "7", "--dry-run")
    assert proc.stdout.splitlines()[-1].startswith("would remove 2 of 3 entries")
    assert partial.exists() and old.exists()
    proc = _cli_cache("--cache-dir", str(cache), "prune", "--incomplete", "--older-than", "7")
    assert proc.returncode == 0 and not partial.exists() and not old.exists() and good.exists()
    proc = _cli_cache("--cache-dir", str(cache), "prune", "--key", good.name[:8])
    out = proc.stdout.splitlines()
    assert len(out) == 2 and out[0].startswith(f"removed {good.name} (ok, ")
    assert out[1].startswith("removed 1 of 1 entries")
    assert not good.exists() and (cache / "not-an-entry").exists()
