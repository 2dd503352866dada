"""float16 overflow never poisons the cache: non-finite features are refused before an entry is finished.

Activations beyond float16's 65,504 (reported for Qwen2 and Qwen2-VL) become inf when cast to
``backbone.cache_dtype=float16``. The tiny backbone with a huge ``initializer_range`` gives such
activations for real; the unit tests pin the message and the older-entry guards.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import compose_train

pytestmark = pytest.mark.needs_shared


def test_fp16_overflow_fails_naming_dtype_layer_and_remedy_and_no_entry_holds_it(tmp_path):
    from ipi.extraction.activation_cache import NonFiniteFeatures
    from ipi.run.tasks import extract

    cfg = compose_train(tmp_path, ["data.max_trajectories=2", "evaluation.transfer=false", "backbone.cache_dtype=float16",
                                   "+backbone.loader.text.initializer_range=3000.0", "extract.shard_rows=5"])
    with pytest.raises(NonFiniteFeatures) as e:
        extract(cfg)
    msg = str(e.value)
    assert "\n" not in msg
    assert "non-finite features at decoder layer 0" in msg and "backbone.cache_dtype=float16" in msg
    assert "largest finite 65504" in msg and "set backbone.cache_dtype=bfloat16 or float32" in msg
    entries = [p for p in (tmp_path / "cache").iterdir() if p.is_dir() and len(p.name) == 24]
    assert all(not (p / "manifest.json").exists() for p in entries)  # nothing finished
    from safetensors.torch import load_file

    for shard in (tmp_path / "cache").rglob("shard-*.safetensors"):  # shards before the bad one are finite
        assert torch.isfinite(load_file(shard)["features"]).all()


def test_the_same_activations_in_float32_are_cached(tmp_path):
    """The check passes what it should: float32 holds these activations."""
    from ipi.run.tasks import extract

    cfg = compose_train(tmp_path, ["data.max_trajectories=2", "evaluation.transfer=false", "backbone.cache_dtype=float32",
                                   "+backbone.loader.text.initializer_range=3000.0"])
    extract(cfg)
    (entry,) = [p for p in (tmp_path / "cache").iterdir() if p.is_dir() and len(p.name) == 24]
    assert (entry / "manifest.json").exists()


def test_check_finite_messages_and_limits():
    from ipi.extraction.activation_cache import NonFiniteFeatures
    from ipi.extraction.extractor import check_finite

    f = torch.zeros(2, 3, 2, 4)
    f[1, 2, 1, 0] = 65504.0  # float16's largest finite value: passes
    check_finite(f, torch.float16, ["a", "b"], [4, 9, 17], ["task", "action"])
    f[1, 2, 1, 1] = 70000.0  # over it: inf in float16
    with pytest.raises(NonFiniteFeatures, match=r"decoder layer 17 \(token group action, row b; layers affected: 17\)"
                                                r": hidden states up to 7e\+04"):
        check_finite(f, torch.float16, ["a", "b"], [4, 9, 17], ["task", "action"])
    check_finite(f, torch.bfloat16, ["a", "b"])  # bf16 and fp32 hold it
    check_finite(f, torch.float32, ["a", "b"])
    f[0, 0, 0, 0] = float("nan")  # the forward itself: another remedy
    with pytest.raises(NonFiniteFeatures, match=r"forward pass itself produced inf/NaN .*extract[.]precision"):
        check_finite(f, torch.float32, ["a", "b"], [4, 9, 17], ["task", "action"])


def _inf_shard(cache, name="shard-r0-00000"):
    feats = torch.zeros(2, 1, 1, 4, dtype=torch.float16)
    feats[1, 0, 0, 2] = float("inf")
    cache.write_shard(name, {"features": feats, "collapse": torch.zeros(2, 1), "prompt_len": torch.ones(2).long(),
                             "seq_len": torch.ones(2).long()}, ["r0", "r1"])


def test_finalize_refuses_a_shard_with_inf_written_before_the_check(tmp_path):
    from ipi.extraction.activation_cache import ActivationCache, NonFiniteFeatures

    cache = ActivationCache(tmp_path, "ab" * 32, {"layers": [0], "token_groups": ["task"]})
    _inf_shard(cache)
    with pytest.raises(NonFiniteFeatures, match=r"shard-r0-00000.safetensors holds inf/NaN \(float16; row r1"):
        cache.finalize(["r0", "r1"])
    assert not cache.is_complete()


def test_a_finished_entry_holding_inf_is_refused_with_the_remedy(tmp_path, monkeypatch):
    from ipi.extraction import activation_cache as ac

    cache = ac.ActivationCache(tmp_path, "cd" * 32, {"layers": [0], "token_groups": ["task"]})
    _inf_shard(cache)
    monkeypatch.setattr(ac, "_nonfinite_shard", lambda p: None)  # as an older version finished it
    cache.finalize(["r0", "r1"])
    assert json.loads(cache.manifest_path.read_text())["n_rows"] == 2
    monkeypatch.undo()
    with pytest.raises(ac.NonFiniteFeatures, match=r"finished entry holds inf/NaN .* extract.force=true"):
        cache.load(["r0", "r1"])
