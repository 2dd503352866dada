"""The Lightning callback that writes a run's outputs once its results exist (``train.py``).

It sits in :mod:`ipi.reporting` (not beside :class:`~ipi.evaluation.callbacks.EstimandsCallback`)
so that :mod:`ipi.evaluation` imports nothing from :mod:`ipi.reporting`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import WandbLogger

from ipi.evaluation.callbacks import EstimandsCallback
from ipi.evaluation.spread import split_spread
from ipi.metrics.keys import SPLIT_REPEATS, SPLIT_SPREAD
from ipi.reporting.report import write_run_report
from ipi.reporting.tracking import log_run

__all__ = ["ReportCallback"]


class ReportCallback(L.Callback):
    """Writes the run's outputs once the estimands exist (atomic writes, rank 0 only).

    ``results.json``, ``report.md``, ``report.html`` (self-contained), ``roc.png`` and
    ``forest.png`` (see :func:`ipi.reporting.report.write_run_report`); then, for every W&B logger
    of the trainer, the config, estimands, verdict and figures (:func:`ipi.reporting.tracking.log_run`).

    Args:
        estimands: The :class:`~ipi.evaluation.callbacks.EstimandsCallback` of the same trainer
            (must run first).
        out_dir: Run directory.
        extra: Entries merged into the results (counts, run description, cache info).
        config: Resolved config (plain dict) for the HTML report and W&B, or None.
        gallery: Gallery PNG in the run directory (embedded in the HTML; uploaded to W&B only
            when the logger allows screenshots), or None.
        plots: Draw the figures.
        html: Write ``report.html``.
        before_results: Called after the reports and before ``results.json`` (which is written
            last, so that it exists only for a finished run), or None.
    """

    def __init__(self, estimands: EstimandsCallback, out_dir: str | Path, extra: Mapping,
                 config: Mapping | None = None, gallery: str | Path | None = None,
                 plots: bool = True, html: bool = True, before_results=None):
        self.estimands = estimands
        self.out_dir = Path(out_dir)
        self.extra = dict(extra)
        self.config = config
        self.gallery = gallery
        self.plots, self.html = plots, html
        self.before_results = before_results
        self.results: dict | None = None
        self.paths: dict[str, Path] = {}

    def on_predict_epoch_end(self, trainer, pl_module) -> None:
        if self.estimands.results is None:
            raise RuntimeError("ReportCallback: EstimandsCallback must come first in the callback list")
        self.results = {**self.estimands.results.to_dict(), **self.extra}
        repeats = self.results.pop(SPLIT_REPEATS, None)
        if repeats:
            self.results[SPLIT_SPREAD] = split_spread(self.results, repeats["results"], repeats["seeds"])
        if not trainer.is_global_zero:
            return
        self.paths = write_run_report(self.results, self.out_dir, scores=self.estimands.scores,
                                      config=self.config, gallery=self.gallery, plots=self.plots,
                                      html_report=self.html, before_results=self.before_results)
        figures = {k: p for k, p in self.paths.items() if k in ("roc", "forest", "gallery")}
        for lg in trainer.loggers:
            if isinstance(lg, WandbLogger):
                log_run(lg, self.results, figures, self.config)
