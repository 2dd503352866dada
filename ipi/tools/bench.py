"""Benchmarks: ``python -m ipi.tools.bench`` prints ONE JSON line.

``extraction`` (the default) times two ways of turning replay rows of real shared trajectories
into pooled features, on the configured backbone (default: the tiny Qwen2.5-VL of
``conf/backbone/tiny_qwen2_5_vl.yaml``, composed through Hydra, so its numbers live in one place):

* **baseline** — the naive way: per row, render + tokenise (the processor's own call), the full
  ``Qwen2_5_VLForConditionalGeneration`` forward with ``output_hidden_states=True`` (vision tower,
  every decoder block, final norm and LM head), then mean-pooling each token group of each
  chosen layer in Python. Transformers returns ``hidden_states[-1]`` *after* the final norm,
  while the project's layer ``k`` is the output of block ``k`` (docs/replay.md); so that the two
  paths compute the same quantity, the baseline's final norm is swapped for the identity while
  it runs (an RMSNorm costs nothing next to the LM head; the logits are still computed).
* **ours** — :func:`ipi.extraction.forward.extract_features` exactly as ``train.py`` runs it
  (Lightning predict, step groups with each screenshot encoded once, hooks on the chosen layers,
  early stop, no LM head, batched pooling, shards streamed to a temporary cache entry).

Both include building the model and rendering/tokenising; both are timed over the same rows,
and the features (all layers × token groups) and collapse statistics are compared.
``peak_rss_mb`` runs the project path alone in fresh subprocesses at two subset sizes
(``ru_maxrss`` is a per-process high-water mark): shards stream to disk, so it should not grow
with the number of rows.

``bootstrap`` runs :func:`ipi.tools.bootstrap_timing.bench_bootstrap` (all estimands × 1000 cluster-bootstrap
replicates on a 5,000-row table, vectorised vs a plain ``roc_auc_score`` loop, on one core).

``permutation`` runs :func:`ipi.tools.bootstrap_timing.bench_permutation`: the exact permutation test's
199 refits as ``train.py`` runs them (Gram matrix once, then all 199 Newton solves on ≤ n
coefficients in one batched call, ``fit_reduced_batch`` in ``ipi/probe/dual.py``; single sequential
refits timed beside it for the batching gain) against 20 scikit-learn fits, at paper width (107,520 features, 1,000 training rows) unless
``--perm-features``/``--perm-train`` scale it down; ``ratio`` ≤ 1 is the requirement (the refits
cost no more than 20 scikit-learn fits).

``profile`` (:func:`profile_benchmark`; default ``backbone=smollm2_135m layers=six_1``, needs
``make setup-smollm``): an extraction's rows/s and effective FLOP/s against this machine's matmul
peak (:func:`matmul_peak`), for the default run and with the cuts a CPU audit takes (blocks above
the deepest probed, bf16 autocast), and how far each cut moves the features.

``paper_cost`` (:func:`paper_cost`): the FLOPs of the CPU audit's runs (``i_dom``, ``i_tool``) on
Qwen2.5-VL-7B, counted from the real rows and processor, and the GPU hours they take.

``--gpu-7b-shapes`` (needs a CUDA GPU) builds the real Qwen2.5-VL architecture at 7B shapes with
random bf16 weights and reports rows/s of the project path and the model FLOP utilisation.

Examples::

    python -m ipi.tools.bench                                  # extraction, 8 steps x all surfaces
    python -m ipi.tools.bench --steps 4 --rss-steps 2,8
    python -m ipi.tools.bench --only all
    python -m ipi.tools.bench --only permutation               # 199 dual refits vs 20 sklearn fits
    python -m ipi.tools.bench --only profile --steps 16        # SmolLM2 extraction vs matmul peak
    python -m ipi.tools.bench --only paper_cost                # the audit on the 7B, on paper
    python -m ipi.tools.bench --gpu-7b-shapes --steps 16       # on a GPU machine
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import replace

import torch

from ipi.tools.stopwatch import Stopwatch, best_of
from ipi.backbone import Backbone, build_backbone, find_decoder_layers, qwen2_5_vl_config
from ipi.run.schemas import REPO_ROOT, register_configs
from ipi.extraction.datamodule import StepGroupDataset, collate_steps
from ipi.extraction.extractor import HiddenStateExtractor
from ipi.extraction.forward import extract_features, extraction_layers
from ipi.run.settings import extract_settings
from ipi.tools.bootstrap_timing import bench_bootstrap, bench_permutation
from ipi.progress import quiet_lightning, run_stages
from ipi.protocol import SURFACES, TOKEN_GROUPS
from ipi.run.stages import layer_indices, load_data, make_rows
from ipi.tools.extraction_timing import entry_timings, matmul_peak_flops, speed_benchmark

#: Qwen2.5-VL-7B-Instruct's architecture (config.json of the checkpoint).
QWEN2_5_VL_7B_TEXT = dict(
    hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
    num_key_value_heads=4, max_position_embeddings=128000, vocab_size=152064, rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
)
QWEN2_5_VL_7B_VISION = dict(
    depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
    fullatt_block_indexes=[7, 15, 23, 31],
)



def compose(overrides: list[str]):
    """Compose the ``train`` config with ``overrides`` (paths relative to the repository)."""
    from hydra import compose as hcompose
    from hydra import initialize_config_dir


    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return hcompose(config_name="train",
                        overrides=["paths.output_dir=" + tempfile.gettempdir(), "quiet=true", *overrides])


def subset_rows(overrides: list[str], n_steps: int, surfaces=SURFACES):
    """Rows of the first ``n_steps`` steps (trajectories in id order) on every surface.

    Each surface brings all its variants (clean, attack, every applicable control).

    Returns:
        ``(cfg, rows)`` with ``cfg`` composed for the first surface.
    """

    cfg = compose(overrides)
    trajs, _, _ = load_data(cfg)
    keep, n = [], 0
    for t in trajs:
        if n >= n_steps:
            break
        keep.append(t)
        n += len(t.steps)
    chosen = set()
    for t in keep:
        for s in t.steps:
            if len(chosen) < n_steps:
                chosen.add((t.trajectory_id, s.step))
    rows = []
    for surface in surfaces:
        scfg = compose([*overrides, f"surface={surface}"])
        rows += [r for r in make_rows(scfg, keep, surface) if (r.trajectory_id, r.step.step) in chosen]
    return cfg, rows


def _rss_probe(overrides: list[str], n_steps: int, shard_rows: int) -> dict:
    """Run the project path alone in this process and report its peak RSS."""

    cfg, rows = subset_rows(overrides, n_steps)
    with tempfile.TemporaryDirectory() as tmp:  # exactly the run's layers into a fresh cache entry
        settings = replace(extract_settings(cfg), shard_rows=shard_rows, cache_dir=tmp, layers=())
        secs, _ = best_of(lambda: extract_features(settings, rows, layer_indices(cfg), list(TOKEN_GROUPS)), 1)
    return {"rows": len(rows), "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "seconds": round(secs, 2)}


def _spawn_rss(overrides: list[str], n_steps: int, shard_rows: int) -> dict:
    cmd = [sys.executable, "-m", "ipi.tools.bench", "--rss-probe", str(n_steps), "--shard-rows", str(shard_rows)]
    for o in overrides:
        cmd += ["--override", o]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"rss probe ({n_steps} steps) failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def extraction_benchmark(n_steps: int = 6, rss_steps: tuple[int, int] = (4, 16), shard_rows: int = 16,
                         overrides: list[str] = (), reps: int = 3) -> dict:
    """TaskTracker-style, elk-style and the project path over the first ``n_steps`` steps.

    Every surface's variants of those steps; see :mod:`ipi.tools.extraction_timing` for the three ways
    and the keys (``speedup``, ``speedup_vs_elk_style``, per surface and mixed).

    Args:
        n_steps: Steps of the timed subset (every surface, every variant of each).
        rss_steps: Two subset sizes (steps) for the peak-RSS comparison (``()`` to skip).
        shard_rows: Rows per cache shard in the RSS probes (small, so several shards stream).
        overrides: Hydra overrides of the ``train`` config (e.g. ``backbone=...``, ``layers=...``).
        reps: Repetitions of each steady-state measurement.

    Returns:
        A JSON-able dict.
    """
    overrides = list(overrides)
    cfg, rows = subset_rows(overrides, n_steps)
    layers = layer_indices(cfg)
    by_surface = {s: [r for r in rows if r.variant.surface == s] for s in SURFACES}
    by_surface = {s: rs for s, rs in by_surface.items() if rs}
    out = {"benchmark": "extraction", "backbone": cfg.backbone.name, "steps": n_steps, "rows": len(rows),
           "rows_by_surface": {s: len(rs) for s, rs in by_surface.items()},
           **speed_benchmark(extract_settings(cfg), by_surface, layers, reps=reps,
                             build_backbone=lambda: build_backbone(cfg.backbone.loader, with_lm_head=True),
                             build_ours=lambda: build_backbone(cfg.backbone.loader, max_layer=max(layers)))}
    if rss_steps:
        out["peak_rss_mb"] = [_spawn_rss(overrides, n, shard_rows) for n in rss_steps]
    if torch.cuda.is_available():
        gpu = shapes_benchmark(n_steps, overrides, None)
        out.update({"gpu_mfu": gpu.get("mfu"), "gpu_mfu_with_prep": gpu.get("mfu_with_prep"), "gpu": gpu})
    else:
        out.update({"gpu_mfu": "not measured (no GPU)", "gpu_mfu_with_prep": "not measured (no GPU)"})
    return out


def shapes_benchmark(n_steps: int, overrides: list[str], peak_tflops: float | None, *, device: str = "cuda",
                     text: dict = QWEN2_5_VL_7B_TEXT, vision: dict = QWEN2_5_VL_7B_VISION,
                     dtype: torch.dtype = torch.bfloat16) -> dict:
    """Project path on the real Qwen2.5-VL architecture at given shapes (random weights).

    With the defaults: 7B shapes in bf16 on a CUDA GPU (``--gpu-7b-shapes``). Rows come from the
    real shared trajectories and processor; the tokenised batches are prepared first, so the
    timed loop is host-to-device copies plus :meth:`HiddenStateExtractor.predict_step`.

    Returns:
        ``{"rows_per_s", "model_tflop", "achieved_tflops", "mfu"?, ...}``; the model FLOPs count
        the vision tower's linear layers on each distinct image (its windowed attention is left
        out, so the MFU is a slight underestimate) and the decoder blocks up to the deepest chosen
        layer on every row (2 FLOPs per multiply-add, causal attention counted half).
    """
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration


    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--gpu-7b-shapes needs a CUDA GPU")
    cfg, rows = subset_rows([*overrides, f"backbone.n_layers={text['num_hidden_layers']}"], n_steps)
    processor = AutoProcessor.from_pretrained(cfg.backbone.tokenizer_path)
    tok = processor.tokenizer
    config = qwen2_5_vl_config(tok, text, vision)
    torch.manual_seed(0)
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2_5_VLForConditionalGeneration(config).eval().requires_grad_(False)
    finally:
        torch.set_default_dtype(old_dtype)
    image_size = dict(cfg.backbone.image_size)
    bb = Backbone("qwen2_5_vl_shapes", model, processor, find_decoder_layers(model), text["hidden_size"], True,
                  config.image_token_id, {}, image_size)
    layers = layer_indices(cfg)
    ext = HiddenStateExtractor(bb, layers, list(TOKEN_GROUPS), max_rows=cfg.backbone.batch_size)
    ds = StepGroupDataset(rows, processor, cfg.backbone.system_prompt, True, image_size, config.image_token_id)
    with Stopwatch() as sw:
        batches = [collate_steps([ds[g]], tok.pad_token_id or 0) for g in range(len(ds))]  # CPU work first
    prep_secs = sw.wall_s

    def to_dev(b):
        from lightning.fabric.utilities.apply_func import move_data_to_device

        return move_data_to_device(b, device)

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ext.on_predict_start()
    try:
        with torch.inference_mode():
            ext.predict_step(to_dev(batches[0]))  # warm-up
            sync()
            with Stopwatch() as sw:
                for b in batches:
                    ext.predict_step(to_dev(b))
                sync()
            secs = sw.wall_s
    finally:
        ext.on_predict_end()
    depth = max(layers) + 1
    flops = 0.0
    for b in batches:
        flops += sum(decoder_flops(text, n, depth) for n in b["seq_len_list"])
        if b["images"] is not None:
            flops += vision_flops(vision, int(b["images"]["image_grid_thw"].prod(-1).sum()))
    name = torch.cuda.get_device_name() if device == "cuda" else device
    if peak_tflops is None:
        peak_tflops = 989.0 if ("H100" in name or "H200" in name) else (312.0 if "A100" in name else None)
    n_rows = sum(len(b["row_ids"]) for b in batches)
    out = {"benchmark": "shapes", "hidden_size": text["hidden_size"], "n_layers": text["num_hidden_layers"],
           "device": name, "rows": n_rows, "steps": n_steps, "layers": layers, "rows_per_s": _sig(n_rows / secs),
           "model_tflop": _sig(flops / 1e12), "achieved_tflops": _sig(flops / secs / 1e12),
           "prep_s": _sig(prep_secs), "forward_s": _sig(secs)}
    if peak_tflops:
        out["mfu"] = _sig(flops / secs / (peak_tflops * 1e12))
        # serial CPU preparation (num_workers=0) added to the device time: the floor without workers
        out["mfu_with_prep"] = _sig(flops / (secs + prep_secs) / (peak_tflops * 1e12))
        out["peak_tflops_bf16_dense"] = peak_tflops
    return out


def decoder_flops(text: Mapping, n_tokens: int, depth: int) -> float:
    """Model FLOPs of one row through the first ``depth`` decoder blocks of a Llama/Qwen2-style decoder.

    2 FLOPs per multiply-add: the q/o projections (``d × d`` each), the k/v projections (``d ×
    kv_heads · head_dim`` each), the gated MLP (three ``d × f``), and causal attention's ``QKᵀ`` and
    ``AV`` counted half (``2 · n² · d``). Norms, rotary embeddings and the LM head are left out.

    Args:
        text: The decoder's config as a mapping: ``hidden_size``, ``intermediate_size``,
            ``num_attention_heads``, ``num_key_value_heads`` (``head_dim`` if given, else
            ``hidden_size / num_attention_heads``).
        n_tokens: The row's prompt length in tokens.
        depth: Decoder blocks forwarded.

    Returns:
        FLOPs (float).
    """
    d, f, h, kv = text["hidden_size"], text["intermediate_size"], text["num_attention_heads"], text["num_key_value_heads"]
    hd = text.get("head_dim") or d // h
    per_tok_layer = 2 * (d * d * 2 + 2 * d * kv * hd + 3 * d * f)
    return float(depth * (n_tokens * per_tok_layer + 2 * n_tokens * n_tokens * d))


def vision_flops(vision: Mapping, patches: int) -> int:
    """Model FLOPs of a Qwen2.5-VL vision tower on ``patches`` patches (2 FLOPs per multiply-add).

    Every block's linear layers (q, k, v, o: ``d × d`` each; the gated MLP: three ``d × f``) on
    every patch, and the patch merger's MLP on each 2×2 group; the windowed attention is left out.

    Args:
        vision: The vision config as a mapping: ``depth``, ``hidden_size``, ``intermediate_size``,
            ``out_hidden_size``.
        patches: Patches of the images (4 per image token).

    Returns:
        FLOPs (int).
    """
    vd, vf, md = vision["hidden_size"], vision["intermediate_size"], 4 * vision["hidden_size"]
    per_patch = vision["depth"] * 2 * (4 * vd * vd + 3 * vd * vf)
    return patches * per_patch + (patches // 4) * 2 * (md * md + md * vision["out_hidden_size"])


def matmul_peak(n: int = 2048, reps: int = 5) -> dict:
    """This machine's dense matmul throughput per dtype (:func:`ipi.tools.extraction_timing.matmul_peak_flops`):
    the peak an extraction's achieved FLOP/s is read against.

    Returns:
        ``{"float32": GFLOP/s, "bfloat16": GFLOP/s or None (no native bf16), "threads", "n"}``.
    """
    from ipi.extraction.forward import cpu_supports_bf16

    out = {"threads": torch.get_num_threads(), "n": n}
    for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        native = dt != torch.bfloat16 or cpu_supports_bf16()
        out[name] = _sig(matmul_peak_flops(n, reps, dt) / 1e9) if native else None
    return out


#: ``--only profile``'s default overrides: the CPU audit's backbone, probe layer and page-text cap
#: (docs/real_audit.md).
PROFILE_BACKBONE = ("backbone=smollm2_135m", "layers=six_1", "data.max_element_chars=500")

#: The extraction settings :func:`profile_benchmark` compares: name -> (overrides, what it changes).
PROFILE_SETTINGS = {
    "before": ([], "the default run: the extract.layers superset (all six depths: every block), 32-true"),
    "cut": (["extract.layers=[]"], "only the blocks up to the deepest one probed, 32-true"),
    "cut_bf16": (["extract.layers=[]", "extract.precision=bf16-mixed"],
                 "only the blocks up to the deepest one probed, bf16 autocast (enters the cache key)"),
}


def profile_benchmark(n_steps: int = 8, overrides: list[str] = (), surface: str = "i_dom") -> dict:
    """Extraction profile of a backbone on this machine, before and after the cuts of a CPU audit.

    For each of :data:`PROFILE_SETTINGS`, in one process, cold cache entries in a temporary
    folder, the rows of the first ``n_steps`` steps of ``surface`` (every variant) through
    :func:`ipi.extraction.forward.extract_features` as ``train.py`` runs it (prefix reuse, hooks,
    early stop; a one-off warm-up extraction runs first). Reported per setting: seconds, the model
    build alone (``build_s``, timed apart and taken off the rates), rows/s, tokens/s, the model FLOPs of the blocks forwarded
    (:func:`decoder_flops` of every row's full prompt; prefix reuse forwards fewer, so the
    achieved FLOP/s is an effective rate), and that rate against :func:`matmul_peak` of the
    dtype the matmuls run in. The probe's features are compared with ``before``'s: the cut must
    equal them to float rounding; bf16's relative error is reported (its key differs).

    Args:
        n_steps: Steps of ``surface`` profiled.
        overrides: Hydra overrides of the ``train`` config (e.g. ``backbone=smollm2_135m``, ``layers=six_1``).
        surface: The surface whose rows are profiled.

    Returns:
        A JSON-able dict: ``matmul_peak_gflops``, per setting ``{"seconds", "build_s", "rows_per_s",
        "tokens_per_s", "blocks_forwarded", "model_gflop", "effective_gflops", "of_peak",
        "max_abs_diff_vs_before", "max_rel_err_vs_before"}``, ``load_before``/``load_after``.
    """
    load0 = os.getloadavg()
    base = [*overrides, f"surface={surface}"]
    cfg, rows = subset_rows(base, n_steps, surfaces=(surface,))
    layers = layer_indices(cfg)
    model = build_backbone(cfg.backbone.loader, max_layer=0).model
    text = getattr(model.config, "text_config", model.config).to_dict()
    del model
    out = {"benchmark": "profile", "backbone": cfg.backbone.name, "surface": surface, "steps": n_steps,
           "rows": len(rows), "layers": layers, "threads": torch.get_num_threads(), "matmul_peak_gflops": matmul_peak()}
    ref = None
    with tempfile.TemporaryDirectory() as tmp:
        warm = extract_settings(compose([*base, "extract.layers=[]"]))
        extract_features(replace(warm, cache_dir=os.path.join(tmp, "warm")), rows[:2], layers, list(TOKEN_GROUPS))
        for name, (extra, what) in PROFILE_SETTINGS.items():
            c = compose([*base, *extra])
            settings = replace(extract_settings(c), cache_dir=os.path.join(tmp, name))
            with Stopwatch() as sw:
                fs, _ = extract_features(settings, rows, layers, list(TOKEN_GROUPS))
            depth = max(extraction_layers(settings, layers)) + 1
            build_s, _ = best_of(lambda: build_backbone(c.backbone.loader, max_layer=depth - 1), 1)
            secs = max(sw.wall_s - build_s, 1e-9)  # the extraction less its model build, timed alone
            flop = sum(decoder_flops(text, int(n), depth) for n in fs.prompt_len.tolist())
            feats = fs.features[:, [fs.layers.index(k) for k in layers]].double()
            peak = out["matmul_peak_gflops"]["bfloat16" if "bf16" in c.extract.precision else "float32"]
            rec = {"what": what, "seconds": round(sw.wall_s, 2), "build_s": round(build_s, 2),
                   "rows_per_s": _sig(len(rows) / secs), "tokens_per_s": _sig(float(fs.prompt_len.sum()) / secs),
                   "blocks_forwarded": depth, "of_blocks": int(cfg.backbone.n_layers), "model_gflop": _sig(flop / 1e9),
                   "effective_gflops": _sig(flop / secs / 1e9)}
            rec["of_peak"] = _sig(rec["effective_gflops"] / peak) if peak else None
            if ref is None:
                ref = feats
            else:
                diff = (feats - ref).abs()
                rec["max_abs_diff_vs_before"] = _sig(float(diff.max()))
                rec["max_rel_err_vs_before"] = _sig(float((diff.norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12)).max()))
            out[name] = rec
    out["speedup_cut_bf16_vs_before"] = _sig(out["cut_bf16"]["rows_per_s"] / out["before"]["rows_per_s"])
    out["load_before"] = [round(x, 2) for x in load0]
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def paper_cost(surface: str = "i_dom", overrides: list[str] = ()) -> dict:
    """The FLOPs of the CPU audit's run on Qwen2.5-VL-7B, counted from the real rows (on paper).

    The run's rows are built as ``train.py`` builds them (every trajectory of ``data``, the audit's
    surface), with the real Qwen2.5-VL processor at the 7B's pixel limits
    (``conf/backbone/qwen2_5_vl_7b.yaml``), so every row's token count and every screenshot's image
    tokens are the ones the 7B would see (:func:`ipi.extraction.rows.sequence_lengths`). Counted
    (2 FLOPs per multiply-add, prefix reuse ignored: an upper bound):

    * main pass: every row through the vision tower (each distinct screenshot once) and the
      decoder blocks up to the deepest one probed (``layers=six_1``; :func:`decoder_flops`);
    * 19 random-weight twins (check 6's S): the same again per twin (their own vision tower too);
    * the likelihood measure: the attack and clean test rows (``split.test_fraction``) through
      all 28 blocks, 3 times (no ablation, probe direction, random direction).

    The GPU hours are given at an H100 SXM's dense bf16 peak, 989 TFLOP/s.

    Args:
        surface: The audit's surface.
        overrides: Hydra overrides of the ``train`` config (e.g. ``data.max_element_chars=500``).

    Returns:
        ``{"rows", "mean_tokens", "mean_image_tokens", "depth", "tflop": {...}, "gpu_hours_at_peak",
        "gpu_hours_at_mfu": {0.2: ..., 0.4: ...}}``.
    """
    from transformers import AutoProcessor

    from ipi.extraction.rows import sequence_lengths
    from ipi.protocol import resolve_layers

    layers, twins, arms, peak_tflops = "six_1", 19, 3, 989.0
    seven = compose(["backbone=qwen2_5_vl_7b"]).backbone
    c = compose([*overrides, f"surface={surface}", f"layers={layers}",
                 f"backbone.image_size.longest_edge={seven.image_size.longest_edge}",
                 f"backbone.image_size.shortest_edge={seven.image_size.shortest_edge}"])
    processor = AutoProcessor.from_pretrained(c.backbone.tokenizer_path)
    trajs, _, _ = load_data(c)
    rows = make_rows(c, trajs, surface)
    lengths = sequence_lengths(rows, processor, str(c.backbone.system_prompt), True, dict(c.backbone.image_size))
    text, vision = QWEN2_5_VL_7B_TEXT, QWEN2_5_VL_7B_VISION
    depth = max(resolve_layers(list(c.layers.spec), text["num_hidden_layers"])) + 1
    if surface == "i_vis":
        raise ValueError("paper_cost counts one screenshot per step: a text surface (i_dom, i_tool)")
    images = {r.step.screenshot: n_img for r, (_, n_img) in zip(rows, lengths)}  # one per step on a text surface
    vision_flop = vision_flops(vision, 4 * sum(images.values()))  # 2x2 patches merged into one image token
    main = sum(decoder_flops(text, n, depth) for n, _ in lengths) + vision_flop
    frac = float(c.split.test_fraction)
    lik_rows = [n for r, (n, _) in zip(rows, lengths) if r.variant.variant in ("attack", "clean")]
    likelihood = arms * frac * (sum(decoder_flops(text, n, text["num_hidden_layers"]) for n in lik_rows) + vision_flop)
    total = main * (1 + twins) + likelihood
    tf = {"main_pass": _sig(main / 1e12), "twins": _sig(twins * main / 1e12), "likelihood": _sig(likelihood / 1e12),
          "total": _sig(total / 1e12)}
    return {"benchmark": "paper_cost", "surface": surface, "rows": len(rows), "layers": layers, "depth": depth,
            "twins": twins, "test_fraction": frac, "mean_tokens": _sig(sum(n for n, _ in lengths) / len(rows)),
            "mean_image_tokens": _sig(sum(i for _, i in lengths) / len(rows)), "screenshots": len(images),
            "tflop": tf, "peak_tflops": peak_tflops, "gpu_hours_at_peak": _sig(total / (peak_tflops * 1e12) / 3600),
            "gpu_hours_at_mfu": {str(m): _sig(total / (m * peak_tflops * 1e12) / 3600) for m in (0.2, 0.4)}}


def twin_benchmark(n_steps: int = 6, n_twins: int = 3, overrides: list[str] = (), probe_layers=("six", "six_1"),
                   surface: str = "i_vis") -> dict:
    """Cost of the random-weight twins per seed as a fraction of the main pass.

    In one process, on the first ``n_steps`` steps of ``surface`` (all its variants) and cold cache
    entries in a temporary folder: the main pass (:func:`ipi.extraction.forward.extract_features`, the
    ``extract.layers`` superset, as ``train.py`` runs it), then ``n_twins`` twins in one data pass
    (:func:`ipi.extraction.twin_pass.extract_twin_features`) for each layer choice of
    ``probe_layers`` (a twin reads only the probe's blocks), and the same twins one extraction
    each (before the shared pass) for the first choice. ``fraction = pass seconds / n_twins / main
    seconds``; the twins' build (random init) is inside each.

    Returns:
        A JSON-able dict: ``main_s``, per layer choice ``{"blocks", "twins_s", "fraction_per_seed"}``,
        ``separate_fraction_per_seed``, ``build_s_per_twin`` and ``build_fraction_per_seed`` (the
        twins' construction alone, timed after the main pass), ``load_before``/``load_after``.
    """
    from ipi.extraction.twin_pass import extract_twin_features
    from ipi.run.twin import twin_config

    load0 = os.getloadavg()
    cfg, rows = subset_rows([*overrides, f"surface={surface}", "evaluation.random_twin=true",
                             f"evaluation.random_twin_seeds=[{','.join(str(i + 1) for i in range(n_twins))}]"],
                            n_steps, surfaces=(surface,))
    out = {"benchmark": "twins", "backbone": cfg.backbone.name, "surface": surface, "steps": n_steps,
           "rows": len(rows), "twins": n_twins, "threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory() as tmp:
        cfg.extract.cache_dir = tmp
        with Stopwatch() as sw:
            extract_features(extract_settings(cfg), rows, layer_indices(cfg), list(TOKEN_GROUPS))
        main_s = sw.wall_s
        out["main_s"] = round(main_s, 2)
        out["main_blocks_forwarded"] = max(extraction_layers(extract_settings(cfg), layer_indices(cfg))) + 1
        for k, choice in enumerate(probe_layers):
            c = compose([*overrides, f"surface={surface}", f"layers={choice}", "evaluation.random_twin=true"])
            layers = layer_indices(c)
            sub = os.path.join(tmp, f"twins_{choice}")
            tcfgs = {}
            for s in range(1, n_twins + 1):
                t = twin_config(cfg, s)
                t.extract.cache_dir = sub
                t.extract.layers = []  # nothing in the superset is cached here: the probe's blocks only
                tcfgs[s] = t
            if k == 0:  # building the twins alone (random init, processor): the part no block cut removes
                with Stopwatch() as sw:
                    for t in tcfgs.values():
                        build_backbone(t.backbone.loader, max_layer=max(layers))
                out["build_s_per_twin"] = _sig(sw.wall_s / n_twins)
                out["build_fraction_per_seed"] = _sig(sw.wall_s / n_twins / main_s)
                # the same twins one extraction each, for comparison
                sep = os.path.join(tmp, "separate")
                with Stopwatch() as sw:
                    for s, t in tcfgs.items():
                        t2 = copy.deepcopy(t)
                        t2.extract.cache_dir = sep
                        extract_features(extract_settings(t2), rows, layers, list(TOKEN_GROUPS), exact_layers=True)
                out["separate_s"] = round(sw.wall_s, 2)
                out["separate_fraction_per_seed"] = _sig(out["separate_s"] / n_twins / main_s)
            with Stopwatch() as sw:
                _, infos = extract_twin_features({k: extract_settings(v) for k, v in tcfgs.items()}, rows, layers,
                                                 list(TOKEN_GROUPS))
            secs = sw.wall_s
            deepest = max(layers)
            out[f"layers={choice}"] = {"blocks_read": layers, "blocks_forwarded": deepest + 1,
                                       "of_blocks": cfg.backbone.n_layers, "twins_s": round(secs, 2),
                                       "fraction_per_seed": _sig(secs / n_twins / main_s),
                                       "shared_pass": infos[1].get("shared_pass")}
    out["load_before"] = [round(x, 2) for x in load0]
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def _entry_timings(sweep: bool) -> dict:
    """:func:`ipi.tools.extraction_timing.entry_timings` with its run folders in a temporary folder."""
    with tempfile.TemporaryDirectory() as tmp:
        return entry_timings(REPO_ROOT, tmp, sweep=sweep)


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ipi.tools.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=("extraction", "timings", "bootstrap", "permutation", "twins", "profile", "paper_cost",
                                       "all"),
                   default="extraction")
    p.add_argument("--no-timings", action="store_true", help="skip warm_run_s / sweep30_s (entry-script subprocesses)")
    p.add_argument("--no-sweep", action="store_true", help="time the warm run but not the 30-job sweep")
    p.add_argument("--steps", type=int, default=6, help="steps of the timed subset (x every surface's variants)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of every steady-state measurement")
    p.add_argument("--rss-steps", default="4,16", help="two subset sizes (steps) for peak RSS; '' skips")
    p.add_argument("--shard-rows", type=int, default=16, help="rows per shard in the RSS probes")
    p.add_argument("--override", action="append", default=[], help="Hydra override of the train config")
    p.add_argument("--twins", type=int, default=3, help="random-weight twins of the twin-cost bench (--only twins)")
    p.add_argument("--boot-rows", type=int, default=5000)
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--perm-features", type=int, default=107_520, help="feature width of the permutation bench")
    p.add_argument("--perm-train", type=int, default=1000, help="training rows of the permutation bench")
    p.add_argument("--perm-m", type=int, default=199, help="refits of the permutation bench")
    p.add_argument("--perm-sklearn-fits", type=int, default=2, help="scikit-learn fits timed (x20 by their mean)")
    p.add_argument("--gpu-7b-shapes", action="store_true", help="7B-shaped random model on a CUDA GPU")
    p.add_argument("--peak-tflops", type=float, default=None, help="device bf16 peak for the MFU")
    p.add_argument("--rss-probe", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    quiet_lightning()
    if a.rss_probe is not None:
        print(json.dumps(_rss_probe(a.override, a.rss_probe, a.shard_rows)))
        return
    if a.gpu_7b_shapes:
        print(json.dumps(shapes_benchmark(a.steps, a.override, a.peak_tflops)))
        return
    stages: list[tuple[str, object]] = []
    if a.only in ("extraction", "all"):
        rss = tuple(int(x) for x in a.rss_steps.split(",") if x.strip())
        if rss and len(rss) != 2:
            p.error("--rss-steps takes two sizes, e.g. 4,16")
        stages.append(("extraction", lambda: extraction_benchmark(a.steps, rss, a.shard_rows, a.override, a.reps)))
    if a.only in ("timings", "all") or (a.only == "extraction" and not a.no_timings):
        stages.append(("timings", lambda: _entry_timings(not a.no_sweep)))
    if a.only in ("twins", "all"):
        stages.append(("twins", lambda: twin_benchmark(a.steps, a.twins, a.override)))
    if a.only == "paper_cost":
        stages.append(("paper_cost", lambda: {s: paper_cost(s, a.override or ["data.max_element_chars=500"])
                                              for s in ("i_dom", "i_tool")}))
    if a.only == "profile":
        stages.append(("profile", lambda: profile_benchmark(a.steps, a.override or list(PROFILE_BACKBONE))))
    if a.only in ("bootstrap", "all"):
        stages.append(("bootstrap", lambda: bench_bootstrap(n_rows=a.boot_rows, n_boot=a.n_boot)))
    if a.only in ("permutation", "all"):
        stages.append(("permutation", lambda: bench_permutation(n_train=a.perm_train, n_features=a.perm_features,
                                                                m=a.perm_m, sklearn_fits=a.perm_sklearn_fits)))
    # each stage on one bar (stages done, elapsed, ETA; the running one named), its own bars below
    out = run_stages(stages, "bench")
    if a.only == "extraction" and "timings" in out:
        out["extraction"].update(out.pop("timings"))
    print(json.dumps(out if len(out) != 1 else next(iter(out.values()))))


if __name__ == "__main__":
    main()
