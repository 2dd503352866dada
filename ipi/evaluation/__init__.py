"""Evaluation: one assessment path from score tables to results (PROTOCOL.md §5, §7).

:func:`assess` turns a run's score tables into the typed :class:`Results` (estimands, verdict,
reportability); score tables on disk are read and assessed by :func:`evaluate_score_table`.

Public API::

    from ipi.evaluation import assess, ScoreTables, Settings, read_score_table, evaluate_score_table, judge
"""

from ipi.evaluation.assess import ScoreTables, assess
from ipi.evaluation.results import DEFAULTS, Results, Settings
from ipi.evaluation.scoretable import evaluate_score_table, read_score_table
from ipi.evaluation.verdict import judge

__all__ = ["DEFAULTS", "Results", "ScoreTables", "Settings", "assess", "evaluate_score_table", "judge",
           "read_score_table"]
