"""The common interface of every detector: fit on training rows, score any rows.

A detector turns rows into one float score per row (higher = more likely an attack). Every
detector is fitted on the same training rows the probe is fitted on (clean vs attack rows of the
fold's training trajectories; controls never; PROTOCOL.md §4) and scores the same test rows, so
the estimands, baselines, cluster bootstrap and verdict (PROTOCOL.md §5–§7) apply unchanged.
See ``docs/detectors.md``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
from ipi.probe.fit import validate_xy

__all__ = ["Detector", "check_fit_inputs"]


@runtime_checkable
class Detector(Protocol):
    """What :func:`ipi.detectors.crossfit.cross_fit` needs from a detector.

    Optional capabilities (docs/detectors.md, "One cross-fit, capabilities instead of special
    cases"): ``tune``, ``fit_logged``, ``null_refits`` (:mod:`ipi.detectors.crossfit`), ``folded``
    (the fold models as one module for ``Trainer.predict``), ``with_probe`` (takes the ``probe.*``
    settings), ``baseline_l2`` (``C`` of the C1/collapse-only baselines; 1.0 without it),
    ``fit_info_`` on a fitted copy (recorded per fold as ``detector_*``).

    Attributes:
        name: Config name (``logistic``, ``diff_means``, ``mlp``, ``attention_focus``).
        input: ``"hidden"`` (pooled hidden states, the probe's features) or ``"attention"``
            (the attention-focus features of :mod:`ipi.detectors.attention`).
"""

    name: str
    input: str

    def fit(self, x: np.ndarray, y: np.ndarray, groups: np.ndarray) -> Detector:
        """Fit on training rows ``x [n, d]``, labels ``y [n]`` (1 = attack), trajectory ``groups [n]``;
        returns a fitted copy (the detector itself is never mutated)."""

    def score(self, x: np.ndarray) -> np.ndarray:
        """float64 scores ``[m]`` of rows ``x [m, d]`` (higher = attack)."""

    def settings(self) -> dict:
        """JSON-ready settings recorded as ``run.detector`` in results.json."""


def check_fit_inputs(x: np.ndarray, y: np.ndarray, groups: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Validate a detector's training inputs (shapes, finiteness, both classes).

    Returns:
        ``(x float64 [n, d], y int64 [n])``.

    Raises:
        ValueError: Shapes disagree, NaN/inf features, labels outside {0, 1} or a single class.
    """
    validate_xy(x, y, name=f"detector={name}: training features")
    if len(np.asarray(groups)) != len(y):
        raise ValueError(f"detector={name}: {len(groups)} trajectory ids for {len(y)} training rows")
    return np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.int64)
