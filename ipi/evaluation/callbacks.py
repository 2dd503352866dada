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
from ipi.evaluation.verdict import read_keys
from ipi.metrics.keys import (
    at,
    C1,
    CI_HIGH,
    CI_LOW,
    COLLAPSE_ONLY,
    E1,
    E1_PAIRED,
    E2,
    E3,
    ESTIMATE,
    NULL_MEAN,
    P_VALUE,
    PERMUTATION,
    PERMUTED,
    TRANSFER,
    dotted,
)
from ipi.progress import progress_bar

__all__ = ["EstimandsCallback", "flat_metrics"]



#: Baselines whose E1 the paper reports (PROTOCOL.md §8): logged beside the headline estimands.
PAPER_BASELINES = (C1, COLLAPSE_ONLY, PERMUTED, TRANSFER)


def flat_metrics(results: Mapping, prefix: str = "test") -> dict[str, float]:
    """The logged metrics of a results dict (Lightning loggers, W&B): the headline estimands, the
    baselines' E1 the paper reports (:data:`PAPER_BASELINES`) and every estimand a verdict check reads (:func:`ipi.evaluation.verdict.read_keys`, the one
    declaration), each as ``<prefix>/<key with "_" for ".">`` (``test/e3_c_scrambled``) with ``_ci_low``/``_ci_high`` when it
    is an interval; and the permutation test's p-value and null mean."""
    out: dict[str, float] = {}
    keys = [E1, E1_PAIRED, E2, *(dotted(E3, c) for c in sorted(results.get(E3) or {}))]
    keys += [dotted(b, E1) for b in PAPER_BASELINES if isinstance(results.get(b), Mapping)]
    keys += [k for k in read_keys(results) if k not in keys]
    for key in keys:
        v = at(results, key)
        name = f"{prefix}/{key.replace('.', '_')}"
        if isinstance(v, Mapping) and v.get(ESTIMATE) is not None:
            out[name] = float(v[ESTIMATE])
            if v.get(CI_LOW) is not None:
                out[f"{name}_ci_low"] = float(v[CI_LOW])
                out[f"{name}_ci_high"] = float(v[CI_HIGH])
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[name] = float(v)
    perm = results.get(PERMUTATION)
    if isinstance(perm, Mapping) and perm.get(P_VALUE) is not None:
        out[f"{prefix}/permutation_p"] = float(perm[P_VALUE])
        out[f"{prefix}/permutation_null_mean"] = float(perm[NULL_MEAN])
    return out


class EstimandsCallback(L.Callback):
    """Collects the probe's test-row scores during ``Trainer.predict`` and computes the estimands.

    At the end of the predict epoch it builds the probe's score table
    (``trajectory_id, step, variant, score`` per test row), assesses it with the baseline and
    twin tables (:func:`ipi.evaluation.assess.assess`), logs every estimand and CI bound to the
    trainer's loggers (:func:`flat_metrics`) and keeps ``results``.

    Args:
        rows: Metadata of the scored rows (``trajectory_id, step, variant``), in predict order.
        baselines: Baseline score tables on the same test rows, by name.
        settings: :class:`~ipi.evaluation.results.Settings`.
        permutation: The exact permutation test's input, or None (check 4 NOT RUN).
        twins: The probe's score tables on the random-weight twins' features ``{seed: table}``,
            or None (check 6 NOT RUN).

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
