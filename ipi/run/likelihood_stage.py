"""The behaviour stage's measures (docs/behaviour.md §5–6): free run, teacher-forced likelihood, or both.

``behaviour.measure`` picks them (:class:`ipi.run.schemas.BehaviourMeasure`):

* ``free_run`` — :func:`ipi.run.free_run.run_behaviour`: generation, hijack labels, E4 and the
  ablation on labels; its keys are the top-level keys of ``results.json``'s ``behaviour`` block;
* ``likelihood`` — :func:`run_likelihood`: each attack and clean test row's hijack propensity
  ``log p(goal action) − log p(gold action)`` under teacher forcing
  (:mod:`ipi.behaviour.propensity`), its shift against the clean row of the step, E4
  (likelihood), ρ(score, shift) and the ablation read on the shift
  (:mod:`ipi.evaluation.likelihood`); the block's ``likelihood`` key;
* ``both``.

The block's ``measure`` says which ran. Neither measure enters the verdict's checks or its claim.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from ipi.metrics.keys import (ABLATION, ARM_NONE, ARM_PROBE, ARM_RANDOM, ATTACK_ROWS, BACKBONE_WEIGHTS, CLAIMS, COUNTS,
                              DETAIL, E4, LAYERS, LIKELIHOOD, LOWERS_SHIFT, NOTE, NO_GOAL_ACTION,
                              NO_GOAL_ACTION_BY_FAMILY, PREDICTS_HIJACK, RANDOM_SEED, ROWS, SCORED as SCORED_KEY,
                              SETTINGS, STATUS, TABLE_FILE, TRAJECTORIES, VARIANTS, WITH_GOAL_ACTION)
from ipi.run.schemas import BehaviourMeasure
from ipi.run.validation import enum_value, to_container

log = logging.getLogger(__name__)

__all__ = ["LIKELIHOOD_FILE", "LIKELIHOOD_NOTE", "behaviour_measures", "run_behaviour_stage", "run_likelihood"]

#: The propensity table of the run folder (every arm).
LIKELIHOOD_FILE = "behaviour_likelihood.parquet"
#: What the report says beside the propensities of a backbone whose weights were not trained.
LIKELIHOOD_NOTE = ("The backbone's weights are {weights}, not trained: its log-likelihoods are not an agent's "
                   "preferences and every propensity, E4 (likelihood) and ablation effect here is meaningless "
                   "(the stage runs to test the machinery).")
#: What the measure scores, as results.json records it.
SCORED = ("log p(goal action) − log p(gold action), nats: each action's tokens and the turn-closing token, "
          "teacher-forced after the row's prompt and the recorded 'Thought: … Action:'; shift = attack row − "
          "clean row of the step, same two actions")


def behaviour_measures(cfg: DictConfig) -> tuple[bool, bool]:
    """``(free run, likelihood)``: which measures ``behaviour.measure`` asks for."""
    m = enum_value(cfg.behaviour.get("measure", BehaviourMeasure.both.value))
    return m in ("free_run", "both"), m in ("likelihood", "both")


def run_behaviour_stage(cfg: DictConfig, rows, fits, x: np.ndarray, layers: list[int], groups: list[str], det, pool,
                        out_dir: Path) -> tuple[dict, dict]:
    """The configured measures (module docstring); arguments as :func:`ipi.run.free_run.run_behaviour`.

    Returns:
        ``(results.json's behaviour block, run_info entries)``; the block holds ``measure``, the
        free run's keys when it ran and ``likelihood`` when that ran.
    """
    from ipi.run.free_run import run_behaviour
    from ipi.run.twin import backbone_weights

    free, lik = behaviour_measures(cfg)
    block: dict = {"measure": enum_value(cfg.behaviour.get("measure", BehaviourMeasure.both.value))}
    info: dict = {}
    if free:
        b, info = run_behaviour(cfg, rows, fits, x, layers, groups, det, pool, out_dir)
        block.update(b)
    else:
        weights = backbone_weights(cfg)
        block[BACKBONE_WEIGHTS] = weights
        if weights != "pretrained":
            block[NOTE] = LIKELIHOOD_NOTE.format(weights=weights)
    if lik:
        block[LIKELIHOOD], info[LIKELIHOOD] = run_likelihood(cfg, rows, fits, layers, groups, pool, out_dir)
    if not free:
        info[SETTINGS] = to_container(cfg.behaviour)
    return block, info


def _scores(rows, fits) -> tuple[dict, dict | None]:
    """``row_id → probe score`` over the test rows, and C1's (None without the baseline)."""
    test_index = np.asarray(fits.test_index)
    ids = [rows[i].row_id for i in test_index]
    score_of = dict(zip(ids, np.asarray(fits.test_scores, dtype=np.float64)))
    c1 = fits.baselines.get("c1")
    if c1 is None:
        return score_of, None
    if len(c1) != len(test_index) or any(str(c1["trajectory_id"].iloc[j]) != str(rows[i].trajectory_id)
                                         for j, i in enumerate(test_index)):
        raise RuntimeError("behaviour: the C1 baseline's table is not aligned with the probe's test rows")
    return score_of, dict(zip(ids, c1["score"].to_numpy(dtype=np.float64)))


def _counts(table: pd.DataFrame) -> dict:
    att = table[table["variant"] == "attack"]
    has = att["goal_action"] != ""
    return {ROWS: int(len(table)), ATTACK_ROWS: int(len(att)),
            TRAJECTORIES: int(table["trajectory_id"].nunique()),
            WITH_GOAL_ACTION: int(has.sum()), NO_GOAL_ACTION: int((~has).sum()),
            NO_GOAL_ACTION_BY_FAMILY: {str(k): int(v) for k, v in att[~has]["goal_family"].value_counts().items()},
            "mean_tokens": {"gold": float(att["n_tokens_gold"].mean()) if len(att) else None,
                            "goal": float(att.loc[has, "n_tokens_goal"].mean()) if has.any() else None}}


def _ablation_arms(cfg, backbone, sel_rows, sel_index, fits, layers, groups, goal_of, none: pd.DataFrame):
    """The ``probe`` and ``random`` arms' tables: each fold's test rows under that fold's probe
    direction and under a random direction of equal norm; rows in ``none``'s order."""
    from ipi.behaviour.ablation import ProjectOut, probe_directions, random_directions, raw_weights
    from ipi.behaviour.propensity import likelihood_table
    from ipi.protocol import resolve_layers

    b = cfg.behaviour
    at = (sorted(set(resolve_layers(list(b.ablation.layers), cfg.backbone.n_layers)))
          if b.ablation.layers is not None else list(layers))
    seed = int(b.ablation.seed)
    fold = np.asarray(fits.fold_of_row)[sel_index]
    parts: dict[str, list] = {ARM_PROBE: [], ARM_RANDOM: []}
    norms = {}
    system_prompt = str(cfg.backbone.system_prompt)
    for f in sorted(set(fold.tolist())):
        fr = [r for r, k in zip(sel_rows, fold) if k == f]
        fitted = fits.fitted[f]
        dirs = probe_directions(raw_weights(getattr(fitted, "probe_", fitted)), layers, groups, backbone.hidden_size,
                                at=at)
        norms[str(f)] = {str(k): float(np.linalg.norm(v)) for k, v in dirs.items()}
        for arm, inter in ((ARM_PROBE, ProjectOut(dirs, f"probe[fold {f}]")),
                           (ARM_RANDOM, ProjectOut(random_directions(dirs, seed), f"random[{seed}]"))):
            parts[arm].append(likelihood_table(backbone, fr, system_prompt, goal_of, intervention=inter,
                                               description=f"likelihood: ablation, {arm} arm, fold {f} (rows)"))
    order = none["row_id"].tolist()
    arms = {a: pd.concat(p, ignore_index=True).set_index("row_id").loc[order].reset_index() for a, p in parts.items()}
    return arms, {LAYERS: at, RANDOM_SEED: seed, "direction_norms": norms}


def run_likelihood(cfg: DictConfig, rows, fits, layers: list[int], groups: list[str], pool,
                   out_dir: Path) -> tuple[dict, dict]:
    """The likelihood measure on the run's attack and clean test rows (module docstring).

    Args:
        cfg: The run config (``behaviour``, ``backbone``, ``evaluation``, ``extract``).
        rows: The run's replay rows (the order of ``fits``' row indices).
        fits: The detector's cross-fit (test rows, test scores, folds, per-fold probes, C1).
        layers: The probe's decoder blocks, in feature order.
        groups: The probe's token groups, in feature order.
        pool: The run's attack pool (the goals).
        out_dir: The run folder (:data:`LIKELIHOOD_FILE` is written there).

    Returns:
        ``(the block's likelihood entry, run_info entries: rows scored, seconds)``.
    """
    from ipi.backbone import build_backbone
    from ipi.behaviour.propensity import likelihood_table
    from ipi.evaluation.hijack import join_scores
    from ipi.evaluation.likelihood import likelihood_ablation, likelihood_e4, lowers_shift, predicts_hijack_likelihood
    from ipi.io import atomic_path
    from ipi.run.free_run import _claim, _goal_of, _to_accelerator, run_draws
    from ipi.run.settings import extract_settings

    t0 = time.perf_counter()
    ev = cfg.evaluation
    score_of, c1_of = _scores(rows, fits)
    test_index = np.asarray(fits.test_index)
    sel_index = [int(i) for i in test_index if rows[i].variant.variant in ("attack", "clean")]
    sel_rows = [rows[i] for i in sel_index]
    settings = extract_settings(cfg)
    backbone = build_backbone(settings.backbone["loader"], with_lm_head=True)
    _to_accelerator(backbone.model, settings.accelerator)
    goal_of = _goal_of(pool)
    log.info("behaviour: teacher-forced likelihood of the gold and goal actions on %d test rows", len(sel_rows))
    none = likelihood_table(backbone, sel_rows, str(cfg.backbone.system_prompt), goal_of)
    none = join_scores(none, score_of)
    if c1_of is not None:
        none = join_scores(none, c1_of, "c1")
    draws, level, gate = run_draws(ev, rows, test_index)
    res = likelihood_e4(none, baseline="c1" if c1_of is not None else None, draws=draws, level=level, **gate)
    t_score = time.perf_counter() - t0
    block = {TABLE_FILE: LIKELIHOOD_FILE, SCORED_KEY: SCORED, VARIANTS: ["attack", "clean"],
             COUNTS: _counts(none), E4: res.to_dict(),
             CLAIMS: {PREDICTS_HIJACK: _claim(predicts_hijack_likelihood(res))}}
    table = [none.assign(arm="none")]
    t1 = time.perf_counter()
    has_shift = bool(none.loc[none["variant"] == "attack", "shift"].notna().any())
    if cfg.behaviour.ablation.enabled and has_shift:
        arms, record = _ablation_arms(cfg, backbone, sel_rows, sel_index, fits, layers, groups, goal_of, none)
        effects = likelihood_ablation({ARM_NONE: none, **arms}, draws=draws, level=level)
        block[ABLATION] = {**effects.to_dict(), **record}
        block[CLAIMS][LOWERS_SHIFT] = _claim(lowers_shift(effects, **gate))
        for a, t in arms.items():
            table.append(t.assign(arm=a, score=none["score"].to_numpy(),
                                  **({"c1": none["c1"].to_numpy()} if "c1" in none.columns else {})))
    else:
        why = ("behaviour.ablation.enabled=false" if not cfg.behaviour.ablation.enabled
               else "no attack row has a goal action")
        block[ABLATION] = None
        block[CLAIMS][LOWERS_SHIFT] = {STATUS: "NOT RUN", DETAIL: why}
    with atomic_path(Path(out_dir) / LIKELIHOOD_FILE) as tmp:
        pd.concat(table, ignore_index=True).to_parquet(tmp, index=False)
    del backbone
    return block, {ROWS: len(sel_rows), "score_s": round(t_score, 2),
                   "ablation_s": round(time.perf_counter() - t1, 2)}
