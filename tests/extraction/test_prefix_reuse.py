"""Prefix reuse: a step group's shared token prefix forwarded once (key/value cache), then the rows'
suffixes with their own (3-D M-RoPE) positions, gives the features of forwarding every row whole."""

from __future__ import annotations

import pytest
import torch

from ipi.extraction.datamodule import StepGroupDataset, collate_steps
from ipi.extraction.extractor import AUTO_MIN_SAVED_SHARE, HiddenStateExtractor, planned_prefix_len, shared_prefix_len
from ipi.protocol import DEFAULT_SYSTEM_PROMPT, TOKEN_GROUPS
from tests.extraction.test_scale import _rows as _step_rows


def _rows(bb, trajectories, surface, n_steps=2, traj=0):
    """The first ``n_steps`` steps' rows of one trajectory (two steps: a step group boundary)."""
    return _step_rows(bb, trajectories, surface, n_steps=n_steps, traj=traj)


def _extract(bb, ds, layers, mode, max_rows=3):
    ext = HiddenStateExtractor(bb, layers, list(TOKEN_GROUPS), max_rows=max_rows, prefix_reuse=mode)
    tok = bb.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ext.on_predict_start()
    try:
        with torch.inference_mode():
            out = ext.predict_step(collate_steps([ds[g] for g in range(len(ds))], pad_token_id=pad))
    finally:
        ext.on_predict_end()
    return out, ext.prefix_stats


def rel_error(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``max |a - b| / max |b|`` per layer and token group: ``[N, L, G, H]`` -> ``[L, G]``."""
    num = (a - b).abs().amax(dim=(0, 3))
    den = b.abs().amax(dim=(0, 3)).clamp_min(1e-30)
    return num / den


def _check(bb, rows, expect_prefix_before_image: bool | None):
    ds = StepGroupDataset(rows, bb.processor, DEFAULT_SYSTEM_PROMPT, bb.multimodal, bb.image_size,
                          bb.image_token_id)
    layers = list(range(bb.n_layers))
    ref, ref_stats = _extract(bb, ds, layers, "false")
    got, stats = _extract(bb, ds, layers, "true")
    assert ref_stats["groups_reused"] == 0
    assert stats["groups_reused"] == stats["groups"] == len(ds.groups) >= 2
    assert stats["positions_forwarded"] < stats["positions"]
    assert got["row_ids"] == ref["row_ids"] == [r.row_id for r in rows]
    err = rel_error(got["features"], ref["features"])
    cerr = ((got["collapse"] - ref["collapse"]).abs().max() / ref["collapse"].abs().max()).item()
    print(f"{rows[0].variant.surface}: max rel feature error {err.max().item():.2e} "
          f"(per layer/group max), collapse {cerr:.2e}, positions {stats['positions_forwarded']}/{stats['positions']}")
    assert err.max().item() <= 1e-5, err
    assert cerr <= 1e-5
    for name in ("prompt_len", "seq_len"):
        assert torch.equal(got[name], ref[name])
    if expect_prefix_before_image is not None:
        batch = collate_steps([ds[0]], pad_token_id=0)
        lens = batch["seq_len_list"]
        p = shared_prefix_len(batch["inputs"]["input_ids"], lens, batch["inputs"]["mm_token_type_ids"],
                              batch["images"]["index_list"])
        first_image = int((batch["inputs"]["mm_token_type_ids"][0] != 0).nonzero()[0])
        assert (p <= first_image) == expect_prefix_before_image
        assert p > 0
    return err


pytestmark = pytest.mark.needs_shared


@pytest.mark.parametrize("surface", ["i_vis", "i_dom", "i_tool"])
def test_prefix_reuse_gives_the_features_of_whole_rows(small_backbone, trajectories, surface):
    """fp32, every layer and token group: max |a-b| / max |b| <= 1e-5 (two steps, chunks of 3 rows).

    ``i_vis`` variants show different screenshots (banner drawn in), so their prefix ends before
    the image; ``i_dom`` / ``i_tool`` variants share the screenshot, so it is in the prefix.
    """
    rows = _rows(small_backbone, trajectories, surface)
    _check(small_backbone, rows, expect_prefix_before_image=(surface == "i_vis"))


@pytest.fixture(scope="module")
def text_backbone(processor):
    """A tiny random LlamaForCausalLM (SmolLM2's class) driven text-only, as the GGUF backbone is."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from ipi.backbone import Backbone, _freeze, find_decoder_layers
    from ipi.backbone_text import TextChatProcessor

    tok = processor.tokenizer
    config = LlamaConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192)
    torch.manual_seed(0)
    model = _freeze(LlamaForCausalLM(config))
    return Backbone(name="tiny_llama", model=model, processor=TextChatProcessor(tok),
                    layers=find_decoder_layers(model), hidden_size=48, multimodal=False, image_token_id=None,
                    identity={}, image_size=None)


@pytest.mark.parametrize("surface", ["i_dom", "i_tool"])
def test_prefix_reuse_on_a_text_only_backbone(text_backbone, trajectories, surface):
    """The text-only (GGUF / SmolLM2-style LlamaForCausalLM) path: 1-D positions continue after the prefix."""
    rows = _rows(text_backbone, trajectories, surface)
    _check(text_backbone, rows, expect_prefix_before_image=None)


def test_shared_prefix_len_hand_worked_cases():
    ids = torch.tensor([[1, 2, 9, 9, 3, 4, 5], [1, 2, 9, 9, 3, 7, 0], [1, 2, 9, 9, 3, 4, 8]])
    types = (ids == 9).int()
    # text-only: common prefix [1, 2, 9, 9, 3]
    assert shared_prefix_len(ids, [7, 6, 7]) == 5
    # one shared image (tokens 2-3): the image is in the prefix
    assert shared_prefix_len(ids, [7, 6, 7], types, [0, 0, 0]) == 5
    # different images per row: the prefix ends before the first image token
    assert shared_prefix_len(ids, [7, 6, 7], types, [0, 1, 2]) == 2
    # the prefix would end inside the image (a row of length 4 keeps 1 own token: limit 3)
    assert shared_prefix_len(ids, [7, 4, 7], types, [0, 0, 0]) == 2
    # every row keeps at least one token of its own; one row: nothing to share
    assert shared_prefix_len(ids[:, :3][[0, 0]], [3, 3]) == 2
    assert shared_prefix_len(ids[:1], [7]) == 0


def test_auto_reuses_where_it_saves_positions(small_backbone, trajectories):
    """``auto`` reuses a prefix only when it saves >= AUTO_MIN_SAVED_SHARE of a group's positions."""
    bb = small_backbone
    for surface in ("i_vis", "i_dom"):
        rows = _rows(bb, trajectories, surface, n_steps=1)
        ds = StepGroupDataset(rows, bb.processor, DEFAULT_SYSTEM_PROMPT, True, bb.image_size, bb.image_token_id)
        batch = collate_steps([ds[0]], pad_token_id=0)
        lens = batch["seq_len_list"]
        p = shared_prefix_len(batch["inputs"]["input_ids"], lens, batch["inputs"]["mm_token_type_ids"],
                              batch["images"]["index_list"])
        ext = HiddenStateExtractor(bb, [0], ["last_prompt"], prefix_reuse="auto")
        expect = p if (len(lens) - 1) * p >= AUTO_MIN_SAVED_SHARE * sum(lens) else 0
        assert planned_prefix_len(batch, 0, len(lens), ext.prefix_reuse) == expect
        print(surface, "prefix", p, "of", lens, "auto ->", expect)


def test_prefix_reuse_is_validated_and_leaves_the_cache_entry_alone(tmp_path, trajectories):
    """Through the run's own path (``extract_features``): the same cache key with and without reuse,
    and features equal to 1e-5 relative; an unknown value fails validation with one line."""
    from ipi.run.validation import validate
    from ipi.extraction.forward import cache_key, extract_features
    from ipi.run.settings import extract_settings
    from tests.conftest import compose_train

    cfg_on = compose_train(tmp_path, ["extract.prefix_reuse=true"])
    cfg_off = compose_train(tmp_path, ["extract.prefix_reuse=false", "extract.force=true"])
    validate(cfg_on)
    validate(cfg_off)
    with pytest.raises(ValueError, match="extract.prefix_reuse='maybe'; allowed: auto, true, false"):
        validate(compose_train(tmp_path, ["extract.prefix_reuse=maybe"]))
    from hydra.utils import instantiate

    bb = instantiate(cfg_on.backbone.loader)
    rows = _rows(bb, trajectories, "i_tool", n_steps=1)
    layers, groups = [0, 3], list(TOKEN_GROUPS)
    assert cache_key(cfg_on.backbone, rows, layers, groups)[0] == cache_key(cfg_off.backbone, rows, layers, groups)[0]
    on, info_on = extract_features(extract_settings(cfg_on), rows, layers, groups)
    off, info_off = extract_features(extract_settings(cfg_off), rows, layers, groups)
    assert info_on["cache_key"] == info_off["cache_key"] and info_off["rows_forwarded"] == len(rows)
    err = rel_error(on.features.float(), off.features.float())
    assert err.max().item() <= 1e-5
