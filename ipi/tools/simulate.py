"""Planted-truth self-test of the statistics: ``python -m ipi.tools.simulate`` (docs/selftest.md).

Generates **feature-level** datasets with the protocol's structure (PROTOCOL.md §2–§3) under
known truths, runs the project's real pipeline pieces on each — trajectory split
(:func:`~ipi.probe.folds.make_folds`), the Lightning :class:`~ipi.probe.LinearProbe` via
:func:`~ipi.probe.fit_probe` (the :class:`~ipi.detectors.linear.LogisticDetector` of
``probe.l2``, seed 0), the C1 metadata baseline, the permuted-label probe and the
collapse-only probe (all through :func:`~ipi.detectors.crossfit.cross_fit`, the one fold loop
``train.py`` runs for every detector, including the M = 199 permuted-label refits of verdict check 4's exact
permutation test), and the one assessment path :func:`~ipi.evaluation.assess.assess` (estimands,
verdict, reportability) — and reports:

* the rate of the claim "detects malicious content" under truths (b), (c), ``twin_token`` and
  ``twin_seed``, where it is false (must be ≤ 5%; under ``twin_seed`` at most ``1/(S+1)`` by
  exchangeability, in practice far lower);
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
* truth ``twin_token``: ``content = 0``, ``lexical > 0`` — attacks carry a *token-identity*
  direction ``v_lex`` (the attack bank's vocabulary) that separates them from the controls, and
  the random twins' features carry it just as strongly: E3 > 0.5 (check 3 passes) for a reason
  a network with random weights shares;
* truth ``twin_seed``: as ``twin_token``, but every network — the "trained" one and each twin —
  has its own token-identity gain ``lexical · exp(seed_sd · z)``, ``z ~ N(0, 1)`` per network
  (init-seed variance), and the "trained" features are generated exactly like a twin's: the
  trained net is just another random draw, exchangeable with the twins;
* the **random-weight twins** (verdict check 6), ``n_twins`` of them: the same inputs (the same
  trajectory and step effects, the same attack templates) through another network: twin ``j``'s
  features are ``Q_j (mu_twin[variant] + pos · (step / H_t) · v_pos + u_t + s_(t,step) + e_j)``
  with a random rotation ``Q_j``, its own row noise ``e_j`` of the same SD, and ``mu_twin`` =
  ``mu`` without the content term (a random network keeps surface statistics, wording and token
  identity, not content). Twin ``j`` draws from its own generator (``spawn_key=(truth, index, 1,
  j)``), so the trained-feature datasets of truths (a), (b), (c) are those of the self-test
  without twins;
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
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import ndtr

from ipi.evaluation.assess import DEFAULTS, ScoreTables, Settings, assess
from ipi.evaluation.verdict import CHECKS, CLAIM_DETECTS, CLAIM_NONE
from ipi.io import atomic_write_text
from ipi.metrics.compare import Estimates
from ipi.metrics.twins import rank_correlations
from ipi.detectors.crossfit import cross_fit
from ipi.detectors.linear import LogisticDetector
from ipi.probe.folds import make_folds
from ipi.progress import progress_bar, quiet_lightning
from ipi.protocol import CONTROLS, VARIANTS
from ipi.run.config import ProbeConf
from ipi.reporting.sweep import claim_p_values, familywise, twin_e3_networks
from ipi.surfaces.bank import ATTACK_TEMPLATES, attack_text
from ipi.attacks.wording import wording_plan

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

TRUTHS = ("a", "b", "c", "twin_token", "twin_seed")
#: Truths the CLI accepts: the five, ``c_shared`` = truth (c) with held-out wording OFF (train
#: and test share the bank: shows what the held-out wording guards against), and ``null``: the
#: attack rows are drawn exactly like the clean rows (nothing separates them; the level of
#: "separates", verdict check 1). Appended, so the seeds of the others do not move.
ALL_TRUTHS = (*TRUTHS, "c_shared", "null")
#: Split designs (``split.kind``): one trajectory holdout, or grouped K-fold cross-fitting.
SPLITS = ("holdout", "kfold")
#: Test-set sizes (trajectories) of the "separates" table: holdout test sets, and K-fold designs
#: over that many trajectories, every one tested (42: the shared WebVoyager data; 14: a small set).
NULL_N_TEST = (14, 24)
NULL_KFOLD_TRAJECTORIES = (14, 42)
#: Truths whose control separation is token identity shared by the twins (no content, no wording).
TWIN_TRUTHS = ("twin_token", "twin_seed")
#: Test-set sizes (trajectories) of the interval-coverage table (docs/selftest.md).
COVERAGE_N_TEST = (5, 10, 24, 50)
#: Cells of the simulated layer × token-group sweep (6 layers × 5 token groups).
SWEEP_CELLS = 30


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
    wording: float = 4.0  # truth (c): template-specific direction of attack rows; (a), (b) set 0
    heldout_wording: bool = True  # attack templates of test trajectories unseen in training
    lexical: float = 0.9  # truths twin_token, twin_seed: token identity on attack rows, shared by the twins
    seed_sd: float = 0.3  # truth twin_seed: SD of the log token-identity gain across network seeds
    n_twins: int = 19  # random-weight twins (seeds) per dataset: evaluation.random_twin_seeds' default S
    collapse_box: float = 0.002
    test_fraction: float = 0.3
    split: str = "holdout"  # "holdout" (test_fraction) or "kfold" (k folds), as split.kind
    k: int = 5  # folds of the K-fold design (split.k's default)
    null_attack: bool = False  # truth "null": attack rows drawn like clean rows
    l2: float = 1.0
    n_boot: int = DEFAULTS.n_boot
    permutation_m: int = 199  # refits of the exact permutation test (verdict check 4)
    min_clusters: int = DEFAULTS.min_clusters  # the verdict's gate on Kish effective test trajectories

    def for_truth(self, truth: str) -> SimParams:
        """The process under truth ``"a"`` (content as set, no wording signal), ``"b"`` (neither),
        ``"c"`` (wording as set, no content) or ``"twin_token"``/``"twin_seed"`` (token identity
        as set, neither content nor wording); token identity is 0 under (a), (b), (c)."""
        if truth not in TRUTHS and truth != "null":
            raise ValueError(f"truth must be one of {', '.join(TRUTHS)} or null, got {truth!r}")
        if truth == "null":
            return replace(self, content=0.0, wording=0.0, lexical=0.0, null_attack=True)
        if truth == "a":
            return replace(self, wording=0.0, lexical=0.0)
        if truth == "b":
            return replace(self, content=0.0, wording=0.0, lexical=0.0)
        if truth == "c":
            return replace(self, content=0.0, lexical=0.0)
        return replace(self, content=0.0, wording=0.0)

    def twin(self, gain: float = 1.0) -> SimParams:
        """A random-weight network's process: no content term, token identity times ``gain``."""
        return replace(self, content=0.0, lexical=self.lexical * gain)

    @property
    def sigma(self) -> float:
        """SD of the Gaussian part of one row along any unit direction (traj + step + row)."""
        return math.sqrt(self.sigma_traj**2 + self.sigma_step**2 + self.sigma_row**2)


def _probe(l2: float) -> LogisticDetector:
    """The logistic probe at ``C = l2`` with the other ``probe.*`` settings at the schema's defaults, seed 0."""
    p = ProbeConf()
    return LogisticDetector(l2=l2, max_iter=p.max_iter, tol=p.tol, solver=p.solver.value, seed=0)


def _directions(rng: np.random.Generator, d: int) -> dict[str, np.ndarray]:
    """Four orthonormal signal directions and one unit direction per attack template ``[d, 24]``.

    Template directions are orthonormal to each other and to the four when ``d >= 28``; with
    smaller ``d`` they are random unit vectors orthogonal to the four.
    """

    n_t = len(ATTACK_TEMPLATES)
    if d >= 4 + n_t:
        q, _ = np.linalg.qr(rng.standard_normal((d, 4 + n_t)))
        tmpl = q[:, 4:]
    else:
        q, _ = np.linalg.qr(rng.standard_normal((d, 4)))
        r = rng.standard_normal((d, n_t))
        r -= q @ (q.T @ r)
        tmpl = r / np.linalg.norm(r, axis=0, keepdims=True)
    return {"content": q[:, 0], "box": q[:, 1], "text": q[:, 2], "pos": q[:, 3], "templates": tmpl}


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
    if p.null_attack:  # truth "null": an attack row is a clean row
        attack = np.zeros_like(dirs["box"])
    return {
        "clean": np.zeros_like(dirs["box"]),
        "attack": attack,
        "c_scrambled": surface,
        "c_imperative": surface,
        "c_occlusion": p.box * dirs["box"],
    }


def trajectory_ids(n: int) -> list[str]:
    """Ids of a simulated dataset's trajectories (``sim00000, sim00001, ...``)."""
    return [f"sim{t:05d}" for t in range(n)]


def _network_features(p: SimParams, dirs: dict[str, np.ndarray], step_part: np.ndarray,
                      attack_rows: np.ndarray, tmpl: np.ndarray, rng: np.random.Generator,
                      ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Another network's features of the same inputs: ``Q (mu[variant] + step part + e)``.

    Args:
        p: The network's process (e.g. :meth:`SimParams.twin`).
        dirs: The directions (input space).
        step_part: Trajectory, step and position parts ``[n_steps, d]`` (shared: same inputs).
        attack_rows: Row indices of the attack rows; ``tmpl`` their templates.
        tmpl: Template index of each attack row ``[n_steps]``.
        rng: The network's generator (rotation ``Q`` first, then the row noise ``e``).

    Returns:
        ``(x [N, d], dirs as the network's features carry them: Q v)``.
    """
    d, nv = p.n_features, len(VARIANTS)
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    mu = variant_means(p, dirs)
    x = np.repeat(step_part, nv, axis=0) + rng.standard_normal((step_part.shape[0] * nv, d)) * p.sigma_row
    x += np.tile(np.stack([mu[v] for v in VARIANTS]), (step_part.shape[0], 1))
    if p.wording:
        x[attack_rows] += p.wording * dirs["templates"][:, tmpl].T
    return x @ q.T, {k: q @ v for k, v in dirs.items()}


def simulate_dataset(p: SimParams, rng: np.random.Generator, dirs: dict[str, np.ndarray] | None = None,
                     n_trajectories: int | None = None, template_of=None, twins=None, trained=None):
    """One dataset with the protocol's structure (and, with ``twins``, its random twins' features).

    Args:
        p: Parameters.
        rng: Random generator.
        dirs: Signal directions (drawn from ``rng`` when None; the token-identity direction
            ``"lex"`` right after them when ``p.lexical`` and ``dirs`` lacks it).
        n_trajectories: Overrides ``p.n_trajectories`` (e.g. a large fresh sample).
        template_of: ``(trajectory_id, step) -> template index`` of the step's attack row (the
            real chooser :func:`ipi.surfaces.bank.attack_text`, restricted to the trajectory's
            held-out wording family); default: the whole bank.
        twins: ``[(generator, gain), ...]``, one per random-weight twin (module docstring), or
            None. Twin ``j`` is :func:`_network_features` of ``p.twin(gain)``.
        trained: ``(generator, gain)`` or None: the "trained" features are then generated like a
            twin's (truth ``twin_seed``: the trained net is another random draw) instead of ``x``.

    Returns:
        ``(meta, x, collapse, dirs)``: ``meta`` has ``trajectory_id, step, variant, surface,
        horizon, prompt_len, delta_prompt_len, template`` (one row per (trajectory, step,
        variant); ``template`` is the attack's template on attack rows, −1 elsewhere); ``x`` is
        ``[N, d]`` float64 (attack rows add ``wording · v_template``); ``collapse`` ``[N, 2]``;
        ``dirs`` the directions as ``x`` carries them. With ``twins`` two more items: the
        twins' features ``[x_j [N, d], ...]`` and their directions ``[dirs_j, ...]``.
    """
    d = p.n_features
    dirs = dict(dirs) if dirs is not None else _directions(rng, d)
    if p.lexical and "lex" not in dirs:
        dirs["lex"] = _lexical_direction(rng, dirs)
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
    ids = np.array(trajectory_ids(n_t), dtype=object)
    if template_of is None:
        def template_of(tid, st):
            return attack_text(tid, st)[1]["template"]
    tmpl = np.array([template_of(ids[t], int(st)) for t, st in zip(traj, step)], dtype=np.int64)
    attack_rows = np.arange(n_steps) * nv + VARIANTS.index("attack")
    if p.wording:
        x[attack_rows] += p.wording * dirs["templates"][:, tmpl].T
    template_col = np.full(n_steps * nv, -1, dtype=np.int64)
    template_col[attack_rows] = tmpl
    base_len = rng.normal(900.0, 120.0, size=n_t)
    prompt_len = np.round(base_len[traj] + 60.0 * step + rng.normal(0.0, 20.0, size=n_steps))
    boxed = np.array([v != "clean" for v in VARIANTS], dtype=np.float64)
    c_traj = rng.normal(0.0, 0.03, size=(n_t, 2))
    collapse = (0.35 + np.repeat(c_traj[traj] + 0.02 * (step / hor)[:, None], nv, axis=0)
                + p.collapse_box * np.tile(boxed, n_steps)[:, None]
                + rng.normal(0.0, 0.02, size=(n_steps * nv, 2)))
    meta = pd.DataFrame({
        "trajectory_id": np.repeat(ids[traj], nv),
        "step": np.repeat(step, nv),
        "variant": np.tile(np.array(VARIANTS, dtype=object), n_steps),
        "surface": "i_vis",
        "horizon": np.repeat(hor, nv),
        "prompt_len": np.repeat(prompt_len, nv),
        "delta_prompt_len": 0.0,
        "template": template_col,
    })
    out_dirs = dirs
    if trained is not None:
        x, out_dirs = _network_features(p.twin(trained[1]), dirs, step_part, attack_rows, tmpl, trained[0])
    if twins is None:
        return meta, x, collapse, out_dirs
    nets = [_network_features(p.twin(g), dirs, step_part, attack_rows, tmpl, r) for r, g in twins]
    return meta, x, collapse, out_dirs, [n[0] for n in nets], [n[1] for n in nets]


def _position_grid(p: SimParams) -> np.ndarray:
    """Positions ``step / H`` of the pooled row distribution: every (H, step) pair equally likely.

    A trajectory of horizon ``h`` contributes ``h`` steps, so pooling rows over trajectories
    draws ``H`` size-biased and the step uniformly given ``H``: all pairs ``(h, s < h)`` with
    ``h`` in ``[h_min, h_max]`` are equally likely.
    """
    return np.array([s / h for h in range(p.h_min, p.h_max + 1) for s in range(h)])


def true_estimands(w: np.ndarray, p: SimParams, dirs: dict[str, np.ndarray],
                   templates=None) -> dict[str, float]:
    """Population E1, E2, E3[c] of the linear score ``f = w·x + b`` (the CI's target).

    Under truth (c) the attack rows are a mixture over the test trajectories' templates
    (``templates``, equally likely: the chooser hashes uniformly over the family), and an AUC
    against a mixture is the mixture's average of the per-template AUCs.

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

        templates: Template indices attack rows of the target population use (truth (c));
            default: the whole bank. Ignored when ``p.wording`` is 0.

    Returns:
        ``{"e1", "e2", "e3.c_scrambled", "e3.c_imperative", "e3.c_occlusion"}``.
    """
    w = np.asarray(w, dtype=np.float64)
    norm = float(np.linalg.norm(w))
    mu = variant_means(p, dirs)
    q = _position_grid(p)
    shift = float(w @ dirs["pos"]) * p.pos * (q[:, None] - q[None, :])
    scale = norm * p.sigma * math.sqrt(2.0)
    if p.wording:
        tl = range(dirs["templates"].shape[1]) if templates is None else list(templates)
        extra = [p.wording * float(w @ dirs["templates"][:, t]) for t in tl]
    else:
        extra = [0.0]

    def pooled(neg: str) -> float:
        base = float(w @ (mu["attack"] - mu[neg]))
        return float(np.mean([np.mean(ndtr((base + e + shift) / scale)) for e in extra]))

    d_ac = float(w @ (mu["attack"] - mu["clean"]))
    out = {"e1": pooled("clean"),
           "e2": float(np.mean([ndtr((d_ac + e) / (norm * p.sigma_row * math.sqrt(2.0))) for e in extra]))}
    for c in CONTROLS:
        out[f"e3.{c}"] = pooled(c)
    return out


#: The estimands :func:`true_estimands` returns.
_ESTIMAND_KEYS = ("e1", "e2", *(f"e3.{c}" for c in CONTROLS))


def _flat(est: Estimates) -> dict[str, dict]:
    """JSON-ready intervals by flat key: ``e1, e2, e3.<c>``; with twins ``diff.e3.<c>`` (E3 − mean
    twin E3, check 6's paired interval)."""
    main = est.main
    flat = {"e1": main.e1.to_dict(), "e2": main.e2.to_dict()}
    flat.update({f"e3.{c}": iv.to_dict() for c, iv in main.e3.items()})
    if est.random_twin is not None:
        flat.update({f"diff.e3.{c}": x.to_dict() for c, x in est.differences.twin.e3_mean.items()})
    return flat


def _split_and_templates(p: SimParams, rng: np.random.Generator, n_t: int):
    """Trajectory holdout, the held-out wording plan and the real template chooser."""

    split_seed = int(rng.integers(0, 2**31 - 1))
    folds = make_folds(trajectory_ids(n_t), p.split, test_fraction=p.test_fraction, k=p.k, seed=split_seed)
    plan = wording_plan(folds, split_seed) if p.heldout_wording else None

    def template_of(tid: str, st: int) -> int:
        fam = plan.family(tid) if plan is not None else None
        kw = {"templates": fam.templates, "goals": fam.goals} if fam is not None else {}
        return attack_text(tid, st, **kw)[1]["template"]

    test_templates = plan.families["test"].templates if plan is not None and p.split == "holdout" else None
    return folds, plan, template_of, test_templates


def run_dataset(p: SimParams, truth: str, index: int, seed: int, key: tuple | None = None) -> dict:
    """Simulate dataset ``index`` of ``truth`` and run the real pipeline on it.

    Seeds: ``numpy.random.SeedSequence(seed, spawn_key=key or (truth_index, index))`` drives the
    data, the split, the label permutation and the bootstrap draws, so a dataset's result does
    not depend on how many workers ran; twin ``j`` (``p.n_twins`` of them, 0: no twin and check
    6 NOT RUN) draws from ``spawn_key=(*key, 1, j)``, the networks' token-identity gains of
    truth ``twin_seed`` from ``(*key, 2)``. The split (and with it the held-out wording family of
    each trajectory, :func:`ipi.attacks.wording.wording_plan`) is drawn first; each attack row's
    template comes from the real chooser restricted to its trajectory's family.

    Returns:
        A JSON-ready record: truth, index, the claim, every check's status, each estimand's
        estimate/CI with its true value and whether the CI covers it, and the wall time.
    """

    t0 = time.perf_counter()
    pt = (replace(p, heldout_wording=False).for_truth("c") if truth == "c_shared" else p.for_truth(truth))
    holdout = pt.split == "holdout"
    ss = np.random.SeedSequence(seed, spawn_key=key if key is not None else (ALL_TRUTHS.index(truth), index))
    rng = np.random.default_rng(ss)
    key = key if key is not None else (ALL_TRUTHS.index(truth), index)
    folds, plan, template_of, test_templates = _split_and_templates(pt, rng, pt.n_trajectories)
    # Token-identity gains: 1 for every network, except under twin_seed (one draw per network,
    # index 0 the "trained" one: exchangeable with the twins).
    gains = (np.exp(pt.seed_sd * np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(*key, 2)))
                    .standard_normal(pt.n_twins + 1)) if truth == "twin_seed" else np.ones(pt.n_twins + 1))
    twins = [(np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(*key, 1, j))), float(gains[j]))
             for j in range(1, pt.n_twins + 1)]
    trained = ((np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(*key, 1, 0))), float(gains[0]))
               if truth == "twin_seed" else None)
    sim = simulate_dataset(pt, rng, template_of=template_of, twins=twins or None, trained=trained)
    meta, x, collapse, dirs = sim[:4]
    x_twins, dirs_twins = (sim[4], sim[5]) if twins else ([], [])
    perm_seed, boot_seed = (int(v) for v in rng.integers(0, 2**31 - 1, size=2))
    null_seed = int(rng.integers(0, 2**31 - 1))
    md = meta[["step", "horizon", "prompt_len", "delta_prompt_len"]].to_numpy(dtype=np.float64)
    probe = _probe(pt.l2)
    fits = cross_fit(probe, meta, x, folds, metadata=md, collapse=collapse, permuted=True, permute_seed=perm_seed,
                     l2=pt.l2, permutation_m=pt.permutation_m, permutation_seed=null_seed)
    main_table = fits.score_table(meta)
    # The random-weight twins: the same probe on the same folds (verdict check 6).
    twin_tables, twin_w = {}, []
    for j, xt in enumerate(x_twins, start=1):
        tf = cross_fit(probe, meta, xt, folds, l2=pt.l2)
        tbl = main_table[["trajectory_id", "step", "variant"]].copy()
        tbl["score"] = tf.test_scores
        twin_tables[j] = tbl
        twin_w.append(tf.fitted[0].probe_.effective_weights()[0].detach().numpy())
    assessed = assess(ScoreTables(main_table, fits.baselines, twin_tables or None, fits.permutation_input()),
                      Settings(n_boot=pt.n_boot, seed=boot_seed, pretrained=True if twin_tables else None,
                               min_clusters=pt.min_clusters, heldout_wording=pt.heldout_wording, split=pt.split))
    v, perm = assessed.verdict, assessed.estimates.permutation
    w, _ = fits.fitted[0].probe_.effective_weights()
    p_trained = pt.twin(trained[1]) if trained is not None else pt
    # The analytic truth is one probe's; K-fold scores come from k probes (no single target).
    truth_vals = (true_estimands(w.detach().numpy(), p_trained, dirs, test_templates) if holdout
                  else dict.fromkeys(_ESTIMAND_KEYS))
    if twin_tables and holdout:
        tv = [true_estimands(wt, pt.twin(float(g)), dt, test_templates)
              for wt, dt, g in zip(twin_w, dirs_twins, gains[1:])]
        for c in CONTROLS:
            truth_vals[f"diff.e3.{c}"] = truth_vals[f"e3.{c}"] - float(np.mean([t[f"e3.{c}"] for t in tv]))
        # Does the trained probe beat every twin in the population (the event exchangeability bounds)?
        beats_all = all(truth_vals[f"e3.{c}"] > max(t[f"e3.{c}"] for t in tv) for c in CONTROLS)
    else:
        beats_all = None
    res = assessed.to_dict()
    p_sep, p_det = claim_p_values(res)
    twin_e3 = twin_e3_networks(res)
    est = {}
    for key, iv in _flat(assessed.estimates).items():
        tv = truth_vals.get(key)
        est[key] = {**iv, "true": tv,
                    "covered": (None if tv is None else
                                bool(iv["ci_low"] is not None and iv["ci_low"] <= tv <= iv["ci_high"]))}
    return {
        "truth": truth,
        "split": pt.split,
        "index": index,
        "claim": v.claim,
        "checks": {str(c.id): c.status for c in v.checks},
        "estimands": est,
        "baselines": {k: b.e1.to_dict()["estimate"] for k, b in assessed.estimates.baselines.items()},
        "permutation": ({"p_value": perm.p_value, "null_mean": perm.null_mean, "null_sd": perm.null_sd,
                         "e1_refit": perm.e1_refit} if perm is not None else None),
        "n_test_trajectories": len(set().union(*(set(te) for _, te in folds))),
        "p_separates": p_sep,
        "p_detects": p_det,
        "twin_e3": list(twin_e3) if twin_e3 is not None else None,
        "n_twins": len(twin_tables),
        "twin_guards": list(assessed.estimates.random_twin.guards) if twin_tables else None,
        "twin_rank_correlation_max": _max_twin_rank_correlation(twin_tables),
        "true_beats_every_twin": beats_all,
        "gains": [float(g) for g in gains] if truth == "twin_seed" else None,
        "seconds": time.perf_counter() - t0,
    }


def _max_twin_rank_correlation(twin_tables: dict) -> float | None:
    """The largest Spearman correlation between two twins' scores (what check 6's distinctness guard
    reads; :func:`ipi.metrics.twins.rank_correlations`), or None with fewer than two twins."""
    if len(twin_tables) < 2:
        return None
    return float(max(rank_correlations({k: t["score"].to_numpy() for k, t in twin_tables.items()}).values()))


def trajectories_for_test_size(p: SimParams, n_test: int) -> int:
    """Trajectories ``n`` whose holdout at ``p.test_fraction`` tests exactly ``n_test`` of them."""
    n = max(2, int(round(n_test / p.test_fraction)))
    while round(p.test_fraction * n) < n_test:
        n += 1
    while round(p.test_fraction * n) > n_test:
        n -= 1
    return n


def null_params(p: SimParams, split: str, n_test: int) -> SimParams:
    """The "separates" design: ``split`` at ``n_test`` test trajectories (holdout: the test half of
    a larger set; K-fold: ``n_test`` trajectories, every one tested); no twins. Holdout runs no
    permutation refits (check 1 reads the bootstrap alone); K-fold runs check 4's M refits, which
    check 1 needs there (PROTOCOL.md §7.1)."""
    n = trajectories_for_test_size(p, n_test) if split == "holdout" else int(n_test)
    return replace(p, split=split, n_trajectories=n, n_twins=0,
                   permutation_m=0 if split == "holdout" else p.permutation_m)


def coverage_dataset(p: SimParams, n_test: int, index: int, seed: int,
                     intervals: tuple[str, ...] = ("expanded", "percentile")) -> dict:
    """Interval coverage on one truth-(a) dataset with ``n_test`` test trajectories.

    The dataset has ``n`` trajectories with ``round(test_fraction · n) == n_test``; only the
    probe is fitted (the baselines do not enter E1/E2/E3), its test rows are scored and
    bootstrapped once per interval method on the same draws, and each interval is checked
    against the fitted probe's analytic population estimand (:func:`true_estimands`).

    Returns:
        ``{"n_test", "index", "covered": {method: {estimand: bool}}, "width": {method: {estimand: float}}}``.
    """

    n = trajectories_for_test_size(p, n_test)
    pt = replace(p.for_truth("a"), n_trajectories=n, split="holdout")
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(20, n_test, index)))
    folds, plan, template_of, test_templates = _split_and_templates(pt, rng, n)
    meta, x, _, dirs = simulate_dataset(pt, rng, template_of=template_of)
    boot_seed = int(rng.integers(0, 2**31 - 1))
    fits = cross_fit(_probe(pt.l2), meta, x, folds, l2=pt.l2)
    table = fits.score_table(meta)
    w, _ = fits.fitted[0].probe_.effective_weights()
    truth_vals = true_estimands(w.detach().numpy(), pt, dirs, test_templates)
    covered, width = {}, {}
    for method in intervals:
        res = _flat(assess(ScoreTables(table), Settings(n_boot=pt.n_boot, seed=boot_seed, interval=method)).estimates)
        covered[method] = {k: bool(iv["ci_low"] is not None and iv["ci_low"] <= truth_vals[k] <= iv["ci_high"])
                           for k, iv in res.items()}
        width[method] = {k: (iv["ci_high"] - iv["ci_low"]) if iv["ci_low"] is not None else None
                         for k, iv in res.items()}
    return {"n_test": len(folds[0][1]), "index": index, "covered": covered, "width": width}


def sweep_dataset(p: SimParams, index: int, seed: int, n_cells: int = SWEEP_CELLS) -> dict:
    """One simulated ``n_cells``-cell sweep under truth (b); claims with and without Holm.

    Every cell is a full :func:`run_dataset` under truth (b) (nothing to detect) with its own
    features — cells are independent, the least favourable case for a family of tests (Holm
    holds under any dependence; positively dependent cells, as real layers are, make a false
    claim somewhere *less* likely). The family-wise claim of each cell is what
    ``python -m ipi.reporting.sweep`` licenses (:func:`ipi.reporting.sweep.familywise`).

    With twins, check 6's family-wise rank part is applied as the sweep report applies it
    (:func:`ipi.reporting.sweep.familywise_rank`: the same seeds ``1..S`` in every cell; each
    cell's S + 1 networks are exchangeable and cells are independent, so they are exchangeable
    jointly over the family).

    Returns:
        ``{"index", "n_cells", "nominal_any_detects", "familywise_any_detects",
        "familywise_any_separates", "rank_familywise_any" (None without twins), "p_detects_min",
        "seconds"}``.
    """

    cells = [run_dataset(p, "b", index, seed, key=(30, index, j)) for j in range(n_cells)]
    df = pd.DataFrame({"job": [str(j) for j in range(n_cells)], "overrides": [f"cell={j}" for j in range(n_cells)],
                       "claim": [c["claim"] for c in cells], "p_separates": [c["p_separates"] for c in cells],
                       "p_detects": [c["p_detects"] for c in cells]})
    if all(c.get("twin_e3") is not None for c in cells):
        # check 6's family-wise rank part, as the sweep report applies it (the twins of each cell
        # are exchangeable with its trained network, cells independent: jointly exchangeable)
        df["_twin_e3"] = [c["twin_e3"] for c in cells]
    fw = familywise(df, alpha=(1.0 - 0.95) / 2.0)
    return {"index": index, "n_cells": n_cells,
            "nominal_any_detects": bool((df.claim == CLAIM_DETECTS).any()),
            "familywise_any_detects": bool((fw.claim_familywise == CLAIM_DETECTS).any()),
            "familywise_any_separates": bool((fw.claim_familywise != "none").any()),
            "rank_familywise_any": (bool(any(fw.rank_familywise)) if fw.rank_familywise.notna().all() else None),
            "p_detects_min": float(df.p_detects.min()),
            "seconds": float(sum(c["seconds"] for c in cells))}


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)

    quiet_lightning()


def _job(args) -> dict:
    kind, rest = args[0], args[1:]
    if kind == "null":  # (p, split, n_test, index, seed[, truth]): "separates" under the null or under (a)
        p, split, n_test, index, seed, *truth = rest
        truth = truth[0] if truth else "null"
        key = (40 if truth == "null" else 41, SPLITS.index(split), n_test or 0, index)
        rec = run_dataset(null_params(p, split, n_test), truth, index, seed, key=key)
        return {"kind": "null", "design": "separates", **rec}
    if kind == "coverage":
        return {"kind": "coverage", **coverage_dataset(*rest)}
    if kind == "sweep":
        return {"kind": "sweep", **sweep_dataset(*rest)}
    p, truth, index, seed = rest
    key = None if p.split == "holdout" else (ALL_TRUTHS.index(truth), index, 1 + SPLITS.index(p.split))
    return run_dataset(p, truth, index, seed, key=key)


def job_id(job: tuple) -> str:
    """A job's identity in the journal: its kind and its place (truth, split, size, index), not ``p``.

    The parameters are the same for every job of one command; a journal is only valid for the
    command that wrote it (the CLI refuses nothing here: use one journal per command line).
    """
    kind = job[0]
    if kind == "sweep":
        return f"sweep/{job[2]}/{job[3]}"
    if kind == "coverage":
        return f"coverage/{job[2]}/{job[3]}/{job[4]}"
    if kind == "null":
        truth = job[6] if len(job) > 6 else "null"
        return f"{'null' if truth == 'null' else 'separates-' + truth}/{job[2]}/{job[3]}/{job[4]}/{job[5]}"
    return f"run/{job[1].split}/{job[2]}/{job[3]}/{job[4]}"


def _clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


def summarise(records: list[dict]) -> dict:
    """Rates per truth: the claim, each check's PASS rate, CI coverage per estimand.

    Each rate comes with its exact (Clopper–Pearson) 95% interval over datasets.
    """

    def rate(k: int, n: int) -> dict:
        lo, hi = _clopper_pearson(k, n)
        return {"rate": k / n, "k": k, "n": n, "ci": [lo, hi]}

    out: dict = {}
    cov = [r for r in records if r.get("kind") == "coverage"]
    if cov:
        table: dict = {}
        for method in cov[0]["covered"]:
            table[method] = {}
            for n_test in sorted({r["n_test"] for r in cov}):
                rs = [r for r in cov if r["n_test"] == n_test]
                table[method][str(n_test)] = {
                    k: {**rate(sum(r["covered"][method][k] for r in rs), len(rs)),
                        "mean_width": float(np.mean([r["width"][method][k] for r in rs
                                                     if r["width"][method][k] is not None]))}
                    for k in rs[0]["covered"][method]}
        out["coverage_by_n_test"] = table
    sw = [r for r in records if r.get("kind") == "sweep"]
    if sw:
        out["sweep_b"] = {"n_cells": sw[0]["n_cells"],
                          "familywise_false_claim": rate(sum(r["familywise_any_detects"] for r in sw), len(sw)),
                          "nominal_any_cell_false_claim": rate(sum(r["nominal_any_detects"] for r in sw), len(sw)),
                          "seconds_per_sweep": float(np.mean([r["seconds"] for r in sw]))}
    groups: dict[str, list[dict]] = {}
    for r in records:
        if r.get("truth") is not None:
            groups.setdefault(group_of(r), []).append(r)
    for name in sorted(groups, key=_group_order):
        rec = groups[name]
        n = len(rec)

        s = {"claim_detects": rate(sum(r["claim"] == CLAIM_DETECTS for r in rec), n),
             "claim_separates_or_more": rate(sum(r["claim"] != CLAIM_NONE for r in rec), n),
             "n_test_trajectories": sorted({int(r["n_test_trajectories"]) for r in rec})}
        s["check_pass"] = {cid: rate(sum(r["checks"][cid] == "PASS" for r in rec), n) for cid in rec[0]["checks"]}
        perm = [r["permutation"] for r in rec if r.get("permutation")]
        if perm:
            s["permutation"] = {
                "mean_null_mean": float(np.mean([q["null_mean"] for q in perm])),
                "max_abs_null_mean_off": float(np.max([abs(q["null_mean"] - 0.5) for q in perm])),
                "p_le_0.05": rate(sum(q["p_value"] <= 0.05 for q in perm), len(perm)),
            }
        keys = [k for k in rec[0]["estimands"] if rec[0]["estimands"][k]["covered"] is not None]
        s["coverage"] = {k: rate(sum(r["estimands"][k]["covered"] for r in rec), n) for k in keys}
        s["mean_true"] = {k: float(np.mean([r["estimands"][k]["true"] for r in rec])) for k in keys}
        s["mean_estimate"] = {k: float(np.mean([r["estimands"][k]["estimate"] for r in rec]))
                              for k in rec[0]["estimands"]}
        s["seconds_per_dataset"] = float(np.mean([r["seconds"] for r in rec]))
        beats = [r["true_beats_every_twin"] for r in rec if r.get("true_beats_every_twin") is not None]
        if beats:  # population event: the trained probe's true E3 above every twin's, every control
            s["true_beats_every_twin"] = rate(sum(beats), len(beats))
        if rec[0].get("n_twins"):
            s["n_twins"] = int(rec[0]["n_twins"])
            s["candidates"] = {k: rate(sum(candidate_detects(r)[k] for r in rec), n) for k in CANDIDATES}
            rho = [r["twin_rank_correlation_max"] for r in rec if r.get("twin_rank_correlation_max") is not None]
            if rho:
                s["twin_rank_correlation_max"] = float(max(rho))
            s["twin_guards_fired"] = rate(sum(bool(r.get("twin_guards")) for r in rec), n)
        out[name] = s
    return out


#: Constructions of check 6 measured beside the rule (``summary[group]["candidates"]``): with
#: fewer than 19 twins a distribution-free rank test cannot reach 0.05, so another construction
#: would have to hold the level by simulation (PROTOCOL.md §7.6).
CANDIDATES = {
    "rank": "the rank rule at level 1/(S+1), whatever S",
    "t_prediction": "a one-sided 95% Student-t prediction bound for a new twin (normal seed effects)",
}


def candidate_detects(record: dict) -> dict[str, bool]:
    """Whether each construction of :data:`CANDIDATES`, in place of check 6, would have licensed
    "detects" on one record: checks 0–5 PASS, the paired CI of E3[c] − mean twin E3[c] above 0 for
    every control, and the construction's own part for every control (``rank``: E3[c] above every
    twin's; ``t_prediction``: ``(E3[c] − mean) / (sd · sqrt(1 + 1/S)) > t_{S−1, 0.95}``)."""
    from scipy.stats import t as student_t

    no = dict.fromkeys(CANDIDATES, False)
    twin = record.get("twin_e3")
    if not twin or any(record["checks"].get(str(i)) != "PASS" for i in range(6)):
        return no
    by_c = twin[1]
    if any((record["estimands"].get(f"diff.e3.{c}") or {}).get("ci_low") is None
           or record["estimands"][f"diff.e3.{c}"]["ci_low"] <= 0.0 for c in by_c):
        return no
    out = {}
    nets = {c: np.asarray(v, dtype=np.float64) for c, v in by_c.items()}
    out["rank"] = all(v[0] > v[1:].max() for v in nets.values())
    s = len(next(iter(nets.values()))) - 1
    if s < 2:
        out["t_prediction"] = False
    else:
        q = float(student_t.ppf(0.95, s - 1))
        out["t_prediction"] = all(
            (v[0] - v[1:].mean()) > q * float(np.std(v[1:], ddof=1)) * math.sqrt(1.0 + 1.0 / s) for v in nets.values())
    return out


def group_of(record: dict) -> str:
    """The summary group of a run record: ``"<truth>"`` (holdout), ``"<truth>/kfold"``, and for the
    null ``"null/holdout/<n_test>"`` or ``"null/kfold/<n_test>"``."""
    truth, split = record["truth"], record.get("split", "holdout")
    if truth == "null":
        return f"null/{split}/{record['n_test_trajectories']}"
    if record.get("design") == "separates":
        return f"{truth}/separates-{split}/{record['n_test_trajectories']}"
    return truth if split == "holdout" else f"{truth}/{split}"


def _group_order(name: str) -> tuple:
    parts = name.split("/")
    return (ALL_TRUTHS.index(parts[0]), parts[1:2] != [] and parts[1] != "holdout",
            int(parts[2]) if len(parts) > 2 else 0)


def format_table(summary: dict) -> str:
    """The self-test table (Markdown), as written to docs/selftest.md."""

    def pct(r: dict) -> str:
        return f"{r['rate']:.3f} ({r['k']}/{r['n']}; 95% CI {r['ci'][0]:.3f}–{r['ci'][1]:.3f})"

    heads = {"a": "truth (a): content signal", "b": "truth (b): surface only",
             "c": "truth (c): bank wording, held out", "c_shared": "truth (c), wording shared",
             "twin_token": "twin_token: token identity shared by the twins",
             "twin_seed": "twin_seed: trained = another random draw",
             "null": "null: attack rows drawn as clean rows"}

    def head(name: str) -> str:
        parts = name.split("/")
        h = heads[parts[0]] + ("" if len(parts) == 1 else f", {parts[1]}")
        return h + (f", {parts[2]} test trajectories" if len(parts) > 2 else "")

    present = [k for k in summary if isinstance(summary[k], dict) and "claim_detects" in summary[k]]
    lines = ["| figure | " + " | ".join(head(t) for t in present) + " |", "|---" * (len(present) + 1) + "|"]

    def row(label: str, get) -> None:
        cells = []
        for t in present:
            try:
                cells.append(get(summary[t]))
            except KeyError:
                cells.append("n/a")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("claims \"detects malicious content\"", lambda s: pct(s["claim_detects"]))
    row("claims \"separates\" or more", lambda s: pct(s["claim_separates_or_more"]))
    row("test trajectories", lambda s: ", ".join(map(str, s["n_test_trajectories"])))
    row("coverage of the 95% CI of E1", lambda s: pct(s["coverage"]["e1"]))
    for k in ("e2", *(f"e3.{c}" for c in CONTROLS)):
        row(f"coverage of the 95% CI of {k.upper() if k == 'e2' else 'E3 ' + k[3:]}", lambda s, k=k: pct(s["coverage"][k]))
    if any("diff.e3.c_scrambled" in summary[t]["coverage"] for t in present):
        for c in CONTROLS:
            row(f"coverage of the paired 95% CI of E3 − mean twin E3 {c}",
                lambda s, c=c: pct(s["coverage"][f"diff.e3.{c}"]))
    if any("true_beats_every_twin" in summary[t] for t in present):
        row("trained beats every twin in truth (all controls)", lambda s: pct(s["true_beats_every_twin"]))
    for rule in CHECKS:
        row(f"check {rule.id} ({rule.name}) PASS", lambda s, cid=str(rule.id): pct(s["check_pass"][cid]))
    if any("candidates" in summary[t] for t in present):
        for name, what in CANDIDATES.items():
            row(f"\"detects\" if check 6 were {what}", lambda s, name=name: pct(s["candidates"][name]))
        row("largest Spearman correlation of two twins' scores (max over datasets)",
            lambda s: f"{s['twin_rank_correlation_max']:.3f}")
    if any("permutation" in summary[t] for t in present):
        row("permutation null: mean of null means / max |null mean − 0.5|",
            lambda s: (f"{s['permutation']['mean_null_mean']:.3f} / {s['permutation']['max_abs_null_mean_off']:.3f}"
                       if "permutation" in s else "n/a"))
    for k in ("e1", "e2", *(f"e3.{c}" for c in CONTROLS), "diff.e3.c_scrambled"):
        row(f"mean true {k} / mean estimate", lambda s, k=k: f"{s['mean_true'][k]:.3f} / {s['mean_estimate'][k]:.3f}")
    row("seconds per dataset (one worker)", lambda s: f"{s['seconds_per_dataset']:.2f}")
    if not present:
        lines = []
    if "sweep_b" in summary:
        sb = summary["sweep_b"]
        lines += ["", f"| {sb['n_cells']}-cell sweep under truth (b) | rate over sweeps |", "|---|---|",
                  f"| family-wise (Holm) false \"detects\" in any cell | {pct(sb['familywise_false_claim'])} |",
                  f"| nominal (no control) false \"detects\" in any cell | {pct(sb['nominal_any_cell_false_claim'])} |"]
    if "coverage_by_n_test" in summary:
        cov = summary["coverage_by_n_test"]
        keys = ("e1", "e2", *(f"e3.{c}" for c in CONTROLS))
        lines += ["", "| interval | test trajectories | " + " | ".join(keys) + " |", "|---" * (len(keys) + 2) + "|"]
        for method, by_n in cov.items():
            for n_test, d in by_n.items():
                lines.append(f"| {method} | {n_test} | " + " | ".join(
                    f"{d[k]['rate']:.3f} ({d[k]['k']}/{d[k]['n']})" for k in keys) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    """CLI: simulate, run the pipeline, print the table and write the records (JSON)."""
    ap = argparse.ArgumentParser(prog="python -m ipi.tools.simulate", description=__doc__.split("\n")[0])
    ap.add_argument("--n-datasets", type=int, default=200, help="datasets per truth (default 200)")
    ap.add_argument("--trajectories", type=int, default=80, help="trajectories per dataset (default 80)")
    ap.add_argument("--features", type=int, default=SimParams.n_features, help="feature dimension d")
    ap.add_argument("--content", type=float, default=SimParams.content, help="content signal of truth (a)")
    ap.add_argument("--wording", type=float, default=SimParams.wording,
                    help="per-template wording signal of truth (c) (default %(default)s)")
    ap.add_argument("--lexical", type=float, default=SimParams.lexical,
                    help="token-identity signal of truths twin_token and twin_seed (default %(default)s)")
    ap.add_argument("--seed-sd", type=float, default=SimParams.seed_sd,
                    help="SD of the log token-identity gain across network seeds, truth twin_seed (default %(default)s)")
    ap.add_argument("--twins", type=int, default=SimParams.n_twins,
                    help="random-weight twins per dataset (default %(default)s, as evaluation.random_twin_seeds; "
                         "0: check 6 NOT RUN)")
    ap.add_argument("--n-boot", type=int, default=SimParams.n_boot, help="bootstrap replicates (default %(default)s)")
    ap.add_argument("--permutations", type=int, default=SimParams.permutation_m,
                    help="refits M of the exact permutation test, verdict check 4 (default 199; 0: not run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--truths", default=",".join(TRUTHS),
                    help=f"comma-separated subset of {','.join(ALL_TRUTHS)} (default {','.join(TRUTHS)})")
    ap.add_argument("--coverage-datasets", type=int, default=None,
                    help="truth-(a) datasets per test-set size for the coverage table (default: --n-datasets; 0: skip)")
    ap.add_argument("--coverage-n-test", default=",".join(map(str, COVERAGE_N_TEST)),
                    help="test-set sizes of the coverage table (default 5,10,24,50)")
    ap.add_argument("--sweep-datasets", type=int, default=None,
                    help=f"simulated {SWEEP_CELLS}-cell sweeps under truth (b) (default: --n-datasets // 4; 0: skip)")
    ap.add_argument("--splits", default="holdout",
                    help=f"comma-separated split designs of the truths' datasets, of {','.join(SPLITS)} "
                         "(default holdout; K-fold uses k = 5 over the same 80 trajectories)")
    ap.add_argument("--null-datasets", type=int, default=None,
                    help="datasets per size of the null-\"separates\" table (default: --n-datasets; 0: skip)")
    ap.add_argument("--null-sizes", default=",".join(map(str, NULL_N_TEST)),
                    help="holdout test-set sizes of the null table (default %(default)s)")
    ap.add_argument("--null-kfold-sizes", default=",".join(map(str, NULL_KFOLD_TRAJECTORIES)),
                    help="with kfold in --splits: K-fold designs of the null table over this many trajectories, "
                         "every one tested, with check 4's permutation refits (default %(default)s)")
    ap.add_argument("--separates-power", type=int, default=None,
                    help="truth-(a) datasets per design of the null table: the power of \"separates\" beside its "
                         "false rate (default: --null-datasets; 0: skip)")
    ap.add_argument("--sweep-n-boot", type=int, default=1999,
                    help="bootstrap replicates of each sweep cell: p-values are (1 + k)/(B + 1), and Holm's "
                         "first threshold over 30 cells, 0.025/30, needs B >= 1200 (default %(default)s)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", default="outputs/selftest/selftest.json", help="JSON with every record + summary")
    ap.add_argument("--records", default=None,
                    help="JSON-Lines journal: each finished job is appended as it ends, and a rerun with the "
                         "same journal resumes (finished jobs are read, not rerun)")
    ap.add_argument("--journal-only", action="store_true",
                    help="run nothing: summarise every job of the --records journal (written by one or more "
                         "commands with the same parameters, e.g. to run the designs in a chosen order)")
    ap.add_argument("--summary-only", action="store_true",
                    help="write the command, parameters and summary to --out, not every record (the journal has them)")
    args = ap.parse_args(argv)
    p = SimParams(n_trajectories=args.trajectories, n_features=args.features, content=args.content,
                  wording=args.wording, lexical=args.lexical, seed_sd=args.seed_sd, n_twins=args.twins,
                  n_boot=args.n_boot, permutation_m=args.permutations)
    truths = [t.strip() for t in args.truths.split(",") if t.strip()]
    for t in truths:
        if t not in ALL_TRUTHS or t == "null":
            ap.error(f"--truths: unknown truth {t!r} (use {', '.join(ALL_TRUTHS[:-1])}; the null has --null-datasets)")
    splits = [t.strip() for t in args.splits.split(",") if t.strip()]
    for t in splits:
        if t not in SPLITS:
            ap.error(f"--splits: unknown split {t!r} (use {', '.join(SPLITS)})")
    n_null = args.n_datasets if args.null_datasets is None else args.null_datasets
    null_sizes = [int(v) for v in args.null_sizes.split(",") if v.strip()]
    n_cov = args.n_datasets if args.coverage_datasets is None else args.coverage_datasets
    n_sweep = args.n_datasets // 4 if args.sweep_datasets is None else args.sweep_datasets
    sizes = [int(v) for v in args.coverage_n_test.split(",") if v.strip()]
    # Sweeps first (the longest jobs), then the truths, then the cheap coverage datasets.
    jobs = [("sweep", replace(p, n_boot=args.sweep_n_boot), i, args.seed) for i in range(n_sweep)]
    jobs += [("run", replace(p, split=sp), t, i, args.seed) for sp in splits for t in truths
             for i in range(args.n_datasets)]
    kfold_sizes = [int(v) for v in args.null_kfold_sizes.split(",") if v.strip()] if "kfold" in splits else []
    null_designs = [("holdout", n) for n in null_sizes] + [("kfold", n) for n in kfold_sizes]
    n_power = n_null if args.separates_power is None else args.separates_power
    jobs += [("null", p, sp, n, i, args.seed) for sp, n in null_designs for i in range(n_null)]
    jobs += [("null", p, sp, n, i, args.seed, "a") for sp, n in null_designs for i in range(n_power)]
    jobs += [("coverage", p, n, i, args.seed) for n in sizes for i in range(n_cov)]
    # Resume: jobs already in --records (one JSON line per finished job) are read, not rerun.
    done: dict[str, dict] = {}
    journal = Path(args.records) if args.records else None
    if journal is not None and journal.exists():
        lines = journal.read_text().splitlines()
        for n, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    if n == len(lines):  # the last line cut by a kill: dropped, that job is rerun
                        atomic_write_text(journal, "".join(x + "\n" for x in lines[:-1]))
                        continue
                    raise ValueError(f"{journal}: line {n} is not JSON ({e})") from None
                done[rec["job_id"]] = rec
    if args.journal_only:
        if not done:
            ap.error("--journal-only needs a non-empty --records journal")
        jobs, todo = [], []
    else:
        todo = [j for j in jobs if job_id(j) not in done]
    t0 = time.perf_counter()
    fresh: list[dict] = []
    sink = journal.open("a") if journal is not None else None

    def keep(job, rec: dict) -> None:
        rec = {"job_id": job_id(job), **rec}
        fresh.append(rec)
        if sink is not None:
            sink.write(json.dumps(rec) + "\n")
            sink.flush()

    try:
        with progress_bar(f"simulate ({len(done)} resumed)", len(todo)) as bar:
            if args.workers > 1 and todo:
                import multiprocessing as mp

                with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn"),
                                         initializer=_init_worker) as ex:
                    futures = {ex.submit(_job, j): j for j in todo}
                    for fut in as_completed(futures):
                        keep(futures[fut], fut.result())
                        bar.advance()
            elif todo:
                _init_worker()
                for j in todo:
                    keep(j, _job(j))
                    bar.advance()
    finally:
        if sink is not None:
            sink.close()
    wall = time.perf_counter() - t0
    by_id = {**done, **{r["job_id"]: r for r in fresh}}
    records = [by_id[job_id(j)] for j in jobs] if jobs else list(done.values())
    summary = summarise(records)
    command = "python -m ipi.tools.simulate " + " ".join(argv if argv is not None else sys.argv[1:])
    out = {"command": command.strip(), "params": asdict(p), "seed": args.seed, "workers": args.workers,
           "jobs": len(records), "jobs_resumed": len(records) - len(todo), "wall_s": wall,
           "cpu_s_of_jobs": float(sum(r.get("seconds", 0.0) for r in records)), "summary": summary}
    if not args.summary_only:
        out["records"] = records

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(out, indent=1))
    print(format_table(summary))
    brief = {k: v["claim_detects"]["rate"] for k, v in summary.items() if "claim_detects" in v and "null" not in k}
    brief.update({k: v["claim_separates_or_more"]["rate"] for k, v in summary.items() if k.startswith("null")})
    if "sweep_b" in summary:
        brief["sweep_b_familywise"] = summary["sweep_b"]["familywise_false_claim"]["rate"]
    print(f"\nclaim_detects.rate: {json.dumps(brief)}")
    print(f"{len(todo)} jobs run ({len(records) - len(todo)} resumed) in {wall:.0f} s with {args.workers} worker(s); "
          f"summary: {args.out}")
    return out


if __name__ == "__main__":
    main()
