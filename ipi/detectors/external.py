"""A detector whose scores the user brings: any score table ``evaluate.py`` accepts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = ["ExternalDetector", "join_scores"]


@dataclass
class ExternalDetector:
    """Scores from a CSV/Parquet table (``trajectory_id, step, variant, score``; docs/outputs.md).

    ``train.py detector=external detector.scores=PATH detector.label="..."`` takes the detector's
    score of every test row from the table (:func:`join_scores`) and computes everything else —
    the C1 and collapse-only baselines, bootstrap, verdict — as for any detector. It is not
    trainable here, so the permuted-label baseline, transfer and the permutation test (verdict
    check 4) are NOT RUN; ``label`` names the detector in the report and ``run.detector``.
    """

    scores: str = ""
    label: str = ""
    name: str = "external"
    input: str = "table"
    trainable: bool = False
    permutation_m: int | None = None

    def settings(self) -> dict:
        return {"name": self.name, "label": self.label, "scores": str(self.scores)}


def join_scores(table: pd.DataFrame, rows: pd.DataFrame, source: str) -> np.ndarray:
    """The score of each of ``rows`` from ``table``, matched on ``(trajectory_id, step, variant, k)``.

    ``k`` numbers rows sharing ``(trajectory_id, step, variant)`` (several attacks at a step) in
    table order, so a table written by ``train.py`` (``scores.csv``) matches row for row.

    Args:
        table: Validated score table (:func:`ipi.evaluation.scoretable.read_score_table`).
        rows: ``[n]`` rows to score (``trajectory_id, step, variant``).
        source: File name for messages.

    Returns:
        ``[n]`` float64 scores.

    Raises:
        ValueError: A row the table does not score (count and first ones named), or a non-finite score.
    """
    key = ["trajectory_id", "step", "variant"]

    def keyed(df):
        df = df[key].copy()
        df["trajectory_id"] = df["trajectory_id"].astype(str)
        df["step"] = df["step"].astype(int)
        df["variant"] = df["variant"].astype(str)
        df["k"] = df.groupby(key).cumcount()
        return df

    t = keyed(table)
    t["score"] = pd.to_numeric(table["score"], errors="coerce").to_numpy()
    merged = keyed(rows).merge(t, on=key + ["k"], how="left")
    miss = merged["score"].isna()
    if miss.any():
        first = merged.loc[miss, key].head(5).to_dict("records")
        raise ValueError(f"detector=external: {source} has no finite score for {int(miss.sum())} of {len(rows)} "
                         f"test rows (first: {first}); score every test row of the run's split")
    return merged["score"].to_numpy(dtype=np.float64)
