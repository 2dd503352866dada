"""Extraction benchmark against two baselines on the same rows, precision and threads.

Three ways of turning replay rows into pooled features (all layers × token groups, collapse
statistic), timed on the same rows of real shared trajectories, surface by surface:

* **TaskTracker-style** (key ``speedup``): per row, the processor's own call, then the full
  ``...ForConditionalGeneration`` forward with ``output_hidden_states=True`` (LM head included),
  one row at a time, pooling in Python.
* **elk-style** (key ``speedup_vs_elk_style``): the base model without the LM head, the
  variants of one step batched, every decoder block with ``output_hidden_states=True``.
* **ours**: :func:`ipi.extraction.forward.extract_features` exactly as ``train.py`` runs it, into
  a fresh temporary cache entry each repetition (``prefix_reuse`` reported per surface).

Start-up (building the backbone) is timed apart from the steady state, which is repeated
``reps`` times (median, min, max). Also reported: CPU-seconds, load averages, torch threads,
tokens and FLOPs per row (``torch.utils.flop_counter.FlopCounterMode``, an untimed pass),
achieved FLOP/s against a measured fp32 matmul peak, the share of data preparation, and the
relative feature error of the two other ways against the TaskTracker-style features."""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from ipi.tools.stopwatch import Stopwatch, best_of
from ipi.backbone import _pretrained
from ipi.extraction.datamodule import ReplayDataset, StepGroupDataset, collate_rows, collate_steps, step_groups
from ipi.extraction.extractor import base_model, collapse_statistic, planned_prefix_len, pool_groups
from ipi.extraction.forward import ExtractSettings, extract_features
from ipi.progress import progress_bar
from ipi.protocol import TOKEN_GROUPS

__all__ = ["matmul_peak_flops", "measurement_warnings", "speed_benchmark"]


def matmul_peak_flops(n: int = 1024, reps: int = 8, dtype: torch.dtype = torch.float32) -> float:
    """Measured dense matmul throughput of this machine at the current torch thread count.

    Best of ``reps`` timed ``[n, n] @ [n, n]`` products (2 n³ FLOPs each) after one warm-up.

    Returns:
        FLOP/s.
    """
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    a @ b
    return 2.0 * n**3 / best_of(lambda: a @ b, reps)[0]


@contextlib.contextmanager
def _identity_final_norm(model):
    """Swap the text model's final norm for the identity (``hidden_states[-1]`` = block output)."""

    lm = getattr(base_model(model), "language_model", base_model(model))
    norm = lm.norm
    lm.norm = torch.nn.Identity()
    try:
        yield
    finally:
        lm.norm = norm


def _replay_dataset(bb, settings, rows):

    return ReplayDataset(rows, bb.processor, settings.backbone["system_prompt"], bb.multimodal, bb.image_size,
                         bb.image_token_id)


def tasktracker_features(bb, settings, rows, layers: Sequence[int]) -> dict:
    """TaskTracker-style: full model with LM head, one row at a time (module docstring).

    Returns:
        ``{"features": [N, L, G, H], "collapse": [N, L], "prep_s", "tokens"}``.
    """

    ds = _replay_dataset(bb, settings, rows)
    feats, coll, prep, tokens = [], [], 0.0, 0
    with torch.inference_mode(), _identity_final_norm(bb.model):
        for i in range(len(ds)):
            with Stopwatch() as sw:
                tok = ds[i]["tok"]
            prep += sw.wall_s
            tokens += tok.seq_len
            hs = bb.model(**tok.inputs, output_hidden_states=True).hidden_states
            feats.append(torch.stack([pool_groups(hs[k + 1][0], tok.groups, TOKEN_GROUPS) for k in layers]))
            coll.append(torch.stack([collapse_statistic(hs[k + 1][0][: tok.prompt_len]) for k in layers]))
    return {"features": torch.stack(feats).numpy(), "collapse": torch.stack(coll).numpy(), "prep_s": prep,
            "tokens": tokens}


def elk_features(bb, settings, rows, layers: Sequence[int]) -> dict:
    """elk-style: base model without head, a step's variants batched (module docstring).

    Returns:
        As :func:`tasktracker_features`; ``tokens`` counts padded positions too.
    """

    ds = _replay_dataset(bb, settings, rows)
    out_f: list = [None] * len(rows)
    out_c: list = [None] * len(rows)
    prep, tokens = 0.0, 0
    model = base_model(bb.model)
    with torch.inference_mode(), _identity_final_norm(bb.model):
        for group in step_groups(rows):
            with Stopwatch() as sw:
                items = [ds[i] for i in group]
                batch = collate_rows(items, bb.pad_token_id)
            prep += sw.wall_s
            tokens += int(batch["inputs"]["input_ids"].numel())
            hs = model(**batch["inputs"], output_hidden_states=True, use_cache=False).hidden_states
            for b, it in enumerate(items):
                tok = it["tok"]
                out_f[it["index"]] = torch.stack(
                    [pool_groups(hs[k + 1][b], tok.groups, TOKEN_GROUPS) for k in layers])
                out_c[it["index"]] = torch.stack(
                    [collapse_statistic(hs[k + 1][b][: tok.prompt_len]) for k in layers])
    return {"features": torch.stack(out_f).numpy(), "collapse": torch.stack(out_c).numpy(), "prep_s": prep,
            "tokens": tokens}


def ours_features(bb, settings, rows, layers: Sequence[int]) -> dict:
    """The project path (:func:`ipi.extraction.forward.extract_features`) into a fresh cache entry.

    Returns:
        As :func:`tasktracker_features`; ``prep_s`` is timed in a separate pass over the same
        step groups (rendering, tokenising, collating: what DataLoader workers would do).
    """

    with tempfile.TemporaryDirectory() as tmp:
        # exactly `layers` into a fresh entry: the same work as the baselines
        fs, _ = extract_features(replace(settings, cache_dir=tmp, layers=()), rows, layers, list(TOKEN_GROUPS),
                                 backbone=bb)
    li = [fs.layers.index(k) for k in layers]
    return {"features": fs.features[:, li].float().numpy(), "collapse": fs.collapse[:, li].float().numpy()}


def ours_prep(bb, settings, rows) -> tuple[float, int, int]:
    """The project path's data preparation alone (step groups rendered, tokenised, collated).

    Returns:
        ``(seconds, positions, prefix_groups)``: ``positions`` counts the token positions the
        language model forwards (with ``extract.prefix_reuse``: a reused prefix once, then each
        chunk of ``backbone.batch_size`` suffixes padded to its longest; without: each chunk of
        whole rows padded to its longest row); ``prefix_groups`` counts the step groups whose
        prefix is reused.
    """

    ds = StepGroupDataset(rows, bb.processor, settings.backbone["system_prompt"], bb.multimodal, bb.image_size,
                          bb.image_token_id)
    mode = settings.prefix_reuse
    with Stopwatch() as sw:
        batches = [collate_steps([ds[g]], bb.pad_token_id) for g in range(len(ds))]
    secs = sw.wall_s
    step = max(1, int(settings.backbone["batch_size"]))
    positions, reused = 0, 0
    for batch in batches:
        ls = batch["seq_len_list"]
        p = planned_prefix_len(batch, 0, len(ls), mode)
        reused += p > 0
        positions += p + sum((max(ls[a:a + step]) - p) * len(ls[a:a + step]) for a in range(0, len(ls), step))
    return secs, positions, reused


def _stats(xs: Sequence[float]) -> dict:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3),
            "n": len(xs)}


def _rates(rows: int, tokens: int, flops: float, prep_s: float, median_s: float, peak: float) -> dict:
    """Rows/s, tokens and FLOPs per row, achieved FLOP/s and its share of ``peak``, and the
    preparation share, of one way's work timed at ``median_s`` seconds."""
    return {"rows_per_s": round(rows / median_s, 3), "tokens_per_row": round(tokens / rows, 1),
            "gflop_per_row": round(flops / rows / 1e9, 4), "achieved_gflop_s": round(flops / median_s / 1e9, 3),
            "fraction_of_matmul_peak": round(flops / median_s / peak, 4), "prep_share": round(prep_s / median_s, 3)}


def _rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(a - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


METHODS = ("tasktracker", "elk", "ours")


def _time_surface(si: int, surface: str, rows: list, runners: dict, reps: int, wall: dict, totals: dict,
                  peak: float, ours_bb, settings: ExtractSettings, bar) -> dict:
    """One surface of :func:`speed_benchmark`: each way's untimed pass, then ``reps`` timed ones.

    Fills ``wall[way][si]`` and adds to ``totals[way]``; advances ``bar`` once per way.

    Returns:
        The surface's entry of ``per_surface``.
    """
    res: dict = {"rows": len(rows)}
    ref = None
    for m in METHODS:
        bar.describe(f"speed: {surface}, {m} ({len(rows)} rows x {reps + 1} passes)")
        with FlopCounterMode(display=False) as mode:  # untimed pass (also warms caches)
            runners[m](rows)
        flops = float(mode.get_total_flops())
        secs, cpus, out = [], [], None
        for r in range(reps):
            with Stopwatch() as sw:
                out = runners[m](rows)
            secs.append(sw.wall_s)
            cpus.append(sw.cpu_s)
            wall[m][si][r] = secs[-1]
        if m == "ours":
            prep, out["tokens"], reused = ours_prep(ours_bb, settings, rows)
            res["prefix_reuse"] = {"mode": str(settings.prefix_reuse),
                                   "step_groups_reused": int(reused),
                                   "step_groups": len({(r.trajectory_id, r.step.step) for r in rows})}
        else:
            prep = out["prep_s"]
        entry = {"steady_s": _stats(secs), "cpu_s": _stats(cpus),
                 **_rates(len(rows), out["tokens"], flops, prep, statistics.median(secs), peak)}
        if m == "tasktracker":
            ref = out
        else:
            entry["rel_feature_error"] = _rel_err(out["features"], ref["features"])
            entry["rel_collapse_error"] = _rel_err(out["collapse"], ref["collapse"])
        res[m] = entry
        t = totals[m]
        t["rows"] += len(rows)
        t["tokens"] += out["tokens"]
        t["flops"] += flops
        t["cpu"] += statistics.median(cpus)
        t["prep"] += prep
        bar.advance()
    res["speedup"] = round(res["tasktracker"]["steady_s"]["median"] / res["ours"]["steady_s"]["median"], 3)
    res["speedup_vs_elk_style"] = round(res["elk"]["steady_s"]["median"] / res["ours"]["steady_s"]["median"], 3)
    return res


def speed_benchmark(settings: ExtractSettings, rows_by_surface: dict[str, list], layers: Sequence[int], *, reps: int = 3,
                    build_backbone: Callable[[], object], build_ours: Callable[[], object] | None = None) -> dict:
    """Time the three ways (module docstring) on each surface's rows; ``reps`` repetitions.

    Args:
        settings: The extraction settings of the composed ``train`` config (:func:`ipi.run.settings.extract_settings`).
        rows_by_surface: Replay rows per surface (the same rows for every way).
        layers: Decoder blocks read.
        reps: Repetitions of every steady-state measurement (>= 1; 3 or more for a spread).
        build_backbone: Builds the baselines' backbone (the full model, LM head included).
        build_ours: Builds the project's backbone (None: ``build_backbone``).

    Returns:
        A JSON-able dict: ``per_surface`` (per way: steady seconds as median/min/max, rows/s,
        CPU-seconds, tokens and FLOPs per row, achieved FLOP/s and its fraction of the matmul
        peak, preparation share, relative feature error; ``speedup`` and
        ``speedup_vs_elk_style`` of the medians), the same for ``mixed`` (all surfaces' rows:
        sums of the per-surface steady times of each repetition), ``startup_s`` per way, load
        averages, threads and the matmul peak.
    """

    build_ours = build_ours or build_backbone
    load_before = os.getloadavg()
    peak = matmul_peak_flops()
    startup = {}
    _pretrained.cache_clear()  # each start-up parses the processor files itself
    with Stopwatch() as sw:
        bb = build_backbone()
    startup["baselines"] = {"wall_s": round(sw.wall_s, 3), "cpu_s": round(sw.cpu_s, 3)}
    _pretrained.cache_clear()
    with Stopwatch() as sw:
        ours_bb = build_ours()
    startup["ours"] = {"wall_s": round(sw.wall_s, 3), "cpu_s": round(sw.cpu_s, 3)}
    runners = {
        "tasktracker": lambda rows: tasktracker_features(bb, settings, rows, layers),
        "elk": lambda rows: elk_features(bb, settings, rows, layers),
        "ours": lambda rows: ours_features(ours_bb, settings, rows, layers),
    }
    per_surface: dict = {}
    wall = {m: [[0.0] * reps for _ in rows_by_surface] for m in METHODS}
    totals = {m: {"rows": 0, "tokens": 0, "flops": 0.0, "cpu": 0.0, "prep": 0.0} for m in METHODS}
    with progress_bar("speed", len(rows_by_surface) * len(METHODS)) as bar:  # (surface, way) pairs, elapsed, ETA
        for si, (surface, rows) in enumerate(rows_by_surface.items()):
            per_surface[surface] = _time_surface(si, surface, rows, runners, reps, wall, totals, peak, ours_bb,
                                                 settings, bar)
    mixed: dict = {"rows": totals["ours"]["rows"]}
    for m in METHODS:
        per_rep = [sum(wall[m][si][r] for si in range(len(rows_by_surface))) for r in range(reps)]
        t = totals[m]
        mixed[m] = {"steady_s": _stats(per_rep), "cpu_s_median_sum": round(t["cpu"], 3),
                    **_rates(t["rows"], t["tokens"], t["flops"], t["prep"], statistics.median(per_rep), peak)}
        if m != "tasktracker":
            mixed[m]["rel_feature_error"] = max(per_surface[s][m]["rel_feature_error"] for s in per_surface)
    mixed["speedup"] = round(mixed["tasktracker"]["steady_s"]["median"] / mixed["ours"]["steady_s"]["median"], 3)
    mixed["speedup_vs_elk_style"] = round(mixed["elk"]["steady_s"]["median"] / mixed["ours"]["steady_s"]["median"], 3)
    load_after = os.getloadavg()
    return {
        "warnings": measurement_warnings(reps, load_before, load_after),
        "speedup": mixed["speedup"],
        "speedup_vs_elk_style": mixed["speedup_vs_elk_style"],
        "mixed": mixed,
        "per_surface": per_surface,
        "startup_s": startup,
        "reps": reps,
        "layers": list(layers),
        "precision": settings.precision,
        "torch_threads": torch.get_num_threads(),
        "matmul_peak_gflop_s": round(peak / 1e9, 2),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
    }


def measurement_warnings(reps: int, load_before: Sequence[float], load_after: Sequence[float],
                         n_cpus: int | None = None) -> list[str]:
    """Why a bench result should not be quoted: too few repetitions, or a busy machine.

    Args:
        reps: Repetitions of each steady-state measurement.
        load_before: ``os.getloadavg()`` before the timed part (1-, 5-, 15-minute).
        load_after: The same after it.
        n_cpus: CPUs of the machine (default ``os.cpu_count()``).

    Returns:
        One sentence per problem; empty when the figures can be quoted.
    """
    n_cpus = n_cpus or os.cpu_count() or 1
    out = []
    if reps < 3:
        out.append(f"reps={reps}: median, min and max of fewer than 3 repetitions; a single load spike "
                   "decides the ratios (quote runs with --reps 3 or more)")
    busy = max(load_before[0], load_after[0])
    # the bench itself adds about one unit of load; more than that on top means other work ran
    if busy > 1.0 + 0.5 * n_cpus:
        out.append(f"1-minute load average reached {busy:.2f} on {n_cpus} CPUs: other processes shared "
                   "the machine; ratios between the ways are unreliable")
    return out


def _timed_run(cmd: list[str], cwd, env: dict) -> dict:
    """Run ``cmd`` to completion; wall seconds, CPU-seconds (user + system) and load averages."""
    import subprocess

    load = os.getloadavg()
    with Stopwatch(children=True) as sw:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    out = {"wall_s": round(sw.wall_s, 2), "cpu_s": round(sw.cpu_s, 2),
           "loadavg_before": [round(x, 2) for x in load], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
           "command": " ".join(cmd[1:])}
    if proc.returncode != 0:
        raise RuntimeError(f"{out['command']} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return out


SWEEP_LAYERS = ("six_1", "six_2", "six_3", "six_4", "six_5", "six_6")
SWEEP_GROUPS = ("last_prompt", "image", "task", "observation", "action")


def entry_timings(repo_root, out_dir, *, sweep: bool = True) -> dict:
    """``warm_run_s`` and ``sweep30_s``: the real entry scripts on the real shared data, as subprocesses.

    1. ``extract_s``: ``python extract.py surface=i_vis`` fills the activation cache (or finds it).
    2. ``warm_run_s``: ``python train.py surface=i_vis layers=six`` with that cache (a hit).
    3. ``imports_s``: ``python -c "import train, ipi.run.tasks"``;
       ``warm_run_cpu_beyond_imports_s`` subtracts its CPU-seconds.
    4. ``sweep30_s``: ``python train.py -m layers=six_1,...,six_6
       token_group=last_prompt,image,task,observation,action`` (30 jobs in one process).

    Each figure is wall seconds; ``*_cpu_s`` are the subprocess's CPU-seconds, beside the load
    averages before and after.

    Args:
        repo_root: Repository root (where ``train.py`` is).
        out_dir: Folder for the runs' Hydra outputs.
        sweep: Also time the 30-job sweep.

    Returns:
        A JSON-able dict with the keys above.
"""
    import sys

    py = sys.executable
    env = {**os.environ, "IPI_QUIET": "1", "TOKENIZERS_PARALLELISM": "false"}
    res: dict = {}
    with progress_bar("entry scripts", 4 if sweep else 3) as bar:  # subprocesses run, elapsed, ETA
        bar.describe("entry scripts: extract.py surface=i_vis")
        ext = _timed_run([py, "extract.py", "surface=i_vis", "quiet=true", f"hydra.run.dir={out_dir}/extract"],
                         repo_root, env)
        bar.advance()
        res["extract_s"] = ext
        bar.describe("entry scripts: imports")
        imp = _timed_run([py, "-c", "import train, ipi.run.tasks, ipi.run.cli"], repo_root, env)
        bar.advance()
        bar.describe("entry scripts: train.py surface=i_vis layers=six (warm cache)")
        warm = _timed_run([py, "train.py", "surface=i_vis", "layers=six", "quiet=true",
                           f"hydra.run.dir={out_dir}/warm"], repo_root, env)
        bar.advance()
        res.update({"warm_run_s": warm["wall_s"], "warm_run_cpu_s": warm["cpu_s"], "warm_run": warm,
                    "imports_s": imp["wall_s"], "imports_cpu_s": imp["cpu_s"],
                    "warm_run_cpu_beyond_imports_s": round(warm["cpu_s"] - imp["cpu_s"], 2)})
        if sweep:
            bar.describe(f"entry scripts: train.py -m ({len(SWEEP_LAYERS) * len(SWEEP_GROUPS)} jobs)")
            sw = _timed_run([py, "train.py", "-m", "surface=i_vis", "layers=" + ",".join(SWEEP_LAYERS),
                             "token_group=" + ",".join(SWEEP_GROUPS), "quiet=true",
                             f"hydra.sweep.dir={out_dir}/sweep"], repo_root, env)
            bar.advance()
    if sweep:
        n_jobs = sum(1 for p in __import__("pathlib").Path(out_dir, "sweep").rglob("results.json"))
        res.update({"sweep30_s": sw["wall_s"], "sweep30_cpu_s": sw["cpu_s"], "sweep30": {**sw, "jobs": n_jobs}})
    return res
