"""Evaluation: score tables on disk and the reportability verdict (PROTOCOL.md §5, §7).

Public API::

    from ipi.evaluation import read_score_table, evaluate_score_table, verdict
"""

from ipi.evaluation.scoretable import evaluate_score_table, read_score_table
from ipi.evaluation.verdict import format_verdict, verdict

__all__ = ["evaluate_score_table", "format_verdict", "read_score_table", "verdict"]
