"""Several runs on one activation cache, and caches whose manifest does not match (ipi.extraction.activation_cache).

Runs on the synthetic corpus and reference run of ``tests/conftest.py``.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import (
    N_ROWS,
    PY,
    REPO,
    _base,
    _cache_copy,
    _cli,
    _env,
    compose_train,
)

# ------------------------------------------------------------------ several runs, one cache


@pytest.mark.needs_shared
def test_two_extract_runs_started_together_forward_each_row_once(tmp_path, syn_root):
    cache = tmp_path / "cache"
    procs = []
    for i in range(2):
        cmd = [PY, "extract.py", *_cli(_base(syn_root), tmp_path / f"run{i}", cache)]
        log = open(tmp_path / f"log{i}", "wb")
        procs.append((subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT), log))
    for p, log in procs:
        p.wait(timeout=600)
        log.close()
    logs = [(tmp_path / f"log{i}").read_text() for i in range(2)]
    assert [p.returncode for p, _ in procs] == [0, 0], logs
    infos = [json.loads((tmp_path / f"run{i}" / "run_info.json").read_text()) for i in range(2)]
    forwarded = sorted(i["rows_forwarded"] for i in infos)
    assert forwarded == [0, N_ROWS], forwarded  # every row once, between the two runs
    waiter = next(i for i in infos if i["rows_forwarded"] == 0)
    # The waiter read the writer's entry: it waited on the lock, or (on a loaded machine, started after
    # the writer had finished) found the entry complete; the lock itself is tested in
    # tests/extraction/test_cache.py::test_writer_lock_waits_for_a_live_holder_and_breaks_a_dead_ones
    assert waiter["extraction"]["cache_hit"] is True and waiter["extraction"]["lock_wait_s"] >= 0
    (entry,) = [p for p in cache.iterdir() if p.is_dir()]
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["n_rows"] == N_ROWS and manifest["duplicates_ignored"] == 0
    assert list(cache.glob("*.lock")) == []
    # the waiter says so once its first 0.5 s poll times out (writer_lock's); a waiter that
    # started late, as the writer was finishing, may get the lock within that first poll, silently.
    # A first poll that did not time out can still end at 0.5 s as recorded (seen at load 1:
    # lock_wait_s 0.5, no message); a wait of 1 s or more went through at least one timeout.
    if waiter["extraction"]["lock_wait_s"] >= 1.0:
        assert any("is being written by pid" in text for text in logs)
    assert not any("LeafSpec" in text or "Received SIGTERM" in text for text in logs)

# --------------------------------------------------------------------------- cache hygiene

@pytest.mark.needs_shared
@pytest.mark.parametrize("tamper", ["removed_shard", "extra_shard", "resized_shard", "edited_rows",
                                    "edited_layers", "manifest_not_json"])
def test_cache_whose_manifest_does_not_match_is_refused(tmp_path, syn_root, reference, one_thread,
                                                        monkeypatch, tamper):
    from ipi.run import tasks
    from ipi.extraction import forward as run_mod
    from ipi.extraction.activation_cache import CacheError
    from ipi.tools.cache import scan

    entry = _cache_copy(reference, tmp_path / "cache")
    shards = sorted(entry.glob("shard-*.safetensors"))
    manifest = json.loads((entry / "manifest.json").read_text())
    if tamper == "removed_shard":
        shards[3].unlink()
        match = r"shard shard-r0-00003\.safetensors missing or changed since the manifest"
    elif tamper == "extra_shard":
        (entry / "shard-r0-99999.safetensors").write_bytes(shards[0].read_bytes())
        match = "shards on disk do not match the manifest"
    elif tamper == "resized_shard":
        shards[0].write_bytes(shards[0].read_bytes() + b"\0")
        match = "missing or changed since the manifest"
    elif tamper == "edited_rows":
        manifest["n_rows"] -= 5
        match = f"manifest says {N_ROWS - 5} rows, its shards hold {N_ROWS}"
    elif tamper == "edited_layers":
        manifest["layers"] = [0, 1, 2, 2]
        match = "manifest field 'layers' does not match this entry's key"
    else:
        (entry / "manifest.json").write_text('{"key": ')
        match = "manifest .* unreadable"
    if tamper.startswith("edited"):
        (entry / "manifest.json").write_text(json.dumps(manifest))

    def no_backbone(*a, **k):
        raise AssertionError("the backbone was built: the tampered entry was treated as a miss")

    monkeypatch.setattr(run_mod, "instantiate", no_backbone)
    with pytest.raises(CacheError, match=match):
        tasks.extract(compose_train(tmp_path, _base(syn_root)))
    (found,) = scan(tmp_path / "cache")
    if tamper != "edited_layers":  # the CLI does not know the spec a run expects
        assert found.status.startswith("invalid: "), found.status
