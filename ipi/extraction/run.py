"""Extraction orchestration: cache lookup, Lightning predict over missing rows, manifest."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence

import lightning as L
import transformers
from hydra.utils import instantiate

import ipi
from ipi.config import to_container
from ipi.extraction.cache import ActivationCache, FeatureSet, stable_hash
from ipi.extraction.datamodule import ReplayDataModule, ReplayDataset
from ipi.extraction.extractor import HiddenStateExtractor, ShardWriter
from ipi.extraction.rows import ReplayRow, row_fingerprint
from ipi.progress import extraction_callbacks

log = logging.getLogger(__name__)

#: Bumped whenever replay, pooling or the cache layout change the numbers.
EXTRACTION_VERSION = 1


def cache_key(backbone_cfg, rows: Sequence[ReplayRow], layer_indices: Sequence[int],
              token_groups: Sequence[str]) -> tuple[str, dict]:
    """Key of the activation cache entry for these rows, and the spec stored in its manifest.

    The key hashes everything that changes the features: the backbone loader node (model id,
    revision, dtype or tiny config and seed), pixel limits, the system prompt, the resolved layer
    indices, the token groups, the cache dtype and every row's fingerprint (prompt texts,
    screenshot bytes, banner). Device, precision plugin, batch size and workers are left out.

    Args:
        backbone_cfg: The ``backbone`` config node.
        rows: Rows to extract.
        layer_indices: Resolved decoder-block indices.
        token_groups: Token-group names.

    Returns:
        ``(key, spec)``.
    """
    b = to_container(backbone_cfg)
    spec = {
        "extraction_version": EXTRACTION_VERSION,
        "backbone": {k: b[k] for k in ("name", "loader", "image_size", "tokenizer_path", "multimodal")},
        "system_prompt": b["system_prompt"],
        "layers": list(layer_indices),
        "token_groups": list(token_groups),
        "dtype": b["cache_dtype"],
    }
    fps = [row_fingerprint(r, b["system_prompt"], b["multimodal"]) for r in rows]
    key = stable_hash({**spec, "rows": fps})
    manifest_spec = {
        **spec,
        "versions": {"ipi": ipi.__version__, "transformers": transformers.__version__,
                     "lightning": L.__version__},
    }
    return key, manifest_spec


def extract_features(cfg, rows: Sequence[ReplayRow], layer_indices: Sequence[int],
                     token_groups: Sequence[str]) -> tuple[FeatureSet, dict]:
    """Return features for ``rows``, running the backbone only for rows the cache lacks.

    Args:
        cfg: The run config (``backbone``, ``extract``, ``quiet`` are read).
        rows: Rows to extract (one surface or several).
        layer_indices: Decoder blocks to read.
        token_groups: Token groups to pool.

    Returns:
        ``(features, info)`` with info ``{"cache_key", "cache_dir", "cache_hit", "rows_forwarded",
        "cache_bytes"}``.

    Raises:
        ValueError: The loaded model's depth differs from ``backbone.n_layers``.
    """
    key, spec = cache_key(cfg.backbone, rows, layer_indices, token_groups)
    cache = ActivationCache(cfg.extract.cache_dir, key, spec)
    row_ids = [r.row_id for r in rows]
    if cfg.extract.force and cache.dir.exists():
        shutil.rmtree(cache.dir)
    hit = cache.is_complete()
    forwarded = 0
    if not hit:
        done = cache.finished_row_ids()
        todo = [r for r in rows if r.row_id not in done]
        log.info("extraction: %d rows to forward (%d already in finished shards)", len(todo), len(done))
        if todo:
            backbone = instantiate(cfg.backbone.loader)
            if backbone.n_layers != cfg.backbone.n_layers:
                raise ValueError(
                    f"backbone={cfg.backbone.name}: model has {backbone.n_layers} decoder layers, "
                    f"config says n_layers={cfg.backbone.n_layers}"
                )
            dataset = ReplayDataset(todo, backbone.processor, cfg.backbone.system_prompt,
                                    backbone.multimodal, backbone.image_size, backbone.image_token_id)
            tok = backbone.tokenizer
            pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
            dm = ReplayDataModule(dataset, pad, batch_size=cfg.backbone.batch_size,
                                  num_workers=cfg.extract.num_workers)
            writer = ShardWriter(cache, shard_rows=cfg.extract.shard_rows, dtype=cfg.backbone.cache_dtype)
            bars = extraction_callbacks(True if cfg.quiet else None)  # RichProgressBar with ETA
            trainer = L.Trainer(
                accelerator=cfg.extract.accelerator, devices=cfg.extract.devices,
                strategy=cfg.extract.strategy, precision=cfg.extract.precision,
                callbacks=[writer, *bars], logger=False, enable_checkpointing=False,
                enable_model_summary=False, enable_progress_bar=bool(bars),
            )
            trainer.predict(HiddenStateExtractor(backbone, layer_indices, token_groups),
                            datamodule=dm, return_predictions=False)
            forwarded = len(todo)
            if trainer.world_size > 1 and trainer.global_rank != 0:
                return None, {"rank": trainer.global_rank}
        cache.finalize(row_ids)
    features = cache.load(row_ids)
    info = {
        "cache_key": key,
        "cache_dir": str(cache.dir),
        "cache_hit": hit,
        "rows_forwarded": forwarded,
        "cache_bytes": sum(p.stat().st_size for p in cache.shard_paths()),
    }
    return features, info
