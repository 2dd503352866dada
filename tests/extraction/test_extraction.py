"""Extraction: hooks and pooling against a full forward, collapse statistic, the activation cache."""

from __future__ import annotations

import json

import pytest
import torch

from ipi.extraction.activation_cache import CacheError
from ipi.extraction.datamodule import ReplayDataset, collate_rows
from ipi.extraction.extractor import HiddenStateExtractor, collapse_statistic, pool_groups
from ipi.extraction.rows import build_rows
from ipi.protocol import DEFAULT_SYSTEM_PROMPT, TOKEN_GROUPS
from tests.conftest import compose_train

pytestmark = pytest.mark.needs_shared


def test_collapse_statistic_is_mean_pairwise_cosine():
    torch.manual_seed(0)
    h = torch.randn(7, 5, dtype=torch.float64)
    u = torch.nn.functional.normalize(h, dim=-1)
    expected = (u @ u.T).mean()  # self-pairs included
    assert collapse_statistic(h).item() == pytest.approx(expected.item(), rel=1e-6)
    same = torch.ones(4, 3)
    assert collapse_statistic(same).item() == pytest.approx(1.0)


def test_pool_groups_means_and_empty_group():
    h = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    groups = {"a": torch.tensor([0, 2]), "b": torch.tensor([], dtype=torch.long)}
    out = pool_groups(h, groups, ["a", "b"])
    assert torch.equal(out[0], (h[0] + h[2]) / 2)
    assert torch.equal(out[1], torch.zeros(3))


def test_hooked_features_equal_full_forward(small_backbone, trajectories):
    """Hooks on chosen layers + early stop give exactly what a full forward's hidden states give."""
    traj = trajectories[0]
    rows = build_rows([traj], "i_vis", ["c_scrambled", "c_occlusion"])[:3]
    ds = ReplayDataset(rows, small_backbone.processor, DEFAULT_SYSTEM_PROMPT, True,
                       small_backbone.image_size, small_backbone.image_token_id)
    layers = [0, 2]  # deepest chosen < last block: the forward stops early
    ext = HiddenStateExtractor(small_backbone, layers, list(TOKEN_GROUPS))
    ext.on_predict_start()
    ours = {h.id for h in ext._handles}
    assert len(ours) == len(layers)
    try:
        for i in range(len(ds)):
            batch = collate_rows([ds[i]], pad_token_id=0)
            out = ext.predict_step(batch)
            with torch.inference_mode():
                full = small_backbone.model(**batch["inputs"], output_hidden_states=True)
            for j, k in enumerate(layers):
                h = full.hidden_states[k + 1][0]  # output of block k (k < last: before the final norm)
                expected = pool_groups(h, batch["groups"][0], TOKEN_GROUPS)
                torch.testing.assert_close(out["features"][0, j], expected, rtol=1e-5, atol=1e-5)
                pl = int(batch["prompt_len"][0])
                torch.testing.assert_close(out["collapse"][0, j], collapse_statistic(h[:pl]), rtol=1e-5, atol=1e-6)
    finally:
        ext.on_predict_end()
    assert not any(ours & set(layer._forward_hooks) for layer in small_backbone.layers)


def test_batched_rows_equal_single_rows(small_backbone, trajectories):
    """Right-padded batches give the same features as one row at a time."""
    rows = build_rows([trajectories[1]], "i_vis", ["c_occlusion"])[:3]
    ds = ReplayDataset(rows, small_backbone.processor, DEFAULT_SYSTEM_PROMPT, True,
                       small_backbone.image_size, small_backbone.image_token_id)
    ext = HiddenStateExtractor(small_backbone, [1, 3], list(TOKEN_GROUPS))
    ext.on_predict_start()
    try:
        single = torch.cat([ext.predict_step(collate_rows([ds[i]], 0))["features"] for i in range(3)])
        batched = ext.predict_step(collate_rows([ds[i] for i in range(3)], 0))["features"]
    finally:
        ext.on_predict_end()
    torch.testing.assert_close(batched, single, rtol=1e-4, atol=1e-4)


def test_cache_reuse_and_invalidation(tmp_path, monkeypatch):
    from ipi.run import tasks
    from ipi.extraction import forward as run

    cfg = compose_train(tmp_path, ["data.max_trajectories=2", "layers=six"])
    f1, _info1 = tasks.extract(cfg)[0], None
    assert f1["cache_hit"] is False and f1["rows_forwarded"] > 0
    manifest = json.loads((tmp_path / "cache" / f1["cache_key"][:24] / "manifest.json").read_text())
    assert manifest["n_rows"] == f1["rows_forwarded"]
    assert manifest["layers"] == [0, 1, 2, 3]

    # Same key again: no model is even built (instantiate would raise).
    def boom(*a, **k):
        raise AssertionError("backbone built on a cache hit")

    monkeypatch.setattr(run, "instantiate", boom)
    f2 = tasks.extract(cfg)[0]
    assert f2["cache_hit"] is True and f2["rows_forwarded"] == 0 and f2["cache_key"] == f1["cache_key"]
    # Batch size and workers do not change the key.
    cfg_b = compose_train(tmp_path, ["data.max_trajectories=2", "layers=six", "backbone.batch_size=3"])
    assert tasks.extract(cfg_b)[0]["cache_key"] == f1["cache_key"]
    # Anything that changes the numbers does: the extracted layers, backbone seed, pixel limits.
    for ov in (["layers=middle", "extract.layers=[0.5]"], ["backbone.loader.seed=1"],
               ["backbone.image_size.longest_edge=40000"]):
        cfg_c = compose_train(tmp_path, ["data.max_trajectories=2", *ov])
        with pytest.raises(AssertionError, match="backbone built"):
            tasks.extract(cfg_c)


def test_cache_refuses_tampered_shards(tmp_path):
    from ipi.run import tasks

    # one trajectory: no train/test split exists, so no held-out wording families either
    cfg = compose_train(tmp_path, ["data.max_trajectories=1", "layers=last", "evaluation.heldout_wording=false"])
    info = tasks.extract(cfg)[0]
    shard = next((tmp_path / "cache" / info["cache_key"][:24]).glob("shard-*.safetensors"))
    shard.write_bytes(shard.read_bytes() + b"\0")
    with pytest.raises(CacheError, match="changed since the manifest"):
        tasks.extract(cfg)
