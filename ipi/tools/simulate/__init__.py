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

from ipi.protocol import CONTROLS, VARIANTS
from ipi.tools.simulate.command import main, summarise
from ipi.tools.simulate.runner import run_dataset
from ipi.tools.simulate.truths import SimParams, simulate_dataset, true_estimands

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
