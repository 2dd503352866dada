"""Detectors audited side by side under the same controls (docs/detectors.md).

Every detector fits on the same training rows and scores the same test rows as the probe, so
the estimands, baselines, cluster bootstrap and verdict of PROTOCOL.md §5–§7 apply unchanged.

- :class:`LogisticDetector` (``detector=logistic``, default): today's probe (docs/probe.md).
- :class:`DiffMeansDetector` (``diff_means``): mass-mean probe on standardised features.
- :class:`MLPDetector` (``mlp``): one hidden layer, early-stopped on held-out training trajectories.
- :class:`AttentionFocusDetector` (``attention_focus``): attention of the last prompt token on
  the task vs the untrusted span, heads chosen on training rows.
- :class:`ExternalDetector` (``external``): a score table the user brings.
"""

from ipi.detectors.attention import AttentionFocusDetector, extract_attention, focus_ratios
from ipi.detectors.detector import Detector
from ipi.detectors.fitting import DetectorScores, cross_fit_detector
from ipi.detectors.external import ExternalDetector, join_scores
from ipi.detectors.linear import DiffMeansDetector, LogisticDetector
from ipi.detectors.mlp import MLPDetector

__all__ = [
    "AttentionFocusDetector",
    "Detector",
    "DetectorScores",
    "DiffMeansDetector",
    "ExternalDetector",
    "LogisticDetector",
    "MLPDetector",
    "cross_fit_detector",
    "extract_attention",
    "focus_ratios",
    "join_scores",
]
