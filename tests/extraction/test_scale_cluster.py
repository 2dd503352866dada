"""Extraction across processes: DDP on CPU (gloo), SIGKILL + resume, and a submitit_local sweep.

These start real ``train.py`` / ``extract.py`` processes and are marked slow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tests.conftest import REPO, SMALL_BACKBONE_OVERRIDES, compose_train

pytestmark = [pytest.mark.needs_shared, pytest.mark.slow]


def read_entry(root: Path) -> tuple[dict, dict[str, tuple[torch.Tensor, torch.Tensor, int]], int]:
    """The single cache entry under ``root``: manifest, row id -> (features, collapse, prompt_len), raw rows."""
    (entry,) = [p for p in root.iterdir() if p.is_dir()]
    manifest = json.loads((entry / "manifest.json").read_text())
    rows: dict = {}
    raw = 0
    for s in manifest["shards"]:
        with safe_open(str(entry / s["name"]), framework="pt") as f:
            ids = json.loads(f.metadata()["row_ids"])
            feats, coll, plen = f.get_tensor("features"), f.get_tensor("collapse"), f.get_tensor("prompt_len")
        raw += len(ids)
        for j, r in enumerate(ids):
            if r in rows:  # a DistributedSampler repeat: must be the same row, same numbers
                torch.testing.assert_close(rows[r][0], feats[j], rtol=0, atol=1e-6)
                continue
            rows[r] = (feats[j], coll[j], int(plen[j]))
    return manifest, rows, raw


def assert_same_entries(a: dict, b: dict, atol: float = 1e-6) -> None:
    assert sorted(a) == sorted(b)
    for r in a:
        torch.testing.assert_close(a[r][0], b[r][0], rtol=0, atol=atol)
        torch.testing.assert_close(a[r][1], b[r][1], rtol=0, atol=atol)
        assert a[r][2] == b[r][2]


def _env(cache: Path) -> dict:
    return {**os.environ, "IPI_CACHE_DIR": str(cache), "TOKENIZERS_PARALLELISM": "false"}


def test_ddp_two_processes_equal_one(tmp_path):
    """train.py with DDP extraction (2 CPU processes, gloo): same rows and features as 1 process.

    Two trajectories have 6 + 3 = 9 step groups, split 5 / 4 over the ranks (Lightning's
    predict sampler does not pad; a padding sampler's repeats would be counted in
    ``duplicates_ignored`` and loaded once: see tests/extraction/test_scale.py).
    """
    from ipi.run import tasks

    # DDP extraction covers one surface per launch (ipi.run.validation.validate): transfer off here.
    common = ["data.max_trajectories=2", "surface=i_vis", "evaluation.n_boot=50", "split.test_fraction=0.5",
              "split.min_per_side=1", "logger=none", "evaluation.transfer=false", "evaluation.random_twin=false"]
    one, _ = tasks.extract(compose_train(tmp_path / "one", common))
    proc = subprocess.run(
        [sys.executable, "train.py", *common, *SMALL_BACKBONE_OVERRIDES, "quiet=true",
         "extract.accelerator=cpu", "extract.devices=2", "extract.strategy=ddp",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, env=_env(tmp_path / "ddp" / "cache"), capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    m_ddp, ddp, raw = read_entry(tmp_path / "ddp" / "cache")
    m_one, single, _ = read_entry(tmp_path / "one" / "cache")
    assert m_ddp["key"] == m_one["key"] == one["cache_key"]
    assert sorted(s["name"][:9] for s in m_ddp["shards"]) == ["shard-r0-", "shard-r1-"]
    assert m_ddp["n_rows"] == len(ddp) == 45 and raw == 45 + m_ddp["duplicates_ignored"]
    assert sorted(s["rows"] for s in m_ddp["shards"]) == [20, 25]
    assert_same_entries(ddp, single)
    # Rank 0 evaluated on every row exactly once (45 rows: 9 steps x 5 variants).
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["counts"]["rows"] == 45
    scores = (tmp_path / "run" / "scores.csv").read_text().splitlines()
    assert len(scores) - 1 == results["counts"]["rows_test"]
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())["extraction"]
    assert info["rows_forwarded"] == 45 and info["cache_hit"] is False


def test_sigkill_mid_extraction_resumes_to_the_same_cache(tmp_path):
    """Kill -9 after the first shard; the same command forwards only the missing rows."""
    cmd = [sys.executable, "extract.py", "data.max_trajectories=2", "surface=i_dom", "evaluation.transfer=false",
           "evaluation.random_twin=false", "extract.shard_rows=4",
           *SMALL_BACKBONE_OVERRIDES, "quiet=true"]
    killed = tmp_path / "killed"
    entry_glob = "*/shard-*.safetensors"
    log = open(tmp_path / "killed.log", "w")
    proc = subprocess.Popen([*cmd, f"hydra.run.dir={tmp_path / 'r1'}"], cwd=REPO, env=_env(killed),
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while not list(killed.glob(entry_glob)):
        assert proc.poll() is None, f"extract.py ended before writing a shard: {(tmp_path / 'killed.log').read_text()[-2000:]}"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # Lightning handles SIGTERM; SIGKILL cannot be caught
    proc.wait()
    log.close()
    (entry,) = [p for p in killed.iterdir() if p.is_dir()]
    assert not (entry / "manifest.json").exists()
    before = {p.name: p.stat().st_mtime_ns for p in entry.glob("shard-*.safetensors")}
    total = 9 * 4  # 9 steps x (clean, attack, c_scrambled, c_imperative)
    assert 0 < sum(1 for _ in before) and len(before) * 4 < total

    resumed = subprocess.run([*cmd, f"hydra.run.dir={tmp_path / 'r2'}"], cwd=REPO, env=_env(killed),
                             capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    done = sum(1 for _ in before) * 4  # every shard before the kill held 4 rows (one step group)
    assert (f"extraction (tiny_qwen2_5_vl): {total - done} rows to forward ({done} already in finished shards)"
            in resumed.stdout + resumed.stderr)
    # Finished shards were kept as they were.
    assert all((entry / n).stat().st_mtime_ns == t for n, t in before.items())

    clean = tmp_path / "clean"
    full = subprocess.run([*cmd, f"hydra.run.dir={tmp_path / 'r3'}"], cwd=REPO, env=_env(clean),
                          capture_output=True, text=True, timeout=900)
    assert full.returncode == 0, full.stderr[-3000:]
    m_k, rows_k, raw_k = read_entry(killed)
    m_c, rows_c, _ = read_entry(clean)
    assert m_k["key"] == m_c["key"] and m_k["n_rows"] == m_c["n_rows"] == total == raw_k
    for field in ("versions", "dtype", "layers", "token_groups", "n_rows", "key", "extraction_version"):
        assert m_k[field] == m_c[field], field
    assert_same_entries(rows_k, rows_c, atol=0.0)


def test_submitit_local_sweep_of_two_jobs(tmp_path):
    """`hydra/launcher=local` (submitit's local executor) runs a 2-job sweep off one extraction."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from ipi.run import tasks

    common = ["data.max_trajectories=2", "evaluation.n_boot=50", "split.test_fraction=0.5", "split.min_per_side=1",
              "logger=none", "evaluation.random_twin=false"]
    cfg = compose_train(tmp_path, common)
    info, _ = tasks.extract(cfg)  # extraction before the sweep (may use DDP); jobs only read
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, "train.py", "-m", "hydra/launcher=local", "token_group=task,action", *common,
         *SMALL_BACKBONE_OVERRIDES, "quiet=true", f"hydra.sweep.dir={sweep}"],
        cwd=REPO, env=_env(tmp_path / "cache"), capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert len(jobs) == 2
    assert (sweep / ".submitit").is_dir()  # really went through submitit
    groups = []
    for job in jobs:
        ri = json.loads((job / "run_info.json").read_text())["extraction"]
        assert ri["rows_forwarded"] == 0 and ri["cache_key"] == info["cache_key"]
        groups.append(json.loads((job / "results.json").read_text())["run"]["token_groups"])
    assert groups == [["task"], ["action"]]
