"""The frozen-backbone predict module: forward hooks on chosen layers, pooling, collapse statistic.

Only the chosen decoder blocks are hooked; the forward stops after the deepest chosen block
(an exception raised from its hook), and the LM head is never computed (the base model is called,
not ``...ForConditionalGeneration``). Layer ``k`` is the output of decoder block ``k`` — the
residual stream before the final norm (PROTOCOL.md §3; ``output_hidden_states[k + 1]`` in
transformers, except for the last block, where ``hidden_states[-1]`` is after the norm).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from ipi.backbone import Backbone
from ipi.extraction.activation_cache import ActivationCache, NonFiniteFeatures
from ipi.extraction.prefix_reuse import resolve_prefix_reuse
from ipi.protocol import TOKEN_GROUPS


class _StopForward(Exception):
    """Raised by the deepest hook to end the forward pass early."""


#: ``auto`` forwards a step group's shared prefix once when that saves at least this share of the
#: group's token positions (``(rows - 1) * prefix / sum(row lengths)``).
AUTO_MIN_SAVED_SHARE = 0.2


def shared_prefix_len(input_ids: torch.Tensor, lens: Sequence[int], mm_token_type_ids: torch.Tensor | None = None,
                      image_index: Sequence[int] | None = None) -> int:
    """Length of the token prefix that every row of a step group shares and that may be forwarded once.

    The longest common prefix of the rows' token ids, cut so that every row keeps at least one
    token of its own, an image is never split, and, when the rows show different images
    (``i_vis``), the prefix ends before the first image token. Prefix hidden states are the same
    for every row (causal attention), so token-group spans may straddle the prefix end.

    Args:
        input_ids: ``[n, T]`` right-padded token ids of the group's rows.
        lens: The ``n`` unpadded lengths.
        mm_token_type_ids: ``[n, T]`` modality of each token (1 = image), or None (text-only).
        image_index: The distinct image each row shows (``collate_steps``'s ``index_list``), or None.

    Returns:
        The prefix length (0: nothing is shared).
"""
    n = len(lens)
    limit = min(lens) - 1
    if n < 2 or limit <= 0:
        return 0
    ids = input_ids[:, :limit]
    differs = (ids != ids[:1]).any(dim=0).nonzero()
    p = int(differs[0]) if differs.numel() else limit
    if mm_token_type_ids is not None and p > 0:
        types = mm_token_type_ids[0].tolist()
        first_image = next((i for i in range(p) if types[i] != 0), None)
        if first_image is not None:
            if image_index is None or len(set(image_index)) > 1:
                p = first_image
            elif types[p] != 0:  # the prefix would end inside an image: back to its start
                while p > 0 and types[p - 1] != 0:
                    p -= 1
    return p


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


def empty_groups(features: torch.Tensor) -> torch.Tensor:
    """Which rows' token groups were empty, read from their pooled features.

    A group with no tokens pools to zeros at every layer (:func:`pool_groups`, the collate's
    pooling matrix); a group with tokens never gives an exactly zero mean of hidden states at
    every layer.

    Args:
        features: ``[N, L, G, H]`` pooled features.

    Returns:
        ``[N, G]`` bool: True where row ``n``'s group ``g`` had no token.
    """
    return ~features.ne(0).any(dim=-1).any(dim=1)


def empty_group_counts(empty: torch.Tensor, variants: Sequence[str], token_groups: Sequence[str]) -> dict:
    """Rows and rows with an empty token group, per variant.

    Args:
        empty: ``[N, G]`` bool (:func:`empty_groups`).
        variants: Each row's variant (length N).
        token_groups: Group names (length G).

    Returns:
        ``{variant: {"rows": n, "<group>": rows whose group is empty}}`` in sorted variant order.
    """
    out: dict = {}
    var = list(variants)
    for v in sorted(set(var)):
        sel = torch.tensor([x == v for x in var], dtype=torch.bool)
        counts = empty[sel].sum(dim=0).tolist()
        out[v] = {"rows": int(sel.sum()), **{g: int(c) for g, c in zip(token_groups, counts)}}
    return out


def empty_group_warnings(counts: dict, read: Sequence[str]) -> list[str]:
    """One warning per token group the detector reads whose empty share differs between attack rows
    and the rows an estimand compares them with.

    An empty group pools to zeros, one constant feature shared by every empty row: a share that
    differs between the two sides of an estimand lets it rest on empty against non-empty. Clean
    against attack drives E1 and E2; a control ``c`` against attack drives E3[c].

    Args:
        counts: :func:`empty_group_counts`.
        read: The token groups the detector reads.

    Returns:
        Sentences naming the group, both shares and the estimands each difference can drive
        (empty when no share differs or there are no attack rows).
    """
    if "attack" not in counts or not counts["attack"]["rows"]:
        return []
    out = []
    for g in read:
        share = {v: c[g] / c["rows"] for v, c in counts.items() if c["rows"] and g in c}
        driven = [(v, "E1, E2" if v == "clean" else f"E3[{v}]") for v in share
                  if v != "attack" and share[v] != share["attack"]]
        if driven:
            sides = "; ".join(f"{v} {share[v]:.1%} vs attack {share['attack']:.1%} (can drive {est})"
                              for v, est in driven)
            out.append(f"token group {g} is empty (pooled to zeros) on different shares of rows by variant: "
                       f"{sides}; a detector can separate empty from non-empty rather than read the content "
                       "(counts.empty_token_groups)")
    return out


def keeps_own_placement(model: torch.nn.Module) -> bool:
    """Whether ``model`` was placed by ``from_pretrained(device_map=...)`` or is quantised.

    Such a model must not be moved with ``.to()`` (bitsandbytes weights cannot be; a model
    dispatched over several devices would be collapsed onto one), so the extractor hides it from
    Lightning's device placement.
    """
    return bool(getattr(model, "is_quantized", False) or getattr(model, "is_loaded_in_8bit", False)
                or getattr(model, "is_loaded_in_4bit", False) or getattr(model, "hf_device_map", None))


def planned_prefix_len(batch: dict, a: int, b: int, mode: str = "auto") -> int:
    """The prefix of step group ``a:b`` of a ``collate_steps`` batch that the extractor forwards once.

    Args:
        batch: A batch of :func:`ipi.extraction.datamodule.collate_steps`.
        a, b: The group's rows.
        mode: ``extract.prefix_reuse`` (``auto`` | ``true`` | ``false``).

    Returns:
        :func:`shared_prefix_len` of the group (``true``), or that length if it saves at least
        :data:`AUTO_MIN_SAVED_SHARE` of the group's positions (``auto``), else 0.
    """
    mode = resolve_prefix_reuse(mode)
    if mode == "false" or b - a < 2:
        return 0
    lens = batch["seq_len_list"][a:b]
    t = max(lens)
    types = batch["inputs"].get("mm_token_type_ids")
    images = batch.get("images")
    p = shared_prefix_len(batch["inputs"]["input_ids"][a:b, :t].cpu(), lens,
                          None if types is None else types[a:b, :t].cpu(),
                          None if images is None else images["index_list"][a:b])
    if mode == "auto" and (b - a - 1) * p < AUTO_MIN_SAVED_SHARE * sum(lens):
        return 0
    return p


def _cache_kwarg(model: torch.nn.Module) -> str:
    """Name of the key/value-cache argument of ``model.forward`` (``cache`` in transformers 5)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class HiddenStateExtractor(L.LightningModule):
    """Runs the frozen backbone on replay batches and returns pooled features.

    A batch of :func:`ipi.extraction.datamodule.collate_steps`: the group's distinct screenshots
    go through the vision tower once and their embeddings are handed to every row showing them;
    the rows go through the language model in chunks of at most ``max_rows`` with their own 3-D
    positions. A :func:`~ipi.extraction.datamodule.collate_rows` batch is forwarded as it is.
    Pooling happens inside the hooks as one batched product with the collate's pooling matrix.

    Args:
        backbone: The frozen backbone. Its model is a child module (so Lightning places it),
            unless it keeps its own placement (:func:`keeps_own_placement`).
        layer_indices: Decoder blocks to read (0-based).
        token_groups: Token groups to pool, in order (a subset of ``ipi.protocol.TOKEN_GROUPS``).
        max_rows: Rows per language-model forward pass (``backbone.batch_size``).
        prefix_reuse: ``extract.prefix_reuse`` (:data:`PREFIX_REUSE_MODES`): forward a step
            group's shared prefix (:func:`shared_prefix_len`) once with a key/value cache, then
            the suffixes; ``auto`` where it saves at least :data:`AUTO_MIN_SAVED_SHARE` of the
            positions (:func:`planned_prefix_len`; docs/extraction.md). A subclass that overrides
            ``_hook`` always forwards whole rows.
"""

    def __init__(self, backbone: Backbone, layer_indices: Sequence[int], token_groups: Sequence[str],
                 max_rows: int = 8, prefix_reuse: str = "auto"):
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
        self.prefix_reuse = resolve_prefix_reuse(prefix_reuse)
        if type(self)._hook is not HiddenStateExtractor._hook:
            # A subclass's own hooks (e.g. attention focus) would see only the suffix tokens.
            self.prefix_reuse = "false"
        self._prefix_states: dict[int, torch.Tensor] = {}
        self.prefix_stats = {"groups": 0, "groups_reused": 0, "positions": 0, "positions_forwarded": 0}
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
            if batch.get("mode") == "prefix":  # the shared prefix: kept for the suffixes' gather
                self._prefix_states[layer_idx] = h
                if layer_idx == deepest:
                    raise _StopForward
                return
            if batch.get("mode") == "suffix":  # [prefix states; suffix states] = the full rows
                pre = self._prefix_states[layer_idx]
                h = torch.cat([pre.expand(h.shape[0], -1, -1), h], dim=1)
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

    def release_backbone(self) -> None:
        """Drop this module's references to the backbone model and its decoder blocks.

        The Trainer and the module reference each other after ``Trainer.predict``; without the
        module's references the model is freed as soon as its last other owner lets go, with no
        full ``gc.collect()``. The module cannot forward after this.
"""
        self.on_predict_end()
        self._modules.pop("backbone_model", None)
        self.__dict__.pop("_placed_model", None)
        object.__setattr__(self, "_layers", [])
        self._prefix_states = {}
        self._out = {}

    def _run(self, inputs: dict, batch_view: dict, cache=None) -> None:
        self._batch = batch_view
        self._out = {}
        kw = {"use_cache": False} if cache is None else {"use_cache": True, _cache_kwarg(base_model(self.model)): cache}
        try:
            base_model(self.model)(**inputs, **kw)
        except _StopForward:
            pass
        finally:
            self._batch = None

    def _forward(self, inputs: dict, batch_view: dict, cache=None) -> tuple[torch.Tensor, torch.Tensor]:
        self._run(inputs, batch_view, cache)
        missing = [i for i in self.layer_indices if i not in self._out]
        if missing:
            raise RuntimeError(f"extraction: hooks on layers {missing} did not fire")
        feats = torch.stack([self._out[i][0] for i in self.layer_indices], dim=1)
        coll = torch.stack([self._out[i][1] for i in self.layer_indices], dim=1)
        return feats, coll

    def _image_outputs(self, vision, batch: dict, a: int, b: int) -> dict:
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        index = batch["images"]["index_list"]
        return {"image": BaseModelOutputWithPooling(pooler_output=tuple(vision[i] for i in index[a:b]))}

    def _plain_chunk(self, batch: dict, pool: torch.Tensor, vision, a: int, b: int):
        """Rows ``a:b`` forwarded whole (padded to the chunk's longest row)."""
        t = max(batch["seq_len_list"][a:b])
        inputs = {k: v[a:b, :t] for k, v in batch["inputs"].items() if k != "image_grid_thw"}
        if vision is not None:
            inputs["image_grid_thw"] = batch["inputs"]["image_grid_thw"][a:b]
            inputs["mm_encoder_outputs"] = self._image_outputs(vision, batch, a, b)
        return self._forward(inputs, {"pool": pool[a:b, :, :t], "prompt_mask": batch["prompt_mask"][a:b, :t]})

    def _prefix_group(self, batch: dict, pool: torch.Tensor, vision, a: int, b: int, p: int):
        """One step group (rows ``a:b``) with its shared prefix of ``p`` tokens forwarded once.

        The positions of every row are computed on the full rows (Qwen2.5-VL's ``get_rope_index``:
        3-D M-RoPE positions, whose text positions after an image depend on the image grid) and
        sliced for the prefix and the suffixes; a text-only model's positions continue at ``p``.
        The prefix's key/value cache (one row) is expanded to each suffix chunk's rows.
        """
        from transformers import DynamicCache

        inputs = batch["inputs"]
        lens = batch["seq_len_list"]
        t = max(lens[a:b])
        ids = inputs["input_ids"][a:b, :t]
        mask = inputs["attention_mask"][a:b, :t]
        types = inputs.get("mm_token_type_ids")
        model = base_model(self.model)
        if types is not None:
            pos, _ = model.get_rope_index(ids, types[a:b, :t], image_grid_thw=inputs["image_grid_thw"][a:b],
                                          attention_mask=mask)
        else:
            pos = torch.arange(t, device=ids.device).unsqueeze(0).expand(b - a, -1)
        has_image = types is not None and vision is not None
        prefix_has_image = has_image and bool((types[a, :p] != 0).any())
        pre = {"input_ids": ids[:1, :p], "attention_mask": mask[:1, :p], "position_ids": pos[..., :1, :p]}
        if prefix_has_image:
            pre["mm_encoder_outputs"] = self._image_outputs(vision, batch, a, a + 1)
        cache = DynamicCache()
        self._prefix_states = {}
        self._run(pre, {"mode": "prefix"}, cache)
        kv = [(layer.keys, layer.values) if getattr(layer, "is_initialized", False) else (None, None)
              for layer in cache.layers]
        out = []
        try:
            for c in range(a, b, self.max_rows):
                d = min(c + self.max_rows, b)
                s = max(lens[c:d]) - p
                suf = {"input_ids": ids[c - a:d - a, p:p + s], "attention_mask": mask[c - a:d - a, :p + s],
                       "position_ids": pos[..., c - a:d - a, p:p + s]}
                if has_image and not prefix_has_image:
                    suf["mm_encoder_outputs"] = self._image_outputs(vision, batch, c, d)
                n = d - c
                chunk_cache = DynamicCache(ddp_cache_data=[
                    (k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) if k is not None else (None, None)
                    for k, v in kv])
                out.append(self._forward(suf, {"mode": "suffix", "pool": pool[c:d, :, :p + s],
                                                "prompt_mask": batch["prompt_mask"][c:d, :p + s]}, chunk_cache))
        finally:
            self._prefix_states = {}
        return out

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
                # Each distinct screenshot through the vision tower once, for all rows showing it.
                vision = base_model(self.model).get_image_features(
                    images["pixel_values"], images["image_grid_thw"], return_dict=True).pooler_output
            lens = batch["seq_len_list"]
            parts: list[tuple[torch.Tensor, torch.Tensor]] = []
            plain: list[int] = []  # consecutive rows forwarded whole, in chunks of max_rows

            def flush():
                for a in range(0, len(plain), self.max_rows):
                    chunk = plain[a:a + self.max_rows]  # consecutive rows
                    parts.append(self._plain_chunk(batch, pool, vision, chunk[0], chunk[-1] + 1))
                plain.clear()

            start = 0
            for size in batch.get("group_sizes") or [len(lens)]:
                a, b = start, start + size
                start = b
                p = planned_prefix_len(batch, a, b, self.prefix_reuse)
                self.prefix_stats["groups"] += 1
                self.prefix_stats["positions"] += sum(lens[a:b])
                if p > 0:
                    flush()
                    self.prefix_stats["groups_reused"] += 1
                    self.prefix_stats["positions_forwarded"] += p + sum(lens[a:b]) - (b - a) * p
                    parts.extend(self._prefix_group(batch, pool, vision, a, b, p))
                else:
                    self.prefix_stats["positions_forwarded"] += sum(lens[a:b])
                    plain.extend(range(a, b))
            flush()
            feats = torch.cat([q[0] for q in parts])
            coll = torch.cat([q[1] for q in parts])
        return {
            "row_ids": batch["row_ids"],
            "features": feats.cpu(),
            "collapse": coll.float().cpu(),
            "prompt_len": batch["prompt_len"].cpu(),
            "seq_len": batch["seq_len"].cpu(),
        }


def check_finite(features: torch.Tensor, dtype: torch.dtype, row_ids: list[str],
                 layers: list[int] | None = None, token_groups: list[str] | None = None) -> None:
    """Refuse features that are, or become in ``dtype``, inf or NaN (before a shard is written).

    float16 holds at most 65,504; activations of Qwen2 and Qwen2-VL exceed it (the residual stream
    of later blocks), and a cast turns them into inf. A shard (hence an entry) never holds them.

    Args:
        features: ``[n, L, G, H]`` features as pooled (float32).
        dtype: The cache dtype (``backbone.cache_dtype``).
        row_ids: The n row ids.
        layers: Decoder-block indices of the L axis (for the message), or None.
        token_groups: Names of the G axis (for the message), or None.

    Raises:
        NonFiniteFeatures: One line naming the dtype, the first layer and token group affected,
            a row, the largest magnitude and the remedy.
    """
    cast = features.to(dtype)
    bad = ~torch.isfinite(cast)
    if not bool(bad.any()):
        return
    r, li, gi = (int(x) for x in bad.nonzero()[0][:3])
    layer = layers[li] if layers is not None and li < len(layers) else li
    group = token_groups[gi] if token_groups is not None and gi < len(token_groups) else gi
    finite_before = bool(torch.isfinite(features).all())
    name = str(dtype).removeprefix("torch.")
    peak = float(features[torch.isfinite(features)].abs().max()) if finite_before else float("nan")
    by_layer = sorted({int(x) for x in bad.any(dim=(0, 2, 3)).nonzero().flatten()})
    layer_list = ", ".join(str(layers[i] if layers is not None and i < len(layers) else i) for i in by_layer)
    if finite_before:
        why = (f"hidden states up to {peak:.4g} in absolute value overflow backbone.cache_dtype={name} "
               f"(largest finite {float(torch.finfo(dtype).max):.6g})")
        remedy = "set backbone.cache_dtype=bfloat16 or float32"
    else:
        why = "the forward pass itself produced inf/NaN hidden states"
        remedy = ("run the forward in bf16 or fp32 (extract.precision=bf16-mixed or 32-true; a float16 "
                  "model dtype overflows) and keep backbone.cache_dtype=bfloat16 or float32")
    raise NonFiniteFeatures(
        f"non-finite features at decoder layer {layer} (token group {group}, row {row_ids[r]}; "
        f"layers affected: {layer_list}): {why}; {remedy}. Nothing of these rows was cached")


class ShardWriter(BasePredictionWriter):
    """Streams predict outputs to cache shards (each rank its own), so memory stays flat.

    Args:
        cache: The cache entry to write into.
        shard_rows: Rows per shard.
        dtype: Stored feature dtype (``float16`` | ``bfloat16`` | ``float32``).
        layers: Decoder-block indices of the features' layer axis (named in errors).
        token_groups: Token-group names of the features' group axis (named in errors).

    Raises (from a batch's end):
        NonFiniteFeatures: A feature is inf or NaN after the cast to ``dtype`` (float16 holds
            at most 65,504): nothing of that shard is written, so no entry holds it.
    """

    def __init__(self, cache: ActivationCache, shard_rows: int = 256, dtype: str = "float32",
                 layers: list[int] | None = None, token_groups: list[str] | None = None):
        super().__init__(write_interval="batch")
        self.cache = cache
        self.shard_rows = shard_rows
        self.dtype = getattr(torch, dtype)
        self.layers = layers
        self.token_groups = token_groups
        self._buf: list[dict] = []
        self._n = 0
        self._seq = 0
        self.rows_written = 0

    def _flush(self, rank: int) -> None:
        if not self._buf:
            return
        ids = [r for b in self._buf for r in b["row_ids"]]
        raw = torch.cat([b["features"] for b in self._buf])
        check_finite(raw, self.dtype, ids, self.layers, self.token_groups)
        tensors = {
            "features": raw.to(self.dtype),
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
