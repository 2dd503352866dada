"""Shared fixtures: the ../shared folder, the real Qwen2.5-VL processor, a very small backbone."""

from __future__ import annotations

import os
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

    from ipi.config import register_configs

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
