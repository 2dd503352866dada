"""The named stages that :mod:`ipi.run.tasks`'s tasks call in sequence, and the tools reuse.

Setup, data import, the split, replay rows, feature selection, transfer sources, probe fits,
the counts and run record of ``results.json``, scoring through Lightning, and the settings each
stage takes from its own piece of the config (``cfg.probe``, ``cfg.evaluation``).
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import replace
from enum import Enum
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch.utils.data import DataLoader, TensorDataset

from ipi.backbone_text import load_tokenizer
from ipi.run.cli import in_multirun
from ipi.run.validation import enum_value as _value
from ipi.run.validation import resolved_controls, run_surface, to_container, validate
from ipi.run.schemas import BackboneConf, SplitConf
from ipi.run.detection import fit_detector
from ipi.run.settings import extract_settings
from ipi.data import DataError
from ipi.data.text import REPLACED
from ipi.data.discover import summarise_skips
from ipi.data.images import decode_memo, image_limits_for
from ipi.detectors.crossfit import CrossFit, DetectorScores
from ipi.evaluation.results import Settings
from ipi.extraction.rows import build_rows
from ipi.extraction.forward import extract_features, transfer_rows
from ipi.extraction.extractor import empty_group_counts, empty_group_warnings, empty_groups
from ipi.io import tree_fingerprint
from ipi.extraction.twin_pass import extract_twin_features
from ipi.probe.folds import TransferSource, make_folds
from ipi.progress import quiet_lightning, set_quiet, track
from ipi.protocol import TOKEN_GROUPS, resolve_layers, transfer_source_surfaces
from ipi.replay import count_plain_tokens
from ipi.reporting.gallery import build_gallery, save_png_atomic
from ipi.surfaces.registry import get_surface, surfaces
from ipi.attacks.pool import pool_from_config, project_pool
from ipi.attacks.wording import full_family, source_wording_plan, wording_overlap, wording_plan
from ipi.run.twin import twin_config, twin_description, twin_seeds

log = logging.getLogger(__name__)

#: Results of the job-independent stages (data import, replay rows, the gallery) kept across the
#: jobs of one ``train.py -m`` sweep, which Hydra's local launcher runs one after another in one
#: process (docs/sweeps.md). Keyed by everything the stage reads; only used in multirun mode, so a
#: single run (or a test calling a task twice) always recomputes. Bounded: oldest entry dropped.
_SWEEP_MEMO: dict[tuple, object] = {}
_SWEEP_MEMO_MAX = 16


def sweep_memo(key: tuple, compute, what: str):
    """``compute()``, or its value from an earlier job of this sweep with the same ``key``.

    Outside a multirun ``compute()`` always runs. The memo keeps at most ``_SWEEP_MEMO_MAX``
    values; ``what`` names the stage in the log line of a reuse.
    """
    if not in_multirun():
        return compute()
    if key in _SWEEP_MEMO:
        log.info("%s: reused from an earlier job of this sweep (same inputs)", what)
        return _SWEEP_MEMO[key]
    value = compute()
    while len(_SWEEP_MEMO) >= _SWEEP_MEMO_MAX:
        _SWEEP_MEMO.pop(next(iter(_SWEEP_MEMO)))
    _SWEEP_MEMO[key] = value
    return value


def _content_of(path) -> str:
    """A local file or folder's content digest (memoised by its files' stat fingerprints); a hub id as is."""
    from ipi.extraction.activation_cache import content_addressed

    return str(content_addressed(str(path)))


def _config_key(node) -> str:
    return json.dumps(to_container(node), sort_keys=True, default=str)


def importer(data: DictConfig, backbone: DictConfig) -> functools.partial:
    """The configured importer (``data.importer``, a ``_target_`` node of ``conf/data/<kind>.yaml``).

    Its node binds the data-wide settings (``on_bad_step``, ``unknown_action``,
    ``max_element_chars``, ``limit`` = ``data.max_trajectories``); the backbone's image limits and
    ``data.options`` are added here.

    Returns:
        ``importer(root) -> (trajectories, skipped)`` (docs/data.md).
"""
    fn = instantiate(data.importer)
    limits = (image_limits_for(to_container(backbone.get("image_size")), backbone.get("tokenizer_path"))
              if backbone.get("multimodal", BackboneConf.multimodal) else None)
    settings = {k: _value(v) if isinstance(v, Enum) else v for k, v in fn.keywords.items()}
    # data.options last: an importer option overrides a data-wide setting
    return functools.partial(fn.func, **{**settings, "image_limits": limits, **to_container(data.get("options") or {})})


def exclusion_report(skips: list[dict], limit: int = 10) -> str:
    """What was left out, as counts per reason then the first ``limit`` folders with their reason."""

    if not skips:
        return "nothing left out"
    lines = [f"left out {len(skips)}: " + "; ".join(f"{n} × {kind}" for kind, n in summarise_skips(skips))]
    lines += [f"  {d['path']}: {d['reason']}" for d in skips[:limit]]
    if len(skips) > limit:
        lines.append(f"  ... and {len(skips) - limit} more (results.json counts.skipped_trajectories)")
    return "\n".join(lines)


def load_data(cfg: DictConfig):
    """Import trajectories and collect every skip (trajectory-level and step-level).

    Every import-time check runs here, before any rendering or extraction; what was left out is
    logged as counts per reason (:func:`exclusion_report`).

    Returns:
        ``(trajectories, skipped_trajectories, skipped_steps)``.

    Raises:
        DataError: No usable trajectory remains; the message says which folders were found and
            why each was left out (counts per reason).
"""

    # the same data and backbone in an earlier job of a -m sweep: the same import (sweep_memo)
    # keyed by the data's files too (tree_fingerprint: a root rewritten between jobs is imported
    # again); every screenshot decode the import check does is remembered by content in the cache
    def run_import():
        with decode_memo(cfg.extract.cache_dir if "extract" in cfg else None):
            return importer(cfg.data, cfg.backbone)(cfg.data.root)

    trajs, traj_skips = sweep_memo(("load_data", _config_key(cfg.data), _config_key(cfg.backbone),
                                    tree_fingerprint(cfg.data.root), _content_of(cfg.backbone.get("tokenizer_path"))),
                                   run_import, "data import")
    trajs, traj_skips = list(trajs), [dict(d) for d in traj_skips]
    if cfg.data.max_trajectories is not None:
        trajs = trajs[: cfg.data.max_trajectories]
    step_skips = [
        {"trajectory_id": t.trajectory_id, "step": s.step, "reason": s.reason, "path": s.path}
        for t in trajs for s in t.skipped
    ]
    where = f"data.root={cfg.data.root} (data={cfg.data.kind})"
    if not trajs:
        found = "nothing that looks like a task folder was found" if not traj_skips else exclusion_report(traj_skips)
        raise DataError(f"{where}: no usable trajectory; {found}")
    replaced = sum(r["count"] for r in replaced_characters(trajs))
    log.info("data: %d trajectories, %d steps (%d steps skipped%s) from %s%s", len(trajs),
             sum(len(t.steps) for t in trajs), len(step_skips),
             f"; {replaced} lone UTF-16 surrogate(s) replaced by U+FFFD" if replaced else "", where,
             "" if not traj_skips else "; " + exclusion_report(traj_skips))
    return trajs, traj_skips, step_skips


def check_split_feasible(cfg: DictConfig, trajectory_ids: list[str]) -> None:
    """Refuse, before any heavy work, a split with a fold side too small.

    Every fold of ``cfg.split`` (PROTOCOL.md §4) needs at least ``split.min_per_side`` (default 2)
    training and as many test trajectories.

    Raises:
        ValueError: The split cannot be made or a fold side is too small (message gives the
            counts and what to change).
    """
    min_per_side = cfg.split.get("min_per_side", SplitConf.min_per_side)
    n = len(set(trajectory_ids))
    kind = _value(cfg.split.kind)
    design = (f"split=holdout test_fraction={cfg.split.test_fraction}" if kind == "holdout"
              else f"split=kfold k={cfg.split.k}")
    advice = ("more trajectories (data.root, data.max_trajectories) or another split "
              "(split.test_fraction, split.k)")
    try:
        folds = make_folds(sorted(set(trajectory_ids)), kind, test_fraction=cfg.split.test_fraction,
                           k=cfg.split.k, seed=cfg.split.seed)
    except ValueError as e:
        raise ValueError(f"{n} usable trajectories cannot be split by {design}: {e}; needs {advice}") from e
    for i, (train, test) in enumerate(folds):
        if min(len(train), len(test)) < min_per_side:
            raise ValueError(
                f"{n} usable trajectories: {design} gives fold {i} {len(train)} training and "
                f"{len(test)} test trajectories; each side of each fold needs >= {min_per_side} "
                f"(split.min_per_side); "
                f"needs {advice}")


def _tokenizer(backbone: DictConfig):
    """The backbone's tokenizer (``tokenizer_path``, ``tokenizer_kwargs``; loaded once per process)."""
    return load_tokenizer(backbone.tokenizer_path, **to_container(backbone.get("tokenizer_kwargs") or {}))


def _tokenizer_key(backbone: DictConfig) -> tuple:
    """What a memoised stage that tokenises reads of the backbone: path, kwargs, the files' content."""
    return (str(backbone.tokenizer_path), _config_key(backbone.get("tokenizer_kwargs") or {}),
            _content_of(backbone.tokenizer_path))


def token_counter(cfg: DictConfig):
    """Token counter of the backbone's tokenizer (loaded once per process)."""

    tok = _tokenizer(cfg.backbone)
    # Recorded and injected text is tokenised as plain characters in replay; count it the same way.
    return lambda s: count_plain_tokens(tok, s)


def split_folds(cfg: DictConfig, trajectories, seed: int | None = None):
    """Trajectory folds of the configured split design and the held-out wording plan.

    Args:
        cfg: Run config (``split``, ``evaluation.heldout_wording``).
        trajectories: Imported trajectories.
        seed: Split seed (default ``split.seed``; ``split.repeats`` passes others).

    Returns:
        ``(folds, plan)``; ``plan`` is None when ``evaluation.heldout_wording`` is off.
    """

    seed = cfg.split.seed if seed is None else seed
    kind = _value(cfg.split.kind)
    folds = make_folds(sorted({t.trajectory_id for t in trajectories}), kind,
                       **({"test_fraction": cfg.split.test_fraction} if kind == "holdout" else {"k": cfg.split.k}),
                       seed=seed)
    plan = None
    if cfg.evaluation.heldout_wording:
        by_source = _value(cfg.split.get("wording", SplitConf.wording)) == "source"
        plan = (source_wording_plan if by_source else wording_plan)(folds, seed, attack_pool(cfg))
    return folds, plan


def attack_pool(cfg: DictConfig):
    """The run's :class:`~ipi.attacks.pool.AttackPool` (``cfg.attack``; the project bank without one)."""
    return pool_from_config(cfg.attack) if "attack" in cfg else project_pool()


def replay_processor(backbone: DictConfig):
    """The processor replay renders and tokenises with, loaded without the model: the multimodal
    backbone's processor, or a text-only backbone's tokenizer as a chat processor."""
    from ipi.backbone import load_processor
    from ipi.backbone_text import TextChatProcessor

    if backbone.multimodal:
        return load_processor(str(backbone.tokenizer_path))
    return TextChatProcessor(_tokenizer(backbone))


def check_context(cfg: DictConfig, rows, surface: str, rebuild=None) -> tuple[list, dict, list[dict]]:
    """Compare every row's token count with the backbone's context before any forward pass.

    The context is :func:`ipi.backbone.context_positions` of the backbone's config; a row's
    count is its whole replayed sequence, image tokens included
    (:func:`ipi.extraction.rows.sequence_lengths`). ``extract.over_context`` decides what
    happens to a step whose longest row does not fit: ``skip`` leaves the step out; ``truncate``
    cuts the step's ``element_text`` from its end to the longest length at which every variant
    fits (else skips the step); ``error`` stops the run.

    Args:
        cfg: The run config.
        rows: The surface's rows, in :func:`ipi.extraction.rows.build_rows` order.
        surface: Their surface (for messages).
        rebuild: ``rebuild(row, step) -> rows``: the rows of ``row``'s step built from ``step`` (a
            copy with cut page text); needed by ``truncate``.

    Returns:
        ``(rows kept, record, skipped steps)``; the record is ``counts.context`` of results.json:
        ``{"positions", "longest_row_tokens", "rows_over_context", "steps_over_context", "action",
        "steps_truncated"}``.

    Raises:
        ValueError: ``extract.over_context=error`` and a row does not fit (one line naming the
            trajectory, step, surface, both counts and what to change).
"""
    from ipi.backbone import context_positions, model_config
    from ipi.extraction.rows import over_context, sequence_lengths

    b = cfg.backbone
    positions = context_positions(model_config(b.loader))
    proc, image_size = replay_processor(b), to_container(b.get("image_size"))
    lengths = sequence_lengths(rows, proc, str(b.system_prompt), bool(b.multimodal), image_size)
    kept, skips = over_context(rows, lengths, positions)
    action = extract_settings(cfg).over_context
    record = {"positions": positions, "longest_row_tokens": max((n for n, _ in lengths), default=0),
              "rows_over_context": sum(n > positions for n, _ in lengths), "steps_over_context": len(skips),
              "action": action, "steps_truncated": []}
    if skips and action == "error":
        first = skips[0]
        raise ValueError(f"data.root={cfg.data.root}: trajectory {first['trajectory_id']} step {first['step']} "
                         f"(surface={surface}): {first['reason']} of backbone={b.name} "
                         f"(max_position_embeddings of its model config); {len(skips)} step(s) do not fit; "
                         "set extract.over_context=skip to leave them out (counted) or truncate to cut their "
                         "page text, or shorten the element lists (data.max_element_chars)")
    if skips and action == "truncate":
        fits = lambda rs: max(n for n, _ in sequence_lengths(rs, proc, str(b.system_prompt), bool(b.multimodal),  # noqa: E731
                                                              image_size, show=False)) <= positions
        kept, skips, record["steps_truncated"] = _truncate_steps(rows, skips, rebuild, fits)
    if skips:
        log.warning("surface=%s: %d step(s) left out, their prompts over backbone=%s's context of %d positions "
                    "(longest row %d tokens; extract.over_context=%s; results.json counts.skipped_steps)",
                    surface, len(skips), b.name, positions, record["longest_row_tokens"], action)
    if record["steps_truncated"]:
        log.warning("surface=%s: the page text of %d step(s) cut to fit backbone=%s's context of %d positions "
                    "(results.json counts.context.steps_truncated)", surface, len(record["steps_truncated"]),
                    b.name, positions)
    return kept, record, skips


def _truncate_steps(rows, skips: list[dict], rebuild, fits) -> tuple[list, list[dict], list[dict]]:
    """``extract.over_context=truncate`` (:func:`check_context`): each step of ``skips`` rebuilt
    from the longest prefix of its page text at which ``fits`` (binary search over characters).

    Returns:
        ``(rows, steps still skipped, steps truncated)``; rows keep :func:`build_rows` order.
    """
    first = {}
    for r in rows:
        first.setdefault((r.trajectory_id, r.step.step), r)
    cut, still = {}, []
    for sk in skips:
        row = first[(sk["trajectory_id"], sk["step"])]
        text = row.step.element_text
        at = lambda n: rebuild(row, replace(row.step, element_text=text[:n]))  # noqa: E731
        if not fits(at(0)):
            still.append({**sk, "reason": sk["reason"] + ", even without page text"})
            continue
        lo, hi = 0, len(text)
        while lo < hi:  # the longest prefix that fits
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(at(mid)) else (lo, mid - 1)
        cut[(sk["trajectory_id"], sk["step"])] = (at(lo), len(text), lo)
    gone = {(s["trajectory_id"], s["step"]) for s in still}
    out, done = [], set()
    for r in rows:
        key = (r.trajectory_id, r.step.step)
        if key in cut:
            if key not in done:
                out.extend(cut[key][0])
                done.add(key)
        elif key not in gone:
            out.append(r)
    truncated = [{"trajectory_id": k[0], "step": k[1], "element_chars": [n, m]} for k, (_, n, m) in cut.items()]
    return out, still, truncated


def make_rows(cfg: DictConfig, trajectories, surface: str, wording=None, context: dict | None = None):
    """Replay rows of one surface.

    The run's own surface gets the configured controls; any other surface (the transfer
    sources) gets every control that applies to it, so its rows and cache entry are those of a
    run on that surface. ``wording`` is the held-out wording plan
    (:func:`split_folds`), or None. Token counts are checked by :func:`check_context`, whose
    record and skipped steps go to ``context`` when given. In a ``-m`` sweep rows of an earlier
    job with the same inputs are reused (:func:`sweep_memo`).
"""
    controls = resolved_controls(cfg) if _value(cfg.surface.name) == surface else list(get_surface(surface).controls)
    trajectories = list(trajectories)
    token_matched = get_surface(surface).token_matched

    def build():
        count_tokens = token_counter(cfg) if token_matched else None
        rows = build_rows(track(trajectories, f"rendering {surface} variants"), surface, controls,
                          n_attacks=cfg.surface.n_attacks, count_tokens=count_tokens, wording=wording,
                          pool=pool)
        by_id = {t.trajectory_id: t for t in trajectories}

        def rebuild(row, step):  # one step's rows from a copy of the step (cut page text)
            return build_rows([replace(by_id[row.trajectory_id], steps=(step,))], surface, controls,
                              n_attacks=cfg.surface.n_attacks, count_tokens=count_tokens, wording=wording, pool=pool)

        rows, record, skips = check_context(cfg, rows, surface, rebuild)
        return trajectories, rows, record, skips  # the trajectories stay referenced: their ids in the key stay theirs

    pool = attack_pool(cfg)
    key = ("make_rows", tuple(map(id, trajectories)), surface, tuple(controls), int(cfg.surface.n_attacks),
           _tokenizer_key(cfg.backbone), _config_key(cfg.backbone.loader), extract_settings(cfg).over_context,
           repr(wording), repr(pool))
    _, rows, record, skips = sweep_memo(key, build, f"rows of {surface}")
    if context is not None:
        context.update(record, skipped_steps=[dict(s) for s in skips])
    return list(rows)


def drop_rowless(cfg: DictConfig, trajectories, folds, rows) -> tuple[list, list]:
    """Trajectories and folds without the trajectories whose every step was left out at row building.

    The other trajectories keep their sides (a fold loses the dropped ids only); each side of
    each fold must still hold ``split.min_per_side`` trajectories.

    Returns:
        ``(trajectories, folds)``.

    Raises:
        ValueError: Too few trajectories left on a side of a fold.
    """
    have = {r.trajectory_id for r in rows}
    gone = {t.trajectory_id for t in trajectories} - have
    if not gone:
        return list(trajectories), folds
    log.warning("%d trajector%s left out: every step over the backbone's context (%s)", len(gone),
                "y" if len(gone) == 1 else "ies", ", ".join(sorted(gone)[:5]))
    kept = [t for t in trajectories if t.trajectory_id not in gone]
    folds = [(set(tr) - gone, set(te) - gone) for tr, te in folds]
    for i, (tr, te) in enumerate(folds):
        need = cfg.split.get("min_per_side", SplitConf.min_per_side)
        if min(len(tr), len(te)) < need:
            raise ValueError(f"after leaving out the steps over the backbone's context, fold {i} has {len(tr)} training "
                             f"and {len(te)} test trajectories; each side needs >= {need} (split.min_per_side)")
    return kept, folds


def write_gallery(cfg: DictConfig, trajectory, out_dir: Path) -> Path | None:
    """``gallery.png``: every surface × variant of the first usable step of ``trajectory``.

    One row per surface that ships, and one for the run's own surface when it does not ship.
    """

    if not trajectory.steps:
        return None
    own, shipped = run_surface(cfg), surfaces()
    shown = [*shipped, *([] if own in shipped else [own])]
    pool = attack_pool(cfg)
    key = ("gallery", id(trajectory), tuple(s.name for s in shown), int(cfg.surface.n_attacks),
           *_tokenizer_key(cfg.backbone), repr(pool))
    _, img = sweep_memo(key, lambda: (trajectory, build_gallery(
        trajectory.trajectory_id, trajectory.steps[0], token_counter(cfg), task=trajectory.task,
        n_attacks=cfg.surface.n_attacks, shown=shown, wording=full_family(pool).bind(trajectory.task))), "gallery")
    return save_png_atomic(img, out_dir / "gallery.png")


def layer_indices(cfg: DictConfig) -> list[int]:
    """Resolved decoder-block indices of ``cfg.layers`` for ``cfg.backbone``."""
    return resolve_layers(list(cfg.layers.spec), cfg.backbone.n_layers)


def row_table(rows, features) -> pd.DataFrame:
    """Row metadata (PROTOCOL.md §3): step, horizon, prompt length, Δprompt length vs clean."""
    df = pd.DataFrame([r.metadata() for r in rows])
    df["prompt_len"] = features.prompt_len.numpy()
    clean = df[df.variant == "clean"].set_index(["trajectory_id", "step", "surface"])["prompt_len"]
    key = pd.MultiIndex.from_frame(df[["trajectory_id", "step", "surface"]])
    df["delta_prompt_len"] = df["prompt_len"].to_numpy() - clean.reindex(key).to_numpy()
    return df


def empty_group_record(rows, features, read: list[str]) -> tuple[dict, list[str]]:
    """Rows whose token groups are empty, by variant, and the warnings they raise (logged here).

    Args:
        rows: The replay rows, in ``features`` order.
        features: Their :class:`~ipi.extraction.activation_cache.FeatureSet`.
        read: The token groups the detector reads ([] when it reads no pooled features).

    Returns:
        ``(counts.empty_token_groups, warnings)`` (:func:`ipi.extraction.extractor.empty_group_counts`,
        :func:`ipi.extraction.extractor.empty_group_warnings`).
    """
    counts = empty_group_counts(empty_groups(features.features), [r.variant.variant for r in rows],
                                features.token_groups)
    warnings = empty_group_warnings(counts, read)
    for w in warnings:
        log.warning("%s", w)
    return counts, warnings


def select_features(features, layers: list[int], groups: list[str]) -> np.ndarray:
    """Concatenate features over layers × token groups: ``[N, len(layers) * len(groups) * H]``."""
    li = [features.layers.index(i) for i in layers]
    gi = [features.token_groups.index(g) for g in groups]
    x = features.features[:, li][:, :, gi]
    return x.reshape(x.shape[0], -1).float().numpy()


def wording_record(rows, folds, plan, pool=None) -> dict:
    """``run.wording`` of results.json: held-out wording on/off and the train/test overlap (must be 0 when on)."""

    meta = [{"trajectory_id": r.trajectory_id, "variant": r.variant.variant, **r.variant.meta} for r in rows]
    rec = wording_overlap(meta, folds, plan, pool)
    if plan is not None and rec["overlap"] != 0:  # by construction impossible: a bug, never a number to report
        raise AssertionError(f"held-out wording: {rec['overlap']} wording entries on both sides of a fold")
    if plan is not None and plan.scheme == "holdout":
        rec["train_families"] = plan.families["train"].to_dict()
        rec["test_families"] = plan.families["test"].to_dict()
    return rec


def run_info(info: dict, infos: dict[str, dict], elapsed_s: float, attention: dict | None = None) -> dict:
    """What ``run_info.json`` holds: extraction per surface, rows forwarded in all, wall time.

    ``rows_forwarded`` counts the rows this run sent through the backbone, over every surface it
    extracted (0 when every entry was already in the cache, or another run filled it while this
    one waited for the entry's lock).
    """
    out = {"extraction": info, "extraction_by_surface": infos,
           "rows_forwarded": int(sum(i.get("rows_forwarded", 0) for i in infos.values())),
           "elapsed_s": round(elapsed_s, 2)}
    if attention:  # detector=attention_focus: its own cache entries (docs/detectors.md)
        out["attention_extraction_by_surface"] = attention
        out["attention_rows_forwarded"] = int(sum(i.get("rows_forwarded", 0) for i in attention.values()))
    return out


def prepare(cfg: DictConfig) -> None:
    """Check the config and quiet the libraries; raises ``ValueError`` as :func:`ipi.run.validation.validate`."""
    validate(cfg)
    quiet_lightning()
    set_quiet(True if cfg.quiet else None)  # None: auto (quiet under CI or IPI_QUIET=1)


def output_dir(cfg: DictConfig) -> Path:
    """Create the run folder and seed every generator (``cfg.seed``); returns the folder."""
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    return out_dir


def extraction_surfaces(cfg: DictConfig) -> list[str]:
    """The run's surface, then the transfer sources when ``evaluation.transfer`` is on (PROTOCOL.md §6)."""
    surface = _value(cfg.surface.name)
    if not cfg.evaluation.transfer:
        return [surface]
    return [surface, *transfer_source_surfaces(surface, cfg.backbone.multimodal)]


def twin_features(cfg: DictConfig, rows, features, layers: list[int], groups: list[str]):
    """The random-weight twins' features of the run's rows, one per ``evaluation.random_twin_seeds``.

    Each twin (:func:`ipi.run.twin.twin_config`) extracts the same rows under its own cache key
    (verdict check 6; docs/estimands.md); the twins the cache lacks share one data pass and read
    only the probe's layers (:func:`ipi.extraction.twin_pass.extract_twin_features`).

    Returns:
        ``({seed: x [N, F]}, {seed: extraction info})`` (both empty with the twin off), or None
        on a non-zero DDP rank.

    Raises:
        RuntimeError: A twin's cache entry holds other rows than the backbone's.
    """
    seeds = twin_seeds(cfg)
    if not seeds:
        return {}, {}
    feats, infos = extract_twin_features({s: extract_settings(twin_config(cfg, s)) for s in seeds}, rows, layers,
                                         list(TOKEN_GROUPS))
    if feats is None:  # a non-zero DDP rank
        return None
    x_twin = {}
    for seed in seeds:
        if feats[seed].row_ids != features.row_ids:
            raise RuntimeError(f"random twin seed {seed}: its cache entry holds other rows than the backbone's")
        x_twin[seed] = select_features(feats.pop(seed), layers, groups)
    return x_twin, infos


def twin_score_tables(cfg: DictConfig, det, meta: pd.DataFrame, x_twin: dict, folds, test_index: np.ndarray,
                      default_root_dir=None) -> dict[int, pd.DataFrame]:
    """The run's detector (same configuration, seed and ``l2``) on each twin's features, same folds.

    Cross-fitted by :func:`ipi.run.detection.fit_detector` without baselines and without the
    permutation test: the twins enter only check 6 (the rank rule and E3 − mean twin E3).

    Returns:
        ``{seed: score table}`` on the probe's out-of-fold rows (``trajectory_id, step, variant, score``).

    Raises:
        RuntimeError: A twin's out-of-fold rows differ from the probe's.
    """
    out = {}
    for seed, xt in x_twin.items():
        fits = fit_detector(cfg, det, meta, xt, folds, baselines=False, default_root_dir=default_root_dir)
        if not np.array_equal(fits.test_index, test_index):
            raise RuntimeError(f"random twin seed {seed}: its out-of-fold rows differ from the probe's")
        out[seed] = fits.score_table(meta)
    return out


def twin_record(cfg: DictConfig, infos: dict) -> dict | None:
    """``run.random_twin`` of results.json: backbone, seeds, init, pretrained, each seed's cache key."""
    if not infos:
        return None
    return {**twin_description(cfg), "cache_keys": {str(k): i["cache_key"] for k, i in infos.items()}}


def transfer_source(cfg: DictConfig, trajectories, surfaces: list[str], wording, layers: list[int],
                    groups: list[str]) -> tuple[TransferSource | None, dict[str, dict]] | None:
    """Clean/attack rows of the transfer source ``surfaces`` (PROTOCOL.md §6), features selected.

    Each surface is extracted (or read from the cache) under its own key.

    Returns:
        ``(source or None when there is no source surface, extraction info per surface)``, or
        None on a non-zero DDP rank (rank 0 evaluates).
    """
    src_meta, src_x, infos = [], [], {}
    for s in surfaces:
        # clean/attack rows only, unless the surface's own full entry is already cached
        s_rows, shared = transfer_rows(extract_settings(cfg), make_rows(cfg, trajectories, s, wording=wording), layers,
                                       list(TOKEN_GROUPS))
        s_feat, infos[s] = extract_features(extract_settings(cfg), s_rows, layers, list(TOKEN_GROUPS))
        if s_feat is None:  # a non-zero DDP rank
            return None
        infos[s]["transfer_rows"] = shared
        src_meta.append(pd.DataFrame([r.metadata() for r in s_rows]))
        src_x.append(select_features(s_feat, layers, groups))
    if not surfaces:
        return None, infos
    return TransferSource.from_rows(pd.concat(src_meta, ignore_index=True), np.concatenate(src_x)), infos


def assess_settings(ev: DictConfig, pretrained: bool | None = None, *, constructed: bool = False,
                    required_controls: tuple[str, ...] | None = None,
                    heldout_wording: bool | None = None, split: str | None = None) -> Settings:
    """The assessment settings of ``cfg.evaluation`` (PROTOCOL.md §5, §7): bootstrap, verdict
    thresholds, reportability gate, permutation level; ``pretrained`` is ``backbone.pretrained``
    (None for a score table of unknown origin), ``constructed`` ``backbone.constructed``,
    ``required_controls`` the surface's (check 3; None: a score table of unknown surface),
    ``heldout_wording`` whether the test rows' wording was held out (check 3; None: a score table),
    ``split`` the split design that produced the scores (``split.kind``; check 1)."""
    return Settings(n_boot=ev.n_boot, seed=ev.seed, level=ev.level, interval=_value(ev.interval),
                    collapse_ceiling=ev.collapse_ceiling, c1_max=ev.c1_max, min_clusters=ev.min_clusters,
                    min_boot_fraction=ev.min_boot_fraction, alpha=ev.permutation.alpha, pretrained=pretrained,
                    constructed=bool(constructed),
                    required_controls=None if required_controls is None else tuple(required_controls),
                    heldout_wording=heldout_wording, split=None if split is None else str(split),
                    operating_fpr=ev.operating_fpr)


def make_loggers(cfg: DictConfig) -> list:
    """The Lightning loggers of ``cfg.logger`` (none, csv, wandb)."""
    return [lg for lg in (instantiate(n) for n in (cfg.logger or {}).values()) if lg is not None]


METADATA_COLUMNS = ["step", "horizon", "prompt_len", "delta_prompt_len"]


def fit_folds(cfg: DictConfig, meta: pd.DataFrame, x: np.ndarray, features, layers: list[int], folds, det,
              transfer: TransferSource | None = None, **extra) -> CrossFit:
    """The detector and its baselines on the same training rows of every fold (PROTOCOL.md §4–§6).

    Through :func:`ipi.run.detection.fit_detector` (the one
    :func:`ipi.detectors.crossfit.cross_fit`), as ``cfg.evaluation`` asks; ``x`` are the
    detector's features; ``extra``: logger, root dir.
"""
    li = [features.layers.index(i) for i in layers]
    metadata = meta[METADATA_COLUMNS].to_numpy(dtype=np.float64)
    collapse = features.collapse[:, li].double().numpy() if cfg.evaluation.collapse_only else None
    return fit_detector(cfg, det, meta, x, folds, metadata=metadata, collapse=collapse, transfer=transfer, **extra)


def fold_sides(folds) -> tuple[set | None, set]:
    """``(training ids or None for k-fold, test ids)``: with k-fold every trajectory is tested once."""
    return folds[0] if len(folds) == 1 else (None, {t for _, f in folds for t in f})


def replaced_characters(trajectories) -> list[dict]:
    """``{"trajectory_id", "step", "field", "count"}`` per imported text whose lone UTF-16 surrogates
    were replaced by U+FFFD (:mod:`ipi.data.text`; ``step`` None for the task)."""
    return [{"trajectory_id": t.trajectory_id, **r} for t in trajectories for r in t.meta.get(REPLACED, ())]


def run_counts(trajectories, meta: pd.DataFrame, rows, fits, folds, step_skips, traj_skips) -> dict:
    """``counts`` of results.json: trajectories, steps, rows per side and variant, skips (docs/outputs.md)."""
    train_ids, test_ids = fold_sides(folds)
    is_test = np.zeros(len(meta), dtype=bool)
    is_test[fits.test_index] = True
    return {
        "trajectories": len(trajectories),
        "trajectories_train": len(train_ids) if train_ids is not None else None,
        "trajectories_test": len(test_ids),
        "steps": sum(len(t.steps) for t in trajectories),
        "rows": len(meta),
        "rows_train_labelled": sum(f["rows_train_labelled"] for f in fits.per_fold),
        "rows_test": int(is_test.sum()),
        "folds": fits.per_fold,
        "rows_by_variant": {k: int(v) for k, v in meta.variant.value_counts().sort_index().items()},
        # Text-surface controls whose token count could not be matched exactly with whole
        # sentences / the scrambled text (docs/surfaces.md); each keeps its row, reported here.
        "control_token_mismatches": sum(1 for r in rows if r.variant.variant.startswith("c_")
                                        and (r.variant.meta or {}).get("token_delta", 0) != 0),
        "skipped_steps": step_skips,
        "skipped_trajectories": traj_skips,
        "replaced_characters": replaced_characters(trajectories),
    }


def run_record(cfg: DictConfig, layers: list[int], groups: list[str], n_features: int, folds, transfer,
               wording: dict, infos: dict[str, dict]) -> dict:
    """``run`` of results.json: what was run (surface, controls, layers, split, transfer, cache keys)."""
    surface = _value(cfg.surface.name)
    split = cfg.split
    return {
        "surface": surface,
        "controls": resolved_controls(cfg),
        "backbone": cfg.backbone.name,
        "layers": layers,
        "layers_config": cfg.layers.name,
        "token_groups": groups,
        "n_features": n_features,
        "split": (f"holdout test_fraction={split.test_fraction} seed={split.seed}" if _value(split.kind) == "holdout"
                  else f"kfold k={split.k} seed={split.seed} (out-of-fold scores from {len(folds)} probes)"),
        "transfer": transfer,
        "wording": wording,
        "cache_key": infos[surface]["cache_key"],
        "cache_keys": {s: i["cache_key"] for s, i in infos.items()},
        "data_root": str(Path(cfg.data.root).resolve()),
    }


def score_test_rows(fits: CrossFit, x: np.ndarray, callbacks: list, loggers: list) -> None:
    """Score every fold's test rows through ``Trainer.predict``; the callbacks write.

    A detector with ``folded`` (the logistic probe) is run as its fold models' Lightning module
    on ``x``; any other hands its out-of-fold scores (:class:`ipi.detectors.crossfit.DetectorScores`).
    """
    te = fits.test_index
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=loggers or False, callbacks=callbacks,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    model = fits.fitted[0]
    if not hasattr(model, "folded"):  # out-of-fold scores as they are (docs/detectors.md)
        trainer.predict(DetectorScores(fits.test_scores),
                        DataLoader(TensorDataset(torch.arange(len(te))), batch_size=4096), return_predictions=False)
        return
    x_te = torch.from_numpy(np.ascontiguousarray(x[te], dtype=np.float64))
    fold_te = torch.from_numpy(fits.fold_of_row[te])
    trainer.predict(model.folded(fits.fitted), DataLoader(TensorDataset(x_te, fold_te), batch_size=4096),
                    return_predictions=False)
