"""ipi.extraction.activation_cache: the writer lock of a cache entry."""

from __future__ import annotations

import subprocess
import textwrap
import time

import pytest

from tests.conftest import (
    PY,
    REPO,
    _env,
)


def test_writer_lock_waits_for_a_live_holder_and_breaks_a_dead_ones(tmp_path, caplog):
    from ipi.extraction.activation_cache import ActivationCache

    entry = ActivationCache(tmp_path, "ab" * 32, {})
    holder = textwrap.dedent(f"""
        import sys, time
        from ipi.extraction.activation_cache import ActivationCache
        with ActivationCache({str(tmp_path)!r}, {"ab" * 32!r}, {{}}).writer_lock():
            print("held", flush=True)
            time.sleep(float(sys.argv[1]))
    """)
    # A live holder: the second writer waits, names it, then gets the lock once it is released.
    proc = subprocess.Popen([PY, "-c", holder, "2"], cwd=REPO, env=_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    assert entry.lock_holder().startswith(f"pid {proc.pid} on host ")
    with caplog.at_level("WARNING", logger="ipi.extraction.activation_cache"):
        with entry.writer_lock() as waited:
            assert waited > 1.0
    assert proc.wait(timeout=30) == 0
    assert f"being written by pid {proc.pid}" in caplog.text
    assert not entry.lock_path.exists()
    # A holder killed with SIGKILL (no cleanup ran): its lock file stays, and is broken at once.
    proc = subprocess.Popen([PY, "-c", holder, "600"], cwd=REPO, env=_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    proc.kill()
    proc.wait()
    assert entry.lock_path.exists()
    t0 = time.monotonic()
    with entry.writer_lock() as waited:
        assert waited < 5
    assert time.monotonic() - t0 < 5 and not entry.lock_path.exists()


@pytest.mark.slow  # the longest fast tests (54-95 s at load 4); run by `make test-all`
@pytest.mark.needs_shared
def test_cache_key_follows_the_processor_files_not_their_path(tmp_path, trajectories):
    """A copy of the processor files elsewhere keys the same entry; one changed byte keys another."""
    import shutil

    from omegaconf import open_dict

    from ipi.io import local_content_digest
    from ipi.extraction.rows import build_rows
    from ipi.extraction.forward import cache_key
    from tests.conftest import compose_train

    cfg = compose_train(tmp_path)
    src = cfg.backbone.tokenizer_path
    copy = shutil.copytree(src, tmp_path / "elsewhere" / "processor")
    moved = compose_train(tmp_path, [f"backbone.tokenizer_path={copy}"])
    assert moved.backbone.loader.processor_path == str(copy) != cfg.backbone.loader.processor_path
    rows = build_rows(trajectories[:1], "i_vis", ["c_scrambled"])
    key, spec = cache_key(cfg.backbone, rows, [0], ["last_prompt"])
    key_moved, spec_moved = cache_key(moved.backbone, rows, [0], ["last_prompt"])
    assert key_moved == key
    assert spec_moved["backbone"]["tokenizer_path"] == str(copy)  # the manifest keeps the path as given
    # Dot-files and __pycache__ are not content; a changed file is.
    (copy / ".DS_Store").write_bytes(b"x")
    assert cache_key(moved.backbone, rows, [0], ["last_prompt"])[0] == key
    cfg_json = copy / "preprocessor_config.json"
    cfg_json.write_text(cfg_json.read_text().replace("3136", "3137"))
    assert cache_key(moved.backbone, rows, [0], ["last_prompt"])[0] != key
    # Hub ids that are not local folders stay strings.
    hub = compose_train(tmp_path)
    with open_dict(hub):
        hub.backbone.tokenizer_path = "Qwen/Qwen2.5-VL-7B-Instruct"
        hub.backbone.loader.processor_path = "Qwen/Qwen2.5-VL-7B-Instruct"
    assert cache_key(hub.backbone, rows, [0], ["last_prompt"])[0] != key
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        local_content_digest(tmp_path / "missing")


def test_local_content_digest_small_files_by_bytes_large_files_by_location(tmp_path, monkeypatch):
    """Files up to WHOLE_FILE_BYTES enter by every byte; larger ones (weights) by path, size and mtime."""
    import os
    import shutil

    import ipi.io as cache

    monkeypatch.setattr(cache, "WHOLE_FILE_BYTES", 2 << 20)
    tick = iter(range(1, 100))

    def write(path, blob):  # a distinct mtime per write: the memo is keyed on (size, mtime)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
        os.utime(path, ns=(next(tick) * 10**9,) * 2)

    small = tmp_path / "a" / "s.bin"
    write(small, bytes(1 << 20))
    s0 = cache.local_content_digest(small.parent)
    write(small, bytes(512 << 10) + b"\1" + bytes((512 << 10) - 1))
    s1 = cache.local_content_digest(small.parent)
    assert s1 != s0  # one byte in the middle
    moved = shutil.copytree(small.parent, tmp_path / "b", copy_function=shutil.copy2)
    assert cache.local_content_digest(moved) == s1  # same bytes elsewhere
    big = tmp_path / "c" / "w.bin"
    write(big, bytes(3 << 20))
    b0 = cache.local_content_digest(big.parent)
    os.utime(big, ns=(10**12,) * 2)  # rewritten in place (same size): a new key
    assert cache.local_content_digest(big.parent) != b0
    other = shutil.copytree(big.parent, tmp_path / "d", copy_function=shutil.copy2)
    assert cache.local_content_digest(other) != cache.local_content_digest(big.parent)  # by location


def _entry_with_processor(tmp_path, processor_dir, spec_extra=None):
    """A one-shard cache entry whose backbone node names ``processor_dir`` (as ``cache_key`` builds it)."""
    import torch

    from ipi.extraction.activation_cache import ActivationCache, keyed_form, stable_hash

    def spec_for(path):
        return {"backbone": {"name": "tiny", "tokenizer_path": str(path),
                             "loader": {"processor_path": str(path), "seed": 0}},
                "layers": [0], "token_groups": ["task"], "dtype": "float32", **(spec_extra or {})}

    spec = spec_for(processor_dir)
    key = stable_hash({**keyed_form(spec), "rows": ["r0"]})
    entry = ActivationCache(tmp_path / "cache", key, spec)
    entry.write_shard("shard-r0-00000", {"features": torch.ones(1, 1, 1, 2), "collapse": torch.zeros(1, 1),
                                         "prompt_len": torch.tensor([3]), "seq_len": torch.tensor([3])}, ["r0"])
    entry.finalize(["r0"])
    return entry, spec_for


def test_manifest_check_compares_the_backbone_by_content_as_the_key_does(tmp_path):
    """Another checkout (another path string to the same files) or a moved processor folder hits the
    entry and passes the manifest check; a processor with other bytes, or an edited manifest, does not."""
    import json
    import os
    import shutil

    from ipi.extraction.activation_cache import ActivationCache, CacheError, keyed_form, stable_hash

    proc = tmp_path / "shared" / "models" / "processor"
    proc.mkdir(parents=True)
    (proc / "preprocessor_config.json").write_text('{"min_pixels": 3136}')
    (proc / "tokenizer.json").write_text('{"vocab": [1, 2, 3]}')
    entry, spec_for = _entry_with_processor(tmp_path, proc)
    key = entry.key

    def read(path):
        spec = spec_for(path)
        assert stable_hash({**keyed_form(spec), "rows": ["r0"]}) == key  # the same entry by its key
        return ActivationCache(tmp_path / "cache", key, spec).load(["r0"])

    # another checkout: `<checkout>/../shared/...` spells the same folder differently
    (tmp_path / "wt-other").mkdir()
    assert read(tmp_path / "wt-other" / ".." / "shared" / "models" / "processor").features.sum() == 2
    # a copy elsewhere, then the original moved away: the manifest's own path no longer exists
    copy = shutil.copytree(proc, tmp_path / "mnt" / "processor")
    moved = tmp_path / "moved" / "processor"
    shutil.move(str(proc), str(moved))
    assert read(copy).features.shape == (1, 1, 1, 2)
    assert read(moved).features.shape == (1, 1, 1, 2)
    # The check still fails where it should: another processor's bytes under the entry's key ...
    other = shutil.copytree(copy, tmp_path / "other" / "processor")
    (other / "tokenizer.json").write_text('{"vocab": [1, 2, 4]}')
    os.utime(other / "tokenizer.json", ns=(10**12,) * 2)
    with pytest.raises(CacheError, match="manifest field 'backbone' does not match this entry's key"):
        ActivationCache(tmp_path / "cache", key, spec_for(other)).read_manifest()
    # ... and an edited content record
    manifest = json.loads(entry.manifest_path.read_text())
    manifest["content"]["backbone"]["tokenizer_path"] = "sha256:" + "0" * 64
    entry.manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(CacheError, match="manifest field 'backbone' does not match"):
        ActivationCache(tmp_path / "cache", key, spec_for(copy)).read_manifest()


def test_manifest_without_content_record_is_read_through_its_paths(tmp_path):
    """An entry written before the manifest kept the content record (e.g. /work/cache's): its paths
    are digested where they exist, so another checkout hits it; where they are gone it is refused."""
    import json
    import shutil

    from ipi.extraction.activation_cache import ActivationCache, CacheError

    proc = tmp_path / "a" / "processor"
    proc.mkdir(parents=True)
    (proc / "tokenizer.json").write_text('{"vocab": [1]}')
    entry, spec_for = _entry_with_processor(tmp_path, proc)
    manifest = json.loads(entry.manifest_path.read_text())
    del manifest["content"]
    entry.manifest_path.write_text(json.dumps(manifest))
    copy = shutil.copytree(proc, tmp_path / "b" / "processor")
    assert ActivationCache(tmp_path / "cache", entry.key, spec_for(copy)).load(["r0"]).features.sum() == 2
    shutil.rmtree(proc)
    with pytest.raises(CacheError, match="manifest field 'backbone'"):
        ActivationCache(tmp_path / "cache", entry.key, spec_for(copy)).read_manifest()


@pytest.mark.needs_shared
def test_a_16_bit_forward_keys_its_own_entry_and_a_32_bit_one_keeps_the_key(tmp_path, trajectories, monkeypatch):
    """bf16 features differ from float32 ones beyond rounding: they must never be read for a 32-true run
    (nor the reverse); every 32-bit plugin keeps the key entries were written under."""
    import ipi.extraction.forward as fwd
    from ipi.extraction.rows import build_rows
    from ipi.run.settings import extract_settings
    from tests.conftest import compose_train

    monkeypatch.setattr(fwd, "cpu_supports_bf16", lambda: True)  # whatever CPU runs the test
    rows = build_rows(trajectories[:1], "i_vis", ["c_scrambled"])

    def key(precision):
        s = extract_settings(compose_train(tmp_path, [f"extract.precision={precision}", "extract.accelerator=cpu"]))
        return fwd.cache_key(s.backbone, rows, [0], ["last_prompt"], fwd.feature_precision(s))

    base = fwd.cache_key(extract_settings(compose_train(tmp_path)).backbone, rows, [0], ["last_prompt"])
    assert key("32-true") == base and key("32") == base and key("auto") == base  # auto on a CPU: 32-true
    k16, spec16 = key("bf16-mixed")
    assert k16 != base[0] and spec16["precision"] == "bf16-mixed" and "precision" not in base[1]
    assert key("bf16-true")[0] not in (base[0], k16)
