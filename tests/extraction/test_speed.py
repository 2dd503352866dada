"""Speed-related defaults (issue 12): extraction workers, precision on a CPU, attention kernel."""

from __future__ import annotations

import pytest
import torch

from ipi.backbone import resolve_attn_implementation
from ipi.extraction import forward as xrun


def test_num_workers_auto_is_zero_on_cpu_and_feeds_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert xrun.resolve_num_workers("auto", "auto", cpu_count=16) == 0
    assert xrun.resolve_num_workers("auto", "cpu", cpu_count=16) == 0
    assert xrun.resolve_num_workers("auto", "gpu", cpu_count=16) == 8
    assert xrun.resolve_num_workers("auto", "gpu", cpu_count=4) == 3
    assert xrun.resolve_num_workers("auto", "gpu", cpu_count=1) == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert xrun.resolve_num_workers("auto", "auto", cpu_count=6) == 5
    assert xrun.resolve_num_workers(3, "cpu") == 3 and xrun.resolve_num_workers("2", "cpu") == 2
    for bad in (-1, "many", 1.5):
        with pytest.raises(ValueError, match="extract.num_workers"):
            xrun.resolve_num_workers(bad, "cpu")


def test_bf16_never_chosen_for_a_cpu_without_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert xrun.resolve_precision("auto", "auto") == "32-true"
    assert xrun.resolve_precision("auto", "cpu") == "32-true"
    monkeypatch.setattr(xrun, "cpu_supports_bf16", lambda: False)
    with pytest.raises(ValueError, match="no bf16 support"):
        xrun.resolve_precision("bf16-mixed", "cpu")
    assert xrun.resolve_precision("32-true", "cpu") == "32-true"
    monkeypatch.setattr(xrun, "cpu_supports_bf16", lambda: True)
    assert xrun.resolve_precision("bf16-mixed", "cpu") == "bf16-mixed"
    assert xrun.resolve_precision("auto", "cpu") == "32-true"  # auto never picks bf16 on a CPU


def test_attn_implementation_auto(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if n == "flash_attn" else real(n, *a))
    assert resolve_attn_implementation("auto", "bfloat16") == "flash_attention_2"
    assert resolve_attn_implementation("auto", "float32") == "sdpa"
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "flash_attn" else real(n, *a))
    assert resolve_attn_implementation("auto", "bfloat16") == "sdpa"
    assert resolve_attn_implementation("eager", "bfloat16") == "eager"
    assert resolve_attn_implementation(None) is None


@pytest.mark.slow
@pytest.mark.needs_shared
def test_bench_reports_both_speedups_with_exact_features(tmp_path):
    """The three ways on one step of every surface: the keys of issue 12, the project path's
    features equal to the TaskTracker-style ones (1e-5 relative), prefix reuse counted per surface."""
    from ipi.backbone import build_backbone
    from ipi.run.settings import extract_settings
    from ipi.tools.extraction_timing import speed_benchmark
    from ipi.run.stages import layer_indices
    from ipi.tools.bench import subset_rows
    from tests.conftest import SMALL_BACKBONE_OVERRIDES

    cfg, rows = subset_rows(list(SMALL_BACKBONE_OVERRIDES), 1)
    layers = layer_indices(cfg)
    by_surface = {s: [r for r in rows if r.variant.surface == s] for s in ("i_vis", "i_dom", "i_tool")}
    out = speed_benchmark(extract_settings(cfg), by_surface, layers, reps=1,
                          build_backbone=lambda: build_backbone(cfg.backbone.loader, with_lm_head=True),
                          build_ours=lambda: build_backbone(cfg.backbone.loader, max_layer=max(layers)))
    assert out["speedup"] > 0 and out["speedup_vs_elk_style"] > 0
    for s, res in out["per_surface"].items():
        assert res["speedup"] > 0 and res["speedup_vs_elk_style"] > 0
        assert res["ours"]["rel_feature_error"] <= 1e-5 and res["elk"]["rel_feature_error"] <= 1e-5, s
        assert res["prefix_reuse"]["step_groups_reused"] == res["prefix_reuse"]["step_groups"] == 1, s
        assert res["ours"]["tokens_per_row"] < res["elk"]["tokens_per_row"], s
