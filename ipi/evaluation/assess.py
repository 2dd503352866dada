"""The one assessment path: score tables → estimands → verdict → reportability (PROTOCOL.md §5–§7).

:func:`assess` is how every caller (``train.py``'s callback, ``evaluate.py``, the re-rolled
splits of ``split.repeats``, the self-test) turns scores into results, in this order:

1. the numbers (:func:`ipi.metrics.compare.compare_tables`) and the operating point
   (:func:`ipi.metrics.operating_point.operating_points`);
2. the verdict (:func:`ipi.evaluation.verdict.judge`);
3. the reportability marks (:func:`ipi.evaluation.reportable.mark`);

returned as one typed :class:`~ipi.evaluation.results.Results`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from ipi.evaluation.reportable import mark
from ipi.evaluation.results import DEFAULTS, Results, Settings
from ipi.evaluation.verdict import judge
from ipi.metrics.compare import compare_tables
from ipi.metrics.operating_point import operating_points

__all__ = ["DEFAULTS", "ScoreTables", "Settings", "assess"]


@dataclass(frozen=True)
class ScoreTables:
    """What a run scored on its test rows (score tables: :mod:`ipi.metrics.table`).

    Attributes:
        main: The probe's (detector's) score table.
        baselines: Baseline score tables on the same test trajectories by name (``c1``,
            ``collapse_only``, ``permuted``, ``transfer``; PROTOCOL.md §5–§6).
        twins: The probe's score tables on the random-weight twins' features, ``{seed: table}``
            on the same rows, or None (verdict check 6 NOT RUN).
        permutation: The exact permutation test's input
            (:meth:`ipi.detectors.crossfit.CrossFit.permutation_input`: ``null_scores`` ``[M, n]``
            aligned with ``main``'s rows, ``seed``, ``refit_scores``, ``unit``, ``design``), or
            None (check 4 NOT RUN).
    """

    main: pd.DataFrame
    baselines: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    twins: Mapping[int | str, pd.DataFrame] | None = None
    permutation: Mapping | None = None


def assess(tables: ScoreTables, settings: Settings = DEFAULTS, *, source: str | None = None,
           source_twin: str | None = None, counts: dict | None = None) -> Results:
    """Estimands, verdict and reportability of a run's score tables, in that order.

    Args:
        tables: The score tables.
        settings: Bootstrap, verdict thresholds and reportability gate.
        source: The score table's path, recorded (``evaluate.py``), or None.
        source_twin: The twins' score table's path, recorded, or None.
        counts: Counts of the score table, recorded (``evaluate.py``), or None.

    Returns:
        The typed :class:`~ipi.evaluation.results.Results`; ``to_dict()`` is the JSON-ready form.

    Raises:
        ValueError: An invalid table, a reserved baseline name, a bad level or interval.
        TypeError: ``tables.twins`` is not a mapping.
    """
    estimates = compare_tables(tables.main, tables.baselines, n_boot=settings.n_boot, seed=settings.seed,
                               level=settings.level, interval=settings.interval, permutation=tables.permutation,
                               twins=tables.twins, alpha=settings.alpha)
    numbers = estimates.to_dict()
    # The operating point (TPR at a fixed FPR) on the same draws' seed; reported, decides nothing.
    operating = (operating_points(tables.main, settings.operating_fpr, n_boot=settings.n_boot, seed=settings.seed,
                                  level=settings.level, interval=settings.interval)
                 if settings.operating_fpr is not None else None)
    return Results(estimates=estimates, verdict=judge(numbers, settings), reportability=mark(numbers, settings),
                   settings=settings, source=source, source_twin=source_twin, counts=counts,
                   operating_point=operating)
