"""The random-weight twins' features in one data pass (verdict check 6).

Check 6 forwards the run's own rows through S twins (:mod:`ipi.run.twin`). Done one twin at a time,
every twin repeats the whole data side of an extraction: reading the screenshots, drawing the
banners, the image processor, tokenising every row, building the pooling matrices. Here that
is done **once**: one :class:`~ipi.extraction.datamodule.StepGroupDataset` over the rows, and
each batch is forwarded through every twin of the pass (:class:`TwinPassExtractor`) before the
next batch is prepared; each twin's pooled features go to its own cache entry
(:class:`TwinShardWriter`), exactly the entry, shards and manifest a separate extraction of
that twin would write (same key, same rows, same features; tested).

Each twin reads only the decoder blocks the probe reads (:func:`twin_layers`) and is built
without the blocks above the deepest one (``max_layer``), so a probe on an early layer pays for
those layers only; an existing entry of the ``extract.layers`` superset (e.g. filled by
``extract.py`` for a layer sweep) is read instead when it is complete.

How many twins share one pass is ``extract.twins_per_pass`` (``auto``: all of them on a CPU;
on a GPU as many as fit in 70 % of the free device memory, measured on the first twin built).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from contextlib import ExitStack

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from ipi.extraction.activation_cache import ActivationCache, FeatureSet
from ipi.extraction.extractor import HiddenStateExtractor, ShardWriter
from ipi.extraction.rows import ReplayRow
from ipi.extraction.forward import (
    ExtractSettings,
    _built,
    _rank_zero_env,
    _uses_gpu,
    cache_key,
    extract_features,
    extraction_layers,
    feature_precision,
    predict_rows,
)

log = logging.getLogger(__name__)

__all__ = ["TwinPassExtractor", "TwinShardWriter", "extract_twin_features", "twin_layers", "twins_per_pass"]


def twin_layers(settings: ExtractSettings, rows: Sequence[ReplayRow], layer_indices: Sequence[int],
                token_groups: Sequence[str], superset: bool = False) -> list[int]:
    """Decoder blocks a random twin of the run reads.

    The probe's own blocks (``layer_indices``), unless the twin's entry of the
    ``extract.layers`` superset (:func:`ipi.extraction.forward.extraction_layers`) is already
    complete in the cache (then it is read: nothing is forwarded), or ``superset`` is asked
    (``extract.py``, which fills the cache for later layer sweeps). When the two sets are equal
    (the default ``layers=six`` with the default superset) the key is the one a twin always had.

    Args:
        settings: The twin's extraction settings (of :func:`ipi.run.twin.twin_config`).
        rows: The run's rows.
        layer_indices: Blocks the probe reads.
        token_groups: Token groups pooled.
        superset: Always read the superset.

    Returns:
        Sorted block indices.
    """
    sup = extraction_layers(settings, layer_indices)
    own = sorted({int(i) for i in layer_indices})
    if superset or sup == own:
        return sup
    key, spec = cache_key(settings.backbone, rows, sup, token_groups, feature_precision(settings))
    if not settings.force and ActivationCache(settings.cache_dir, key, spec).is_complete():
        return sup
    return own


def twins_per_pass(setting, n_twins: int, accelerator: str = "auto", twin_bytes: int | None = None,
                   free_bytes: int | None = None) -> int:
    """``extract.twins_per_pass``: how many twins one data pass forwards.

    Args:
        setting: ``auto`` or a positive integer.
        n_twins: Twins still to extract.
        accelerator: ``extract.accelerator``.
        twin_bytes: Parameter bytes of one twin (``auto`` on a GPU).
        free_bytes: Free device memory (``auto`` on a GPU).

    Returns:
        A number in ``1 .. n_twins`` (``n_twins`` when it is 0).

    Raises:
        ValueError: ``setting`` is neither ``auto`` nor a positive integer.
    """
    if n_twins <= 0:
        return 0
    if setting == "auto":
        if not _uses_gpu(accelerator) or not twin_bytes or free_bytes is None:
            return n_twins
        return max(1, min(n_twins, int(0.7 * free_bytes // twin_bytes)))
    try:
        n = int(setting)
    except (TypeError, ValueError):
        n = 0
    if n < 1 or str(n) != str(setting).strip():
        raise ValueError(f"extract.twins_per_pass={setting!r}: give 'auto' or a positive integer")
    return min(n, n_twins)


class TwinPassExtractor(L.LightningModule):
    """Forwards each batch through several backbones (the twins of one pass).

    Args:
        extractors: ``{seed: HiddenStateExtractor}``, one per twin; children of this module, so
            Lightning places every twin.
    """

    def __init__(self, extractors: dict[int, HiddenStateExtractor]):
        super().__init__()
        self.seeds = [int(s) for s in extractors]
        self.extractors = torch.nn.ModuleDict({str(s): m for s, m in extractors.items()})

    def on_predict_start(self) -> None:
        for m in self.extractors.values():
            m.on_predict_start()

    def on_predict_end(self) -> None:
        for m in self.extractors.values():
            m.on_predict_end()

    def predict_step(self, batch: dict, batch_idx: int = 0) -> dict:
        """``{seed: HiddenStateExtractor.predict_step(batch)}``: one prepared batch, every twin."""
        return {s: self.extractors[str(s)].predict_step(batch, batch_idx) for s in self.seeds}

    def release_backbones(self) -> None:
        """Let go of every twin's model (:meth:`HiddenStateExtractor.release_backbone`)."""
        for m in self.extractors.values():
            m.release_backbone()


def _take(pred: dict, keep: list[int]) -> dict:
    idx = torch.tensor(keep, dtype=torch.long)
    return {k: ([v[i] for i in keep] if isinstance(v, list) else v.index_select(0, idx)) for k, v in pred.items()}


class TwinShardWriter(BasePredictionWriter):
    """One :class:`~ipi.extraction.extractor.ShardWriter` per twin of the pass.

    A twin whose entry already holds some rows in finished shards (an interrupted earlier run)
    is given only the rows it lacks, so resuming never writes a row twice.

    Args:
        writers: ``{seed: ShardWriter}``.
        todo: ``{seed: row ids the twin's entry lacks}``.
    """

    def __init__(self, writers: dict[int, ShardWriter], todo: dict[int, set[str]]):
        super().__init__(write_interval="batch")
        self.writers = writers
        self.todo = todo

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx=0):
        for s, w in self.writers.items():
            pred = prediction[s]
            keep = [i for i, r in enumerate(pred["row_ids"]) if r in self.todo[s]]
            if keep:
                w.write_on_batch_end(trainer, pl_module, pred if len(keep) == len(pred["row_ids"])
                                     else _take(pred, keep), batch_indices, batch, batch_idx, dataloader_idx)

    def on_predict_epoch_end(self, trainer, pl_module) -> None:
        for w in self.writers.values():
            w.on_predict_epoch_end(trainer, pl_module)

    @property
    def rows_written(self) -> dict[int, int]:
        return {s: w.rows_written for s, w in self.writers.items()}


def _one_process(settings: ExtractSettings) -> bool:
    return str(settings.devices) in ("1", "auto") and str(settings.strategy) == "auto" and _rank_zero_env()


def extract_twin_features(cfgs: dict[int, ExtractSettings], rows: Sequence[ReplayRow], layer_indices: Sequence[int],
                          token_groups: Sequence[str], *, superset: bool = False
                          ) -> tuple[dict[int, FeatureSet] | None, dict[int, dict]]:
    """Features of ``rows`` through every twin, the twins the cache lacks sharing one data pass.

    Args:
        cfgs: ``{seed: the twin's extraction settings}`` (:func:`ipi.run.settings.extract_settings`
            of :func:`ipi.run.twin.twin_config`), all of one run.
        rows: The run's rows.
        layer_indices: Blocks the probe reads (:func:`twin_layers` picks what is read).
        token_groups: Token groups pooled.
        superset: Read the ``extract.layers`` superset (``extract.py``).

    Returns:
        ``({seed: FeatureSet}, {seed: info})`` with the info keys of
        :func:`ipi.extraction.forward.extract_features` plus ``shared_pass`` (the seeds forwarded
        together) and ``pass_s`` (that pass's wall time, shared by its twins); ``(None, {})`` on
        a non-zero DDP rank.
    """
    import time

    seeds = [int(s) for s in cfgs]
    layers = {s: twin_layers(cfgs[s], rows, layer_indices, token_groups, superset) for s in seeds}
    keys = {s: cache_key(cfgs[s].backbone, rows, layers[s], token_groups, feature_precision(cfgs[s])) for s in seeds}
    caches = {s: ActivationCache(cfgs[s].cache_dir, *keys[s]) for s in seeds}
    missing = [s for s in seeds if cfgs[s].force or not caches[s].is_complete()]
    shareable = len(missing) > 1 and all(_one_process(cfgs[s]) for s in missing) and \
        len({tuple(layers[s]) for s in missing}) == 1
    feats, infos = {}, {}
    if not shareable:  # one twin, DDP, or different layer sets: one extraction per twin
        for s in seeds:
            f, infos[s] = extract_features(cfgs[s], rows, layers[s], token_groups, exact_layers=True)
            if f is None:
                return None, {}
            feats[s] = f
        return feats, infos
    row_ids = [r.row_id for r in rows]
    forwarded, waited, passes = {s: 0 for s in seeds}, {}, {}
    with ExitStack() as stack:
        for s in missing:  # one writer per entry, in seed order (no two runs deadlock)
            waited[s] = stack.enter_context(caches[s].writer_lock())
        todo_seeds = []
        for s in missing:
            if cfgs[s].force and caches[s].dir.exists():
                shutil.rmtree(caches[s].dir)
            if not caches[s].is_complete():
                todo_seeds.append(s)
        t0 = time.perf_counter()
        while todo_seeds:
            group, todo_seeds = _forward_pass(cfgs, caches, rows, layers, token_groups, todo_seeds, forwarded)
            elapsed = time.perf_counter() - t0
            for s in group:
                passes[s] = {"seeds": group, "seconds": round(elapsed, 2)}
            t0 = time.perf_counter()
        for s in missing:
            if forwarded[s] or not caches[s].is_complete():
                caches[s].finalize(row_ids)
    for s in seeds:
        feats[s] = caches[s].load(row_ids)
        infos[s] = {
            "cache_key": keys[s][0],
            "cache_dir": str(caches[s].dir),
            "cache_hit": s not in missing,
            "rows_forwarded": forwarded[s],
            "lock_wait_s": round(waited.get(s, 0.0), 2),
            "cache_bytes": sum(p.stat().st_size for p in caches[s].shard_paths()),
            "layers": layers[s],
            **({"shared_pass": passes[s]["seeds"], "pass_s": passes[s]["seconds"]} if s in passes else {}),
        }
    return feats, infos


def _forward_pass(cfgs, caches, rows, layers, token_groups, seeds: list[int], forwarded: dict) -> tuple[list, list]:
    """Build twins (as many as ``extract.twins_per_pass`` allows), forward the rows they lack once.

    Returns:
        ``(seeds forwarded in this pass, seeds left for the next)``.
    """
    cfg0 = cfgs[seeds[0]]
    b0 = cfg0.backbone
    deepest = max(layers[seeds[0]])
    backbones = {}
    n = len(seeds)
    for s in seeds:
        if len(backbones) >= n:
            break
        backbones[s] = bb = _built(cfgs[s].backbone, deepest)
        if len(backbones) == 1:
            twin_bytes = sum(p.numel() * p.element_size() for p in bb.model.parameters())
            free = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None
            n = twins_per_pass(cfg0.twins_per_pass, len(seeds), cfg0.accelerator, twin_bytes, free)
    group = list(backbones)
    todo = {s: set(r.row_id for r in rows) - caches[s].finished_row_ids() for s in group}
    union = set().union(*todo.values())
    todo_rows = [r for r in rows if r.row_id in union]
    first = backbones[group[0]]
    log.info("extraction (%s, random-weight twins %s in one data pass): %d rows to forward",
             b0["name"], group, len(todo_rows))
    if todo_rows:
        writers = {s: ShardWriter(caches[s], shard_rows=cfgs[s].shard_rows, dtype=cfgs[s].backbone["cache_dtype"])
                   for s in group}
        writer = TwinShardWriter(writers, todo)
        module = TwinPassExtractor({s: HiddenStateExtractor(backbones[s], layers[s], token_groups,
                                                            max_rows=cfgs[s].backbone["batch_size"],
                                                            prefix_reuse=cfgs[s].prefix_reuse)
                                    for s in group})
        predict_rows(cfg0, first, todo_rows, module, writer, devices=1, strategy="auto")
        for s, k in writer.rows_written.items():
            forwarded[s] += k
        module.release_backbones()
        del module
    del backbones, first
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return group, [s for s in seeds if s not in group]
