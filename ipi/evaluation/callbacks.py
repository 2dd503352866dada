"""Lightning callbacks that turn probe scores into estimands, a verdict and logged metrics.

:class:`EstimandsCallback` collects the test-row scores of ``Trainer.predict`` and assesses them
(:func:`ipi.evaluation.assess.assess`: C1, C2, E1–E3, the random twins, the verdict and the
reportability marks) and logs them. Writing the run's files is
:class:`ipi.reporting.report_callback.ReportCallback`'s (reporting may import evaluation, never
the reverse).
"""

from __future__ import annotations

from collections.abc import Mapping

import lightning as L
import numpy as np
import pandas as pd

from ipi.evaluation.assess import ScoreTables, assess
from ipi.evaluation.results import DEFAULTS, Results, Settings
from ipi.metrics.keys import (
    C1,
    COLLAPSE_ONLY,
    DIFFERENCES,
    E1,
    E1_MINUS_TWIN_E1,
    E1_MINUS_TWIN_E1_PREDICTIVE,
    E2,
    E3,
    E3_MINUS_TWIN_E3,
    E3_MINUS_TWIN_E3_BY_SEED,
    E3_MINUS_TWIN_E3_PREDICTIVE,
    NULL_MEAN,
    P_VALUE,
    PERMUTATION,
    PERMUTED,
    RANDOM_TWIN,
    TRANSFER,
)
from ipi.progress import progress_bar

__all__ = ["EstimandsCallback", "flat_metrics"]


def flat_metrics(results: Mapping, prefix: str = "test") -> dict[str, float]:
    """The logged metrics of a results dict: ``<prefix>/e1``, ``<prefix>/e1_ci_low`` ... (Lightning loggers)."""
    out: dict[str, float] = {}

    def add(name, iv):
        if isinstance(iv, dict) and iv.get("estimate") is not None:
            out[f"{prefix}/{name}"] = float(iv["estimate"])
            if iv.get("ci_low") is not None:
                out[f"{prefix}/{name}_ci_low"] = float(iv["ci_low"])
                out[f"{prefix}/{name}_ci_high"] = float(iv["ci_high"])

    add(E1, results.get(E1))
    add(E2, results.get(E2))
    for c, iv in (results.get(E3) or {}).items():
        add(f"{E3}_{c}", iv)
    twin = results.get(RANDOM_TWIN) or {}
    add(f"{RANDOM_TWIN}_{E1}", twin.get(E1))
    add(f"{RANDOM_TWIN}_{E2}", twin.get(E2))
    for c, iv in (twin.get(E3) or {}).items():
        add(f"{RANDOM_TWIN}_{E3}_{c}", iv)
    diffs = results.get(DIFFERENCES) or {}
    add(E1_MINUS_TWIN_E1, diffs.get(E1_MINUS_TWIN_E1))
    for c, iv in (diffs.get(E3_MINUS_TWIN_E3) or {}).items():
        add(f"{E3_MINUS_TWIN_E3}_{c}", iv)
    add(E1_MINUS_TWIN_E1_PREDICTIVE, diffs.get(E1_MINUS_TWIN_E1_PREDICTIVE))
    for c, iv in (diffs.get(E3_MINUS_TWIN_E3_PREDICTIVE) or {}).items():
        add(f"{E3_MINUS_TWIN_E3_PREDICTIVE}_{c}", iv)
    for seed, by_c in (diffs.get(E3_MINUS_TWIN_E3_BY_SEED) or {}).items():
        for c, iv in by_c.items():
            add(f"e3_minus_twin{seed}_e3_{c}", iv)
    for base in (C1, COLLAPSE_ONLY, PERMUTED, TRANSFER):
        if isinstance(results.get(base), dict):
            add(f"{base}_{E1}", results[base].get(E1))
            add(f"{base}_{E2}", results[base].get(E2))
    perm = results.get(PERMUTATION)
    if isinstance(perm, dict) and perm.get(P_VALUE) is not None:
        out[f"{prefix}/permutation_p"] = float(perm[P_VALUE])
        out[f"{prefix}/permutation_null_mean"] = float(perm[NULL_MEAN])
    return out


class EstimandsCallback(L.Callback):
    """Collects the probe's test-row scores during ``Trainer.predict`` and computes the estimands.

    At the end of the predict epoch it builds the probe's score table (one row per test row:
    ``trajectory_id, step, variant, score``) and assesses it together with the baseline and twin
    tables (:func:`ipi.evaluation.assess.assess`: E1, E2, E3 per control, C1, C2 = collapse-only,
    permuted labels, paired differences on shared bootstrap draws, PROTOCOL.md §5–§6; the
    verdict, §7; the reportability marks), logs every estimand and CI bound to the trainer's
    loggers (``test/e1``, ``test/e1_ci_low`` …; :func:`flat_metrics`) and keeps ``results``.

    Args:
        rows: Metadata of the scored rows (``trajectory_id, step, variant``), in predict order.
        baselines: Baseline score tables on the same test rows, by name (``c1``, ``collapse_only``,
            ``permuted``).
        settings: Bootstrap, verdict thresholds, reportability gate, permutation level and
            ``pretrained`` (:class:`~ipi.evaluation.results.Settings`).
        permutation: The exact permutation test's refit scores
            (:meth:`ipi.detectors.crossfit.CrossFit.permutation_input`), or None (check 4 NOT RUN).
        twins: The probe's score tables on the random-weight twins' features (same rows), one
            per seed ``{seed: table}``, or None (verdict check 6 is then NOT RUN).

    Attributes:
        results: The typed :class:`~ipi.evaluation.results.Results` once predicted, else None.
        scores: The probe's score table once predicted, else None.
    """

    def __init__(self, rows: pd.DataFrame, baselines: Mapping[str, pd.DataFrame], settings: Settings = DEFAULTS,
                 *, permutation: Mapping | None = None, twins: Mapping[int | str, pd.DataFrame] | None = None):
        self.rows = rows.reset_index(drop=True)
        self.baselines = dict(baselines)
        self.twins = dict(twins) if twins else None
        self.settings = settings
        self.permutation = permutation
        self._scores: list[np.ndarray] = []
        self.results: Results | None = None
        self.scores: pd.DataFrame | None = None

    def on_predict_epoch_start(self, trainer, pl_module) -> None:
        self._scores = []

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._scores.append(outputs.detach().double().cpu().numpy().reshape(-1))

    def on_predict_epoch_end(self, trainer, pl_module) -> None:
        scores = np.concatenate(self._scores) if self._scores else np.zeros(0)
        if len(scores) != len(self.rows):
            raise RuntimeError(f"EstimandsCallback: {len(scores)} scores for {len(self.rows)} rows")
        table = self.rows[["trajectory_id", "step", "variant"]].copy()
        table["score"] = scores
        self.scores = table
        desc = f"bootstrap (B={self.settings.n_boot}, {1 + len(self.baselines) + len(self.twins or {})} score tables)"
        with progress_bar(desc, total=1) as bar:
            self.results = assess(ScoreTables(table, self.baselines, self.twins, self.permutation), self.settings)
            bar.advance()
        metrics = flat_metrics(self.results.to_dict())
        for lg in trainer.loggers:
            lg.log_metrics(metrics, step=0)
            lg.save()
