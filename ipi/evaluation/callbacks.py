"""Lightning callbacks that turn probe scores into estimands, a verdict and logged metrics."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd

from ipi.evaluation.reportable import mark_reportability
from ipi.evaluation.spread import split_spread
from ipi.evaluation.verdict import verdict
from ipi.metrics import evaluate_tables
from ipi.progress import progress_bar
from ipi.reporting.report import write_run_report
from ipi.reporting.tracking import log_run


def _flat_metrics(results: dict, prefix: str = "test") -> dict[str, float]:
    out: dict[str, float] = {}

    def add(name, iv):
        if isinstance(iv, dict) and iv.get("estimate") is not None:
            out[f"{prefix}/{name}"] = float(iv["estimate"])
            if iv.get("ci_low") is not None:
                out[f"{prefix}/{name}_ci_low"] = float(iv["ci_low"])
                out[f"{prefix}/{name}_ci_high"] = float(iv["ci_high"])

    add("e1", results.get("e1"))
    add("e2", results.get("e2"))
    for c, iv in (results.get("e3") or {}).items():
        add(f"e3_{c}", iv)
    twin = results.get("random_twin") or {}
    add("random_twin_e1", twin.get("e1"))
    add("random_twin_e2", twin.get("e2"))
    for c, iv in (twin.get("e3") or {}).items():
        add(f"random_twin_e3_{c}", iv)
    diffs = results.get("differences") or {}
    add("e1_minus_twin_e1", diffs.get("e1_minus_twin_e1"))
    for c, iv in (diffs.get("e3_minus_twin_e3") or {}).items():
        add(f"e3_minus_twin_e3_{c}", iv)
    add("e1_minus_twin_e1_predictive", diffs.get("e1_minus_twin_e1_predictive"))
    for c, iv in (diffs.get("e3_minus_twin_e3_predictive") or {}).items():
        add(f"e3_minus_twin_e3_predictive_{c}", iv)
    for seed, by_c in (diffs.get("e3_minus_twin_e3_by_seed") or {}).items():
        for c, iv in by_c.items():
            add(f"e3_minus_twin{seed}_e3_{c}", iv)
    for base in ("c1", "collapse_only", "permuted", "transfer"):
        if isinstance(results.get(base), dict):
            add(f"{base}_e1", results[base].get("e1"))
            add(f"{base}_e2", results[base].get("e2"))
    perm = results.get("permutation")
    if isinstance(perm, dict) and perm.get("p_value") is not None:
        out[f"{prefix}/permutation_p"] = float(perm["p_value"])
        out[f"{prefix}/permutation_null_mean"] = float(perm["null_mean"])
    return out


class EstimandsCallback(L.Callback):
    """Collects the probe's test-row scores during ``Trainer.predict`` and computes the estimands.

    At the end of the predict epoch it builds the probe's score table (one row per test row:
    ``trajectory_id, step, variant, score``), evaluates it together with the baseline tables on
    shared bootstrap draws (E1, E2, E3 per control, C1, C2 = collapse-only, permuted labels,
    paired differences; PROTOCOL.md §5–§6), runs the verdict (§7), logs every estimand and CI
    bound to the trainer's loggers (``test/e1``, ``test/e1_ci_low`` …) and keeps ``results``.

    Args:
        rows: Metadata of the scored rows (``trajectory_id, step, variant``), in predict order.
        baselines: Baseline score tables on the same test rows, by name (``c1``, ``collapse_only``,
            ``permuted``).
        n_boot: Bootstrap replicates.
        seed: Bootstrap seed.
        level: Interval coverage.
        collapse_ceiling: Ceiling of verdict check 5.
        c1_max: Bound of verdict check 2.
        min_clusters: Fewest test trajectories contributing to both sides of an estimand for it
            to enter a verdict check (PROTOCOL.md §7.0).
        permutation: The exact permutation test's refit scores
            (:meth:`ipi.probe.crossfit.CrossFit.permutation_input`), or None (check 4 NOT RUN).
        alpha: Level of the permutation test.
        min_boot_fraction: Fewest usable bootstrap replicates (fraction of ``n_boot``) for an
            estimate to be reportable (:mod:`ipi.evaluation.reportable`).
        twins: The probe's score tables on the random-weight twins' features (same rows), one
            per seed ``{seed: table}``, or None (verdict check 6 is then NOT RUN).
        pretrained: ``backbone.pretrained`` (False caps the claim at "separates ..."), or None.
    """

    def __init__(self, rows: pd.DataFrame, baselines: Mapping[str, pd.DataFrame], *, n_boot: int = 1000,
                 seed: int = 0, level: float = 0.95, collapse_ceiling: float = 0.60, c1_max: float = 0.95,
                 min_clusters: int = 5, permutation: Mapping | None = None, alpha: float = 0.05,
                 min_boot_fraction: float = 0.9, interval: str = "percentile",
                 twins: Mapping[int | str, pd.DataFrame] | None = None,
                 pretrained: bool | None = None):
        self.rows = rows.reset_index(drop=True)
        self.interval = interval
        self.baselines = dict(baselines)
        self.twins, self.pretrained = (dict(twins) if twins else None), pretrained
        self.n_boot, self.seed, self.level = n_boot, seed, level
        self.collapse_ceiling, self.c1_max, self.min_clusters = collapse_ceiling, c1_max, min_clusters
        self.permutation = None if permutation is None else {**permutation, "alpha": alpha}
        self.min_boot_fraction = min_boot_fraction
        self._scores: list[np.ndarray] = []
        self.results: dict | None = None
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
        desc = f"bootstrap (B={self.n_boot}, {1 + len(self.baselines) + len(self.twins or {})} score tables)"
        with progress_bar(desc, total=1) as bar:
            results = evaluate_tables(table, self.baselines, n_boot=self.n_boot, seed=self.seed, level=self.level,
                                      permutation=self.permutation, interval=self.interval, twins=self.twins)
            bar.advance()
        results["verdict"] = verdict(results, collapse_ceiling=self.collapse_ceiling, c1_max=self.c1_max,
                                     min_clusters=self.min_clusters, pretrained=self.pretrained)
        results["reportability"] = mark_reportability(results, self.min_clusters, self.min_boot_fraction)
        self.results = results
        metrics = _flat_metrics(results)
        for lg in trainer.loggers:
            lg.log_metrics(metrics, step=0)
            lg.save()


class ReportCallback(L.Callback):
    """Writes the run's outputs once the estimands exist (atomic writes, rank 0 only).

    ``results.json``, ``report.md``, ``report.html`` (self-contained), ``roc.png`` and
    ``forest.png`` (see :func:`ipi.reporting.report.write_run_report`); then, for every W&B logger
    of the trainer, the config, estimands, verdict and figures (:func:`ipi.reporting.tracking.log_run`).

    Args:
        estimands: The :class:`EstimandsCallback` of the same trainer (must run first).
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
        self.results = {**self.estimands.results, **self.extra}
        repeats = self.results.pop("split_repeats", None)
        if repeats:
            self.results["split_spread"] = split_spread(self.results, repeats["results"], repeats["seeds"])
        if not trainer.is_global_zero:
            return
        self.paths = write_run_report(self.results, self.out_dir, scores=self.estimands.scores,
                                      config=self.config, gallery=self.gallery, plots=self.plots,
                                      html_report=self.html, before_results=self.before_results)
        figures = {k: p for k, p in self.paths.items() if k in ("roc", "forest", "gallery")}
        from lightning.pytorch.loggers import WandbLogger


        for lg in trainer.loggers:
            if isinstance(lg, WandbLogger):
                log_run(lg, self.results, figures, self.config)
