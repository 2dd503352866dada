"""Trajectory-level splits and the linear probe (PROTOCOL.md §4; see ``docs/probe.md``).

Public API:
    - :func:`holdout_split`, :func:`grouped_kfold`: splits over unique trajectory ids.
    - :func:`assert_trajectory_disjoint`, :func:`assert_rows_disjoint`, :class:`LeakageError`.
    - :class:`LinearProbe`: the LightningModule (standardise -> linear -> logit).
    - :class:`ProbeConfig`, :func:`fit_probe`, :func:`score`: fit on train rows, score any rows.
    - :func:`fit_sklearn_reference`: the scikit-learn pipeline the probe must agree with (and C1).
"""

from ipi.probe.fit import ProbeConfig, fit_probe, fit_sklearn_reference, score, validate_xy
from ipi.probe.module import LinearProbe
from ipi.probe.split import (
    LeakageError,
    assert_rows_disjoint,
    assert_trajectory_disjoint,
    grouped_kfold,
    holdout_split,
)

__all__ = [
    "LeakageError",
    "LinearProbe",
    "ProbeConfig",
    "assert_rows_disjoint",
    "assert_trajectory_disjoint",
    "fit_probe",
    "fit_sklearn_reference",
    "grouped_kfold",
    "holdout_split",
    "score",
    "validate_xy",
]
