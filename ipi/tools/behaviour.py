"""A small free run outside the pipeline: hijack rates, E4 and the ablation effect (issue 26).

``python -m ipi.tools.behaviour --surface i_dom --trajectories 12 --max-steps 3 --out DIR``
runs SmolLM2-135M (``make setup-smollm``) on the first ``--trajectories`` WebVoyager
trajectories of ``../shared/data/webvoyager`` (their first ``--max-steps`` steps), one text
surface, clean + attack rows (+ ``--controls``):

1. **features**: each row teacher-forced once (:func:`ipi.replay.tokenise`, hooks on the
   ``--layers`` blocks, token groups mean-pooled with :func:`ipi.extraction.extractor.pool_groups`);
2. **probe and C1, cross-fitted**: trajectories split into two folds (sorted ids, alternating);
   on each fold the scikit-learn probe (:func:`ipi.probe.fit.fit_sklearn_reference`, attack vs
   clean) and the C1 metadata baseline (``step, horizon, prompt_len, delta_prompt_len``) are fitted on
   the other fold and score this one, so every row has an out-of-fold score (E4 then pools two
   probes' scores; the pipeline's own split is not used — this tool stands apart from it);
3. **free run** (:mod:`ipi.behaviour.generate`), labels (:mod:`ipi.behaviour.labels`), hijack
   rates per variant, E4 with its C1 analogue (:mod:`ipi.evaluation.hijack`);
4. **ablation** on the attack rows: the probe fitted on **all** rows gives the direction at each
   layer (:func:`ipi.behaviour.ablation.probe_directions`), against a random one of equal norm.

Writes ``DIR/behaviour.json`` (numbers, wall times, load average), ``DIR/labels.csv`` (the free-run
labels of every row and arm) and ``DIR/generations.jsonl`` (the generation cache: a rerun reuses
it). Not wired into ``train.py`` or ``results.json`` (docs/behaviour.md, *Wiring*).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

__all__ = ["main", "row_features", "run_behaviour"]

SYSTEM_PROMPT_NOTE = "ipi.protocol.DEFAULT_SYSTEM_PROMPT"


def row_features(backbone, rows: Sequence, system_prompt: str, layers: Sequence[int],
                 groups: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forced pooled features ``[N, L, G, H]`` (float32) and prompt lengths ``[N]`` of text rows.

    Raises:
        ValueError: A multimodal backbone (this tool runs text surfaces on text backbones).
    """
    from ipi.extraction.extractor import pool_groups
    from ipi.replay import tokenise

    if backbone.multimodal:
        raise ValueError(f"backbone={backbone.name}: ipi.tools.behaviour runs text-only backbones")
    store: dict[int, torch.Tensor] = {}

    def hook(k):
        def f(_m, _i, out):
            store[k] = (out[0] if isinstance(out, tuple) else out)[0].detach()
        return f

    handles = [backbone.layers[k].register_forward_hook(hook(k)) for k in layers]
    feats, lens = [], []
    try:
        with torch.inference_mode():
            for r in rows:
                tok = tokenise(backbone.processor, r.parts(system_prompt, False))
                backbone.model(input_ids=tok.inputs["input_ids"], attention_mask=tok.inputs["attention_mask"])
                feats.append(torch.stack([pool_groups(store[k], tok.groups, groups) for k in layers]).numpy())
                lens.append(tok.prompt_len)
    finally:
        for h in handles:
            h.remove()
    return np.stack(feats).astype(np.float32), np.asarray(lens, dtype=np.float64)


def _metadata(rows, prompt_len: np.ndarray) -> np.ndarray:
    clean = {(r.trajectory_id, r.step.step): n for r, n in zip(rows, prompt_len) if r.variant.variant == "clean"}
    return np.asarray([[r.step.step, r.horizon, n, n - clean.get((r.trajectory_id, r.step.step), n)]
                       for r, n in zip(rows, prompt_len)], dtype=np.float64)


def _cross_fit(x: np.ndarray, y: np.ndarray, fold: np.ndarray, fit_rows: np.ndarray) -> np.ndarray:
    from ipi.probe.fit import fit_sklearn_reference

    out = np.full(len(y), np.nan)
    for f in (0, 1):
        train = (fold != f) & fit_rows
        out[fold == f] = fit_sklearn_reference(x[train], y[train]).decision_function(x[fold == f])
    return out


def run_behaviour(backbone, trajectories: Sequence, surface: str, out_dir: str | os.PathLike, *,
                  controls: Sequence[str] = (), layers: Sequence[int], max_new_tokens: int = 48, batch_size: int = 4,
                  n_boot: int = 1000, seed: int = 0, system_prompt: str | None = None, log=print,
                  command: dict | None = None) -> dict:
    """Run the steps of the module docstring; returns (and writes) the summary.

    Args:
        backbone: A text-only backbone with its LM head.
        trajectories: Imported trajectories (already cut to the steps to run).
        surface: A text surface (``i_dom``, ``i_tool``).
        out_dir: Output folder (created).
        controls: Controls to label as well (comparison rates).
        layers: Decoder blocks the probe reads (and the ablation acts on).
        max_new_tokens: Generation bound.
        batch_size: Generation batch size.
        n_boot: Bootstrap replicates.
        seed: Seed of the bootstrap draws and of the random direction.
        system_prompt: The agent's system prompt (default :data:`ipi.protocol.DEFAULT_SYSTEM_PROMPT`).
        log: Progress lines.
        command: What the run was started with (recorded in ``behaviour.json``), or None.

    Returns:
        The summary dict written to ``behaviour.json``.
    """
    from ipi.behaviour.ablation import probe_directions, raw_weights, run_ablation
    from ipi.behaviour.generate import GenerationCache, GenerationSettings, generate, requests_of_rows
    from ipi.behaviour.labels import label_generations, label_tasks
    from ipi.extraction.rows import build_rows
    from ipi.metrics.bootstrap import make_draws
    from ipi.evaluation.hijack import e4, join_scores, label_rates, predicts_hijack, uses_direction
    from ipi.probe.fit import fit_sklearn_reference
    from ipi.protocol import DEFAULT_SYSTEM_PROMPT, TOKEN_GROUPS

    t_start = time.perf_counter()
    times: dict[str, float] = {}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    system_prompt = DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt
    tok = backbone.tokenizer
    rows = build_rows(trajectories, surface, list(controls),
                      count_tokens=lambda s: len(tok.encode(s, add_special_tokens=False)))
    log(f"{len(rows)} rows ({surface}; {len(trajectories)} trajectories)")
    groups = [g for g in TOKEN_GROUPS if g != "image"]

    t = time.perf_counter()
    x, prompt_len = row_features(backbone, rows, system_prompt, layers, groups)
    times["features_s"] = time.perf_counter() - t
    x_flat = x.reshape(len(rows), -1)
    variant = np.asarray([r.variant.variant for r in rows], dtype=object)
    y = (variant == "attack").astype(int)
    fit_rows = (variant == "attack") | (variant == "clean")
    ids = sorted({r.trajectory_id for r in rows})
    fold = np.asarray([ids.index(r.trajectory_id) % 2 for r in rows])
    scores = _cross_fit(x_flat, y, fold, fit_rows)
    c1 = _cross_fit(_metadata(rows, prompt_len), y, fold, fit_rows)
    full_probe = fit_sklearn_reference(x_flat[fit_rows], y[fit_rows])
    directions = probe_directions(raw_weights(full_probe), list(layers), groups, backbone.hidden_size)

    t = time.perf_counter()
    settings = GenerationSettings(max_new_tokens=max_new_tokens, batch_size=batch_size)
    cache = GenerationCache(out / "generations.jsonl")
    reqs = requests_of_rows(backbone, rows, system_prompt)
    tasks = label_tasks(rows)
    gens = generate(backbone, reqs, settings, cache=cache,
                    progress=lambda d, n: log(f"free run: {d}/{n} rows"))
    times["free_run_s"] = time.perf_counter() - t
    labels = label_generations(tasks, {g.row_id: g.text for g in gens})
    labels = join_scores(labels, dict(zip([r.row_id for r in rows], scores)))
    labels = join_scores(labels, dict(zip([r.row_id for r in rows], c1)), "c1")
    draws = make_draws([r.trajectory_id for r in rows], n_boot=n_boot, seed=seed)
    rates = label_rates(labels, draws=draws, by=("variant",))
    e4_res = e4(labels, baseline="c1", draws=draws)

    t = time.perf_counter()
    att = [i for i, r in enumerate(rows) if r.variant.variant == "attack"]
    abl = run_ablation(backbone, [reqs[i] for i in att], [tasks[i] for i in att], directions, settings=settings,
                       cache=cache, seed=seed, draws=draws)
    times["ablation_s"] = time.perf_counter() - t
    times["total_s"] = time.perf_counter() - t_start

    table = pd.concat([labels.assign(arm="none")] + [abl.labels[a].assign(arm=a) for a in ("probe", "random")])
    table.to_csv(out / "labels.csv", index=False)
    summary = {
        "command": command, "backbone": backbone.identity, "surface": surface, "n_trajectories": len(ids), "n_rows": len(rows),
        "layers": list(layers), "token_groups": groups, "max_new_tokens": max_new_tokens,
        "labels_by_variant": {v: labels[labels.variant == v]["label"].value_counts().to_dict()
                              for v in sorted(set(variant))},
        "unparsed_share": float((labels["action_kind"] == "").mean()),
        "hijack_rates": {k[0]: v.to_dict() for k, v in rates.items()},
        "e4": e4_res.to_dict(), "predicts_hijack": list(predicts_hijack(e4_res)),
        "ablation": abl.effects.to_dict(), "uses_direction": list(uses_direction(abl.effects)),
        "wall_s": {k: round(v, 1) for k, v in times.items()},
        "load_average": [round(x, 2) for x in os.getloadavg()], "torch_threads": torch.get_num_threads(),
    }
    from ipi.io import atomic_write_text

    atomic_write_text(out / "behaviour.json", json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (module docstring)."""
    p = argparse.ArgumentParser(prog="python -m ipi.tools.behaviour", description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[2].parent / "shared" / "data" / "webvoyager"))
    p.add_argument("--surface", default="i_dom")
    p.add_argument("--controls", nargs="*", default=[])
    p.add_argument("--trajectories", type=int, default=12)
    p.add_argument("--max-steps", type=int, default=3)
    p.add_argument("--layers", type=int, nargs="+", default=[15])
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-element-chars", type=int, default=500,
                   help="cap each step's page text (as the known-answer runs do; 0: no cap)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1 on a shared 2-core machine: two contend and are slower)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)

    from dataclasses import replace

    from ipi.backbone_text import build_gguf_causal_lm
    from ipi.data.webvoyager import import_webvoyager

    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    trajs = sorted(import_webvoyager(a.data, max_element_chars=a.max_element_chars or None),
                   key=lambda t: t.trajectory_id)[: a.trajectories]
    trajs = [replace(t, steps=tuple(t.steps)[: a.max_steps]) for t in trajs]
    backbone = build_gguf_causal_lm()
    t_load = time.perf_counter() - t0
    print(f"data and backbone loaded in {t_load:.0f} s", flush=True)
    s = run_behaviour(backbone, trajs, a.surface, a.out, controls=a.controls, layers=a.layers,
                      max_new_tokens=a.max_new_tokens, batch_size=a.batch_size, n_boot=a.n_boot, seed=a.seed,
                      log=lambda m: print(m, flush=True), command={**vars(a), "load_s": round(t_load, 1)})
    print(json.dumps({k: s[k] for k in ("labels_by_variant", "hijack_rates", "e4", "predicts_hijack", "ablation",
                                        "uses_direction", "wall_s", "load_average")}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
