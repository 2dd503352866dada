"""The tasks behind the entry scripts (``train.py``, ``extract.py``, ``evaluate.py``).

Each task is a short sequence of named stages (:mod:`ipi.run.stages`), takes a composed config and
returns ``(metrics, objects)``; the scripts are thin ``@hydra.main`` wrappers around them
(:func:`ipi.run.cli.run_entry`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from ipi.attacks.pool import project_pool
from ipi.run.validation import enum_value as _value
from ipi.run.validation import run_surface, to_container
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
from ipi.evaluation.scoretable import FOLD, evaluate_score_table, read_score_table, twin_score_table
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
from ipi.run.schemas import BackboneConf, EvaluateConf
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


@dataclass
class TrainRun:
    """What the stages of :func:`train` hand on to each other, filled stage by stage."""

    cfg: DictConfig
    t0: float
    out_dir: Path
    surface: str
    sources: list[str]
    groups: list[str]
    layers: list[int]
    trajs: list = field(default_factory=list)
    traj_skips: list = field(default_factory=list)
    step_skips: list = field(default_factory=list)
    folds: list = field(default_factory=list)
    plan: Any = None
    rows: list = field(default_factory=list)
    features: Any = None
    info: dict = field(default_factory=dict)
    infos: dict = field(default_factory=dict)
    infos_att: dict = field(default_factory=dict)
    meta: Any = None
    x: Any = None
    x_det: Any = None
    det: Any = None
    x_twin: dict = field(default_factory=dict)
    twin_infos: dict = field(default_factory=dict)
    transfer_src: Any = None
    loggers: list = field(default_factory=list)
    fits: Any = None
    twin_tables: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    behaviour_info: dict | None = None
    context: dict = field(default_factory=dict)
    empty_groups: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)


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
    surface, *sources = extraction_surfaces(cfg)
    run = TrainRun(cfg, t0, output_dir(cfg), surface, sources, [_value(g) for g in cfg.token_group.names],
                   layer_indices(cfg))
    load_and_split(run)
    if not extract_inputs(run):  # a non-zero DDP rank: rank 0 evaluates
        return {}, {"extraction": run.info}
    fit_run(run)
    record_run(run)
    est, rep = score_and_report(run)
    elapsed = time.perf_counter() - t0
    log.info("extraction: cache %s (%d rows forwarded), %.1f MB on disk (python -m ipi.tools.cache list); "
             "total %.1f s", "hit" if run.info["cache_hit"] else "miss", run.info["rows_forwarded"],
             run.info["cache_bytes"] / 2**20, elapsed)
    for lg in run.loggers:
        lg.finalize("success")
    fits = run.fits
    fitted = fits.fitted[0] if len(fits.fitted) == 1 else fits.fitted
    return rep.results, {"detector": fitted, "fitted": fits.fitted, "folds": run.folds, "scores": est.scores,
                         "baselines": fits.baselines, "extraction": run.info, "elapsed_s": elapsed}


def load_and_split(run: TrainRun) -> None:
    """Import the data, check the split is feasible, make the trajectory-disjoint folds (PROTOCOL.md
    §4) and then the rows: with held-out wording a trajectory's attack and imperative texts come
    from the wording family of the fold it is tested in."""
    cfg = run.cfg
    run.trajs, run.traj_skips, run.step_skips = load_data(cfg)
    check_split_feasible(cfg, [t.trajectory_id for t in run.trajs])  # before any rendering or extraction
    run.folds, run.plan = split_folds(cfg, run.trajs)
    # prompts against the backbone's context: steps over it are counted skips
    run.rows = make_rows(cfg, run.trajs, run.surface, wording=run.plan, context=run.context)
    run.step_skips = run.step_skips + run.context.pop("skipped_steps")
    run.trajs, run.folds = drop_rowless(cfg, run.trajs, run.folds, run.rows)


def extract_inputs(run: TrainRun) -> bool:
    """The features of the rows (cached), the detector and its inputs, the random-weight twins'
    features and the transfer source; False on a non-zero DDP rank (rank 0 goes on alone).

    Twins (:mod:`ipi.run.twin`) are extracted for hidden-state detectors only (for
    attention_focus / external check 6 is NOT RUN).
"""
    cfg, layers, groups = run.cfg, run.layers, run.groups
    run.features, run.info = extract_features(extract_settings(cfg), run.rows, layers, list(TOKEN_GROUPS))
    if run.features is None:
        return False
    run.meta, run.x = row_table(run.rows, run.features), select_features(run.features, layers, groups)
    run.det, run.x_det = build_detector(cfg), run.x
    # Rows whose token groups pooled to zeros (empty), by variant; a share that differs between
    # the sides of an estimand is a warning when the detector reads that group.
    run.empty_groups, run.warnings = empty_group_record(run.rows, run.features,
                                                        groups if run.det.input == "hidden" else [])
    if run.det.input == "attention":  # the detector's own cached extraction (docs/detectors.md)
        run.x_det, run.infos_att[run.surface], run.det = attention_matrix(cfg, run.det, run.rows, layers)
    twins = twin_features(cfg, run.rows, run.features, layers, groups) if run.det.input == "hidden" else ({}, {})
    if twins is None:
        return False
    run.x_twin, run.twin_infos = twins
    source = (transfer_source(cfg, run.trajs, run.sources, run.plan, layers, groups) if cfg.evaluation.transfer
              else (None, {}))
    if source is None:
        return False
    run.transfer_src, run.infos = source[0], {run.surface: run.info, **source[1]}
    if run.det.input == "attention" and run.transfer_src is not None:  # the other surfaces' attention features
        run.transfer_src, more = attention_transfer_source(
            cfg, run.det, run.sources, lambda s: make_rows(cfg, run.trajs, s, wording=run.plan), layers)
        run.infos_att.update(more)
    return True


def fit_run(run: TrainRun) -> None:
    """Fit the detector and its baselines fold by fold, and score the twins' features."""
    cfg = run.cfg
    run.loggers = make_loggers(cfg)
    run.fits = fit_folds(cfg, run.meta, run.x_det, run.features, run.layers, run.folds, run.det,
                         transfer=run.transfer_src, logger=run.loggers[0] if run.loggers else None,
                         default_root_dir=run.out_dir)
    run.twin_tables = twin_score_tables(cfg, run.det, run.meta, run.x_twin, run.folds, run.fits.test_index,
                                        default_root_dir=run.out_dir)


def record_run(run: TrainRun) -> None:
    """results.json's ``counts`` and ``run`` (detector, backbone weights, attack source, attention
    cache keys) and, with ``behaviour.enabled``, the behaviour stage's block (docs/behaviour.md)."""
    cfg, rows, folds, fits = run.cfg, run.rows, run.folds, run.fits
    transfer = {"train_surfaces": run.sources, "test_surface": run.surface} if run.transfer_src is not None else None
    extra = {"counts": {**run_counts(run.trajs, run.meta, rows, fits, folds, run.step_skips, run.traj_skips),
                        "empty_token_groups": run.empty_groups, "context": run.context},
             WARNINGS: run.warnings,
             "run": {**run_record(cfg, run.layers, run.groups, int(run.x.shape[1]), folds, transfer,
                                  wording_record(rows, folds, run.plan, attack_pool(cfg)), run.infos),
                     RANDOM_TWIN: twin_record(cfg, run.twin_infos)}}
    extra["run"]["detector"] = detector_record(cfg, run.det, fits)
    extra["run"]["backbone_weights"] = backbone_weights(cfg)  # pretrained | random | constructed
    pool = attack_pool(cfg)
    if pool.digest != project_pool().digest:  # the default bank adds nothing: its results.json is unchanged
        extra["run"]["attack"] = attack_source_record(cfg, pool, rows, run.meta, run.x_det, fits, run.det, run.plan)
    if run.infos_att:
        extra["run"]["attention_cache_keys"] = {s: i["cache_key"] for s, i in run.infos_att.items()}
    if behaviour_enabled(cfg):  # behaviour.measure on the test rows: free run and/or likelihood (docs/behaviour.md)
        extra[BEHAVIOUR], run.behaviour_info = run_behaviour_stage(cfg, rows, fits, run.x, run.layers, run.groups,
                                                                   run.det, pool, run.out_dir)
    run.extra = extra


def with_folds(scores, folds: list[tuple[set[str], set[str]]]):
    """The score table with the fold that scored each row (``fold``, 0-based) when there are several
    folds: K-fold out-of-fold scores say so in the file, and ``evaluate.py`` judges them as K-fold
    (:func:`ipi.evaluation.scoretable.design_of_table`). A holdout's table is unchanged."""
    if len(folds) < 2:
        return scores
    fold_of = {tid: k for k, (_, test) in enumerate(folds) for tid in test}
    return scores.assign(**{FOLD: scores["trajectory_id"].map(fold_of).astype("int64")})


def score_and_report(run: TrainRun) -> tuple[EstimandsCallback, ReportCallback]:
    """Score the test rows through Lightning; the callbacks compute the estimands and write the
    run's files (the side files first, results.json last); ``split.repeats`` re-rolled splits."""
    cfg, out_dir, fits = run.cfg, run.out_dir, run.fits
    te_meta = run.meta.iloc[fits.test_index].reset_index(drop=True)
    settings = assess_settings(cfg.evaluation, pretrained=bool(cfg.backbone.pretrained),
                               constructed=bool(cfg.backbone.get("constructed", BackboneConf.constructed)),
                               required_controls=run_surface(cfg).required_controls,
                               heldout_wording=bool(cfg.evaluation.heldout_wording), split=_value(cfg.split.kind))
    est = EstimandsCallback(te_meta, fits.baselines, settings, permutation=fits.permutation_input(),
                            twins=run.twin_tables or None)
    test_ids = fold_sides(run.folds)[1]
    gallery = (write_gallery(cfg, next(t for t in run.trajs if t.trajectory_id in set(test_ids)), out_dir)
               if cfg.report.gallery else None)

    def write_side_files() -> None:  # before results.json, which is written last
        atomic_write_text(out_dir / "scores.csv", with_folds(est.scores, run.folds).to_csv(index=False))
        if run.twin_tables:
            atomic_write_text(out_dir / "scores_twin.csv", twin_score_table(run.twin_tables).to_csv(index=False))
        atomic_write_text(out_dir / "run_info.json", json.dumps(
            {**run_info(run.info, run.infos, time.perf_counter() - run.t0, run.infos_att),
             "extraction_random_twin": {str(k): i for k, i in run.twin_infos.items()} or None,
             "permutation_s": (fits.permutation or {}).get("seconds"),
             **({"behaviour": run.behaviour_info} if run.behaviour_info is not None else {})}, indent=2))

    if cfg.split.repeats > 1:  # re-rolled splits beside the pre-registered one (docs/estimands.md)
        seeds = [cfg.split.seed + i for i in range(cfg.split.repeats)]
        run.extra[SPLIT_REPEATS] = {"seeds": seeds, "results": [
            evaluate_split(cfg, run.trajs, s, run.layers, run.groups, settings)
            for s in track(seeds[1:], "split.repeats")]}
    rep = ReportCallback(est, out_dir, run.extra, config=to_container(cfg), gallery=gallery, plots=cfg.report.plots,
                         html=cfg.report.html, before_results=write_side_files)
    score_test_rows(fits, run.x_det, [est, rep], run.loggers)
    return est, rep


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

    The pre-registered split's pipeline and assessment (its own wording families, rows and
    cache entry; probe and baselines; :func:`ipi.evaluation.assess.assess`) without the
    transfer probe and the random twins.
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

    The configured surface, the transfer source surfaces (with ``evaluation.transfer``) and the
    random-weight twins' entries for the configured surface (with ``evaluation.random_twin``).

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
    constructed = bool(cfg.get("backbone_constructed", EvaluateConf.backbone_constructed))
    results = evaluate_score_table(cfg.scores, twin=cfg.get("twin_scores"),
                                   settings=assess_settings(cfg.evaluation, pretrained=cfg.get("backbone_pretrained"),
                                                            constructed=constructed,
                                                            split=_value(cfg.split.kind)))
    write_run_report(results, Path(cfg.paths.output_dir), scores=read_score_table(cfg.scores),
                     config=to_container(cfg), plots=cfg.report.plots, html_report=cfg.report.html)
    return results, {}


__all__ = ["evaluate", "evaluate_split", "extract", "train"]
