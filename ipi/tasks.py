"""Task functions behind the entry scripts (``train.py``, ``extract.py``, ``evaluate.py``).

Each task takes a composed config and returns ``(metrics, objects)``; the scripts are thin
``@hydra.main`` wrappers around them.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch.utils.data import DataLoader, TensorDataset

from ipi.backbone import resolve_layers
from ipi.config import CONTROLS_BY_SURFACE, resolved_controls, to_container, validate
from ipi.data import load_trajectories
from ipi.detectors.crossfit import DetectorScores
from ipi.detectors.run import attention_matrix, build_detector, detector_record, fit_detector, permutation_m
from ipi.evaluation.callbacks import EstimandsCallback, ReportCallback
from ipi.evaluation.report import write_run_report
from ipi.evaluation.scoretable import evaluate_score_table
from ipi.extraction.rows import build_rows
from ipi.extraction.run import extract_features
from ipi.io import atomic_write_text
from ipi.probe.crossfit import FoldedProbe, TransferSource, cross_fit, make_folds
from ipi.probe.fit import ProbeConfig
from ipi.progress import set_quiet, track
from ipi.replay import TOKEN_GROUPS
from ipi.tracking import task_wrapper

log = logging.getLogger(__name__)


def _value(x):
    return getattr(x, "value", x)


def quiet_lightning() -> None:
    """Silence Lightning's per-Trainer banners (GPU/TPU availability, tips); warnings still show."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda",
                 "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Lightning <= 2.6 builds torch's deprecated ``LeafSpec()`` for every DataLoader it wraps
    # (CombinedLoader -> lightning.pytorch.utilities._pytree); torch >= 2.9 warns on each
    # Trainer.predict. Not ours to fix and harmless (Lightning-AI/pytorch-lightning#21326).
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning)


def _importer_kwargs(cfg: DictConfig) -> dict:
    from ipi.data import IMPORTERS
    from ipi.data.images import image_limits_for

    kind = cfg.data.kind
    kwargs = {"on_bad_step": _value(cfg.data.on_bad_step)}
    if kind in ("webvoyager", "native", "browser_use"):  # importers of free-form agent actions
        kwargs["unknown_action"] = _value(cfg.data.unknown_action)
    if kind != "native":
        kwargs["max_element_chars"] = cfg.data.max_element_chars
    if kind in IMPORTERS:
        if kind != "multimodal_mind2web":  # it takes data.options.limit (its config sets it)
            # data.max_trajectories is applied while importing: later folders are never read.
            kwargs["limit"] = cfg.data.max_trajectories
        # Screenshots the backbone's processor would refuse are counted skips at import.
        kwargs["image_limits"] = (image_limits_for(to_container(cfg.backbone.get("image_size")),
                                                   cfg.backbone.get("tokenizer_path"))
                                  if cfg.backbone.get("multimodal", True) else None)
    kwargs.update(to_container(cfg.data.get("options") or {}))
    return kwargs


def exclusion_report(skips: list[dict], limit: int = 10) -> str:
    """What was left out, as counts per reason then the first ``limit`` folders with their reason."""
    from ipi.data.discover import summarise_skips

    if not skips:
        return "nothing left out"
    lines = [f"left out {len(skips)}: " + "; ".join(f"{n} × {kind}" for kind, n in summarise_skips(skips))]
    lines += [f"  {d['path']}: {d['reason']}" for d in skips[:limit]]
    if len(skips) > limit:
        lines.append(f"  ... and {len(skips) - limit} more (results.json counts.skipped_trajectories)")
    return "\n".join(lines)


def load_data(cfg: DictConfig):
    """Import trajectories and collect every skip (trajectory-level and step-level).

    Discovery, ``data.max_trajectories`` (applied while importing, before duplicate checks) and
    every import-time check run here, before any rendering or extraction. What was left out is
    logged as counts per reason (:func:`exclusion_report`).

    Returns:
        ``(trajectories, skipped_trajectories, skipped_steps)``.

    Raises:
        DataError: No usable trajectory remains; the message says which folders were found and
            why each was left out (counts per reason).
    """
    from ipi.data import DataError

    kwargs = _importer_kwargs(cfg)
    trajs, traj_skips = load_trajectories(cfg.data.kind, cfg.data.root, **kwargs)
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
    log.info("data: %d trajectories, %d steps (%d steps skipped) from %s%s", len(trajs),
             sum(len(t.steps) for t in trajs), len(step_skips), where,
             "" if not traj_skips else "; " + exclusion_report(traj_skips))
    return trajs, traj_skips, step_skips


def check_split_feasible(cfg: DictConfig, trajectory_ids: list[str], min_per_side: int | None = None) -> None:
    """Refuse, before any heavy work, a split with fewer than ``min_per_side`` trajectories on a side.

    Every fold of ``cfg.split`` (PROTOCOL.md §4) needs at least ``min_per_side`` training and
    ``min_per_side`` test trajectories (default ``split.min_per_side``, 2).

    Raises:
        ValueError: The split cannot be made or a fold side is too small (message gives the
            counts and what to change).
    """
    if min_per_side is None:
        min_per_side = cfg.split.get("min_per_side", 2)
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


def token_counter(cfg: DictConfig):
    """Token counter of the backbone's tokenizer (loaded once per process)."""
    from ipi.backbone_text import load_tokenizer

    from ipi.replay import count_plain_tokens

    tok = load_tokenizer(cfg.backbone.tokenizer_path, **to_container(cfg.backbone.get("tokenizer_kwargs") or {}))
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
    from ipi.surfaces.wording import wording_plan

    seed = cfg.split.seed if seed is None else seed
    kind = _value(cfg.split.kind)
    folds = make_folds(sorted({t.trajectory_id for t in trajectories}), kind,
                       **({"test_fraction": cfg.split.test_fraction} if kind == "holdout" else {"k": cfg.split.k}),
                       seed=seed)
    plan = wording_plan(folds, seed) if cfg.evaluation.heldout_wording else None
    return folds, plan


def make_rows(cfg: DictConfig, trajectories, surface: str, controls: list[str] | None = None, wording=None):
    """Replay rows of one surface.

    The run's own surface gets the configured controls; any other surface (the transfer
    sources) gets every control that applies to it, so its rows — and its activation-cache
    entry — are exactly those of a run on that surface, and a ``-m surface=...`` sweep or an
    ``extract.py`` run before it fills each entry once. ``controls`` overrides both.
    ``wording`` is the held-out wording plan of the split (:func:`split_folds`), or None.
    """
    count_tokens = token_counter(cfg) if surface != "i_vis" else None
    if controls is None:
        controls = (resolved_controls(cfg) if _value(cfg.surface.name) == surface
                    else list(CONTROLS_BY_SURFACE[surface]))
    return build_rows(track(trajectories, f"rendering {surface} variants"), surface, controls,
                      n_attacks=cfg.surface.n_attacks, count_tokens=count_tokens, wording=wording)


def write_gallery(cfg: DictConfig, trajectory, out_dir: Path) -> Path | None:
    """``gallery.png``: every surface × variant of the first usable step of ``trajectory``."""
    from ipi.render import build_gallery, save_png_atomic

    if not trajectory.steps:
        return None
    img = build_gallery(trajectory.trajectory_id, trajectory.steps[0], token_counter(cfg),
                        task=trajectory.task, n_attacks=cfg.surface.n_attacks)
    return save_png_atomic(img, out_dir / "gallery.png")


def layer_indices(cfg: DictConfig) -> list[int]:
    """Resolved decoder-block indices of ``cfg.layers`` for ``cfg.backbone``."""
    spec = list(cfg.layers.spec)
    n = cfg.backbone.n_layers
    if spec == ["all"]:
        return list(range(n))
    return resolve_layers(spec, n)


def transfer_source_surfaces(surface: str, multimodal: bool) -> list[str]:
    """Surfaces the cross-surface transfer probe trains on (PROTOCOL.md §6; docs/estimands.md).

    Every *other* surface the backbone can read: on ``i_vis`` this is ``i_dom ∪ i_tool``, exactly
    §6; on a text surface it is the other two (one with a text-only backbone, which has no
    ``i_vis``). The transfer probe is always scored on the run's own test rows, so its E1 sits on
    the same rows and bootstrap draws as the probe's.
    """
    return [s for s in ("i_vis", "i_dom", "i_tool") if s != surface and (multimodal or s != "i_vis")]


def row_table(rows, features) -> pd.DataFrame:
    """Row metadata (PROTOCOL.md §3): step, horizon, prompt length, Δprompt length vs clean."""
    df = pd.DataFrame([r.metadata() for r in rows])
    df["prompt_len"] = features.prompt_len.numpy()
    clean = df[df.variant == "clean"].set_index(["trajectory_id", "step", "surface"])["prompt_len"]
    key = pd.MultiIndex.from_frame(df[["trajectory_id", "step", "surface"]])
    df["delta_prompt_len"] = df["prompt_len"].to_numpy() - clean.reindex(key).to_numpy()
    return df


def select_features(features, layers: list[int], groups: list[str]) -> np.ndarray:
    """Concatenate features over layers × token groups: ``[N, len(layers) * len(groups) * H]``."""
    li = [features.layers.index(i) for i in layers]
    gi = [features.token_groups.index(g) for g in groups]
    x = features.features[:, li][:, :, gi]
    return x.reshape(x.shape[0], -1).float().numpy()


def _wording_record(rows, folds, plan) -> dict:
    """``run.wording`` of results.json: held-out wording on/off and the train/test overlap (must be 0 when on)."""
    from ipi.surfaces.wording import wording_overlap

    meta = [{"trajectory_id": r.trajectory_id, "variant": r.variant.variant, **r.variant.meta} for r in rows]
    rec = wording_overlap(meta, folds, plan)
    if plan is not None and rec["overlap"] != 0:  # by construction impossible: a bug, never a number to report
        raise AssertionError(f"held-out wording: {rec['overlap']} bank entries on both sides of a fold")
    if plan is not None and plan.scheme == "holdout":
        rec["train_families"] = plan.families["train"].to_dict()
        rec["test_families"] = plan.families["test"].to_dict()
    return rec


def evaluate_split(cfg: DictConfig, trajs, seed: int, layers, groups, pcfg, l2, l2_grid) -> dict:
    """Estimands and verdict of the run on the split of ``seed`` (``split.repeats``).

    The same pipeline as the pre-registered split — held-out wording families of that split
    (so its own rows and cache entry), probe, C1, collapse-only and permuted baselines, shared
    bootstrap draws, verdict — without the transfer probe (it does not enter the verdict).
    """
    from ipi.evaluation.verdict import verdict
    from ipi.metrics.estimands import evaluate_tables

    surface = _value(cfg.surface.name)
    folds, plan = split_folds(cfg, trajs, seed)
    rows = make_rows(cfg, trajs, surface, wording=plan)
    features, _ = extract_features(cfg, rows, layers, list(TOKEN_GROUPS))
    meta = row_table(rows, features)
    x = select_features(features, layers, groups)
    li = [features.layers.index(i) for i in layers]
    md = meta[["step", "horizon", "prompt_len", "delta_prompt_len"]].to_numpy(dtype=np.float64)
    collapse = features.collapse[:, li].double().numpy() if cfg.evaluation.collapse_only else None
    det = build_detector(cfg)
    if det.name == "logistic":
        fits = cross_fit(meta, x, folds, probe_cfg=pcfg, metadata=md, collapse=collapse,
                         permuted=cfg.evaluation.permuted, permute_seed=cfg.seed, l2=l2, l2_grid=l2_grid,
                         permutation_m=permutation_m(cfg, det), permutation_seed=cfg.evaluation.permutation.seed)
    else:
        x_det = attention_matrix(cfg, det, rows)[0] if det.input == "attention" else x
        fits = fit_detector(cfg, det, meta, x_det, folds, metadata=md, collapse=collapse, transfer=None, l2=1.0)
    table = meta.iloc[fits.test_index][["trajectory_id", "step", "variant"]].reset_index(drop=True)
    table["score"] = fits.probe_scores(x) if det.name == "logistic" else fits.test_scores
    ev = cfg.evaluation
    perm = fits.permutation_input()
    res = evaluate_tables(table, fits.baselines, n_boot=ev.n_boot, seed=ev.seed, level=ev.level,
                          interval=_value(ev.interval),
                          permutation=None if perm is None else {**perm, "alpha": ev.permutation.alpha})
    res["verdict"] = verdict(res, collapse_ceiling=ev.collapse_ceiling, c1_max=ev.c1_max,
                             min_clusters=ev.min_clusters)
    return res


@task_wrapper
def train(cfg: DictConfig) -> tuple[dict, dict]:
    """Run the main job: replay, extract (cached), probe, estimands, verdict, report.

    Args:
        cfg: Composed ``train`` config.

    Returns:
        ``(results, objects)`` where results is what ``results.json`` holds and objects has the
        probe, the score table and the extraction info.
    """
    t0 = time.perf_counter()
    validate(cfg)
    quiet_lightning()
    set_quiet(True if cfg.quiet else None)  # None: auto (quiet under CI or IPI_QUIET=1)
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    surface = _value(cfg.surface.name)
    groups = [_value(g) for g in cfg.token_group.names]
    layers = layer_indices(cfg)

    trajs, traj_skips, step_skips = load_data(cfg)
    check_split_feasible(cfg, [t.trajectory_id for t in trajs])  # before any rendering or extraction
    # Trajectory-disjoint folds (PROTOCOL.md §4) first: with held-out wording a trajectory's
    # attack and imperative texts come from the wording family of the fold it is tested in.
    split_kind = _value(cfg.split.kind)
    folds, plan = split_folds(cfg, trajs)
    rows = make_rows(cfg, trajs, surface, wording=plan)
    features, info = extract_features(cfg, rows, layers, list(TOKEN_GROUPS))
    if features is None:  # a non-zero DDP rank: rank 0 evaluates
        return {}, {"extraction": info}
    meta = row_table(rows, features)
    x = select_features(features, layers, groups)
    det = build_detector(cfg)
    x_det, infos_att = x, {}
    if det.input == "attention":  # the detector's own cached extraction (docs/detectors.md)
        x_det, infos_att[surface], det = attention_matrix(cfg, det, rows)

    # Cross-surface transfer (PROTOCOL.md §6): clean/attack rows of the other surfaces, each
    # surface extracted (or read from the cache) under its own key.
    transfer_src, transfer_surfaces, infos = None, [], {surface: info}
    if cfg.evaluation.transfer:
        transfer_surfaces = transfer_source_surfaces(surface, cfg.backbone.multimodal)
        src_meta, src_x = [], []
        for s in transfer_surfaces:
            s_rows = make_rows(cfg, trajs, s, wording=plan)
            s_feat, infos[s] = extract_features(cfg, s_rows, layers, list(TOKEN_GROUPS))
            if s_feat is None:  # a non-zero DDP rank
                return {}, {"extraction": info}
            src_meta.append(pd.DataFrame([r.metadata() for r in s_rows]))
            if det.input == "attention":
                s_x, infos_att[s], _ = attention_matrix(cfg, det, s_rows)
                src_x.append(s_x)
            else:
                src_x.append(select_features(s_feat, layers, groups))
        if transfer_surfaces:
            transfer_src = TransferSource.from_rows(pd.concat(src_meta, ignore_index=True), np.concatenate(src_x))

    # Leakage is asserted per fold on ids and on the rows of every fit (cross_fit).
    auto_l2 = cfg.probe.l2 == "auto"
    l2 = 1.0 if auto_l2 else float(cfg.probe.l2)  # auto: per-fold inner CV; baselines keep 1.0
    l2_grid = list(cfg.probe.l2_grid) if auto_l2 else None
    pcfg = ProbeConfig(l2=l2, max_iter=cfg.probe.max_iter, tol=cfg.probe.tol, seed=cfg.seed)
    loggers = [lg for lg in (instantiate(n) for n in (cfg.logger or {}).values()) if lg is not None]
    md_cols = ["step", "horizon", "prompt_len", "delta_prompt_len"]
    li = [features.layers.index(i) for i in layers]
    # The probe and the baselines, fitted on the same training rows of every fold (PROTOCOL.md
    # §5 C1; §6 collapse only, permuted labels, transfer).
    collapse = features.collapse[:, li].double().numpy() if cfg.evaluation.collapse_only else None
    if det.name == "logistic":
        fits = cross_fit(
            meta, x, folds, probe_cfg=pcfg, metadata=meta[md_cols].to_numpy(dtype=np.float64),
            collapse=collapse,
            permuted=cfg.evaluation.permuted, permute_seed=cfg.seed, transfer=transfer_src, l2=l2, l2_grid=l2_grid,
            logger=loggers[0] if loggers else None, default_root_dir=str(out_dir),
            permutation_m=permutation_m(cfg, det), permutation_seed=cfg.evaluation.permutation.seed)
    else:  # same training rows, baselines and permutation labels; the detector refitted directly
        fits = fit_detector(cfg, det, meta, x_det, folds, metadata=meta[md_cols].to_numpy(dtype=np.float64),
                            collapse=collapse, transfer=transfer_src, l2=1.0)
    baselines = fits.baselines
    te = fits.test_index
    te_meta = meta.iloc[te].reset_index(drop=True)
    is_test = np.zeros(len(meta), dtype=bool)
    is_test[te] = True
    # K-fold: every trajectory is a test trajectory once; training sizes are per fold.
    train_ids, test_ids = folds[0] if len(folds) == 1 else (None, {t for _, f in folds for t in f})

    counts = {
        "trajectories": len(trajs),
        "trajectories_train": len(train_ids) if train_ids is not None else None,
        "trajectories_test": len(test_ids),
        "steps": sum(len(t.steps) for t in trajs),
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
    }
    run = {
        "surface": surface,
        "controls": resolved_controls(cfg),
        "backbone": cfg.backbone.name,
        "layers": layers,
        "layers_config": cfg.layers.name,
        "token_groups": groups,
        "n_features": int(x.shape[1]),
        "detector": detector_record(cfg, det, fits),
        "split": (f"holdout test_fraction={cfg.split.test_fraction} seed={cfg.split.seed}" if split_kind == "holdout"
                  else f"kfold k={cfg.split.k} seed={cfg.split.seed} (out-of-fold scores from {len(folds)} probes)"),
        "transfer": ({"train_surfaces": transfer_surfaces, "test_surface": surface} if transfer_src is not None
                     else None),
        "wording": _wording_record(rows, folds, plan),
        "cache_key": info["cache_key"],
        "cache_keys": {s: i["cache_key"] for s, i in infos.items()},
        **({"attention_cache_keys": {s: i["cache_key"] for s, i in infos_att.items()}} if infos_att else {}),
        "data_root": str(Path(cfg.data.root).resolve()),
    }

    # Score the test rows with the probe through Lightning; the callbacks compute and write.
    est = EstimandsCallback(te_meta, baselines, n_boot=cfg.evaluation.n_boot, seed=cfg.evaluation.seed,
                            level=cfg.evaluation.level, collapse_ceiling=cfg.evaluation.collapse_ceiling,
                            c1_max=cfg.evaluation.c1_max, min_clusters=cfg.evaluation.min_clusters,
                            permutation=fits.permutation_input(), alpha=cfg.evaluation.permutation.alpha,
                            min_boot_fraction=cfg.evaluation.min_boot_fraction,
                            interval=_value(cfg.evaluation.interval))
    gallery = None
    if cfg.report.gallery:
        first_test = next(t for t in trajs if t.trajectory_id in set(test_ids))
        gallery = write_gallery(cfg, first_test, out_dir)
    def write_side_files() -> None:  # before results.json, which is written last
        atomic_write_text(out_dir / "scores.csv", est.scores.to_csv(index=False))
        atomic_write_text(out_dir / "run_info.json", json.dumps(
            {**run_info(info, infos, time.perf_counter() - t0, infos_att),
             "permutation_s": (fits.permutation or {}).get("seconds")}, indent=2))

    extra = {"counts": counts, "run": run}
    if cfg.split.repeats > 1:  # re-rolled splits beside the pre-registered one (docs/estimands.md)
        seeds = [cfg.split.seed + i for i in range(cfg.split.repeats)]
        extra["split_repeats"] = {"seeds": seeds, "results": [
            evaluate_split(cfg, trajs, s, layers, groups, pcfg, l2, l2_grid)
            for s in track(seeds[1:], "split.repeats")]}
    rep = ReportCallback(est, out_dir, extra, config=to_container(cfg),
                         gallery=gallery, plots=cfg.report.plots, html=cfg.report.html,
                         before_results=write_side_files)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=loggers or False, callbacks=[est, rep],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    if det.name == "logistic":
        x_te = torch.from_numpy(np.ascontiguousarray(x[te], dtype=np.float64))
        fold_te = torch.from_numpy(fits.fold_of_row[te])
        trainer.predict(FoldedProbe(fits.probes), DataLoader(TensorDataset(x_te, fold_te), batch_size=4096),
                        return_predictions=False)
    else:  # scores already computed out of fold; the same callbacks turn them into results
        trainer.predict(DetectorScores(fits.test_scores),
                        DataLoader(TensorDataset(torch.arange(len(te))), batch_size=4096), return_predictions=False)

    elapsed = time.perf_counter() - t0
    log.info("extraction: cache %s (%d rows forwarded), %.1f MB on disk (python -m ipi.cache list); total %.1f s",
             "hit" if info["cache_hit"] else "miss", info["rows_forwarded"], info["cache_bytes"] / 2**20, elapsed)
    for lg in loggers:
        lg.finalize("success")
    probe = fits.probes[0] if len(fits.probes) == 1 else fits.probes
    return rep.results, {"probe": probe, "probes": fits.probes, "folds": folds, "scores": est.scores,
                         "baselines": baselines, "extraction": info, "elapsed_s": elapsed}


@task_wrapper
def extract(cfg: DictConfig) -> tuple[dict, dict]:
    """Extract (or reuse) every activation-cache entry a ``train.py`` run with this config reads.

    That is the configured surface and, when ``evaluation.transfer`` is on, the transfer source
    surfaces — so a sweep started after ``extract.py`` forwards nothing.

    Returns:
        ``(info of the configured surface, {"features": ..., "extraction_by_surface": ...})``.
    """
    validate(cfg)
    quiet_lightning()
    set_quiet(True if cfg.quiet else None)  # None: auto (quiet under CI or IPI_QUIET=1)
    surface = _value(cfg.surface.name)
    trajs, _, _ = load_data(cfg)
    # rows' wording depends on the split (held-out wording); without it no split is needed
    plan = split_folds(cfg, trajs)[1] if cfg.evaluation.heldout_wording else None
    surfaces = [surface]
    if cfg.evaluation.transfer:
        surfaces += transfer_source_surfaces(surface, cfg.backbone.multimodal)
    t0 = time.perf_counter()
    infos, features = {}, None
    for s in surfaces:
        feats, infos[s] = extract_features(cfg, make_rows(cfg, trajs, s, wording=plan), layer_indices(cfg),
                                           list(TOKEN_GROUPS))
        features = feats if s == surface else features
    if features is not None:  # rank 0 (a non-zero DDP rank writes nothing)
        atomic_write_text(Path(cfg.paths.output_dir) / "run_info.json", json.dumps(
            run_info(infos[surface], infos, time.perf_counter() - t0), indent=2))
    return infos[surface], {"features": features, "extraction_by_surface": infos}


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


@task_wrapper
def evaluate(cfg: DictConfig) -> tuple[dict, dict]:
    """Evaluate a score table (CSV/Parquet) into ``results.json``, reports and figures."""
    from ipi.evaluation.scoretable import read_score_table

    ev = cfg.evaluation
    results = evaluate_score_table(cfg.scores, n_boot=ev.n_boot, seed=ev.seed, level=ev.level,
                                   collapse_ceiling=ev.collapse_ceiling, c1_max=ev.c1_max,
                                   min_clusters=ev.min_clusters, min_boot_fraction=ev.min_boot_fraction,
                                   interval=_value(ev.interval))
    out_dir = Path(cfg.paths.output_dir)
    write_run_report(results, out_dir, scores=read_score_table(cfg.scores), config=to_container(cfg),
                     plots=cfg.report.plots, html_report=cfg.report.html)
    return results, {}


__all__ = ["train", "extract", "evaluate", "to_container"]
