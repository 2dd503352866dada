"""Extraction at scale: shared vision encodings, batched step groups vs the naive full forward,
M-RoPE positions, quantisation config, and a layer × token-group sweep with zero forward passes."""

from __future__ import annotations

import json

import pytest
import torch

from ipi.extraction.datamodule import ReplayDataset, StepGroupDataset, collate_rows, collate_steps
from ipi.extraction.extractor import (
    HiddenStateExtractor,
    base_model,
    collapse_statistic,
    pool_groups,
)
from ipi.extraction.rows import build_rows
from ipi.protocol import CONTROLS_BY_SURFACE, DEFAULT_SYSTEM_PROMPT, TOKEN_GROUPS
from ipi.replay import tokenise
from tests.conftest import compose_train

pytestmark = pytest.mark.needs_shared

CONTROLS = {surface: list(controls) for surface, controls in CONTROLS_BY_SURFACE.items()}


def _rows(backbone, trajectories, surface, n_steps=1, traj=0):
    tok = backbone.tokenizer
    count = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])
    rows = build_rows([trajectories[traj]], surface, CONTROLS[surface], count_tokens=count)
    steps = sorted({r.step.step for r in rows})[:n_steps]
    return [r for r in rows if r.step.step in steps]


def _args(bb):
    return (bb.processor, DEFAULT_SYSTEM_PROMPT, True, bb.image_size, bb.image_token_id)


def test_shared_image_tokenisation_equals_the_processor_call(small_backbone, trajectories):
    """Tokenising against a once-processed image gives the processor's own ids, pixels and groups."""
    bb = small_backbone
    for surface in ("i_dom", "i_vis"):
        row = _rows(bb, trajectories, surface)[1]
        parts = row.parts(DEFAULT_SYSTEM_PROMPT, True)
        image = row.variant.image(row.step)
        ref = tokenise(bb.processor, parts, image, image_size=bb.image_size, image_token_id=bb.image_token_id)
        pre = bb.processor.image_processor(images=[image], return_tensors="pt", size=bb.image_size)
        got = tokenise(bb.processor, parts, None, image_size=bb.image_size, image_token_id=bb.image_token_id,
                       image_inputs={"pixel_values": pre["pixel_values"], "image_grid_thw": pre["image_grid_thw"]})
        for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw", "mm_token_type_ids"):
            assert torch.equal(got.inputs[k], ref.inputs[k]), k
        assert got.prompt_len == ref.prompt_len and got.seq_len == ref.seq_len
        for g in TOKEN_GROUPS:
            assert torch.equal(got.groups[g], ref.groups[g]), g
        # The processor marks exactly the image tokens as modality 1 (what M-RoPE reads).
        assert int(ref.inputs["mm_token_type_ids"].sum()) == ref.groups["image"].numel() > 0


def _naive(bb, tok, layers):
    """Full ForConditionalGeneration forward, output_hidden_states, final norm as identity."""
    from ipi.tools.extraction_timing import _identity_final_norm

    with torch.inference_mode(), _identity_final_norm(bb.model):
        hs = bb.model(**tok.inputs, output_hidden_states=True).hidden_states
    feats = torch.stack([pool_groups(hs[k + 1][0], tok.groups, TOKEN_GROUPS) for k in layers])
    coll = torch.stack([collapse_statistic(hs[k + 1][0][: tok.prompt_len]) for k in layers])
    return feats, coll


@pytest.mark.parametrize("surface", ["i_vis", "i_dom", "i_tool"])
def test_step_groups_equal_the_naive_full_forward(small_backbone, trajectories, surface):
    """Shared vision encodings + batched (padded) variants + hooks == full forward, all layers.

    Tolerance: 1e-6 absolute on features whose magnitude is ~0.1 (fp32 on CPU; the differences
    come from batched matmul shapes and the padded attention mask).
    """
    bb = small_backbone
    rows = _rows(bb, trajectories, surface, n_steps=2)
    layers = list(range(bb.n_layers))  # includes the last block (pre-norm, as the project defines it)
    ds = StepGroupDataset(rows, *_args(bb))
    assert [len(g) for g in ds.groups] == [len(CONTROLS[surface]) + 2] * 2
    ext = HiddenStateExtractor(bb, layers, list(TOKEN_GROUPS), max_rows=3)  # chunks of 3: padding + reuse
    ext.on_predict_start()
    try:
        with torch.inference_mode():
            out = [ext.predict_step(collate_steps([ds[0], ds[1]], pad_token_id=0))]
    finally:
        ext.on_predict_end()
    feats = torch.cat([o["features"] for o in out])
    coll = torch.cat([o["collapse"] for o in out])
    assert out[0]["row_ids"] == [r.row_id for r in rows]
    ref = ReplayDataset(rows, *_args(bb))
    for i in range(len(rows)):
        f, c = _naive(bb, ref[i]["tok"], layers)
        torch.testing.assert_close(feats[i], f, rtol=0, atol=1e-6)
        torch.testing.assert_close(coll[i], c, rtol=0, atol=1e-6)


def test_step_group_decodes_each_screenshot_once_and_renders_the_template_once(small_backbone, trajectories,
                                                                                monkeypatch):
    """A step group decodes its screenshot once (not once per variant) and the placeholder chat
    template is rendered once for all rows; the tokens equal the processor's own per-row call."""
    import ipi.data.images as images
    from ipi import replay

    bb = small_backbone
    rows = _rows(bb, trajectories, "i_vis", n_steps=2)
    decodes, renders = [], []
    real_load, real_template = images.load_rgb, bb.processor.apply_chat_template
    monkeypatch.setattr(images, "load_rgb", lambda path, step=None: decodes.append(path) or real_load(path, step))
    monkeypatch.setattr(bb.processor, "apply_chat_template",
                        lambda *a, **k: renders.append(1) or real_template(*a, **k))
    replay._TEMPLATES.clear()
    ds = StepGroupDataset(rows, *_args(bb))
    groups = [ds[0], ds[1]]
    assert len(decodes) == 2 and len(set(decodes)) == 2  # one decode per step, 5 variants each
    assert len(renders) == 1  # one placeholder rendering for all 10 rows
    monkeypatch.setattr(images, "load_rgb", real_load)
    ref = ReplayDataset(rows, *_args(bb))
    items = [it for g in groups for it in g["items"]]
    for i, it in enumerate(items):
        torch.testing.assert_close(it["tok"].inputs["input_ids"], ref[i]["tok"].inputs["input_ids"], rtol=0, atol=0)


def test_step_group_tokenises_shared_stretches_once_with_the_processors_ids(small_backbone, trajectories,
                                                                             monkeypatch):
    """The variants of a step differ in one text stretch: the others (system, task and history,
    gold turn) go through the tokenizer once per step group; every row's ids still equal the
    processor's own call on the rendered prompt (which expands the image placeholder itself)."""
    from ipi import replay

    bb = small_backbone
    encoded: list[str] = []  # texts that went through the tokenizer (memo misses)
    real = replay.plain_encode

    def counting(tok, text, memo=None):
        if memo is None:
            encoded.append(text)
        return real(tok, text, memo)

    for surface in ("i_dom", "i_tool"):
        rows = _rows(bb, trajectories, surface, n_steps=1)
        encoded.clear()
        monkeypatch.setattr(replay, "plain_encode", counting)
        group = StepGroupDataset(rows, *_args(bb))[0]
        monkeypatch.setattr(replay, "plain_encode", real)
        assert len(encoded) == len(set(encoded))  # no stretch tokenised twice
        per_row = len(encoded) - (len(rows) - 1)  # stretches of one row: all shared but one
        assert per_row >= 4 and len(encoded) == per_row + len(rows) - 1
        for row, it in zip(rows, group["items"]):
            text = replay.render_prompt(bb.processor, row.parts(DEFAULT_SYSTEM_PROMPT, True)).text
            ref = bb.processor(text=[text], images=[row.variant.image(row.step)], images_kwargs={"size": bb.image_size},
                               return_tensors="pt")
            assert torch.equal(it["tok"].inputs["input_ids"], ref["input_ids"]), row.row_id


def test_image_tokens_get_3d_positions(small_backbone, trajectories):
    """Without mm_token_type_ids the model would give image tokens 1-D positions: features differ."""
    bb = small_backbone
    tok = ReplayDataset(_rows(bb, trajectories, "i_vis")[:1], *_args(bb))[0]["tok"]
    f3d, _ = _naive(bb, tok, [bb.n_layers - 1])
    inputs = {k: v for k, v in tok.inputs.items() if k != "mm_token_type_ids"}
    tok1d = type(tok)(inputs=inputs, groups=tok.groups, prompt_len=tok.prompt_len, seq_len=tok.seq_len)
    f1d, _ = _naive(bb, tok1d, [bb.n_layers - 1])
    # Text tokens before the image share positions in both; pooled image/action tokens do not.
    assert (f3d - f1d).abs().max() > 1e-4


def test_vision_tower_runs_once_per_distinct_screenshot(small_backbone, trajectories):
    bb = small_backbone
    calls = []
    hnd = base_model(bb.model).visual.register_forward_hook(
        lambda m, args, kw, out: calls.append(int(kw.get("grid_thw", args[1] if len(args) > 1 else None).shape[0])),
        with_kwargs=True)
    ext = HiddenStateExtractor(bb, [0], list(TOKEN_GROUPS), max_rows=2)
    ext.on_predict_start()
    try:
        with torch.inference_mode():
            for surface, n_images in (("i_dom", 1), ("i_tool", 1), ("i_vis", 5)):
                calls.clear()
                ds = StepGroupDataset(_rows(bb, trajectories, surface), *_args(bb))
                ext.predict_step(collate_steps([ds[0]], 0))
                # one vision pass per step, over the step's distinct screenshots only
                assert calls == [n_images], (surface, calls)
    finally:
        ext.on_predict_end()
        hnd.remove()


def test_collate_rows_batch_equals_step_batch(small_backbone, trajectories):
    """The row path (processor per row, pixel values per row) and the step path agree."""
    bb = small_backbone
    rows = _rows(bb, trajectories, "i_tool")
    ext = HiddenStateExtractor(bb, [1, 3], list(TOKEN_GROUPS))
    ext.on_predict_start()
    try:
        with torch.inference_mode():
            a = ext.predict_step(collate_steps([StepGroupDataset(rows, *_args(bb))[0]], 0))["features"]
            rd = ReplayDataset(rows, *_args(bb))
            b = ext.predict_step(collate_rows([rd[i] for i in range(len(rows))], 0))["features"]
    finally:
        ext.on_predict_end()
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


# --- quantised backbones --------------------------------------------------------------------------

def test_quantization_config_objects():
    from transformers import BitsAndBytesConfig

    from ipi.backbone import quantization_config

    assert quantization_config("none") is None
    q8 = quantization_config("int8")
    assert isinstance(q8, BitsAndBytesConfig) and q8.load_in_8bit and not q8.load_in_4bit
    q4 = quantization_config("nf4", compute_dtype="bfloat16")
    assert q4.load_in_4bit and q4.bnb_4bit_quant_type == "nf4" and q4.bnb_4bit_compute_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="allowed: none, int8, nf4"):
        quantization_config("int4")


def test_quantization_through_the_config(tmp_path, monkeypatch):
    """backbone.quantization reaches from_pretrained with device_map; typos fail at composition."""
    import transformers
    from hydra.errors import ConfigCompositionException
    from hydra.utils import instantiate

    cfg = compose_train(tmp_path, ["backbone=qwen2_5_vl_7b", "backbone.quantization=nf4"], small=False)
    assert getattr(cfg.backbone.loader.quantization, "value", cfg.backbone.loader.quantization) == "nf4"
    seen = {}

    class FakeModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Module()
            self.model.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(28)])
            self.config = transformers.Qwen2_5_VLConfig()
            self.is_quantized = True

    def fake_from_pretrained(model_id, **kw):
        seen.update(kw, model_id=model_id)
        return FakeModel()

    class FakeProcessor:
        tokenizer = type("T", (), {"convert_tokens_to_ids": staticmethod(lambda t: 7)})()

    from ipi.backbone import _pretrained

    monkeypatch.setattr(transformers.Qwen2_5_VLForConditionalGeneration, "from_pretrained", fake_from_pretrained)
    monkeypatch.setattr(transformers.Qwen2_5_VLModel, "from_pretrained", fake_from_pretrained)  # no LM head
    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", lambda *a, **k: FakeProcessor())
    _pretrained.cache_clear()  # load_processor caches per process: not the fake one beyond this test
    bb = instantiate(cfg.backbone.loader)
    q = seen["quantization_config"]
    assert q.load_in_4bit and q.bnb_4bit_quant_type == "nf4"
    assert seen["device_map"] == "auto" and seen["model_id"] == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert bb.identity["quantization"] == "nf4"
    # The extractor leaves a quantised model out of Lightning's placement: .to() does not reach it.
    ext = HiddenStateExtractor(bb, [0], ["last_prompt"])
    assert ext.model is bb.model and not any(p is bb.model for p in ext.children())
    ext.to(torch.float64)
    assert bb.model.model.layers[0].weight.dtype == torch.float32
    # Under DDP each rank loads onto its own GPU.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    instantiate(cfg.backbone.loader)
    assert seen["device_map"] == {"": 1}

    with pytest.raises(ConfigCompositionException):
        compose_train(tmp_path, ["backbone=qwen2_5_vl_7b", "backbone.quantization=int4"], small=False)
    with pytest.raises(Exception, match="quantization=int8 needs a pretrained checkpoint"):
        instantiate(compose_train(tmp_path, ["backbone.quantization=int8"]).backbone.loader)
    _pretrained.cache_clear()


def _has_bnb_gpu() -> bool:
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not _has_bnb_gpu(), reason="bitsandbytes quantisation needs a CUDA GPU and `pip install .[quant]`")
@pytest.mark.parametrize("quantization", ["int8", "nf4"])
def test_quantised_backbone_extracts_on_gpu(tmp_path, small_backbone, trajectories, quantization):
    """Save the small model, reload it quantised in place, extract; features close to fp32."""
    from ipi.backbone import build_pretrained_qwen2_5_vl
    from tests.conftest import PROCESSOR

    small_backbone.model.save_pretrained(tmp_path / "ckpt")
    bb = build_pretrained_qwen2_5_vl(str(tmp_path / "ckpt"), processor_path=str(PROCESSOR), dtype="bfloat16",
                                     image_size=small_backbone.image_size, device_map=None,
                                     local_files_only=True, quantization=quantization)
    assert next(bb.model.parameters()).device.type == "cuda"
    rows = _rows(small_backbone, trajectories, "i_dom")
    ext = HiddenStateExtractor(bb, [0, 3], list(TOKEN_GROUPS))
    ext.on_predict_start()
    try:
        from lightning.fabric.utilities.apply_func import move_data_to_device

        batch = move_data_to_device(collate_steps([StepGroupDataset(rows, *_args(bb))[0]], 0), "cuda")
        with torch.inference_mode():
            out = ext.predict_step(batch)
    finally:
        ext.on_predict_end()
    assert torch.isfinite(out["features"]).all()


# --- extract once, sweep many --------------------------------------------------------------------

def test_layer_by_token_group_sweep_forwards_nothing_after_one_extraction(tmp_path, monkeypatch):
    """2 layers × 2 token groups through compose: one extraction (the run's surface and the
    transfer sources), then four runs with 0 rows forwarded on any surface."""
    from ipi.run import tasks
    from ipi.extraction import forward as run

    base = ["data.max_trajectories=4", "split.test_fraction=0.5", "evaluation.n_boot=50", "logger=none"]
    info = tasks.extract(compose_train(tmp_path, base))[0]
    assert info["rows_forwarded"] > 0 and info["layers"] == [0, 1, 2, 3]

    def boom(*a, **k):
        raise AssertionError("backbone built during the sweep")

    monkeypatch.setattr(run, "instantiate", boom)
    for layers, expected_block in (("six_1", 0), ("six_6", 3)):
        for group in ("task", "action"):
            out = tmp_path / f"{layers}-{group}"
            cfg = compose_train(tmp_path, [*base, f"layers={layers}", f"token_group={group}",
                                           f"paths.output_dir={out}"])
            results, _ = tasks.train(cfg)
            run_info = json.loads((out / "run_info.json").read_text())
            ri = run_info["extraction"]
            assert ri["rows_forwarded"] == 0 and ri["cache_hit"] is True
            assert set(run_info["extraction_by_surface"]) == {"i_vis", "i_dom", "i_tool"}
            assert all(v["rows_forwarded"] == 0 for v in run_info["extraction_by_surface"].values())
            assert ri["cache_key"] == info["cache_key"]
            assert results["run"]["layers"] == [expected_block]
            assert results["run"]["token_groups"] == [group]
            assert results["run"]["n_features"] == 64


# --- the cache across ranks -----------------------------------------------------------------------

def test_repeated_rows_across_rank_shards_are_counted_and_loaded_once(tmp_path):
    """A padding DistributedSampler repeats rows on some rank: finalize counts them, load keeps one."""
    from ipi.extraction.activation_cache import ActivationCache, CacheError

    cache = ActivationCache(tmp_path, "k" * 64, {"layers": [0], "token_groups": ["task"]})
    feats = {r: torch.full((1, 1, 2), float(i)) for i, r in enumerate("abc")}

    def shard(name, ids):
        cache.write_shard(name, {"features": torch.stack([feats[r] for r in ids]),
                                 "collapse": torch.zeros(len(ids), 1), "prompt_len": torch.arange(len(ids)),
                                 "seq_len": torch.ones(len(ids), dtype=torch.long)}, list(ids))

    shard("shard-r0-00000", ["a", "b"])
    shard("shard-r1-00000", ["c", "a"])  # "a" repeated to even out the ranks
    manifest = cache.finalize(["a", "b", "c"])
    assert manifest["n_rows"] == 3 and manifest["duplicates_ignored"] == 1
    fs = cache.load(["c", "b", "a"])
    assert fs.row_ids == ["c", "b", "a"]
    assert fs.features[:, 0, 0, 0].tolist() == [2.0, 1.0, 0.0]
    with pytest.raises(CacheError, match="1 rows missing"):
        cache.finalize(["a", "b", "c", "d"])


@pytest.mark.slow
def test_shapes_benchmark_runs_on_cpu_at_small_shapes():
    """The --gpu-7b-shapes code path (model built at given shapes, timed predict steps, FLOPs)."""
    from ipi.tools.bench import shapes_benchmark

    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                        "mrope_section": [2, 3, 3]})
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[0])
    out = shapes_benchmark(1, ["backbone.image_size.longest_edge=50176"], 1.0, device="cpu", text=text,
                           vision=vision, dtype=torch.float32)
    assert out["rows"] == 13 and out["layers"] == [0, 1, 2, 3] and out["rows_per_s"] > 0
    assert out["n_layers"] == 4 and 0 < out["mfu"]


def test_transfer_sources_forward_clean_and_attack_unless_the_full_entry_is_cached(tmp_path):
    """A transfer source surface is read from its own full entry when that is cached ("shared");
    otherwise only its clean/attack rows (what the transfer probe trains on) are extracted."""
    from ipi.run import stages
    from ipi.extraction.forward import extract_features, transfer_rows
    from ipi.run.settings import extract_settings
    from ipi.protocol import TOKEN_GROUPS

    cfg = compose_train(tmp_path, ["data.max_trajectories=2"])
    trajs = stages.load_data(cfg)[0]
    layers = stages.layer_indices(cfg)
    full = stages.make_rows(cfg, trajs, "i_dom")
    rows, how = transfer_rows(extract_settings(cfg), full, layers, list(TOKEN_GROUPS))
    assert how == "clean_attack"
    assert {r.variant.variant for r in rows} == {"clean", "attack"}
    assert len(rows) < len(full) and [r.row_id for r in rows] == [
        r.row_id for r in full if r.variant.variant in ("clean", "attack")]
    _, info = extract_features(extract_settings(cfg), full, layers, list(TOKEN_GROUPS))  # the surface's own run
    assert info["rows_forwarded"] == len(full)
    rows, how = transfer_rows(extract_settings(cfg), full, layers, list(TOKEN_GROUPS))
    assert how == "shared" and len(rows) == len(full)
    _, info = extract_features(extract_settings(cfg), rows, layers, list(TOKEN_GROUPS))
    assert info["cache_hit"] is True and info["rows_forwarded"] == 0
