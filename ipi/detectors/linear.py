"""Linear detectors on pooled hidden states: the logistic probe and the mass-mean probe."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from sklearn.preprocessing import StandardScaler

from ipi.detectors.detector import check_fit_inputs
from ipi.probe.fit import ProbeConfig, fit_probe, score

__all__ = ["DiffMeansDetector", "LogisticDetector"]


@dataclass
class LogisticDetector:
    """Today's probe (PROTOCOL.md §4; docs/probe.md): standardised, L2 logistic, balanced classes.

    ``train.py`` runs this detector through :func:`ipi.probe.crossfit.cross_fit` exactly as
    before (same fits, same dual-solver permutation test), so its numbers are unchanged; this
    class gives it the common interface for code that handles detectors generically.

    Args:
        l2, max_iter, tol, seed: :class:`ipi.probe.fit.ProbeConfig` (``l2`` is taken from
            ``probe.l2`` by ``train.py``).
    """

    l2: float = 1.0
    max_iter: int = 500
    tol: float = 1e-8
    seed: int = 0
    name: str = "logistic"
    permutation_m: int | None = None  # check 4's refits M; None: evaluation.permutation.m
    input: str = "hidden"
    trainable: bool = True
    probe_: object = field(default=None, repr=False)

    def fit(self, x, y, groups) -> LogisticDetector:
        x, y = check_fit_inputs(x, y, groups, self.name)
        probe = fit_probe(x, y, ProbeConfig(l2=float(self.l2), max_iter=self.max_iter, tol=self.tol,
                                            seed=self.seed))
        return replace(self, probe_=probe)

    def score(self, x) -> np.ndarray:
        if self.probe_ is None:
            raise RuntimeError("LogisticDetector.score before fit")
        return score(self.probe_, x)

    def settings(self) -> dict:
        return {"name": self.name, "l2": self.l2, "max_iter": self.max_iter, "tol": self.tol}


@dataclass
class DiffMeansDetector:
    """Mass-mean probe (Marks & Tegmark 2023, "The Geometry of Truth", §5: ``θ = μ₊ − μ₋``).

    Features are standardised with the training rows' mean and standard deviation
    (``StandardScaler``: ``ddof=0``, a constant feature gets scale 1); the direction is the
    difference of the class means in standardised units, ``w = mean(z | attack) − mean(z | clean)``,
    and a row's score is its projection ``z · w`` (no covariance correction, no intercept: an
    intercept would not change any AUC). Unweighted class means, so class imbalance does not move
    the direction. Deterministic (no seed).
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
