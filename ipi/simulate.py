"""Planted-truth self-test of the statistics: ``python -m ipi.simulate`` (docs/selftest.md).

Generates **feature-level** datasets with the protocol's structure (PROTOCOL.md §2–§3) under three
known truths, runs the project's real pipeline pieces on each — trajectory split
(:func:`~ipi.probe.crossfit.make_folds`), the Lightning :class:`~ipi.probe.LinearProbe` via
:func:`~ipi.probe.fit_probe`, the C1 metadata baseline, the permuted-label probe and the
collapse-only probe (all through :func:`~ipi.probe.crossfit.cross_fit`, the function
``train.py`` uses, including the M = 199 permuted-label refits of verdict check 4's exact
permutation test), :func:`~ipi.metrics.evaluate_tables` and the verdict — and reports:

* the rate of the claim "detects malicious content" under truths (b) and (c), where it is false
  (must be ≤ 5%);
* the power (rate of that claim) under truth (a), where it is true;
* the empirical coverage of the 95% cluster-bootstrap CIs of E1 (and E2, E3[c]) for the
  fitted probe's **true** estimands, computed analytically (:func:`true_estimands`).

The generating process (one dataset; all directions are random orthonormal vectors in
``R^d`` drawn per dataset):

* ``T`` trajectories, horizon ``H_t ~ Uniform{h_min..h_max}``, steps ``0..H_t-1``;
* variants per step: ``clean, attack, c_scrambled, c_imperative, c_occlusion`` (one row each);
* features ``x = mu[variant] + pos · (step / H_t) · v_pos + u_t + s_(t,step) + e`` with the
  trajectory random effect ``u_t ~ N(0, sigma_traj² I)``, the step effect ``s ~ N(0,
  sigma_step² I)`` (shared by all variants of the step: same page and screenshot), and row noise
  ``e ~ N(0, sigma_row² I)``;
* ``mu[clean] = 0``; ``mu[attack] = box · v_box + text · v_text + content · v_content``;
  ``mu[c_scrambled] = mu[c_imperative] = box · v_box + text · v_text`` (same box, same
  amount of text, no malicious content); ``mu[c_occlusion] = box · v_box`` (the empty box);
* truth (a): ``content > 0`` — a malicious-content direction only attacks carry, on top of the
  surface (box/overlay and text) directions every boxed variant shares;
  truth (b): ``content = 0`` — attack and ``c_scrambled`` (and ``c_imperative``) share only the
  surface directions: nothing distinguishes malicious content;
  truth (c): ``content = 0``, ``lexical > 0`` — attacks carry a *token-identity* direction
  ``v_lex`` (the attack bank's vocabulary) that separates them from the controls, and the random
  twin's features carry it just as strongly: E3 > 0.5 (check 3 passes) for a reason a network
  with random weights shares;
* the **random-weight twin** (verdict check 6): the same inputs (the same trajectory and step
  effects) through another network: its features are ``Q (mu_twin[variant] + pos · (step / H_t) ·
  v_pos + u_t + s_(t,step) + e')`` with a random rotation ``Q``, its own row noise ``e'`` of the
  same SD, and ``mu_twin`` = ``mu`` without the content term (a random network keeps surface
  statistics and token identity, not content). Twin draws come from their own generator
  (``spawn_key=(truth, index, 1)``), so the trained-feature datasets are those of the two-truth
  self-test;
* metadata as on ``i_vis``: step, horizon, prompt length (trajectory base + per-step growth,
  equal for every variant of a step, so Δprompt length is 0);
* collapse statistic, two layers: ``0.35 + trajectory effect + position + collapse_box ·
  [boxed] + noise``.

Why an analytic truth. The bootstrap CI conditions on the fitted probe (scores held fixed;
PROTOCOL.md §5), so its target is **that probe's** population estimand: for E1 the limit of the
pooled, step-weighted AUC as the number of test trajectories grows, i.e. ``P(f(X_a) > f(X_c))``
for an attack row and a clean row drawn independently (different trajectories), each from the
pooled row distribution (every step of every trajectory equally likely). For a linear score
``f = w·x + b`` the Gaussian parts give this in closed form up to a finite sum over positions;
a test checks it against a large Monte-Carlo sample scored by the same probe.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import ndtr

__all__ = [
    "CONTROLS",
    "VARIANTS",
    "SimParams",
    "main",
    "run_dataset",
    "simulate_dataset",
    "summarise",
    "true_estimands",
]

CONTROLS = ("c_scrambled", "c_imperative", "c_occlusion")
VARIANTS = ("clean", "attack", *CONTROLS)
TRUTHS = ("a", "b", "c")


@dataclass(frozen=True)
class SimParams:
    """Parameters of the generating process (see the module docstring)."""

    n_trajectories: int = 80
    h_min: int = 3
    h_max: int = 12
    n_features: int = 64
    sigma_traj: float = 0.6
    sigma_step: float = 0.4
    sigma_row: float = 0.8
    pos: float = 0.8
    box: float = 0.8
    text: float = 0.8
    content: float = 0.9  # truth (a); truths (b) and (c) set 0
    lexical: float = 0.9  # truth (c): token identity on attack rows, shared by the twin; (a), (b) set 0
    collapse_box: float = 0.002
    test_fraction: float = 0.3
    l2: float = 1.0
    n_boot: int = 1000
    permutation_m: int = 199  # refits of the exact permutation test (verdict check 4)

    def for_truth(self, truth: str) -> SimParams:
        """The process under truth ``"a"`` (content as set, no token identity), ``"b"`` (neither)
        or ``"c"`` (token identity as set, no content)."""
        if truth not in TRUTHS:
            raise ValueError(f"truth must be one of {', '.join(TRUTHS)}, got {truth!r}")
        if truth == "a":
            return replace(self, lexical=0.0)
        if truth == "b":
            return replace(self, content=0.0, lexical=0.0)
        return replace(self, content=0.0)

    def twin(self) -> SimParams:
        """The random-weight twin's process: the same, without the content term."""
        return replace(self, content=0.0)

    @property
    def sigma(self) -> float:
        """SD of the Gaussian part of one row along any unit direction (traj + step + row)."""
        return math.sqrt(self.sigma_traj**2 + self.sigma_step**2 + self.sigma_row**2)


def _directions(rng: np.random.Generator, d: int) -> dict[str, np.ndarray]:
    q, _ = np.linalg.qr(rng.standard_normal((d, 4)))
    return {"content": q[:, 0], "box": q[:, 1], "text": q[:, 2], "pos": q[:, 3]}


def _lexical_direction(rng: np.random.Generator, dirs: dict[str, np.ndarray]) -> np.ndarray:
    """A unit vector orthogonal to the four directions of :func:`_directions` (token identity)."""
    basis = np.stack([dirs[k] for k in ("content", "box", "text", "pos")], axis=1)
    v = rng.standard_normal(basis.shape[0])
    v -= basis @ (basis.T @ v)
    return v / np.linalg.norm(v)


def variant_means(p: SimParams, dirs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``mu[variant]`` in ``R^d`` (module docstring)."""
    surface = p.box * dirs["box"] + p.text * dirs["text"]
    attack = surface + p.content * dirs["content"]
    if p.lexical:
        attack = attack + p.lexical * dirs["lex"]
    return {
        "clean": np.zeros_like(dirs["box"]),
        "attack": attack,
        "c_scrambled": surface,
        "c_imperative": surface,
        "c_occlusion": p.box * dirs["box"],
    }


def simulate_dataset(p: SimParams, rng: np.random.Generator, dirs: dict[str, np.ndarray] | None = None,
                     n_trajectories: int | None = None, twin_rng: np.random.Generator | None = None):
    """One dataset with the protocol's structure (and, with ``twin_rng``, its random twin's features).

    Args:
        p: Parameters.
        rng: Random generator.
        dirs: Signal directions (drawn from ``rng`` when None; ``"lex"`` from ``twin_rng``, or
            from ``rng`` right after the other directions when ``twin_rng`` is None, when
            ``p.lexical``).
        n_trajectories: Overrides ``p.n_trajectories`` (e.g. a large fresh sample).
        twin_rng: Generator of the twin's rotation and row noise (module docstring), or None.

    Returns:
        ``(meta, x, collapse, dirs)``: ``meta`` has ``trajectory_id, step, variant, surface,
        horizon, prompt_len, delta_prompt_len`` (one row per (trajectory, step, variant));
        ``x`` is ``[N, d]`` float64; ``collapse`` ``[N, 2]``. With ``twin_rng`` two more items:
        ``x_twin [N, d]`` and ``dirs_twin`` (the directions as the twin's features carry them).
    """
    d = p.n_features
    dirs = dict(dirs) if dirs is not None else _directions(rng, d)
    if "lex" not in dirs and (p.lexical or twin_rng is not None):
        dirs["lex"] = _lexical_direction(twin_rng if twin_rng is not None else rng, dirs)
    mu = variant_means(p, dirs)
    n_t = int(n_trajectories or p.n_trajectories)
    horizons = rng.integers(p.h_min, p.h_max + 1, size=n_t)
    n_steps = int(horizons.sum())
    traj = np.repeat(np.arange(n_t), horizons)
    step = np.concatenate([np.arange(h) for h in horizons])
    hor = horizons[traj]
    u = rng.standard_normal((n_t, d)) * p.sigma_traj
    s = rng.standard_normal((n_steps, d)) * p.sigma_step
    step_part = u[traj] + s + np.outer(p.pos * step / hor, dirs["pos"])  # [n_steps, d]
    nv = len(VARIANTS)
    x = np.repeat(step_part, nv, axis=0) + rng.standard_normal((n_steps * nv, d)) * p.sigma_row
    x += np.tile(np.stack([mu[v] for v in VARIANTS]), (n_steps, 1))
    base_len = rng.normal(900.0, 120.0, size=n_t)
    prompt_len = np.round(base_len[traj] + 60.0 * step + rng.normal(0.0, 20.0, size=n_steps))
    boxed = np.array([v != "clean" for v in VARIANTS], dtype=np.float64)
    c_traj = rng.normal(0.0, 0.03, size=(n_t, 2))
    collapse = (0.35 + np.repeat(c_traj[traj] + 0.02 * (step / hor)[:, None], nv, axis=0)
                + p.collapse_box * np.tile(boxed, n_steps)[:, None]
                + rng.normal(0.0, 0.02, size=(n_steps * nv, 2)))
    meta = pd.DataFrame({
        "trajectory_id": np.repeat(np.array([f"sim{t:05d}" for t in range(n_t)], dtype=object)[traj], nv),
        "step": np.repeat(step, nv),
        "variant": np.tile(np.array(VARIANTS, dtype=object), n_steps),
        "surface": "i_vis",
        "horizon": np.repeat(hor, nv),
        "prompt_len": np.repeat(prompt_len, nv),
        "delta_prompt_len": 0.0,
    })
    if twin_rng is None:
        return meta, x, collapse, dirs
    q, _ = np.linalg.qr(twin_rng.standard_normal((d, d)))
    mu_t = variant_means(p.twin(), dirs)
    x_twin = np.repeat(step_part, nv, axis=0) + twin_rng.standard_normal((n_steps * nv, d)) * p.sigma_row
    x_twin += np.tile(np.stack([mu_t[v] for v in VARIANTS]), (n_steps, 1))
    return meta, x, collapse, dirs, x_twin @ q.T, {k: q @ v for k, v in dirs.items()}


def _position_grid(p: SimParams) -> np.ndarray:
    """Positions ``step / H`` of the pooled row distribution: every (H, step) pair equally likely.

    A trajectory of horizon ``h`` contributes ``h`` steps, so pooling rows over trajectories
    draws ``H`` size-biased and the step uniformly given ``H``: all pairs ``(h, s < h)`` with
    ``h`` in ``[h_min, h_max]`` are equally likely.
    """
    return np.array([s / h for h in range(p.h_min, p.h_max + 1) for s in range(h)])


def true_estimands(w: np.ndarray, p: SimParams, dirs: dict[str, np.ndarray]) -> dict[str, float]:
    """Population E1, E2, E3[c] of the linear score ``f = w·x + b`` (the CI's target).

    * ``E1`` (and ``E3[c]`` with ``c`` in place of clean): rows from independent trajectories,
      ``f_a − f_c ~ N(w·(mu_a − mu_c) + (w·v_pos)·pos·(q_a − q_c), 2|w|²sigma²)`` given the
      positions ``q``; averaged over independent positions from :func:`_position_grid`:
      ``mean_{q_a, q_c} Φ((w·Δmu + (w·v_pos)·pos·(q_a − q_c)) / (|w| sigma √2))``.
    * ``E2``: attack and clean rows of one step share the trajectory, step and position parts,
      so the within-step AUC is ``Φ(w·Δmu / (|w| sigma_row √2))`` at every step.

    Args:
        w: Effective probe weights on raw features ``[d]``.
        p: Parameters of the process.
        dirs: Its directions.

    Returns:
        ``{"e1", "e2", "e3.c_scrambled", "e3.c_imperative", "e3.c_occlusion"}``.
    """
    w = np.asarray(w, dtype=np.float64)
    norm = float(np.linalg.norm(w))
    mu = variant_means(p, dirs)
    q = _position_grid(p)
    shift = float(w @ dirs["pos"]) * p.pos * (q[:, None] - q[None, :])
    scale = norm * p.sigma * math.sqrt(2.0)

    def pooled(neg: str) -> float:
        return float(np.mean(ndtr((float(w @ (mu["attack"] - mu[neg])) + shift) / scale)))

    out = {"e1": pooled("clean"),
           "e2": float(ndtr(float(w @ (mu["attack"] - mu["clean"])) / (norm * p.sigma_row * math.sqrt(2.0))))}
    for c in CONTROLS:
        out[f"e3.{c}"] = pooled(c)
    return out


def _flat(results: dict) -> dict[str, dict]:
    flat = {"e1": results["e1"], "e2": results["e2"]}
    flat.update({f"e3.{c}": iv for c, iv in results["e3"].items()})
    twin = results.get("random_twin")
    if twin:
        flat.update({"twin.e1": twin["e1"], "twin.e2": twin["e2"]})
        flat.update({f"twin.e3.{c}": iv for c, iv in twin["e3"].items()})
        flat.update({f"diff.e3.{c}": iv for c, iv in results["differences"]["e3_minus_twin_e3"].items()})
    return flat


def run_dataset(p: SimParams, truth: str, index: int, seed: int) -> dict:
    """Simulate dataset ``index`` of ``truth`` and run the real pipeline on it.

    Seeds: ``numpy.random.SeedSequence(seed, spawn_key=(truth_index, index))`` drives the data,
    the split, the label permutation and the bootstrap draws, so a dataset's result does not
    depend on how many workers ran.

    Returns:
        A JSON-ready record: truth, index, the claim, every check's status, each estimand's
        estimate/CI with its true value and whether the CI covers it, and the wall time.
    """
    from ipi.evaluation.verdict import verdict
    from ipi.metrics.estimands import evaluate_tables
    from ipi.probe.crossfit import cross_fit, make_folds
    from ipi.probe.fit import ProbeConfig

    t0 = time.perf_counter()
    pt = p.for_truth(truth)
    ss = np.random.SeedSequence(seed, spawn_key=(TRUTHS.index(truth), index))
    rng = np.random.default_rng(ss)
    twin_rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(TRUTHS.index(truth), index, 1)))
    meta, x, collapse, dirs, x_twin, dirs_twin = simulate_dataset(pt, rng, twin_rng=twin_rng)
    split_seed, perm_seed, boot_seed = (int(v) for v in rng.integers(0, 2**31 - 1, size=3))
    null_seed = int(rng.integers(0, 2**31 - 1))
    folds = make_folds(meta["trajectory_id"].unique(), "holdout", test_fraction=pt.test_fraction, seed=split_seed)
    md = meta[["step", "horizon", "prompt_len", "delta_prompt_len"]].to_numpy(dtype=np.float64)
    fits = cross_fit(meta, x, folds, probe_cfg=ProbeConfig(l2=pt.l2, seed=0), metadata=md, collapse=collapse,
                     permuted=True, permute_seed=perm_seed, l2=pt.l2, permutation_m=pt.permutation_m,
                     permutation_seed=null_seed)
    main_table = meta.iloc[fits.test_index][["trajectory_id", "step", "variant"]].reset_index(drop=True)
    main_table["score"] = fits.probe_scores(x)
    # The random-weight twin: the same probe on the same folds (verdict check 6).
    twin_fits = cross_fit(meta, x_twin, folds, probe_cfg=ProbeConfig(l2=pt.l2, seed=0))
    twin_table = main_table[["trajectory_id", "step", "variant"]].copy()
    twin_table["score"] = twin_fits.probe_scores(x_twin)
    results = evaluate_tables(main_table, fits.baselines, n_boot=pt.n_boot, seed=boot_seed,
                              permutation=fits.permutation_input(), twin=twin_table)
    v = verdict(results, pretrained=True)
    w, _ = fits.probes[0].effective_weights()
    truth_vals = true_estimands(w.detach().numpy(), pt, dirs)
    w_twin, _ = twin_fits.probes[0].effective_weights()
    twin_vals = true_estimands(w_twin.detach().numpy(), pt.twin(), dirs_twin)
    truth_vals.update({f"twin.{k}": val for k, val in twin_vals.items()})
    truth_vals.update({f"diff.e3.{c}": truth_vals[f"e3.{c}"] - twin_vals[f"e3.{c}"] for c in CONTROLS})
    est = {}
    for key, iv in _flat(results).items():
        tv = truth_vals[key]
        est[key] = {**iv, "true": tv,
                    "covered": bool(iv["ci_low"] is not None and iv["ci_low"] <= tv <= iv["ci_high"])}
    return {
        "truth": truth,
        "index": index,
        "claim": v["claim"],
        "checks": {str(c["id"]): c["status"] for c in v["checks"]},
        "estimands": est,
        "baselines": {k: results[k]["e1"]["estimate"] for k in fits.baselines},
        "permutation": ({k: results["permutation"][k] for k in ("p_value", "null_mean", "null_sd", "e1_refit")}
                        if "permutation" in results else None),
        "n_test_trajectories": len(folds[0][1]),
        "seconds": time.perf_counter() - t0,
    }


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)
    from ipi.tasks import quiet_lightning

    quiet_lightning()


def _job(args) -> dict:
    return run_dataset(*args)


def _clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


def summarise(records: list[dict]) -> dict:
    """Rates per truth: the claim, each check's PASS rate, CI coverage per estimand.

    Each rate comes with its exact (Clopper–Pearson) 95% interval over datasets.
    """
    from ipi.evaluation.verdict import CLAIM_DETECTS

    out = {}
    for truth in TRUTHS:
        rec = [r for r in records if r["truth"] == truth]
        if not rec:
            continue
        n = len(rec)

        def rate(k: int, n: int = n) -> dict:
            lo, hi = _clopper_pearson(k, n)
            return {"rate": k / n, "k": k, "n": n, "ci": [lo, hi]}

        s = {"claim_detects": rate(sum(r["claim"] == CLAIM_DETECTS for r in rec))}
        s["check_pass"] = {cid: rate(sum(r["checks"][cid] == "PASS" for r in rec)) for cid in rec[0]["checks"]}
        perm = [r["permutation"] for r in rec if r.get("permutation")]
        if perm:
            s["permutation"] = {
                "mean_null_mean": float(np.mean([q["null_mean"] for q in perm])),
                "max_abs_null_mean_off": float(np.max([abs(q["null_mean"] - 0.5) for q in perm])),
                "p_le_0.05": rate(sum(q["p_value"] <= 0.05 for q in perm), len(perm)),
            }
        s["coverage"] = {k: rate(sum(r["estimands"][k]["covered"] for r in rec)) for k in rec[0]["estimands"]}
        s["mean_true"] = {k: float(np.mean([r["estimands"][k]["true"] for r in rec])) for k in rec[0]["estimands"]}
        s["mean_estimate"] = {k: float(np.mean([r["estimands"][k]["estimate"] for r in rec]))
                              for k in rec[0]["estimands"]}
        s["seconds_per_dataset"] = float(np.mean([r["seconds"] for r in rec]))
        out[truth] = s
    return out


def format_table(summary: dict) -> str:
    """The self-test table (Markdown), as written to docs/selftest.md."""

    def pct(r: dict) -> str:
        return f"{r['rate']:.3f} ({r['k']}/{r['n']}; 95% CI {r['ci'][0]:.3f}–{r['ci'][1]:.3f})"

    heads = {"a": "truth (a): content signal", "b": "truth (b): surface only",
             "c": "truth (c): token identity shared by the twin"}
    cols = [t for t in TRUTHS if t in summary]
    lines = ["| figure | " + " | ".join(heads[t] for t in cols) + " |", "|---|" + "---|" * len(cols)]

    def row(label: str, get) -> None:
        cells = []
        for t in cols:
            try:
                cells.append(get(summary[t]))
            except KeyError:
                cells.append("n/a")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("claims \"detects malicious content\"", lambda s: pct(s["claim_detects"]))
    row("coverage of the 95% CI of E1", lambda s: pct(s["coverage"]["e1"]))
    for k in ("e2", *(f"e3.{c}" for c in CONTROLS)):
        row(f"coverage of the 95% CI of {k.upper() if k == 'e2' else 'E3 ' + k[3:]}", lambda s, k=k: pct(s["coverage"][k]))
    row("coverage of the 95% CI of twin E1", lambda s: pct(s["coverage"]["twin.e1"]))
    for c in CONTROLS:
        row(f"coverage of the paired 95% CI of E3 − twin E3 {c}", lambda s, c=c: pct(s["coverage"][f"diff.e3.{c}"]))
    names = {"1": "separates", "2": "not a construction artifact", "3": "not surface statistics",
             "4": "no memorisation", "5": "not generic collapse", "6": "selective vs a random-weight twin"}
    for cid, name in names.items():
        row(f"check {cid} ({name}) PASS", lambda s, cid=cid: pct(s["check_pass"][cid]))
    if any("permutation" in summary[t] for t in cols):
        row("permutation null: mean of null means / max |null mean − 0.5|",
            lambda s: (f"{s['permutation']['mean_null_mean']:.3f} / {s['permutation']['max_abs_null_mean_off']:.3f}"
                       if "permutation" in s else "n/a"))
    for k in ("e1", "e2", *(f"e3.{c}" for c in CONTROLS), "twin.e3.c_scrambled", "diff.e3.c_scrambled"):
        row(f"mean true {k} / mean estimate", lambda s, k=k: f"{s['mean_true'][k]:.3f} / {s['mean_estimate'][k]:.3f}")
    row("seconds per dataset (one worker)", lambda s: f"{s['seconds_per_dataset']:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    """CLI: simulate, run the pipeline, print the table and write the records (JSON)."""
    ap = argparse.ArgumentParser(prog="python -m ipi.simulate", description=__doc__.split("\n")[0])
    ap.add_argument("--n-datasets", type=int, default=200, help="datasets per truth (default 200)")
    ap.add_argument("--trajectories", type=int, default=80, help="trajectories per dataset (default 80)")
    ap.add_argument("--features", type=int, default=SimParams.n_features, help="feature dimension d")
    ap.add_argument("--content", type=float, default=SimParams.content, help="content signal of truth (a)")
    ap.add_argument("--n-boot", type=int, default=1000, help="bootstrap replicates (default 1000)")
    ap.add_argument("--permutations", type=int, default=SimParams.permutation_m,
                    help="refits M of the exact permutation test, verdict check 4 (default 199; 0: not run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--truths", default="a,b,c", help="comma-separated subset of a,b,c")
    ap.add_argument("--lexical", type=float, default=SimParams.lexical, help="token-identity signal of truth (c)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", default="outputs/selftest/selftest.json", help="JSON with every record + summary")
    args = ap.parse_args(argv)
    p = SimParams(n_trajectories=args.trajectories, n_features=args.features, content=args.content,
                  lexical=args.lexical, n_boot=args.n_boot, permutation_m=args.permutations)
    truths = [t.strip() for t in args.truths.split(",") if t.strip()]
    for t in truths:
        if t not in TRUTHS:
            ap.error(f"--truths: unknown truth {t!r} (use a, b, c)")
    jobs = [(p, t, i, args.seed) for t in truths for i in range(args.n_datasets)]
    t0 = time.perf_counter()
    if args.workers > 1:
        import multiprocessing as mp

        with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn"), initializer=_init_worker) as ex:
            records = list(ex.map(_job, jobs, chunksize=4))
    else:
        _init_worker()
        records = [_job(j) for j in jobs]
    wall = time.perf_counter() - t0
    summary = summarise(records)
    command = "python -m ipi.simulate " + " ".join(argv if argv is not None else sys.argv[1:])
    out = {"command": command.strip(), "params": asdict(p), "seed": args.seed, "workers": args.workers,
           "wall_s": wall, "summary": summary, "records": records}
    from ipi.io import atomic_write_text

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(out, indent=1))
    print(format_table(summary))
    print(f"\n{len(records)} datasets in {wall:.0f} s with {args.workers} worker(s); records: {args.out}")
    return out


if __name__ == "__main__":
    main()
