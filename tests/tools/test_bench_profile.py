"""ipi.tools.bench --only profile: the FLOP count it divides by, and the profile on a tiny text decoder."""

from __future__ import annotations

import pytest


def test_decoder_flops_by_hand():
    """One block of d = 4, f = 6, 2 heads (head_dim 2), 1 kv head, 3 tokens, counted by hand."""
    from ipi.tools.bench import decoder_flops

    text = {"hidden_size": 4, "intermediate_size": 6, "num_attention_heads": 2, "num_key_value_heads": 1}
    # q, o: 4x4 each; k, v: 4x2 each; MLP: three 4x6 -> 32 + 16 + 72 = 120 multiply-adds per token
    per_token = 2 * 120
    attention = 2 * 3 * 3 * 4  # QK^T and AV, causal (half of 4 n^2 d)
    assert decoder_flops(text, 3, 1) == 3 * per_token + attention
    assert decoder_flops(text, 3, 5) == 5 * (3 * per_token + attention)
    assert decoder_flops({**text, "head_dim": 3}, 3, 1) == 3 * 2 * (32 + 2 * 4 * 3 + 72) + attention


@pytest.mark.slow  # ~30 s: builds the tiny decoder four times
@pytest.mark.needs_shared
def test_profile_on_the_tiny_text_decoder():
    """The cut forwards fewer blocks with the same features; bf16 moves them by its rounding only."""
    from ipi.tools.bench import profile_benchmark

    out = profile_benchmark(2, ["backbone=tiny_qwen2_text", "layers=six_1"])
    assert out["layers"] == [1] and out["rows"] == 8
    assert out["before"]["blocks_forwarded"] == 8 and out["cut"]["blocks_forwarded"] == 2
    assert out["cut"]["max_abs_diff_vs_before"] <= 1e-5
    assert out["cut"]["model_gflop"] == pytest.approx(out["before"]["model_gflop"] * 2 / 8, rel=1e-3)
    if out["matmul_peak_gflops"]["bfloat16"] is not None:
        assert 0 < out["cut_bf16"]["max_rel_err_vs_before"] < 0.05
