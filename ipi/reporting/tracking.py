"""Weights & Biases: the logger factory, what a run logs, and one W&B run per Hydra job.

``logger=wandb`` instantiates :func:`wandb_logger` (``conf/logger/wandb.yaml``). It is offline by
default: nothing leaves the machine; the run is written under ``<run dir>/wandb/offline-run-*``
and uploaded later with ``wandb sync <run dir>/wandb/offline-run-*``. ``WANDB_MODE=online`` (or
``logger.wandb.mode=online``) logs live; ``disabled`` turns W&B off.

At the end of a run :func:`log_run` logs, into that run: the resolved config, every estimand
with its CI in the ``estimands`` table (the headline estimands and every estimand a check reads
are also metrics, ``test/e1``, ``test/e1_ci_low`` …: :func:`ipi.evaluation.callbacks.flat_metrics`),
the verdict (``verdict`` table with each check's rule and detail, ``verdict/claim``), the data
counts, and the figures (``plots/roc``, ``plots/forest``). Each estimate carries its
reportability (:mod:`ipi.evaluation.reportable`) and the checks that read it
(:func:`ipi.evaluation.verdict.read_keys`): the ``estimands`` table has ``reportable``,
``not_reportable_because`` and ``read_by_checks`` columns and the run summary a
``reportable/<estimand key>`` flag. The render gallery (``gallery``) shows a real screenshot, which can hold
personal data; it is uploaded only with ``logger.wandb.upload_screenshots=true``.

:func:`task_wrapper` wraps a task function so that ``wandb.finish()`` runs in a ``finally``:
every Hydra job, including each job of a multirun executed in one process, gets its own W&B run,
and a failing job still closes its run (marked failed).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from lightning.pytorch.loggers import WandbLogger
from omegaconf import DictConfig

from ipi.evaluation.reportable import estimand_entries, reportability_of
from ipi.evaluation.verdict import read_keys
from ipi.evaluation.results import ResultsView
from ipi.metrics.keys import (
    CHECK_ID,
    CHECKS,
    CI_HIGH,
    CI_LOW,
    CLAIM,
    COUNTS,
    DETAIL,
    ESTIMATE,
    N_BOOT_USED,
    NAME,
    RULE,
    STATUS,
    VERDICT,
)

log = logging.getLogger(__name__)

__all__ = ["IpiWandbLogger", "finish_wandb", "log_run", "task_wrapper", "wandb_logger"]


class IpiWandbLogger(WandbLogger):
    """Lightning's ``WandbLogger`` plus the screenshot-upload permission of this run.

    Attributes:
        upload_screenshots: Whether images that show screenshots (the render gallery) may be
            logged. Off by default.
    """

    def __init__(self, *args, upload_screenshots: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.upload_screenshots = bool(upload_screenshots)


def wandb_logger(*, mode: str | None = None, upload_screenshots: bool = False, **kwargs) -> IpiWandbLogger | None:
    """Build the W&B logger of a run (the ``_target_`` of ``conf/logger/wandb.yaml``).

    Args:
        mode: ``offline`` (default; also when ``None`` and ``WANDB_MODE`` is unset), ``online`` or
            ``disabled``.
        upload_screenshots: Allow logging images that contain screenshots (the gallery).
        **kwargs: Passed to ``WandbLogger`` (``project``, ``name``, ``save_dir``, ``group`` …;
            unknown keys go on to ``wandb.init``).

    Returns:
        The logger, or ``None`` when ``mode`` is ``disabled``.

    Raises:
        ValueError: An unknown mode.
    """
    mode = (mode or os.environ.get("WANDB_MODE") or "offline").lower()
    if mode == "dryrun":
        mode = "offline"
    if mode not in ("offline", "online", "disabled"):
        raise ValueError(f"logger.wandb.mode={mode!r}: expected offline, online or disabled")
    if mode == "disabled":
        return None
    if kwargs.get("save_dir"):
        Path(kwargs["save_dir"]).mkdir(parents=True, exist_ok=True)
    return IpiWandbLogger(offline=(mode == "offline"), upload_screenshots=upload_screenshots, **kwargs)


def finish_wandb(exit_code: int = 0) -> bool:
    """Finish the active W&B run of this process, if any.

    Args:
        exit_code: 0 marks the run finished, anything else failed.

    Returns:
        Whether a run was finished.
    """
    if "wandb" not in sys.modules:
        return False
    import wandb

    if wandb.run is None:
        return False
    wandb.finish(exit_code=exit_code)
    return True


def task_wrapper(task: Callable) -> Callable:
    """Wrap a task function so that the W&B run of the job is always finished (``finally``).

    Args:
        task: ``task(config) -> (metrics, objects)``.

    Returns:
        The wrapped task; exceptions propagate after the run was closed (marked failed).
    """

    @functools.wraps(task)
    def wrapped(*args, **kwargs):
        failed = True
        try:
            out = task(*args, **kwargs)
            failed = False
            return out
        except Exception as e:  # the entry script reports it (ipi.run.cli); the log keeps its first line
            first = str(e).strip().splitlines()
            log.error("task %s failed: %s: %s", getattr(task, "__name__", task), type(e).__name__,
                      first[0] if first else "")
            raise
        finally:
            finish_wandb(exit_code=1 if failed else 0)

    return wrapped


def _flat_counts(counts: Mapping) -> dict[str, float]:
    out = {}
    for k, v in counts.items():
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out[f"counts/{k}"] = v
        elif isinstance(v, list):
            out[f"counts/{k}"] = len(v)
        elif isinstance(v, Mapping):
            out.update({f"counts/{k}/{a}": b for a, b in v.items() if isinstance(b, (int, float))})
    return out


def log_run(logger: WandbLogger, results: Mapping, figures: Mapping[str, str | Path],
            config: Mapping | None = None) -> list[str]:
    """Log a finished run's config, estimands, verdict, counts and figures to W&B.

    Args:
        logger: The run's ``WandbLogger`` (an :class:`IpiWandbLogger` carries the screenshot
            permission; a plain ``WandbLogger`` never uploads screenshots).
        results: The dict written to ``results.json``.
        figures: ``{name: PNG path}``; ``gallery`` is skipped unless screenshots are allowed.
        config: The resolved config (plain dict).

    Returns:
        The keys logged (for tests and the run log).
    """
    import wandb


    keys: list[str] = []
    if config is not None:
        logger.log_hyperparams(dict(config))
        keys.append("config")
    marks = reportability_of(results)
    readers = read_keys(results)
    data = []
    for key, label, iv in estimand_entries(results):
        iv = iv or {}
        why = marks.get(key)
        data.append([label, iv.get(ESTIMATE), iv.get(CI_LOW), iv.get(CI_HIGH), iv.get(N_BOOT_USED),
                     why is None, why or "", ", ".join(map(str, readers.get(key, [])))])
    payload: dict = {"estimands": wandb.Table(
        columns=["estimand", "estimate", "ci_low", "ci_high", "n_boot_used", "reportable", "not_reportable_because",
                 "read_by_checks"],
        data=data)}
    view = ResultsView(results)
    verdict = view.get(VERDICT)
    if verdict:
        payload[VERDICT] = wandb.Table(columns=["id", "check", "rule", "status", "detail"],
                                         data=[[c[CHECK_ID], c[NAME], c.get(RULE, ""), c[STATUS], c[DETAIL]]
                                               for c in verdict[CHECKS]])
    allow = bool(getattr(logger, "upload_screenshots", False))
    for name, path in figures.items():
        if name == "gallery" and not allow:
            log.info("W&B: gallery not uploaded (it shows screenshots; logger.wandb.upload_screenshots=false)")
            continue
        if Path(path).is_file():
            payload[f"plots/{name}" if name != "gallery" else "gallery"] = wandb.Image(str(path), caption=name)
    run = logger.experiment
    run.log(payload)
    keys += list(payload)
    # One flag per estimate, beside its test/<key> metrics: filter W&B panels on it.
    summary = {f"reportable/{key}": why is None for key, why in marks.items()}
    if verdict:
        summary["verdict/claim"] = verdict[CLAIM]
        summary.update({f"verdict/check_{c[CHECK_ID]}": c[STATUS] for c in verdict[CHECKS]})
    summary.update(_flat_counts(view.section(COUNTS)))
    run.summary.update(summary)
    keys += list(summary)
    return keys
