"""Shared fixtures: the ../shared folder, the real Qwen2.5-VL processor, a very small backbone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("IPI_SHARED", REPO.parent / "shared"))
PROCESSOR = SHARED / "models" / "qwen2_5_vl_processor"
WEBVOYAGER = SHARED / "data" / "webvoyager"

# A smaller tiny backbone than the default, for fast tests (real class, real processor).
SMALL_BACKBONE_OVERRIDES = [
    "backbone.n_layers=4",
    "backbone.loader.text.num_hidden_layers=4",
    "backbone.loader.vision.depth=1",
    "backbone.loader.vision.fullatt_block_indexes=[0]",
    "backbone.image_size.longest_edge=50176",
]


def pytest_collection_modifyitems(config, items):
    if PROCESSOR.exists() and WEBVOYAGER.exists():
        return
    skip = pytest.mark.skip(reason=f"shared material not found at {SHARED} (set IPI_SHARED)")
    for item in items:
        if "needs_shared" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def processor():
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(PROCESSOR))


@pytest.fixture(scope="session")
def small_backbone():
    from ipi.backbone import build_tiny_qwen2_5_vl

    return build_tiny_qwen2_5_vl(
        str(PROCESSOR),
        text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}),
        vision=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                    fullatt_block_indexes=[0]),
        image_size={"shortest_edge": 3136, "longest_edge": 50176},
    )


@pytest.fixture(scope="session")
def trajectories():
    from ipi.data.webvoyager import import_webvoyager

    return import_webvoyager(WEBVOYAGER)


def compose_train(tmp_path: Path, overrides: list[str] = (), small: bool = True):
    """Compose the real ``train`` config with outputs and cache under ``tmp_path``.

    The random-weight twin (a second extraction) is off unless an override sets
    ``evaluation.random_twin``: tests that check the twin turn it on.
    """
    from hydra import compose, initialize_config_dir

    from ipi.run.schemas import register_configs

    register_configs()
    ov = [
        f"paths.output_dir={tmp_path / 'run'}",
        f"extract.cache_dir={tmp_path / 'cache'}",
        "quiet=true",
        *(SMALL_BACKBONE_OVERRIDES if small else []),
        *([] if any(o.startswith("evaluation.random_twin=") for o in overrides) else ["evaluation.random_twin=false"]),
        *overrides,
    ]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="train", overrides=ov)


# --------------------------------------------- the synthetic corpus and reference run of the e2e tests
# Ten 2-step WebVoyager task folders with small screenshots, built under ``tmp_path``, the small
# tiny backbone above and one torch thread (``OMP_NUM_THREADS=1``: on a shared 2-core machine two
# intra-op threads are far slower, and a fixed thread count keeps float reductions identical
# between processes).

PY = sys.executable
ACTIONS = ["Type [1]; cats", "ANSWER; done"]
N_TRAJ = 10
N_ROWS = N_TRAJ * 2 * 5  # trajectories x steps x variants (clean, attack, 3 controls on i_vis)


def _env(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "7",
            "PYTHONPATH": str(REPO), **extra}


def _base(root: Path, n_boot: int = 200) -> list[str]:
    return [f"data.root={root}", f"evaluation.n_boot={n_boot}", "logger=none", "extract.shard_rows=5",
            "split.test_fraction=0.5", "evaluation.transfer=false", "evaluation.random_twin=false"]


def _cli(overrides: list[str], run: Path, cache: Path) -> list[str]:
    return [*overrides, *SMALL_BACKBONE_OVERRIDES, "quiet=true", f"hydra.run.dir={run}",
            f"extract.cache_dir={cache}"]


def _wait_for(cond, proc: subprocess.Popen, what: str, timeout: float = 300.0) -> None:
    t0 = time.monotonic()
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"process ended (rc={proc.returncode}) before {what}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def one_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def syn_root(tmp_path_factory) -> Path:
    from tests.e2e.test_bad_inputs import messages, task_folder

    root = tmp_path_factory.mktemp("syn")
    for i in range(N_TRAJ):
        task_folder(root / f"t{i}", messages(ACTIONS, task=f"Find thing {i}."), {1: None, 2: None},
                    seed=i + 1)
    return root


@pytest.fixture(scope="session")
def reference(tmp_path_factory, syn_root) -> Path:
    """An uninterrupted in-process run, on one torch thread: ``<dir>/run/results.json`` and a warm ``<dir>/cache``.

    Shared by every test module that compares against it (tests/e2e/, tests/tools/test_cache.py);
    tests add cache entries beside its own (another split gives other rows), never change it.
    """
    import torch

    from ipi.run.tasks import train

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        d = tmp_path_factory.mktemp("reference")
        train(compose_train(d, _base(syn_root)))
    finally:
        torch.set_num_threads(n)
    return d


def _cache_copy(reference: Path, dst: Path) -> Path:
    """Copy the reference run's cache entry (only that one) into ``dst``; return the copy.

    Other tests add entries beside it in the (shared) reference cache (another split gives
    other held-out wording, hence other rows), so the entry is picked by the run's cache key.
    """
    import shutil

    key = json.loads((reference / "run" / "results.json").read_text())["run"]["cache_key"]
    (src,) = [p for p in (reference / "cache").iterdir() if p.is_dir() and key.startswith(p.name)]
    dst.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree(src, dst / src.name))


def run_verdict(results, **settings) -> dict:
    """The verdict of ``results`` as results.json writes it: :func:`ipi.evaluation.verdict.judge` with
    :class:`ipi.evaluation.results.Settings` built from ``settings`` (the production path)."""
    from ipi.evaluation.results import Settings
    from ipi.evaluation.verdict import judge

    return judge(results, Settings(**settings)).to_dict()


def check_of(verdict: dict, cid: int) -> dict:
    """Check ``cid`` of a verdict dict (checks are numbered 0–6, PROTOCOL.md §7)."""
    return next(c for c in verdict["checks"] if c["id"] == cid)


# ------------------------------------------------- library objects at the schema's defaults


def probe_config(**overrides):
    """The probe's settings as a run builds them from the ``probe.*`` schema defaults
    (:func:`ipi.run.settings.probe_settings`), with ``overrides``."""
    import dataclasses

    from omegaconf import OmegaConf

    from ipi.run.schemas import ProbeConf
    from ipi.run.settings import probe_settings

    return dataclasses.replace(probe_settings(OmegaConf.structured(ProbeConf), 0)[0], **overrides)


def logistic_detector(**overrides):
    """The logistic probe detector with the ``probe.*`` schema defaults, then ``overrides``."""
    from ipi.detectors import LogisticDetector

    p = probe_config()
    return LogisticDetector(**{"l2": p.l2, "max_iter": p.max_iter, "tol": p.tol, "solver": p.solver, **overrides})


def mlp_detector(**overrides):
    """The MLP detector at the ``detector=mlp`` schema defaults, then ``overrides``."""
    import dataclasses

    from ipi.detectors import MLPDetector
    from ipi.run.schemas import MLPDetectorConf

    defaults = {f.name: f.default for f in dataclasses.fields(MLPDetectorConf) if f.name != "_target_"}
    return MLPDetector(**{**defaults, **overrides})
