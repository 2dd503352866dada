"""Extraction orchestration: cache lookup, Lightning predict over missing rows, manifest."""

from __future__ import annotations

import functools
import logging
import shutil
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import lightning as L
import safetensors
import torch
import transformers
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf

import ipi
from ipi.backbone import build_kwargs
from ipi.extraction.activation_cache import (
    ActivationCache,
    FeatureSet,
    content_addressed,
    keyed_form,
    stable_hash,
)
from ipi.extraction.datamodule import ReplayDataModule, StepGroupDataset
from ipi.extraction.extractor import HiddenStateExtractor, ShardWriter
from ipi.extraction.rows import ReplayRow, row_fingerprint
from ipi.progress import extraction_callbacks
from ipi.protocol import resolve_layers

log = logging.getLogger(__name__)

#: Bumped whenever replay, pooling or the cache layout change the numbers (versions: docs/extraction.md).
EXTRACTION_VERSION = 2


@dataclass(frozen=True)
class ExtractSettings:
    """What an extraction reads: the backbone node as plain data and the ``extract.*`` runtime.

    Built once from the run config by :func:`ipi.run.settings.extract_settings`; the defaults
    are the schema's (:class:`ipi.run.schemas.ExtractConf`, :class:`ipi.run.schemas.BackboneConf`).

    Attributes:
        backbone: The ``backbone`` node resolved to plain data (``name``, ``loader``, ``n_layers``,
            ``system_prompt``, ``batch_size``, ``cache_dtype``, ...); the cache key hashes part
            of it (:func:`cache_key`).
        cache_dir: Root folder of the activation cache.
        layers: ``extract.layers``: the layer superset every extraction reads (fractions,
            indices or ``["all"]``; empty: only the requested layers).
        force: Ignore an existing cache entry and extract again.
        num_workers: DataLoader workers (``"auto"`` or an integer, :func:`resolve_num_workers`).
        shard_rows: Rows per cache shard.
        accelerator, devices, strategy, precision: Lightning ``Trainer`` settings of the forward.
        prefix_reuse: ``auto`` | ``true`` | ``false`` (docs/extraction.md).
        quiet: Hide the progress bars (else: auto, shown on a terminal).
        twins_per_pass: ``extract.twins_per_pass``: random-weight twins forwarded on one data
            pass (:func:`ipi.extraction.twin_pass.twins_per_pass`).
        over_context: ``extract.over_context``: ``skip`` | ``error`` for a step whose prompt is
            longer than the backbone's context (checked when rows are built, before any forward:
            :func:`ipi.run.stages.check_context`).
    """

    backbone: Mapping[str, Any]
    cache_dir: str
    layers: tuple
    force: bool
    num_workers: Any
    shard_rows: int
    accelerator: str
    devices: Any
    strategy: str
    precision: str
    prefix_reuse: Any
    quiet: bool
    over_context: str
    twins_per_pass: Any = "auto"


def _plain(node) -> Any:
    """An OmegaConf node as plain Python (resolved, enums as values); anything else as it is."""
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    return node


def extraction_layers(settings: ExtractSettings, requested: Sequence[int]) -> list[int]:
    """Decoder blocks an extraction reads: the ``extract.layers`` superset plus ``requested``.

    Every run extracts (and keys its cache entry on) the same superset, so a sweep over layer
    subsets of it (``layers=six_1,...,six_6``) reuses one entry; a requested layer outside the
    superset is added (and then makes its own entry).

    Args:
        settings: The extraction's settings (``layers``, ``backbone["n_layers"]``).
        requested: Blocks the run needs.

    Returns:
        Sorted unique block indices.
    """
    spec = list(settings.layers or [])
    n = settings.backbone["n_layers"]
    base = resolve_layers(spec, n) if spec else []
    return sorted(set(base) | set(int(i) for i in requested))


def cpu_supports_bf16() -> bool:
    """Whether this CPU computes bf16 natively (oneDNN's AVX512-BF16 / AMX check)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _uses_gpu(accelerator: str) -> bool:
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def resolve_precision(precision: str, accelerator: str = "auto") -> str:
    """The Lightning precision plugin of an extraction.

    ``auto`` -> ``bf16-mixed`` on a CUDA device that supports bf16, else ``32-true`` (bf16 is
    never chosen for a CPU). An explicit bf16 precision on a CPU run is refused when the CPU
    lacks bf16 support (it would be emulated: slower than fp32 and less exact).

    Raises:
        ValueError: bf16 asked for a CPU run on a CPU without bf16 support.
    """
    if precision == "auto":
        return "bf16-mixed" if _uses_gpu(accelerator) and torch.cuda.is_bf16_supported() else "32-true"
    if "bf16" in str(precision) and not _uses_gpu(accelerator) and not cpu_supports_bf16():
        raise ValueError(f"extract.precision={precision}: this CPU has no bf16 support (runs on the CPU, "
                         "extract.accelerator=" f"{accelerator}); use extract.precision=32-true or auto")
    return precision


def resolve_num_workers(num_workers, accelerator: str = "auto", cpu_count: int | None = None) -> int:
    """``extract.num_workers``: ``auto`` -> 0 on a CPU run, ``min(8, cores - 1)`` when a GPU extracts.

    On a CPU the cores run the forward pass, so preparing batches in workers only competes with
    it; with a GPU the CPU preparation (screenshot decoding, banner drawing, image processing,
    tokenising) runs in workers ahead of the device so that it is not left waiting.

    Raises:
        ValueError: Neither ``auto`` nor a non-negative integer.
    """
    import os

    if num_workers == "auto":
        if not _uses_gpu(accelerator):
            return 0
        cores = cpu_count if cpu_count is not None else (len(os.sched_getaffinity(0))
                                                          if hasattr(os, "sched_getaffinity") else os.cpu_count())
        return max(0, min(8, int(cores or 1) - 1))
    try:
        n = int(num_workers)
    except (TypeError, ValueError):
        n = -1
    if n < 0 or str(n) != str(num_workers).strip():
        raise ValueError(f"extract.num_workers={num_workers!r}: give 'auto' or a non-negative integer")
    return n


#: The image-processor backend every cache entry was built with before the backend entered the
#: key: transformers' default when torchvision is installed (as in this project's environment).
#: An entry built with it keeps its key; any other backend adds ``image_processor_backend``.
DEFAULT_IMAGE_BACKEND = "torchvision"


@functools.lru_cache(maxsize=8)
def _backend_of(path: str, content: str, kwargs: tuple) -> str:
    try:
        from transformers import AutoImageProcessor

        proc = AutoImageProcessor.from_pretrained(path, **dict(kwargs))
    except (OSError, ValueError, ImportError) as e:  # not available offline: transformers' own rule
        from transformers.utils import is_torchvision_available

        log.debug("image processor of %s not loadable (%s); backend from transformers' default rule", path, e)
        return "torchvision" if is_torchvision_available() else "pil"
    backend = getattr(proc, "backend", None)
    if backend is None:  # a transformers without named backends: the "Fast" classes use torchvision
        backend = "torchvision" if type(proc).__name__.endswith("Fast") else "pil"
    return str(backend)


def image_processor_backend(backbone_cfg) -> str | None:
    """The backend of the image processor the extraction will use (``"torchvision"`` or ``"pil"``).

    transformers picks torchvision when it is installed, else PIL; the two resize and normalise
    differently (pixel values differ by up to 0.015), so the features differ. Resolved the way
    the backbone's processor is loaded (``AutoImageProcessor`` on the processor folder or hub id,
    with the loader's revision and offline settings); None for a text-only backbone.

    Args:
        backbone_cfg: The ``backbone`` config node (or its container).

    Returns:
        The backend name, or None.
    """
    b = _plain(backbone_cfg)
    if not b["multimodal"]:
        return None
    loader = b.get("loader") or {}
    path = str(loader.get("processor_path") or loader.get("model_id") or b.get("tokenizer_path"))
    kwargs = tuple(sorted((k, loader[k]) for k in ("revision", "trust_remote_code", "local_files_only")
                          if loader.get(k) is not None))
    return _backend_of(path, str(content_addressed(path)), kwargs)


def feature_precision(settings: ExtractSettings) -> str | None:
    """The forward's precision plugin when it changes the features beyond float rounding, else None.

    ``32-true`` (and any 32- or 64-bit plugin) gives the float32 features every existing key holds:
    None. A 16-bit plugin (``bf16-mixed``, ``bf16-true``, ``16-mixed``; ``auto`` on a bf16 GPU) rounds
    every matmul to 8 mantissa bits: its name, which enters :func:`cache_key`.

    Raises:
        ValueError: As :func:`resolve_precision`.
    """
    p = str(resolve_precision(settings.precision, settings.accelerator))
    return None if p.startswith(("32", "64")) else p


def cache_key(backbone_cfg, rows: Sequence[ReplayRow], layer_indices: Sequence[int],
              token_groups: Sequence[str], precision: str | None = None) -> tuple[str, dict]:
    """Key of the activation cache entry for these rows, and the spec stored in its manifest.

    The key hashes everything that changes the features: the backbone loader node (model id,
    revision, dtype or tiny config and seed), pixel limits, the system prompt, the resolved layer
    indices, the token groups, the cache dtype, the image-processor backend when it is not
    :data:`DEFAULT_IMAGE_BACKEND` (:func:`image_processor_backend`; PIL and torchvision give other
    pixel values), every row's fingerprint (prompt texts, screenshot bytes, banner) and a 16-bit
    precision plugin (:func:`feature_precision`; a 32-bit one keeps the key). Device, batch size and
    workers are left out.
    Local paths in the backbone node enter by content (:func:`ipi.extraction.activation_cache.
    content_addressed`), so moving the data or the checkout keeps the key.

    Args:
        backbone_cfg: The ``backbone`` config node, or it as plain data (:attr:`ExtractSettings.backbone`).
        rows: Rows to extract.
        layer_indices: Resolved decoder-block indices.
        token_groups: Token-group names.
        precision: :func:`feature_precision` of the extraction (None: 32-bit features).

    Returns:
        ``(key, spec)``.
    """
    b = _plain(backbone_cfg)
    spec = {
        "extraction_version": EXTRACTION_VERSION,
        "backbone": {k: b[k] for k in ("name", "loader", "image_size", "tokenizer_path", "multimodal")},
        "system_prompt": b["system_prompt"],
        "layers": list(layer_indices),
        "token_groups": list(token_groups),
        "dtype": b["cache_dtype"],
    }
    backend = image_processor_backend(b)
    if backend not in (None, DEFAULT_IMAGE_BACKEND):  # the default keeps every existing key
        spec["image_processor_backend"] = backend
    if precision is not None:  # 32-bit features keep every existing key
        spec["precision"] = precision
    fps = [row_fingerprint(r, b["system_prompt"], b["multimodal"]) for r in rows]
    # Local paths (processor files, GGUF folder, checkpoint) enter the key by content, not by
    # location; the manifest keeps the paths as given.
    key = stable_hash({**keyed_form(spec), "rows": fps})
    manifest_spec = {
        **spec,
        "versions": {"ipi": ipi.__version__, "transformers": transformers.__version__,
                     "lightning": L.__version__, "torch": torch.__version__,
                     "safetensors": safetensors.__version__},
        "n_rows": len(rows),
    }
    return key, manifest_spec


TRANSFER_VARIANTS = ("clean", "attack")


def transfer_rows(settings: ExtractSettings, rows: Sequence[ReplayRow], layer_indices: Sequence[int],
                  token_groups: Sequence[str]) -> tuple[list[ReplayRow], str]:
    """Rows of a transfer source surface to extract (PROTOCOL.md §6; docs/extraction.md).

    The transfer probe trains on the source surface's clean and attack rows only. If the
    source surface's own entry (all its variants, exactly the rows of a run on that surface) is
    already complete in the cache, it is read (``"shared"``: nothing is forwarded); otherwise
    only the clean and attack rows are extracted, into their own entry (``"clean_attack"``:
    2 of every 5 rows of the surface).

    Args:
        settings: The extraction's settings.
        rows: All rows of the source surface (:func:`ipi.run.stages.make_rows` for that surface).
        layer_indices: Decoder blocks the run needs.
        token_groups: Token groups pooled.

    Returns:
        ``(rows to extract, "shared" | "clean_attack")``.
    """
    layers = extraction_layers(settings, layer_indices)
    key, spec = cache_key(settings.backbone, rows, layers, token_groups, feature_precision(settings))
    if not settings.force and ActivationCache(settings.cache_dir, key, spec).is_complete():
        return list(rows), "shared"
    return [r for r in rows if r.variant.variant in TRANSFER_VARIANTS], "clean_attack"


def extract_features(settings: ExtractSettings, rows: Sequence[ReplayRow], layer_indices: Sequence[int],
                     token_groups: Sequence[str], *, backbone=None,
                     exact_layers: bool = False) -> tuple[FeatureSet | None, dict]:
    """Return features for ``rows``, running the backbone only for rows the cache lacks.

    The layers read are :func:`extraction_layers` (the ``extract.layers`` superset plus
    ``layer_indices``); callers select their layers from the returned set. Under DDP each rank
    forwards its share of the step groups and writes its own shards; rank 0 waits for all ranks,
    checks the shards and writes the manifest (duplicate rows from the sampler's padding are
    counted and ignored), then loads. Other ranks return ``(None, {"rank": r})``.

    Args:
        settings: The extraction's settings (:class:`ExtractSettings`).
        rows: Rows to extract (one surface or several).
        layer_indices: Decoder blocks the caller needs.
        token_groups: Token groups to pool.
        backbone: An already built :class:`ipi.backbone.Backbone` of ``settings.backbone`` to use
            instead of building one (the benchmark times start-up apart from steady state);
            None: built from ``settings.backbone["loader"]`` only when rows must be forwarded.
        exact_layers: Read exactly ``layer_indices`` (sorted), not the ``extract.layers``
            superset (:func:`ipi.extraction.twin_pass.twin_layers`: a random twin reads only
            what the probe reads).

    Returns:
        ``(features, info)`` with info ``{"cache_key", "cache_dir", "cache_hit", "rows_forwarded",
        "cache_bytes", "layers"}``.

    Raises:
        ValueError: The loaded model's depth differs from ``backbone.n_layers``.
    """
    layers = sorted({int(i) for i in layer_indices}) if exact_layers else extraction_layers(settings, layer_indices)
    key, spec = cache_key(settings.backbone, rows, layers, token_groups, feature_precision(settings))
    cache = ActivationCache(settings.cache_dir, key, spec)
    row_ids = [r.row_id for r in rows]
    hit = cache.is_complete() and not settings.force
    forwarded, waited = 0, 0.0
    if not hit:
        # One writer per entry: a concurrent run for the same entry waits here, then reads.
        # DDP ranks other than 0 (started by Lightning inside predict) never take the lock.
        with (cache.writer_lock() if _rank_zero_env() else nullcontext(0.0)) as waited:
            if settings.force and cache.dir.exists() and _rank_zero_env():
                shutil.rmtree(cache.dir)
            hit = cache.is_complete()  # another run may have finished it while we waited
            if not hit:
                forwarded = _forward_missing(settings, cache, rows, layers, token_groups, backbone)
                if forwarded is None or isinstance(forwarded, dict):  # a non-zero DDP rank
                    return None, forwarded
                cache.finalize(row_ids)
    features = cache.load(row_ids)
    info = {
        "cache_key": key,
        "cache_dir": str(cache.dir),
        "cache_hit": hit,
        "rows_forwarded": forwarded,
        "lock_wait_s": round(waited, 2),
        "cache_bytes": sum(p.stat().st_size for p in cache.shard_paths()),
        "layers": layers,
    }
    return features, info


def predict_rows(settings: ExtractSettings, backbone, rows: Sequence[ReplayRow], module: L.LightningModule,
                 writer: ShardWriter, *, devices, strategy: str) -> L.Trainer:
    """Forward ``rows`` through ``module`` (a predict-step extractor over ``backbone``) into ``writer``.

    The rows are replayed in step groups (:class:`StepGroupDataset`), batched so that about
    ``backbone.batch_size`` rows go through one forward, and predicted by one ``Trainer`` with the
    writer and the progress bars (rows, elapsed, ETA) as callbacks.

    Returns:
        The trainer (its ``world_size`` and ``global_rank`` tell a DDP caller which rank it is).
    """
    b = settings.backbone
    dataset = StepGroupDataset(rows, backbone.processor, b["system_prompt"],
                               backbone.multimodal, backbone.image_size, backbone.image_token_id)
    per_step = max(len(g) for g in dataset.groups)
    dm = ReplayDataModule(dataset, backbone.pad_token_id, batch_size=max(1, b["batch_size"] // per_step),
                          num_workers=resolve_num_workers(settings.num_workers, settings.accelerator))
    bars = extraction_callbacks(True if settings.quiet else None, total_rows=len(rows))
    trainer = L.Trainer(
        accelerator=settings.accelerator, devices=devices, strategy=strategy,
        precision=resolve_precision(settings.precision, settings.accelerator),
        callbacks=[writer, *bars], logger=False, enable_checkpointing=False,
        enable_model_summary=False, enable_progress_bar=False,
    )
    trainer.predict(module, datamodule=dm, return_predictions=False)
    return trainer


def _built(b: Mapping[str, Any], max_layer: int, backbone=None):
    """``backbone``, or one built for this extraction (no LM head, no blocks above ``max_layer``).

    Raises:
        ValueError: The model's depth differs from ``backbone.n_layers``.
    """
    if backbone is None:
        backbone = instantiate(b["loader"], **build_kwargs(b["loader"], max_layer=max_layer))
    if backbone.n_layers != b["n_layers"]:
        raise ValueError(f"backbone={b['name']}: model has {backbone.n_layers} decoder layers, "
                         f"config says n_layers={b['n_layers']}")
    return backbone


def _forward_missing(settings: ExtractSettings, cache: ActivationCache, rows: Sequence[ReplayRow], layers: list[int],
                     token_groups: Sequence[str], backbone=None) -> int | dict:
    """Forward the rows that finished shards lack; return how many (a dict on a non-zero DDP rank)."""
    b = settings.backbone
    done = cache.finished_row_ids()
    todo = [r for r in rows if r.row_id not in done]
    twin = b["loader"].get("random_init_seed")
    which = f"{b['name']}" + (f", random-weight twin seed {twin}" if twin is not None else "")
    log.info("extraction (%s): %d rows to forward (%d already in finished shards)", which, len(todo), len(done))
    if not todo:
        return 0
    backbone = _built(b, max(layers), backbone)
    writer = ShardWriter(cache, shard_rows=settings.shard_rows, dtype=b["cache_dtype"],
                         layers=list(layers), token_groups=list(token_groups))
    module = HiddenStateExtractor(backbone, layers, token_groups, max_rows=b["batch_size"],
                                  prefix_reuse=settings.prefix_reuse)
    trainer = predict_rows(settings, backbone, todo, module, writer, devices=settings.devices,
                           strategy=settings.strategy)
    forwarded = writer.rows_written
    if trainer.world_size > 1:
        # All ranks passed the writer's barrier: every shard is on disk. Leave the process
        # group so that later single-process steps (the probe's metrics) do not try to
        # synchronise with ranks that have returned.
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        if trainer.global_rank != 0:
            return {"rank": trainer.global_rank, "rows_forwarded": forwarded}
        forwarded = len(todo)  # all ranks together (rank 0 wrote only its share)
    # Release the model before the next extraction (the random twin) builds its own: the Trainer
    # and the module reference each other (a cycle only the collector frees), so the module lets
    # go of the model and the model is freed here by reference counting when this function
    # built it (a caller's backbone stays the caller's).
    module.release_backbone()
    del trainer, module, backbone
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return forwarded


def _rank_zero_env() -> bool:
    import os

    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"
