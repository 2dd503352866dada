"""Backbones that generate (tiny, random weights: their labels are meaningless) and a few real replay rows."""

from __future__ import annotations

import pytest

from tests.conftest import PROCESSOR

SYSTEM = "You are a web agent. Answer with 'Thought: ...' and 'Action: ...'."


@pytest.fixture(scope="session")
def gen_backbone():
    """The tiny Qwen2.5-VL of tests/conftest.py ``small_backbone``, with its LM head."""
    from ipi.backbone import build_tiny_qwen2_5_vl

    return build_tiny_qwen2_5_vl(
        str(PROCESSOR),
        text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}),
        vision=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                    fullatt_block_indexes=[0]),
        image_size={"shortest_edge": 3136, "longest_edge": 50176},
        with_lm_head=True,
    )


@pytest.fixture(scope="session")
def text_backbone():
    """A tiny text-only causal LM (Qwen2 architecture, random seeded weights) with the real Qwen tokenizer,
    wrapped as :func:`ipi.backbone_text.build_gguf_causal_lm` wraps SmolLM2 (a :class:`TextChatProcessor`)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from ipi.backbone import Backbone, find_decoder_layers
    from ipi.backbone_text import TextChatProcessor

    tok = AutoTokenizer.from_pretrained(str(PROCESSOR))
    config = Qwen2Config(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = Qwen2ForCausalLM(config).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return Backbone(name="tiny_text", model=model, processor=TextChatProcessor(tok), layers=find_decoder_layers(model),
                    hidden_size=48, multimodal=False, image_token_id=None,
                    identity={"kind": "tiny_text_test", "seed": 1}, image_size=None, depth=3)


@pytest.fixture(scope="session")
def dom_rows(trajectories):
    """i_dom rows (clean, attack, c_scrambled) of the first two steps of the first trajectory."""
    from ipi.extraction.rows import build_rows

    rows = build_rows(trajectories[:1], "i_dom", ["c_scrambled"], count_tokens=lambda s: len(s.split()))
    return [r for r in rows if r.step.step in {rows[0].step.step, rows[3].step.step}][:6]
