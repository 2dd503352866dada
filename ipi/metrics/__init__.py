"""Metrics of the protocol: weighted AUC, estimands E1/E2/E3, cluster bootstrap (PROTOCOL.md §5).

One module per concept (the score-table schema, weighted AUC, bootstrap, estimands, twins, the
permutation test, every table of a run on shared draws, the result key strings).

Public API::

    from ipi.metrics import weighted_auc, bootstrap_weighted_auc, estimands, compare_tables"""

from ipi.metrics.auc import bootstrap_weighted_auc, grouped_weighted_auc, weighted_auc
from ipi.metrics.bootstrap import (
    Draws,
    Interval,
    bca_interval,
    draw_multiplicities,
    expanded_percentile_interval,
    make_draws,
    make_interval,
    paired_difference,
    percentile_interval,
    plus_one_p,
)
from ipi.metrics.compare import Estimates, compare_tables
from ipi.metrics.estimands import EstimandSet, estimands
from ipi.metrics.table import is_control, step_weights, validate_table

__all__ = [
    "Draws",
    "EstimandSet",
    "Estimates",
    "Interval",
    "bca_interval",
    "bootstrap_weighted_auc",
    "compare_tables",
    "draw_multiplicities",
    "estimands",
    "expanded_percentile_interval",
    "grouped_weighted_auc",
    "is_control",
    "make_draws",
    "make_interval",
    "paired_difference",
    "percentile_interval",
    "plus_one_p",
    "step_weights",
    "validate_table",
    "weighted_auc",
]
