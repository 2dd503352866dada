"""Planted-truth self-test of the statistics: ``python -m ipi.tools.simulate`` (docs/selftest.md).

Generates **feature-level** datasets with the protocol's structure (PROTOCOL.md §2–§3) under
known truths, runs the project's real pipeline pieces on each — the trajectory split
(:func:`~ipi.probe.folds.make_folds`), the probe and its baselines through
:func:`~ipi.detectors.crossfit.cross_fit` (the fold loop ``train.py`` runs, including check 4's
permuted-label refits), and :func:`~ipi.evaluation.assess.assess` (estimands, verdict,
reportability) — and reports:

* the rate of the claim "detects malicious content" under truths (b), (c), ``twin_token`` and
  ``twin_seed``, where it is false (must be ≤ 5%);
* the power (rate of that claim) under truth (a), where it is true;
* the empirical coverage of the 95% cluster-bootstrap CIs of E1 (and E2, E3[c]) for the fitted
  probe's **true** estimands, computed analytically (:func:`true_estimands`; docs/selftest.md,
  "The CI's target").

The generating process (features ``x = mu[variant] + position + trajectory effect + step
effect + row noise``, the truths, the random-weight twins, metadata and collapse statistic) is
specified in docs/selftest.md, "What is simulated", and implemented in
:mod:`ipi.tools.simulate.truths`."""

from ipi.tools.simulate.command import main, summarise
from ipi.tools.simulate.runner import run_dataset
from ipi.tools.simulate.truths import SimParams, simulate_dataset, true_estimands

__all__ = [
    "SimParams",
    "main",
    "run_dataset",
    "simulate_dataset",
    "summarise",
    "true_estimands",
]
