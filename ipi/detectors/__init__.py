"""Detectors audited side by side under the same controls (docs/detectors.md).

Every detector fits on the same training rows and scores the same test rows as the probe, so
the estimands, baselines, cluster bootstrap and verdict of PROTOCOL.md §5–§7 apply unchanged.

- :class:`LogisticDetector` (``detector=logistic``, default): the probe (docs/probe.md).
- :class:`DiffMeansDetector` (``diff_means``): mass-mean probe on standardised features.
- :class:`MLPDetector` (``mlp``): one hidden layer, early-stopped on held-out training trajectories.
- :class:`AttentionFocusDetector` (``attention_focus``): attention of the last prompt token on
  the task vs the untrusted span, heads chosen on training rows.
- :class:`ExternalDetector` (``external``): a score table the user brings.

:func:`cross_fit` is the one fold loop every detector goes through."""

from ipi.detectors.attention import AttentionFocusDetector, extract_attention, focus_ratios
from ipi.detectors.detector import Detector
from ipi.detectors.crossfit import CrossFit, DetectorScores, cross_fit
from ipi.detectors.external import ExternalDetector, join_scores
from ipi.detectors.linear import DiffMeansDetector, LogisticDetector
from ipi.detectors.mlp import MLPDetector

__all__ = [
    "AttentionFocusDetector",
    "CrossFit",
    "Detector",
    "DetectorScores",
    "DiffMeansDetector",
    "ExternalDetector",
    "LogisticDetector",
    "MLPDetector",
    "cross_fit",
    "extract_attention",
    "focus_ratios",
    "join_scores",
]
