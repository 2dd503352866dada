"""The self-test's data model: the truths, the generating process (:class:`SimParams`,
:func:`simulate_dataset`) and the analytic true estimands (:func:`true_estimands`); see
:mod:`ipi.tools.simulate`."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy.special import ndtr

from ipi.evaluation.assess import DEFAULTS
from ipi.protocol import CONTROLS, VARIANTS
from ipi.surfaces.bank import ATTACK_TEMPLATES, attack_text


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
