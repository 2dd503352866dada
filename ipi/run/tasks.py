"""The tasks behind the entry scripts (``train.py``, ``extract.py``, ``evaluate.py``).

Each task is a short sequence of named stages (:mod:`ipi.run.stages`), takes a composed config and
returns ``(metrics, objects)``; the scripts are thin ``@hydra.main`` wrappers around them
(:func:`ipi.run.cli.run_entry`).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from omegaconf import DictConfig

from ipi.attacks.pool import project_pool
from ipi.run.config import enum_value as _value
from ipi.run.config import run_surface, to_container
from ipi.run.detection import (
    attention_matrix,
    attention_transfer_source,
    build_detector,
    detector_record,
    fit_detector,
)
from ipi.run.free_run import behaviour_enabled
from ipi.run.likelihood_stage import run_behaviour_stage
from ipi.evaluation.assess import ScoreTables, assess
from ipi.evaluation.by_source import attack_record
from ipi.evaluation.callbacks import EstimandsCallback
from ipi.evaluation.scoretable import evaluate_score_table, read_score_table, twin_score_table
from ipi.extraction.forward import extract_features, transfer_rows
from ipi.extraction.twin_pass import extract_twin_features
from ipi.io import atomic_write_text
from ipi.metrics.keys import BEHAVIOUR, RANDOM_TWIN, SPLIT_REPEATS, WARNINGS
from ipi.progress import track
from ipi.protocol import TOKEN_GROUPS
from ipi.reporting.report import write_run_report
from ipi.reporting.report_callback import ReportCallback
from ipi.reporting.tracking import task_wrapper
from ipi.run.settings import extract_settings
from ipi.run.twin import backbone_weights, twin_config, twin_seeds
from ipi.run.stages import (
    assess_settings,
    attack_pool,
    check_split_feasible,
    drop_rowless,
    empty_group_record,
    extraction_surfaces,
    fit_folds,
    fold_sides,
    layer_indices,
    load_data,
    make_loggers,
    make_rows,
    output_dir,
    prepare,
    row_table,
    run_counts,
    run_info,
    run_record,
    score_test_rows,
    select_features,
    split_folds,
    transfer_source,
    twin_features,
    twin_record,
    twin_score_tables,
    wording_record,
    write_gallery,
)

log = logging.getLogger(__name__)


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
    prepare(cfg)
    out_dir = output_dir(cfg)
    surface, *sources = extraction_surfaces(cfg)
    groups, layers = [_value(g) for g in cfg.token_group.names], layer_indices(cfg)

    trajs, traj_skips, step_skips = load_data(cfg)
    check_split_feasible(cfg, [t.trajectory_id for t in trajs])  # before any rendering or extraction
    # Trajectory-disjoint folds (PROTOCOL.md §4) first: with held-out wording a trajectory's
    # attack and imperative texts come from the wording family of the fold it is tested in.
    folds, plan = split_folds(cfg, trajs)
    context: dict = {}  # prompts against the backbone's context: steps over it are counted skips
    rows = make_rows(cfg, trajs, surface, wording=plan, context=context)
    step_skips = step_skips + context.pop("skipped_steps")
    trajs, folds = drop_rowless(cfg, trajs, folds, rows)
    features, info = extract_features(extract_settings(cfg), rows, layers, list(TOKEN_GROUPS))
    if features is None:  # a non-zero DDP rank: rank 0 evaluates
        return {}, {"extraction": info}
    meta, x = row_table(rows, features), select_features(features, layers, groups)
    det, x_det, infos_att = build_detector(cfg), x, {}
    # Rows whose token groups pooled to zeros (empty), by variant; a share that differs between
    # the sides of an estimand is a warning when the detector reads that group.
    empty, warnings = empty_group_record(rows, features, groups if det.input == "hidden" else [])
    if det.input == "attention":  # the detector's own cached extraction (docs/detectors.md)
        x_det, infos_att[surface], det = attention_matrix(cfg, det, rows, layers)
    # The random-weight twins (verdict check 6; ipi.run.twin): the same rows through the same
    # architecture with seeded random weights, one cache entry per seed, scored by the same
    # detector. Hidden-state detectors only: for attention_focus / external check 6 is NOT RUN.
    twins = twin_features(cfg, rows, features, layers, groups) if det.input == "hidden" else ({}, {})
    if twins is None:  # a non-zero DDP rank
        return {}, {"extraction": info}
    x_twin, twin_infos = twins
    source = transfer_source(cfg, trajs, sources, plan, layers, groups) if cfg.evaluation.transfer else (None, {})
    if source is None:  # a non-zero DDP rank
        return {}, {"extraction": info}
    transfer_src, infos = source[0], {surface: info, **source[1]}
    if det.input == "attention" and transfer_src is not None:  # the other surfaces' attention features
        transfer_src, more = attention_transfer_source(
            cfg, det, sources, lambda s: make_rows(cfg, trajs, s, wording=plan), layers)
        infos_att.update(more)

    loggers = make_loggers(cfg)
    fits = fit_folds(cfg, meta, x_det, features, layers, folds, det, transfer=transfer_src,
                     logger=loggers[0] if loggers else None, default_root_dir=out_dir)
    twin_tables = twin_score_tables(cfg, det, meta, x_twin, folds, fits.test_index, default_root_dir=out_dir)
    transfer = {"train_surfaces": sources, "test_surface": surface} if transfer_src is not None else None
    extra = {"counts": {**run_counts(trajs, meta, rows, fits, folds, step_skips, traj_skips),
                        "empty_token_groups": empty, "context": context},
             WARNINGS: warnings,
             "run": {**run_record(cfg, layers, groups, int(x.shape[1]), folds, transfer,
                                  wording_record(rows, folds, plan, attack_pool(cfg)), infos),
                     RANDOM_TWIN: twin_record(cfg, twin_infos)}}
    extra["run"]["detector"] = detector_record(cfg, det, fits)
    extra["run"]["backbone_weights"] = backbone_weights(cfg)  # pretrained | random | constructed
    pool = attack_pool(cfg)
    if pool.digest != project_pool().digest:  # the default bank adds nothing: its results.json is unchanged
        extra["run"]["attack"] = attack_source_record(cfg, pool, rows, meta, x_det, fits, det,
                                                      plan)
    if infos_att:
        extra["run"]["attention_cache_keys"] = {s: i["cache_key"] for s, i in infos_att.items()}
    behaviour_info = None
    if behaviour_enabled(cfg):  # behaviour.measure on the test rows: free run and/or likelihood (docs/behaviour.md)
        extra[BEHAVIOUR], behaviour_info = run_behaviour_stage(cfg, rows, fits, x, layers, groups, det, pool,
                                                               out_dir)

    # Score the test rows with the probe through Lightning; the callbacks compute and write.
    te_meta = meta.iloc[fits.test_index].reset_index(drop=True)
    settings = assess_settings(cfg.evaluation, pretrained=bool(cfg.backbone.pretrained),
                               constructed=bool(cfg.backbone.get("constructed", False)),
                               required_controls=run_surface(cfg).required_controls,
                               heldout_wording=bool(cfg.evaluation.heldout_wording), split=_value(cfg.split.kind))
    est = EstimandsCallback(te_meta, fits.baselines, settings, permutation=fits.permutation_input(),
                            twins=twin_tables or None)
    test_ids = fold_sides(folds)[1]
    gallery = (write_gallery(cfg, next(t for t in trajs if t.trajectory_id in set(test_ids)), out_dir)
               if cfg.report.gallery else None)

    def write_side_files() -> None:  # before results.json, which is written last
        atomic_write_text(out_dir / "scores.csv", est.scores.to_csv(index=False))
        if twin_tables:
            atomic_write_text(out_dir / "scores_twin.csv", twin_score_table(twin_tables).to_csv(index=False))
        atomic_write_text(out_dir / "run_info.json", json.dumps(
            {**run_info(info, infos, time.perf_counter() - t0, infos_att),
             "extraction_random_twin": {str(k): i for k, i in twin_infos.items()} or None,
             "permutation_s": (fits.permutation or {}).get("seconds"),
             **({"behaviour": behaviour_info} if behaviour_info is not None else {})}, indent=2))

    if cfg.split.repeats > 1:  # re-rolled splits beside the pre-registered one (docs/estimands.md)
        seeds = [cfg.split.seed + i for i in range(cfg.split.repeats)]
        extra[SPLIT_REPEATS] = {"seeds": seeds, "results": [
            evaluate_split(cfg, trajs, s, layers, groups, settings) for s in track(seeds[1:], "split.repeats")]}
    rep = ReportCallback(est, out_dir, extra, config=to_container(cfg), gallery=gallery, plots=cfg.report.plots,
                         html=cfg.report.html, before_results=write_side_files)
    score_test_rows(fits, x_det, [est, rep], loggers)

    elapsed = time.perf_counter() - t0
    log.info("extraction: cache %s (%d rows forwarded), %.1f MB on disk (python -m ipi.tools.cache list); "
             "total %.1f s", "hit" if info["cache_hit"] else "miss", info["rows_forwarded"],
             info["cache_bytes"] / 2**20, elapsed)
    for lg in loggers:
        lg.finalize("success")
    fitted = fits.fitted[0] if len(fits.fitted) == 1 else fits.fitted
    return rep.results, {"detector": fitted, "fitted": fits.fitted, "folds": folds, "scores": est.scores,
                         "baselines": fits.baselines, "extraction": info, "elapsed_s": elapsed}


def attack_source_record(cfg: DictConfig, pool, rows, meta, x, fits, det, plan) -> dict:
    """``run.attack`` (:func:`ipi.evaluation.by_source.attack_record`) of a run on a published source.

    The source × source transfer table (wording held out by source) refits the run's detector on
    the detector's features ``x`` (:func:`ipi.run.detection.fit_detector` without baselines).
    """
    rows_meta = [{**r.metadata(), **r.variant.meta} for r in rows]

    def fit_score(train_ids: set, test_ids: set):  # the rows of these trajectories only
        sel = meta["trajectory_id"].astype(str).isin(train_ids | test_ids).to_numpy()
        m = meta[sel].reset_index(drop=True)
        return fit_detector(cfg, det, m, x[sel], [(train_ids, test_ids)], baselines=False).score_table(m)

    settings = assess_settings(cfg.evaluation, pretrained=bool(cfg.backbone.pretrained), split=_value(cfg.split.kind))
    return attack_record(pool, rows_meta, fits.score_table(meta), settings, plan=plan, seed=cfg.split.seed,
                         fit_score=fit_score if getattr(det, "trainable", True) else None)


def evaluate_split(cfg: DictConfig, trajs, seed: int, layers, groups, settings) -> dict:
    """Results of the run on the split of ``seed`` (``split.repeats``), as a dict.

    The same pipeline as the pre-registered split — held-out wording families of that split
    (so its own rows and cache entry), probe, C1, collapse-only and permuted baselines, and the
    same assessment (:func:`ipi.evaluation.assess.assess` with the run's ``settings``: shared
    bootstrap draws, verdict, reportability) — without the transfer probe (it does not enter the
    verdict) and the random twins.
    """
    folds, plan = split_folds(cfg, trajs, seed)
    rows = make_rows(cfg, trajs, _value(cfg.surface.name), wording=plan)
    trajs, folds = drop_rowless(cfg, trajs, folds, rows)  # steps over the backbone's context left out
    features, _ = extract_features(extract_settings(cfg), rows, layers, list(TOKEN_GROUPS))
    meta, x = row_table(rows, features), select_features(features, layers, groups)
    det = build_detector(cfg)
    x_det = attention_matrix(cfg, det, rows, layers)[0] if det.input == "attention" else x
    fits = fit_folds(cfg, meta, x_det, features, layers, folds, det)
    return assess(ScoreTables(fits.score_table(meta), fits.baselines, permutation=fits.permutation_input()), settings).to_dict()


@task_wrapper
def extract(cfg: DictConfig) -> tuple[dict, dict]:
    """Extract (or reuse) every activation-cache entry a ``train.py`` run with this config reads.

    That is the configured surface and, when ``evaluation.transfer`` is on, the transfer source
    surfaces — so a sweep started after ``extract.py`` forwards nothing — and, when
    ``evaluation.random_twin`` is on, the random-weight twins' entries (one per seed of
    ``evaluation.random_twin_seeds``) for the configured surface (the twins are probed on the
    run's own surface only; their transfer is not reported).

    Returns:
        ``(info of the configured surface, {"features": ..., "extraction_by_surface": ...,
        "extraction_random_twin": {seed: info} or None})``.
    """
    prepare(cfg)
    surfaces = extraction_surfaces(cfg)
    trajs, _, _ = load_data(cfg)
    # rows' wording depends on the split (held-out wording); without it no split is needed
    plan = split_folds(cfg, trajs)[1] if cfg.evaluation.heldout_wording else None
    t0 = time.perf_counter()
    infos, features, twin_infos = {}, None, {}
    for s in surfaces:
        rows = make_rows(cfg, trajs, s, wording=plan)
        shared = None
        if s != surfaces[0]:  # a transfer source: what train.py will read (clean/attack unless shared)
            rows, shared = transfer_rows(extract_settings(cfg), rows, layer_indices(cfg), list(TOKEN_GROUPS))
        feats, infos[s] = extract_features(extract_settings(cfg), rows, layer_indices(cfg), list(TOKEN_GROUPS))
        if shared is not None and feats is not None:
            infos[s]["transfer_rows"] = shared
        if s == surfaces[0]:
            features = feats
            seeds = twin_seeds(cfg)
            if seeds:  # the extract.layers superset, for the layer sweeps that follow (one data pass)
                _, tinfo = extract_twin_features({sd: extract_settings(twin_config(cfg, sd)) for sd in seeds}, rows,
                                                 layer_indices(cfg), list(TOKEN_GROUPS), superset=True)
                twin_infos = {str(k): v for k, v in tinfo.items()}
    if features is not None:  # rank 0 (a non-zero DDP rank writes nothing)
        atomic_write_text(Path(cfg.paths.output_dir) / "run_info.json", json.dumps(
            {**run_info(infos[surfaces[0]], infos, time.perf_counter() - t0),
             "extraction_random_twin": twin_infos or None}, indent=2))
    return infos[surfaces[0]], {"features": features, "extraction_by_surface": infos,
                                "extraction_random_twin": twin_infos or None}


@task_wrapper
def evaluate(cfg: DictConfig) -> tuple[dict, dict]:
    """Evaluate a score table (CSV/Parquet) into ``results.json``, reports and figures."""
    results = evaluate_score_table(cfg.scores, twin=cfg.get("twin_scores"),
                                   settings=assess_settings(cfg.evaluation, pretrained=cfg.get("backbone_pretrained"),
                                                            constructed=bool(cfg.get("backbone_constructed", False)),
                                                            split=_value(cfg.split.kind)))
    write_run_report(results, Path(cfg.paths.output_dir), scores=read_score_table(cfg.scores),
                     config=to_container(cfg), plots=cfg.report.plots, html_report=cfg.report.html)
    return results, {}


__all__ = ["evaluate", "evaluate_split", "extract", "train"]
