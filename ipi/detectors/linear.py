"""Linear detectors on pooled hidden states: the logistic probe and the mass-mean probe."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np
from sklearn.preprocessing import StandardScaler

from ipi.detectors.detector import check_fit_inputs
from ipi.probe.dual import ReducedDesign, fit_reduced, fit_reduced_batch
from ipi.probe.fit import ProbeConfig, fit_probe, score
from ipi.probe.folds import FoldedProbe, select_l2

__all__ = ["DiffMeansDetector", "LogisticDetector"]


@dataclass
class LogisticDetector:
    """The probe (PROTOCOL.md §4; docs/probe.md): standardised, L2 logistic, balanced classes.

    Its settings are ``probe.*`` (:meth:`with_probe`). It has the three optional capabilities of
    :func:`ipi.detectors.crossfit.cross_fit` (:meth:`tune`: ``C`` per fold by grouped inner CV
    for ``probe.l2=auto``; :meth:`fit_logged`; :meth:`null_refits`) and :meth:`folded`.

    Args:
        l2, max_iter, tol, seed, solver: :class:`ipi.probe.fit.ProbeConfig`; None until
            :meth:`with_probe` sets them from ``probe.*``.
        l2_grid: ``probe.l2=auto``: candidate ``C`` values (:meth:`tune`); None: ``l2`` everywhere.
        fit_fn: The probe fitter (:func:`ipi.probe.fit.fit_probe`); injectable for tests.
"""

    l2: float | None = None
    max_iter: int | None = None
    tol: float | None = None
    seed: int = 0
    solver: str | None = None
    l2_grid: tuple[float, ...] | None = None
    name: str = "logistic"
    permutation_m: int | None = None  # check 4's refits M; None: evaluation.permutation.m
    input: str = "hidden"
    trainable: bool = True
    fit_fn: Callable = field(default=fit_probe, repr=False, compare=False)
    probe_: object = field(default=None, repr=False)

    #: How :meth:`null_refits` refits (``run.detector.permutation_refits`` of results.json).
    null_refits_method: ClassVar[str] = "dual Newton solver (exact, cheap)"

    def with_probe(self, config: ProbeConfig, l2_grid: Sequence[float] | None = None) -> LogisticDetector:
        """This detector with the probe's settings (``probe.*``; ``l2_grid`` for ``probe.l2=auto``)."""
        return replace(self, l2=config.l2, max_iter=config.max_iter, tol=config.tol, seed=config.seed,
                       solver=config.solver, l2_grid=None if l2_grid is None else tuple(l2_grid))

    @property
    def probe_config(self) -> ProbeConfig:
        """The :class:`ipi.probe.fit.ProbeConfig` of a fit."""
        return ProbeConfig(l2=float(self.l2), max_iter=self.max_iter, tol=self.tol, seed=self.seed,
                           solver=self.solver)

    @property
    def baseline_l2(self) -> float:
        """``C`` of the C1 and collapse-only baselines: the probe's (1.0 under ``probe.l2=auto``)."""
        return 1.0 if self.l2_grid is not None else float(self.l2)

    def tune(self, x, y, groups, fold: int) -> tuple[LogisticDetector, dict]:
        """``C`` of fold ``fold`` by :func:`ipi.probe.folds.select_l2` on its training rows
        (trajectories shuffled by ``seed=fold``); ``(self, {})`` without ``l2_grid``.

        Returns:
            ``(detector with the chosen l2, {"l2": C, "l2_inner_cv_auc": {str(C): AUC}})``.
        """
        if self.l2_grid is None:
            return self, {}
        best, cv = select_l2(x, y, groups, self.l2_grid, seed=fold)
        return replace(self, l2=best), {"l2": best, "l2_inner_cv_auc": cv}

    def fit(self, x, y, groups) -> LogisticDetector:
        return self.fit_logged(x, y, groups)

    def fit_logged(self, x, y, groups, *, logger=None, default_root_dir=None) -> LogisticDetector:
        """:meth:`fit` through a Lightning ``logger`` and trainer root (:func:`ipi.probe.fit.fit_probe`)."""
        check_fit_inputs(x, y, groups, self.name)
        return replace(self, probe_=self.fit_fn(x, y, self.probe_config, logger=logger,
                                                default_root_dir=default_root_dir))

    def score(self, x) -> np.ndarray:
        if self.probe_ is None:
            raise RuntimeError("LogisticDetector.score before fit")
        return score(self.probe_, x)

    def null_refits(self, x_fit, y, y_perm, x_test) -> tuple[np.ndarray, np.ndarray, str]:
        """Check 4's refits of one fold, exact and cheap (PROTOCOL.md §7.4; docs/estimands.md).

        The standardised training rows are reduced once to at most ``n`` coordinates
        (:class:`ipi.probe.dual.ReducedDesign`); the refit on the true labels is
        :func:`ipi.probe.dual.fit_reduced` and the M permuted-label refits one batched Newton
        solve, :func:`ipi.probe.dual.fit_reduced_batch`, all at this detector's ``C``.

        Args:
            x_fit: ``[n, d]`` the fold's training rows.
            y: ``[n]`` their labels.
            y_perm: ``[M, n]`` the permuted labels.
            x_test: ``[m, d]`` the fold's clean/attack test rows.

        Returns:
            ``(refit scores [m], null scores [M, m], design description)``.
        """
        design = ReducedDesign.build(x_fit, x_test)
        theta = fit_reduced(design.phi, y, C=self.l2)
        refit = design.phi_test @ theta[:-1] + theta[-1]
        theta = fit_reduced_batch(design.phi, y_perm, C=self.l2)
        null = theta[:, :-1] @ design.phi_test.T + theta[:, -1:]
        return refit, null, (f"{'dual' if design.dual else 'primal'} rank {design.rank} "
                             f"({design.phi.shape[0]} training rows, {design.n_features} features)")

    @staticmethod
    def folded(fitted: Sequence[LogisticDetector]) -> FoldedProbe:
        """The fold probes of ``fitted`` as one module for ``Trainer.predict`` (row ``i`` by its fold's)."""
        return FoldedProbe([d.probe_ for d in fitted])

    def settings(self) -> dict:
        return {"name": self.name, "l2": "auto" if self.l2_grid is not None else self.l2,
                "max_iter": self.max_iter, "tol": self.tol}


@dataclass
class DiffMeansDetector:
    """Mass-mean probe (Marks & Tegmark 2023, "The Geometry of Truth", §5: ``θ = μ₊ − μ₋``).

    Features are standardised with the training rows' statistics (``StandardScaler``); the
    direction is ``w = mean(z | attack) − mean(z | clean)`` (unweighted class means) and a row's
    score is ``z · w`` (no covariance correction, no intercept). Deterministic.
"""

    name: str = "diff_means"
    permutation_m: int | None = None  # check 4's refits M; None: evaluation.permutation.m
    input: str = "hidden"
    trainable: bool = True
    mean_: np.ndarray | None = field(default=None, repr=False)
    scale_: np.ndarray | None = field(default=None, repr=False)
    direction_: np.ndarray | None = field(default=None, repr=False)

    def fit(self, x, y, groups) -> DiffMeansDetector:
        x, y = check_fit_inputs(x, y, groups, self.name)
        sc = StandardScaler().fit(x)
        z = sc.transform(x)
        w = z[y == 1].mean(axis=0) - z[y == 0].mean(axis=0)
        return replace(self, mean_=sc.mean_, scale_=sc.scale_, direction_=w)

    def score(self, x) -> np.ndarray:
        if self.direction_ is None:
            raise RuntimeError("DiffMeansDetector.score before fit")
        # (x − μ)/σ · w without a standardised copy of x
        v = self.direction_ / self.scale_
        return np.asarray(x, dtype=np.float64) @ v - float(self.mean_ @ v)

    def settings(self) -> dict:
        return {"name": self.name, "standardise": "training rows (StandardScaler)", "score": "projection on mean(attack) - mean(clean)"}
