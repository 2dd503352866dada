"""The frozen-backbone predict module: forward hooks on chosen layers, pooling, collapse statistic.

Only the chosen decoder blocks are hooked; the forward stops after the deepest chosen block
(an exception raised from its hook), and the LM head is never computed (the base model is called,
not ``...ForConditionalGeneration``). Layer ``k`` is the output of decoder block ``k`` — the
residual stream before the final norm (PROTOCOL.md §3; ``output_hidden_states[k + 1]`` in
transformers, except for the last block, where ``hidden_states[-1]`` is after the norm).
"""

from __future__ import annotations

from collections.abc import Sequence

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from ipi.backbone import Backbone
from ipi.extraction.cache import ActivationCache
from ipi.protocol import TOKEN_GROUPS


class _StopForward(Exception):
    """Raised by the deepest hook to end the forward pass early."""


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The backbone without its LM head (``model.model`` for ``...ForCausalLM`` / ``...ForConditionalGeneration``)."""
    inner = getattr(model, "model", None)
    return inner if isinstance(inner, torch.nn.Module) and hasattr(model, "lm_head") else model


def collapse_statistic(h: torch.Tensor) -> torch.Tensor:
    """Squared norm of the mean unit-normalised token state (PROTOCOL.md §3).

    Equals the mean pairwise cosine similarity of the tokens, self-pairs included.

    Args:
        h: ``[T, H]`` hidden states of the prompt tokens.

    Returns:
        Scalar tensor (float32).
    """
    u = torch.nn.functional.normalize(h.float(), dim=-1)
    m = u.mean(dim=0)
    return (m * m).sum()


def pool_groups(h: torch.Tensor, groups: dict[str, torch.Tensor], names: Sequence[str]) -> torch.Tensor:
    """Mean-pool one row's hidden states over each token group.

    Args:
        h: ``[T, H]`` hidden states of one row.
        groups: Token indices per group.
        names: Group order.

    Returns:
        ``[G, H]`` float32; a group with no tokens pools to zeros.
    """
    out = torch.zeros((len(names), h.shape[-1]), dtype=torch.float32, device=h.device)
    for g, name in enumerate(names):
        idx = groups[name]
        if idx.numel():
            out[g] = h.index_select(0, idx.to(h.device)).float().mean(dim=0)
    return out


def keeps_own_placement(model: torch.nn.Module) -> bool:
    """Whether ``model`` was placed by ``from_pretrained(device_map=...)`` or is quantised.

    Such a model must not be moved with ``.to()`` (bitsandbytes weights cannot be; a model
    dispatched over several devices would be collapsed onto one), so the extractor hides it from
    Lightning's device placement.
    """
    return bool(getattr(model, "is_quantized", False) or getattr(model, "is_loaded_in_8bit", False)
                or getattr(model, "is_loaded_in_4bit", False) or getattr(model, "hf_device_map", None))


class HiddenStateExtractor(L.LightningModule):
    """Runs the frozen backbone on replay batches and returns pooled features.

    A batch is a step group (or several) from :func:`ipi.extraction.datamodule.collate_steps`:
    the group's distinct screenshots are encoded by the vision tower once, and their embeddings
    are handed to every row showing them (``mm_encoder_outputs``); the rows go through the
    language model in chunks of at most ``max_rows`` with their own 3-D (M-RoPE) positions
    (computed by the model from ``mm_token_type_ids`` and ``image_grid_thw``). A batch from
    :func:`ipi.extraction.datamodule.collate_rows` (pixel values per row) is forwarded as it is.

    Pooling happens inside the hooks as one batched product with the collate's pooling matrix
    (no per-row Python loop, no host-device synchronisation).

    Args:
        backbone: The frozen backbone. Its model is a child module (so Lightning places it),
            unless it is quantised or was dispatched with ``device_map`` (then it stays where
            ``from_pretrained`` put it; see :func:`keeps_own_placement`).
        layer_indices: Decoder blocks to read (0-based).
        token_groups: Token groups to pool, in order (a subset of ``ipi.protocol.TOKEN_GROUPS``).
        max_rows: Rows per language-model forward pass (``backbone.batch_size``).
    """

    def __init__(self, backbone: Backbone, layer_indices: Sequence[int], token_groups: Sequence[str],
                 max_rows: int = 8):
        super().__init__()
        if keeps_own_placement(backbone.model):
            object.__setattr__(self, "_placed_model", backbone.model)  # not a child: never moved
        else:
            self.backbone_model = backbone.model
        object.__setattr__(self, "_layers", list(backbone.layers))  # hook targets, not children
        self.layer_indices = list(layer_indices)
        self.token_groups = list(token_groups)
        unknown = [g for g in self.token_groups if g not in TOKEN_GROUPS]
        if unknown:
            raise ValueError(f"extraction: unknown token groups {unknown}; allowed: {', '.join(TOKEN_GROUPS)}")
        self._group_rows = [TOKEN_GROUPS.index(g) for g in self.token_groups]
        self.max_rows = max(1, int(max_rows))
        self._batch = None
        self._out: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._handles = []

    @property
    def model(self) -> torch.nn.Module:
        """The wrapped backbone model (``...ForConditionalGeneration`` / ``...ForCausalLM``)."""
        return self.__dict__.get("_placed_model") or self.backbone_model

    def _hook(self, layer_idx: int):
        deepest = max(self.layer_indices)

        def hook(_module, _inputs, output):
            batch = self._batch
            if batch is None:  # a forward pass not issued by predict_step: leave it alone
                return
            h = output[0] if isinstance(output, tuple) else output
            hf = h.float()
            pool = batch["pool"].to(hf.device)
            pm = batch["prompt_mask"].to(hf.device)
            feats = torch.bmm(pool, hf)  # [B, G, H]: mean over each group's tokens
            u = torch.nn.functional.normalize(hf, dim=-1)
            mean_u = torch.bmm(pm.unsqueeze(1), u).squeeze(1) / pm.sum(dim=1, keepdim=True)
            self._out[layer_idx] = (feats, (mean_u * mean_u).sum(dim=-1))
            if layer_idx == deepest:
                raise _StopForward

        return hook

    def on_predict_start(self) -> None:
        self._handles = [self._layers[i].register_forward_hook(self._hook(i)) for i in self.layer_indices]

    def on_predict_end(self) -> None:
        for hnd in self._handles:
            hnd.remove()
        self._handles = []

    def _forward(self, inputs: dict, batch_view: dict) -> tuple[torch.Tensor, torch.Tensor]:
        self._batch = batch_view
        self._out = {}
        try:
            base_model(self.model)(**inputs, use_cache=False)
        except _StopForward:
            pass
        finally:
            self._batch = None
        missing = [i for i in self.layer_indices if i not in self._out]
        if missing:
            raise RuntimeError(f"extraction: hooks on layers {missing} did not fire")
        feats = torch.stack([self._out[i][0] for i in self.layer_indices], dim=1)
        coll = torch.stack([self._out[i][1] for i in self.layer_indices], dim=1)
        return feats, coll

    def predict_step(self, batch: dict, batch_idx: int = 0) -> dict:
        """Forward one batch and pool.

        Returns:
            ``{"row_ids": list[str], "features": [B, L, G, H] float32, "collapse": [B, L],
            "prompt_len": [B], "seq_len": [B]}`` on the CPU.
        """
        pool = batch["pool"][:, self._group_rows]
        if "pixel_values" in batch["inputs"] or "seq_len_list" not in batch:  # one row per item
            feats, coll = self._forward(batch["inputs"], {"pool": pool, "prompt_mask": batch["prompt_mask"]})
        else:
            images = batch.get("images")
            vision = None
            if images is not None:
                from transformers.modeling_outputs import BaseModelOutputWithPooling

                # Each distinct screenshot through the vision tower once, for all rows showing it.
                vision = base_model(self.model).get_image_features(
                    images["pixel_values"], images["image_grid_thw"], return_dict=True).pooler_output
            lens = batch["seq_len_list"]
            parts = []
            for a in range(0, len(lens), self.max_rows):
                b = min(a + self.max_rows, len(lens))
                t = max(lens[a:b])
                inputs = {k: v[a:b, :t] for k, v in batch["inputs"].items() if k != "image_grid_thw"}
                if vision is not None:
                    inputs["image_grid_thw"] = batch["inputs"]["image_grid_thw"][a:b]
                    inputs["mm_encoder_outputs"] = {"image": BaseModelOutputWithPooling(
                        pooler_output=tuple(vision[i] for i in images["index_list"][a:b]))}
                parts.append(self._forward(inputs, {"pool": pool[a:b, :, :t],
                                                    "prompt_mask": batch["prompt_mask"][a:b, :t]}))
            feats = torch.cat([p[0] for p in parts])
            coll = torch.cat([p[1] for p in parts])
        return {
            "row_ids": batch["row_ids"],
            "features": feats.cpu(),
            "collapse": coll.float().cpu(),
            "prompt_len": batch["prompt_len"].cpu(),
            "seq_len": batch["seq_len"].cpu(),
        }


class ShardWriter(BasePredictionWriter):
    """Streams predict outputs to cache shards (each rank its own), so memory stays flat.

    Args:
        cache: The cache entry to write into.
        shard_rows: Rows per shard.
        dtype: Stored feature dtype (``float16`` | ``bfloat16`` | ``float32``).
    """

    def __init__(self, cache: ActivationCache, shard_rows: int = 256, dtype: str = "float32"):
        super().__init__(write_interval="batch")
        self.cache = cache
        self.shard_rows = shard_rows
        self.dtype = getattr(torch, dtype)
        self._buf: list[dict] = []
        self._n = 0
        self._seq = 0
        self.rows_written = 0

    def _flush(self, rank: int) -> None:
        if not self._buf:
            return
        ids = [r for b in self._buf for r in b["row_ids"]]
        tensors = {
            "features": torch.cat([b["features"] for b in self._buf]).to(self.dtype),
            "collapse": torch.cat([b["collapse"] for b in self._buf]),
            "prompt_len": torch.cat([b["prompt_len"] for b in self._buf]).long(),
            "seq_len": torch.cat([b["seq_len"] for b in self._buf]).long(),
        }
        # Resume-safe names: never overwrite a shard left by an earlier (interrupted) run.
        while (self.cache.dir / f"shard-r{rank}-{self._seq:05d}.safetensors").exists():
            self._seq += 1
        self.cache.write_shard(f"shard-r{rank}-{self._seq:05d}", tensors, ids)
        self.rows_written += len(ids)
        self._seq += 1
        self._buf, self._n = [], 0

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx=0):
        self._buf.append(prediction)
        self._n += len(prediction["row_ids"])
        if self._n >= self.shard_rows:
            self._flush(trainer.global_rank)

    def on_predict_epoch_end(self, trainer, pl_module) -> None:
        self._flush(trainer.global_rank)
        # Every rank's shards are on disk before rank 0 checks them and writes the manifest.
        trainer.strategy.barrier("ipi-shards-written")
