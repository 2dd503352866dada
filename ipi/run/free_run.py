"""The behaviour stage of ``train.py`` (docs/behaviour.md): free run, hijack labels, E4, ablation.

Runs only with ``behaviour.enabled=true``. After the probe's fit, on the **test rows** of the
run's split (``behaviour.variants`` of them):

1. the backbone (with its LM head and every block) generates each row's next action
   (:func:`ipi.behaviour.generate.generate`), cached in
   ``<extract.cache_dir>/generations/<backbone digest>.jsonl``;
2. each action is labelled against the goal of its step's attack row (:mod:`ipi.behaviour.labels`);
3. E4 with its C1 analogue and the hijack rates per surface × variant are computed on the
   **run's bootstrap draws**, gated by ``evaluation.min_clusters`` (:mod:`ipi.evaluation.hijack`);
4. with ``behaviour.ablation.enabled``: the attack rows are generated again with each fold's
   probe direction, and with a random direction, projected out (:mod:`ipi.behaviour.ablation`).

Returned as ``results.json``'s ``behaviour`` block; the label table is written as
``behaviour_labels.parquet``. The two claims ("predicts hijack", "uses this direction") never
enter the verdict's checks or its claim."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from ipi.metrics.keys import (ABLATION, ARM_NONE, ARM_PROBE, ARM_RANDOM, BACKBONE_WEIGHTS, BY_VARIANT, CLAIMS, COUNTS,
                              CUT_BY_MAX_NEW_TOKENS, DETAIL, E4, HIJACKED, LABELS_FILE, LAYERS, MAX_NEW_TOKENS, NOTE,
                              OTHER, PREDICTS_HIJACK, RANDOM_SEED, RATES, RESISTED, ROWS, SETTINGS, STATUS,
                              TRAJECTORIES, UNPARSED, USES_DIRECTION, VARIANTS)
from ipi.run.validation import behaviour_variants, to_container
from ipi.run.twin import backbone_weights
from ipi.run.schemas import BehaviourConf

log = logging.getLogger(__name__)

__all__ = ["BEHAVIOUR_LABELS_FILE", "MEANINGLESS_NOTE", "behaviour_enabled", "run_behaviour"]

#: The label table of the run folder.
BEHAVIOUR_LABELS_FILE = "behaviour_labels.parquet"
#: What the report says beside the labels of a backbone whose weights were not trained.
MEANINGLESS_NOTE = ("The backbone's weights are {weights}, not trained: its generations are not an agent's "
                    "actions and every hijack label, rate, E4 and ablation effect here is meaningless "
                    "(the stage runs to test the machinery).")


def behaviour_enabled(cfg: DictConfig) -> bool:
    """Whether the run has the behaviour stage (``behaviour.enabled``)."""
    node = cfg.get("behaviour")
    return bool(node is not None and node.get("enabled", BehaviourConf.enabled))


def _goal_of(pool):
    """``meta → Goal`` of the run's attack pool (``meta["goal"]`` indexes ``pool.goals``)."""
    from ipi.behaviour.labels import goal_in

    goals = tuple(pool.goals)
    return lambda meta: goal_in(meta, goals, f"attack={pool.name}")


def _generation_cache_path(cache_dir: str, identity: dict) -> Path:
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Path(cache_dir) / "generations" / f"{digest}.jsonl"


def _to_accelerator(model, accelerator: str) -> None:
    """Move a model built on the CPU to the GPU when ``extract.accelerator`` allows one and one exists
    (a quantised or device-mapped model stays where its loader put it)."""
    import torch

    if str(accelerator) in ("cpu",) or not torch.cuda.is_available():
        return
    if getattr(model, "hf_device_map", None) or getattr(model, "is_quantized", False):
        return
    if all(p.device.type == "cpu" for p in model.parameters()):
        model.to("cuda")


def _claim(status_detail: tuple[str, str]) -> dict:
    return {STATUS: status_detail[0], DETAIL: status_detail[1]}


def _rates_record(rates: dict) -> dict:
    out: dict = {}
    for (surface, variant), rate in rates.items():
        out.setdefault(str(surface), {})[str(variant)] = rate.to_dict()
    return out


def _counts(labels: pd.DataFrame, stopped: dict[str, bool]) -> dict:
    by_variant = {str(v): {lab: int((g["label"] == lab).sum()) for lab in (HIJACKED, RESISTED, OTHER)}
                  for v, g in labels.groupby("variant", sort=True)}
    return {ROWS: int(len(labels)), TRAJECTORIES: int(labels["trajectory_id"].nunique()),
            BY_VARIANT: by_variant, UNPARSED: int((labels["action_kind"] == "").sum()),
            CUT_BY_MAX_NEW_TOKENS: int(sum(1 for r in labels["row_id"] if not stopped[r]))}


def _context_record(backbone, reqs, max_new_tokens: int) -> dict:
    """Free-run prompts whose generation can run past the backbone's context (logged as a warning).

    Returns:
        ``{"positions", "rows_over_context"}``: the model config's ``max_position_embeddings``
        (:func:`ipi.backbone.context_positions`) and the requests whose prompt tokens plus
        ``max_new_tokens`` exceed it (generated as asked; a RoPE model does not stop there).
    """
    from ipi.backbone import context_positions

    positions = context_positions(backbone.model.config)
    over = sum(int(r.input_ids.numel()) + int(max_new_tokens) > positions for r in reqs)
    if over:
        log.warning("behaviour: %d free-run prompt(s) plus max_new_tokens=%d exceed backbone %s's context of %d "
                    "positions (results.json behaviour.context)", over, max_new_tokens, backbone.name, positions)
    return {"positions": positions, "rows_over_context": over}


def _ablation_texts(backbone, reqs, fold: np.ndarray, fits, layers, groups, at, seed: int, gen, cache):
    """Generations of the attack rows ``reqs`` under each ablation arm (``none``, ``probe``, ``random``).

    Each row is ablated with the direction of the probe of its own fold (``fold``, per row), and
    with a random direction of the same norms; each (fold, arm) is one progress bar.

    Returns:
        ``({arm: {row_id: text}}, {fold: {layer: direction norm}})``.
    """
    from ipi.behaviour.ablation import ProjectOut, probe_directions, random_directions, raw_weights
    from ipi.behaviour.generate import generate

    texts: dict[str, dict[str, str]] = {ARM_NONE: {}, ARM_PROBE: {}, ARM_RANDOM: {}}
    norms = {}
    for f in sorted(set(fold.tolist())):  # each attack row ablated with the direction of the probe that scored it
        idx = np.flatnonzero(fold == f)
        fitted = fits.fitted[f]  # a linear detector's weights (the logistic probe's LinearProbe)
        dirs = probe_directions(raw_weights(getattr(fitted, "probe_", fitted)), layers, groups,
                                backbone.hidden_size, at=at)
        norms[str(f)] = {str(k): float(np.linalg.norm(v)) for k, v in dirs.items()}
        arms = {ARM_NONE: None, ARM_PROBE: ProjectOut(dirs, f"probe[fold {f}]"),
                ARM_RANDOM: ProjectOut(random_directions(dirs, seed), f"random[{seed}]")}
        for arm, inter in arms.items():
            for g in generate(backbone, [reqs[k] for k in idx], gen, cache=cache, intervention=inter,
                              description=f"ablation: fold {f}, arm {arm} (attack rows)"):
                texts[arm][g.row_id] = g.text
    return texts, norms


def _arm_tables(arm_labels: dict, attack_labels: pd.DataFrame) -> list[pd.DataFrame]:
    """The probe and random arms' label tables with the attack rows' scores (the labels file's rows)."""
    out = []
    for a in (ARM_PROBE, ARM_RANDOM):
        t = arm_labels[a].copy()
        t["score"] = attack_labels["score"].to_numpy()
        if "c1" in attack_labels.columns:
            t["c1"] = attack_labels["c1"].to_numpy()
        out.append(t.assign(arm=a))
    return out


def run_draws(ev, rows, test_index) -> tuple:
    """The run's bootstrap draws (the estimands': sorted test trajectories, ``evaluation.n_boot``,
    ``evaluation.seed``), its level and the reportability gate's settings, for the behaviour
    estimands of either measure."""
    from ipi.metrics.bootstrap import make_draws

    draws = make_draws([str(rows[i].trajectory_id) for i in test_index], n_boot=int(ev.n_boot), seed=int(ev.seed))
    gate = {"min_clusters": int(ev.min_clusters), "min_boot_fraction": float(ev.min_boot_fraction)}
    return draws, float(ev.level), gate


def run_behaviour(cfg: DictConfig, rows, fits, x: np.ndarray, layers: list[int], groups: list[str], det, pool,
                  out_dir: Path) -> tuple[dict, dict]:
    """The behaviour stage (module docstring).

    Args:
        cfg: The run config (``behaviour``, ``backbone``, ``evaluation``, ``extract.cache_dir``).
        rows: The run's replay rows (the order of ``fits``' row indices).
        fits: The probe's :class:`~ipi.detectors.crossfit.CrossFit` (or a detector's fits with
            ``test_scores``): test rows, folds, per-fold probes and the C1 baseline's table.
        x: The probe's features ``[N, F]`` (layers × token groups × hidden).
        layers: The probe's decoder blocks, in feature order.
        groups: The probe's token groups, in feature order.
        det: The run's detector (``name``; the ablation needs ``logistic``).
        pool: The run's attack pool (the goals rows are labelled against).
        out_dir: The run folder (``behaviour_labels.parquet`` is written there).

    Returns:
        ``(results.json's behaviour block, run_info entries: seconds and cache use)``.
    """
    from ipi.backbone import build_backbone
    from ipi.behaviour.generate import GenerationCache, GenerationSettings, generate, requests_of_rows
    from ipi.behaviour.labels import label_generations, label_tasks
    from ipi.evaluation.hijack import ablation_effects, e4, join_scores, label_rates, predicts_hijack, \
        uses_direction
    from ipi.protocol import resolve_layers
    from ipi.run.settings import extract_settings

    t0 = time.perf_counter()
    b, ev = cfg.behaviour, cfg.evaluation
    variants = behaviour_variants(cfg)
    test_index = np.asarray(fits.test_index)
    scores = np.asarray(fits.test_scores, dtype=np.float64)  # every detector's out-of-fold test scores
    test_ids = [rows[i].row_id for i in test_index]
    score_of = dict(zip(test_ids, scores))
    c1 = fits.baselines.get("c1")
    c1_of = None
    if c1 is not None:
        if len(c1) != len(test_index) or any(str(c1["trajectory_id"].iloc[j]) != str(rows[i].trajectory_id)
                                             for j, i in enumerate(test_index)):
            raise RuntimeError("behaviour: the C1 baseline's table is not aligned with the probe's test rows")
        c1_of = dict(zip(test_ids, c1["score"].to_numpy(dtype=np.float64)))
    sel = [int(i) for i in test_index if rows[i].variant.variant in set(variants)]
    sel_rows = [rows[i] for i in sel]

    settings = extract_settings(cfg)
    backbone = build_backbone(settings.backbone["loader"], with_lm_head=True)
    _to_accelerator(backbone.model, settings.accelerator)
    gen = GenerationSettings(max_new_tokens=int(b.max_new_tokens), batch_size=int(b.batch_size))
    cache = GenerationCache(_generation_cache_path(settings.cache_dir, backbone.identity))
    system_prompt = str(cfg.backbone.system_prompt)
    log.info("behaviour: free run of %d test rows (%s), max_new_tokens=%d", len(sel_rows), ", ".join(variants),
             gen.max_new_tokens)
    reqs = requests_of_rows(backbone, sel_rows, system_prompt)
    context = _context_record(backbone, reqs, gen.max_new_tokens)
    tasks = label_tasks(sel_rows, _goal_of(pool))
    gens = generate(backbone, reqs, gen, cache=cache,
                    description=f"free run: generating {len(reqs)} test rows (rows)")
    stopped = {g.row_id: g.stopped for g in gens}
    n_cached = sum(g.cached for g in gens)
    labels = label_generations(tasks, {g.row_id: g.text for g in gens})
    labels = join_scores(labels, score_of)
    if c1_of is not None:
        labels = join_scores(labels, c1_of, "c1")
    draws, level, gate = run_draws(ev, rows, test_index)
    rates = label_rates(labels, draws=draws, level=level)
    e4_res = e4(labels, baseline="c1" if c1_of is not None else None, draws=draws, level=level, **gate)
    t_free = time.perf_counter() - t0

    weights = backbone_weights(cfg)
    block = {
        LABELS_FILE: BEHAVIOUR_LABELS_FILE,
        BACKBONE_WEIGHTS: weights,
        SETTINGS: {MAX_NEW_TOKENS: gen.max_new_tokens, VARIANTS: variants, "decoding": "greedy",
                     "system_prompt_chars": len(system_prompt)},
        COUNTS: _counts(labels, stopped),
        "context": context,
        RATES: _rates_record(rates),
        E4: e4_res.to_dict(),
    }
    if weights != "pretrained":
        block[NOTE] = MEANINGLESS_NOTE.format(weights=weights)
    table = [labels.assign(arm=ARM_NONE)]
    claims = {PREDICTS_HIJACK: _claim(predicts_hijack(e4_res))}
    info = {"rows": len(sel_rows), "generated": len(gens) - n_cached, "cached": n_cached,
            "generation_cache": str(cache.path)}

    t1 = time.perf_counter()
    if b.ablation.enabled:
        at = (sorted(set(resolve_layers(list(b.ablation.layers), cfg.backbone.n_layers)))
              if b.ablation.layers is not None else list(layers))
        seed = int(b.ablation.seed)
        att = [j for j, r in enumerate(sel_rows) if r.variant.variant == "attack"]
        texts, norms = _ablation_texts(backbone, [reqs[j] for j in att], fits.fold_of_row[[sel[j] for j in att]],
                                       fits, layers, groups, at, seed, gen, cache)
        att_tasks = [tasks[j] for j in att]
        arm_labels = {a: label_generations(att_tasks, texts[a]) for a in texts}
        effects = ablation_effects(arm_labels, draws=draws, level=level)
        block[ABLATION] = {**effects.to_dict(), LAYERS: at, RANDOM_SEED: seed, "direction_norms": norms}
        claims[USES_DIRECTION] = _claim(uses_direction(effects, **gate))
        table += _arm_tables(arm_labels, labels.iloc[att].reset_index(drop=True))
    else:
        block[ABLATION] = None
        claims[USES_DIRECTION] = {STATUS: "NOT RUN", DETAIL: "behaviour.ablation.enabled=false"}
    block[CLAIMS] = claims
    info["ablation_s"] = round(time.perf_counter() - t1, 2)
    info["free_run_s"] = round(t_free, 2)

    from ipi.io import atomic_path

    with atomic_path(Path(out_dir) / BEHAVIOUR_LABELS_FILE) as tmp:
        pd.concat(table, ignore_index=True).to_parquet(tmp, index=False)
    del backbone
    return block, {**info, "settings": to_container(b)}
