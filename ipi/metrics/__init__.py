"""Metrics of the protocol: weighted AUC, estimands E1/E2/E3, cluster bootstrap (PROTOCOL.md §5).

Public API::

    from ipi.metrics import weighted_auc, bootstrap_weighted_auc, estimands, evaluate_tables
"""

from ipi.metrics.auc import bootstrap_weighted_auc, grouped_weighted_auc, weighted_auc
from ipi.metrics.estimands import (
    Draws,
    EstimandSet,
    Interval,
    draw_multiplicities,
    estimands,
    evaluate_tables,
    is_control,
    make_draws,
    paired_difference,
    seed_predictive_difference,
    percentile_interval,
    step_weights,
    validate_table,
)

__all__ = [
    "Draws",
    "EstimandSet",
    "Interval",
    "bootstrap_weighted_auc",
    "draw_multiplicities",
    "estimands",
    "evaluate_tables",
    "grouped_weighted_auc",
    "is_control",
    "make_draws",
    "paired_difference",
    "seed_predictive_difference",
    "percentile_interval",
    "step_weights",
    "validate_table",
    "weighted_auc",
]
