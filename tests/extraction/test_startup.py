"""Start-up: the extraction builds no LM head and no decoder blocks above the deepest one it reads,
loads the processor once, and its features (main backbone and random twins) stay bit-identical."""

from __future__ import annotations

import pytest
import torch

from ipi.backbone import (
    build_backbone,
    build_pretrained_qwen2_5_vl,
    build_tiny_qwen2_5_vl,
    load_processor,
    random_init_from_config,
)
from ipi.extraction.datamodule import StepGroupDataset, collate_steps
from ipi.extraction.extractor import HiddenStateExtractor
from ipi.extraction.rows import build_rows
from ipi.protocol import DEFAULT_SYSTEM_PROMPT, TOKEN_GROUPS
from tests.conftest import PROCESSOR, compose_train

pytestmark = pytest.mark.needs_shared

TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]})
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
              fullatt_block_indexes=[0])
SIZE = {"shortest_edge": 3136, "longest_edge": 50176}


def _tiny(**kw):
    return build_tiny_qwen2_5_vl(str(PROCESSOR), text=TEXT, vision=VISION, image_size=SIZE, **kw)


def _features(bb, trajectories, layers):
    tok = bb.tokenizer
    count = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])
    rows = [r for r in build_rows(trajectories[:1], "i_dom", ["c_scrambled"], count_tokens=count) if r.step.step
            == trajectories[0].steps[0].step]
    ds = StepGroupDataset(rows, bb.processor, DEFAULT_SYSTEM_PROMPT, True, bb.image_size, bb.image_token_id)
    ext = HiddenStateExtractor(bb, layers, list(TOKEN_GROUPS), prefix_reuse="false")
    ext.on_predict_start()
    try:
        with torch.inference_mode():
            return ext.predict_step(collate_steps([ds[0]], pad_token_id=0))
    finally:
        ext.on_predict_end()


def test_headless_model_has_the_weights_of_the_full_model():
    """Qwen2_5_VLModel under the same seed = ForConditionalGeneration.model, bit for bit (main and twin)."""
    for kw in ({}, {"random_init_seed": 5}):
        full = _tiny(with_lm_head=True, **kw).model
        head_less = _tiny(**kw).model
        assert hasattr(full, "lm_head") and not hasattr(head_less, "lm_head")
        a, b = full.model.state_dict(), head_less.state_dict()
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_upper_blocks_are_not_kept_and_features_are_bit_identical(trajectories):
    """max_layer=2 of 4 blocks, no head: layers 0 and 2 equal those of the full model exactly.

    The random twin (other seed) too: its kept weights come from the same random stream, so its
    cached features stay valid (the cache key, from the loader node, does not change).
    """
    for kw in ({}, {"random_init_seed": 5}):
        full = _tiny(with_lm_head=True, **kw)
        short = _tiny(max_layer=2, **kw)
        assert (short.n_layers, len(short.layers), full.n_layers) == (4, 3, 4)
        assert len(short.model.language_model.layers) == 3
        assert sum(p.numel() for p in short.model.parameters()) < sum(p.numel() for p in full.model.parameters())
        a, b = _features(full, trajectories, [0, 2]), _features(short, trajectories, [0, 2])
        assert torch.equal(a["features"], b["features"]) and torch.equal(a["collapse"], b["collapse"])


def test_build_backbone_passes_max_layer_and_head_only_to_builders_that_take_them(tmp_path):
    cfg = compose_train(tmp_path)
    bb = build_backbone(cfg.backbone.loader, max_layer=1)
    assert (bb.n_layers, len(bb.layers), hasattr(bb.model, "lm_head")) == (cfg.backbone.n_layers, 2, False)
    assert hasattr(build_backbone(cfg.backbone.loader, with_lm_head=True).model, "lm_head")
    assert build_backbone(cfg.backbone.loader).n_layers == len(build_backbone(cfg.backbone.loader).layers)
    with pytest.raises(Exception, match="max_layer=9 is outside"):  # hydra wraps the ValueError
        build_backbone(cfg.backbone.loader, max_layer=9)


def test_processor_is_loaded_once_per_process():
    assert load_processor(str(PROCESSOR)) is load_processor(str(PROCESSOR))
    assert _tiny().processor is _tiny(random_init_seed=3).processor


def test_pretrained_loader_reads_neither_head_nor_upper_blocks(tmp_path, trajectories):
    """A saved checkpoint loaded headless with max_layer: the same features as the full model; its twin
    (initialised with all blocks, then shortened) has the weights of the old full-model twin."""
    from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration

    full = _tiny(with_lm_head=True)
    full.model.save_pretrained(tmp_path / "ckpt")
    kw = dict(processor_path=str(PROCESSOR), dtype="float32", image_size=SIZE, device_map=None,
              attn_implementation="sdpa", local_files_only=True)
    short = build_pretrained_qwen2_5_vl(str(tmp_path / "ckpt"), max_layer=1, **kw)
    assert not hasattr(short.model, "lm_head") and (short.n_layers, len(short.layers)) == (4, 2)
    a, b = _features(full, trajectories, [0, 1]), _features(short, trajectories, [0, 1])
    assert torch.equal(a["features"], b["features"])
    twin = build_pretrained_qwen2_5_vl(str(tmp_path / "ckpt"), max_layer=1, random_init_seed=3, **kw)
    config = AutoConfig.from_pretrained(tmp_path / "ckpt", attn_implementation="sdpa")
    old = random_init_from_config(Qwen2_5_VLForConditionalGeneration, config, 3, dtype=torch.float32).model
    new, ref = twin.model.state_dict(), old.state_dict()
    assert len(new) < len(ref) and all(torch.equal(new[k], ref[k]) for k in new)


def test_extraction_frees_the_model_it_built_without_the_cycle_collector(tmp_path, trajectories, monkeypatch):
    """The backbone built for an extraction is freed when ``extract_features`` returns, by reference
    counting alone (the collector is off), so the random twin's build never holds two models; a
    caller's own backbone is left usable."""
    import gc
    import weakref

    from ipi.extraction import forward as run
    from ipi.run.settings import extract_settings
    from ipi.run.stages import layer_indices

    cfg = compose_train(tmp_path)
    count = lambda s: len(load_processor(str(PROCESSOR)).tokenizer(s, add_special_tokens=False)["input_ids"])
    rows = [r for r in build_rows(trajectories[:1], "i_tool", ["c_scrambled"], count_tokens=count)
            if r.step.step == trajectories[0].steps[0].step]
    built = []

    def instantiate(*a, **k):
        bb = run.instantiate.__wrapped__(*a, **k)
        built.append((weakref.ref(bb.model), [weakref.ref(m) for m in bb.layers]))
        return bb

    instantiate.__wrapped__ = run.instantiate
    monkeypatch.setattr(run, "instantiate", instantiate)
    enabled = gc.isenabled()
    gc.disable()
    try:
        fs, info = run.extract_features(extract_settings(cfg), rows, layer_indices(cfg), list(TOKEN_GROUPS))
        assert info["rows_forwarded"] == len(rows) and len(built) == 1
        model, layers = built[0]
        assert model() is None and all(m() is None for m in layers)
        # A backbone handed in stays the caller's and still extracts the same features.
        mine = build_backbone(cfg.backbone.loader, max_layer=max(info["layers"]))
        cfg.extract.force = True
        again, _ = run.extract_features(extract_settings(cfg), rows, layer_indices(cfg), list(TOKEN_GROUPS), backbone=mine)
        assert mine.model is not None and len(mine.layers) == max(info["layers"]) + 1
        assert torch.equal(fs.features, again.features)
    finally:
        if enabled:
            gc.enable()
