"""Attention-focus detector (the Attention Tracker idea, Hung et al. 2024, arXiv:2411.00348).

From the teacher-forced forward (docs/replay.md) we read, for chosen layers and every head, the
attention of the **last prompt token** summed over each token group:
``a[l, h, g] = Σ_{t ∈ g} softmax_t(q_last · k_t)``.

Extraction (:class:`AttentionFocusExtractor`): forward pre-hooks recompute that one query row
from the attention modules' inputs (:func:`last_token_attention`), so no attention matrix is
materialised; the cache entry (``[N, L, G, heads]``, its own key) lives beside the hidden-state
entries.

Features (:func:`focus_ratios`): ``r = a_task / (a_task + a_untrusted)`` per layer and head, with
``untrusted`` the surface's ``untrusted_group``. Detector (:class:`AttentionFocusDetector`):
score ``= −mean(r over the top_k heads chosen on training rows)``."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from hydra.utils import instantiate

from ipi.detectors.detector import check_fit_inputs
from ipi.extraction.activation_cache import ActivationCache, stable_hash
from ipi.extraction.extractor import HiddenStateExtractor, ShardWriter, _StopForward
from ipi.extraction.forward import ExtractSettings, cache_key, feature_precision, predict_rows
from ipi.protocol import TOKEN_GROUPS
from ipi.surfaces.registry import get_surface, surface_names

log = logging.getLogger(__name__)

__all__ = ["AttentionFocusDetector", "AttentionFocusExtractor", "extract_attention", "focus_ratios",
           "last_token_attention", "untrusted_groups"]


def untrusted_groups() -> dict[str, str]:
    """The token group holding the untrusted content of each surface that ships (docs/replay.md).

    A surface from elsewhere declares its own (``untrusted_group``); :func:`focus_ratios` reads it.
    """
    return {name: get_surface(name).untrusted_group for name in surface_names()}


#: Bumped whenever the attention features change.
ATTENTION_VERSION = 1


def last_token_attention(module: torch.nn.Module, hidden_states: torch.Tensor, position_embeddings,
                         last: torch.Tensor) -> torch.Tensor:
    """Attention weights of one query position per row, recomputed from an attention module's inputs.

    Exactly the causal softmax the module computes for that query (same projections, rotary
    embedding, ``scaling`` and grouped-query expansion), over keys ``0..last[b]``.

    Args:
        module: A transformers decoder attention module (``q_proj``, ``k_proj``, ``head_dim``,
            ``scaling``, ``num_key_value_groups``; its modeling module's ``apply_rotary_pos_emb``).
        hidden_states: ``[B, T, H]`` the module's input (after the layer's input norm).
        position_embeddings: ``(cos, sin)`` the model passes to the module.
        last: ``[B]`` query position per row (right-padded rows: every key ``<= last`` is real).

    Returns:
        ``[B, heads, T]`` float32 weights (zero on keys after ``last[b]``; rows sum to 1).
    """
    b, t, _ = hidden_states.shape
    hd = module.head_dim
    q = module.q_proj(hidden_states).view(b, t, -1, hd).transpose(1, 2)
    k = module.k_proj(hidden_states).view(b, t, -1, hd).transpose(1, 2)
    cos, sin = position_embeddings
    rope = sys.modules[type(module).__module__].apply_rotary_pos_emb
    q, k = rope(q, k, cos, sin)
    rows = torch.arange(b, device=q.device)
    q_last = q[rows, :, last.to(q.device)].float()  # [B, heads, hd]
    k = k.float()
    n_rep = q_last.shape[1] // k.shape[1]
    if n_rep > 1:
        k = k.repeat_interleave(n_rep, dim=1)
    logits = torch.einsum("bhd,bhtd->bht", q_last, k) * float(module.scaling)
    future = torch.arange(t, device=q.device)[None, :] > last.to(q.device)[:, None]  # [B, T]
    logits = logits.masked_fill(future[:, None, :], float("-inf"))
    return torch.softmax(logits, dim=-1)


class AttentionFocusExtractor(HiddenStateExtractor):
    """Predict module returning the last prompt token's attention mass on every token group.

    Same batches, step grouping and early stop as :class:`ipi.extraction.HiddenStateExtractor`;
    hooks sit on the chosen layers' ``self_attn`` modules (forward pre-hooks) instead of the
    blocks' outputs. ``predict_step`` returns ``features [B, L, G, heads]`` (G = all of
    ``TOKEN_GROUPS``) and ``collapse`` filled with NaN (not computed here).
    """

    def __init__(self, backbone, layer_indices: Sequence[int], max_rows: int = 8):
        super().__init__(backbone, layer_indices, list(TOKEN_GROUPS), max_rows=max_rows)
        self._last_idx = TOKEN_GROUPS.index("last_prompt")

    def _hook(self, layer_idx: int):
        deepest = max(self.layer_indices)

        def hook(module, args, kwargs):
            batch = self._batch
            if batch is None:
                return None
            h = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            pool = batch["pool"].to(h.device)  # [B, G, T]
            last = pool[:, self._last_idx].argmax(dim=-1)  # the one last-prompt token
            attn = last_token_attention(module, h, kwargs["position_embeddings"], last)  # [B, heads, T]
            member = (pool > 0).float()
            mass = torch.einsum("bht,bgt->bgh", attn, member)  # [B, G, heads]
            self._out[layer_idx] = (mass, torch.full((h.shape[0],), float("nan"), device=h.device))
            if layer_idx == deepest:
                raise _StopForward
            return None

        return hook

    def on_predict_start(self) -> None:
        self._handles = [self._layers[i].self_attn.register_forward_pre_hook(self._hook(i), with_kwargs=True)
                         for i in self.layer_indices]


def attention_cache_key(settings: ExtractSettings, rows, layers: Sequence[int]) -> tuple[str, dict]:
    """Key of the attention entry: the hidden-state key's inputs plus what this extraction reads."""
    hidden_key, spec = cache_key(settings.backbone, rows, list(layers), list(TOKEN_GROUPS),
                                 feature_precision(settings))
    att = {"kind": "attention_focus", "version": ATTENTION_VERSION, "query": "last_prompt",
           "value": "attention mass per token group [L, G, heads]"}
    return stable_hash({"rows_and_backbone": hidden_key, "attention": att}), {**spec, "attention": att,
                                                                              "dtype": "float32"}


def extract_attention(settings: ExtractSettings, rows, layers: Sequence[int]):
    """Attention masses of ``rows`` at ``layers``, forwarding only rows the cache lacks.

    The entry is keyed by :func:`attention_cache_key` and written through the same shard writer,
    lock and manifest as the hidden-state entries (docs/extraction.md).

    Returns:
        ``(FeatureSet with features [N, L, G, heads], info)``; info as
        :func:`ipi.extraction.forward.extract_features`'s.
"""
    b = settings.backbone
    layers = sorted(set(int(i) for i in layers))
    key, spec = attention_cache_key(settings, rows, layers)
    cache = ActivationCache(settings.cache_dir, key, spec)
    row_ids = [r.row_id for r in rows]
    hit = cache.is_complete() and not settings.force
    forwarded = 0
    if not hit:
        with cache.writer_lock():
            hit = cache.is_complete() and not settings.force
            if not hit:
                done = cache.finished_row_ids()
                todo = [r for r in rows if r.row_id not in done]
                log.info("attention extraction: %d rows to forward", len(todo))
                if todo:
                    backbone = instantiate(b["loader"])
                    writer = ShardWriter(cache, shard_rows=settings.shard_rows, dtype="float32")
                    predict_rows(settings, backbone, todo, AttentionFocusExtractor(backbone, layers,
                                                                                   max_rows=b["batch_size"]),
                                 writer, devices=1, strategy="auto")
                    forwarded = writer.rows_written
                cache.finalize(row_ids)
    feats = cache.load(row_ids)
    info = {"cache_key": key, "cache_dir": str(cache.dir), "cache_hit": hit, "rows_forwarded": forwarded,
            "cache_bytes": sum(p.stat().st_size for p in cache.shard_paths()), "layers": layers}
    return feats, info


def focus_ratios(mass: np.ndarray, surfaces: Sequence[str]) -> np.ndarray:
    """Focus ratio per layer and head, ``a_task / (a_task + a_untrusted)`` (see module docstring).

    Args:
        mass: ``[N, L, G, heads]`` attention masses, G in ``TOKEN_GROUPS`` order.
        surfaces: ``[N]`` each row's surface (picks its ``untrusted_group``, :func:`untrusted_groups`).

    Returns:
        ``[N, L * heads]`` float64, layer-major (column ``l * heads + h``).
    """
    mass = np.asarray(mass, dtype=np.float64)
    task = mass[:, :, TOKEN_GROUPS.index("task"), :]
    gi = np.array([TOKEN_GROUPS.index(get_surface(str(s)).untrusted_group) for s in surfaces])
    untrusted = mass[np.arange(len(gi)), :, gi, :]  # [N, L, heads]
    r = task / (task + untrusted + 1e-12)  # a row with no mass on either span has ratio 0
    return r.reshape(r.shape[0], -1)


@dataclass
class AttentionFocusDetector:
    """Heads chosen on training rows, score = −mean focus ratio of the chosen heads.

    Fit: for every (layer, head) column of :func:`focus_ratios`, the AUC of ``−r`` for attack vs
    clean on the **training rows** (scikit-learn ``roc_auc_score``); the ``top_k`` columns with
    the highest AUC are chosen (ties to the lower column index). Test rows are never seen.

    Args:
        top_k: Heads combined.
        layers: Decoder blocks whose attention is read (fractions in (0, 1] or indices, as
            ``layers.spec``); None = the run's ``layers``.
    """

    top_k: int
    layers: list | None = None
    name: str = "attention_focus"
    permutation_m: int | None = None  # check 4's refits M; None: evaluation.permutation.m
    input: str = "attention"
    trainable: bool = True
    n_heads: int | None = None
    layer_indices: list | None = None
    heads_: np.ndarray | None = field(default=None, repr=False)
    train_auc_: np.ndarray | None = field(default=None, repr=False)

    def fit(self, x, y, groups) -> AttentionFocusDetector:
        from sklearn.metrics import roc_auc_score

        x, y = check_fit_inputs(x, y, groups, self.name)
        auc = np.array([roc_auc_score(y, -x[:, j]) for j in range(x.shape[1])])
        k = min(int(self.top_k), x.shape[1])
        order = np.lexsort((np.arange(len(auc)), -auc))  # highest AUC first, then lower index
        return replace(self, heads_=np.sort(order[:k]), train_auc_=auc)

    def score(self, x) -> np.ndarray:
        if self.heads_ is None:
            raise RuntimeError("AttentionFocusDetector.score before fit")
        return -np.asarray(x, dtype=np.float64)[:, self.heads_].mean(axis=1)

    def chosen_heads(self) -> list[dict]:
        """The chosen ``(layer, head)`` pairs with their training AUC (needs ``layer_indices``, ``n_heads``)."""
        out = []
        for j in (self.heads_ if self.heads_ is not None else []):
            rec = {"column": int(j), "train_auc": float(self.train_auc_[j])}
            if self.n_heads:
                rec["layer"] = int(self.layer_indices[j // self.n_heads]) if self.layer_indices else int(j // self.n_heads)
                rec["head"] = int(j % self.n_heads)
            out.append(rec)
        return out

    def settings(self) -> dict:
        return {"name": self.name, "top_k": self.top_k, "layers": self.layer_indices,
                "query": "last prompt token", "ratio": "a_task / (a_task + a_untrusted)",
                "untrusted": untrusted_groups(), "selection": "top_k heads by training AUC of -ratio",
                "score": "-mean ratio over chosen heads"}
