"""A Hydra callback that checks a composed config before any job starts (no torch imported).

:class:`ConfigCheck` (registered in ``conf/hydra/default.yaml``) runs
:func:`ipi.run.validation.validate` on the composed config at ``on_run_start``; under ``-m`` it
composes and checks *every* job of the sweep at ``on_multirun_start``, so a bad combination in
job 7 fails before job 1 runs. A failure prints one line to stderr and exits with status 1
(``SystemExit``: Hydra turns an exception raised by a callback into a warning).

At ``on_multirun_end`` :func:`sweep_failures` gathers the failed jobs that
:func:`ipi.run.cli.run_entry` recorded into ``<sweep>/failed_jobs.json``, prints one line per
failed job and ends the command with status 1 when any job failed."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, ListConfig, OmegaConf

from ipi.run.schemas import EvaluateConf
from ipi.run.validation import check_known_keys, validate, validate_sweep_job
from ipi.sweep_records import (
    FAILED_JOBS_FILE,
    cell_name,
    job_overrides,
    sweep_failures,
)

log = logging.getLogger(__name__)

_BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


class ConfigError(ValueError):
    """An invalid combination of config values (one-line message naming key and allowed values)."""


def _missing_keys(node, prefix: str = "") -> list[str]:
    """Dotted keys under ``node`` (a top-level ``hydra`` node aside) still ``???`` (mandatory, no default).

    Walks the nodes without resolving interpolations (``paths.output_dir`` needs a job).
    """
    out: list[str] = []
    keys = range(len(node)) if isinstance(node, ListConfig) else list(node.keys())
    for k in keys:
        if not prefix and k == "hydra":
            continue
        name = f"{prefix}{k}"
        if OmegaConf.is_missing(node, k):
            out.append(name)
            continue
        child = node._get_node(k)
        if isinstance(child, (DictConfig, ListConfig)) and not child._is_none() and not child._is_interpolation():
            out += _missing_keys(child, f"{name}.")
    return sorted(out)


def check_config(config: DictConfig, where: str = "", sweep: bool = False) -> None:
    """Run :func:`ipi.run.validation.validate` on a composed ``train``/``extract`` config.

    An ``evaluate`` config (no surface/backbone) is only checked for keys its schema lacks.

    Args:
        config: The composed config (with or without its ``hydra`` node).
        where: Prefix naming the sweep job, e.g. ``"job 3 (surface=i_dom control=occlusion): "``.
        sweep: The config is a job of a ``-m`` sweep (:func:`ipi.run.validation.validate_sweep_job` too:
            no DDP inside a sweep).

    Raises:
        ConfigError: One line naming the key, the value and the allowed values.
    """
    if not all(k in config for k in ("surface", "control", "layers", "token_group", "backbone")):
        if "scores" in config:  # evaluate.py: its schema's keys only

            try:
                check_known_keys(config, EvaluateConf)
            except ValueError as e:
                raise ConfigError(f"config error: {where}{e}") from None
        return
    missing = _missing_keys(config)
    if missing:
        group = missing[0].split(".", 1)[0]
        name = OmegaConf.select(config, f"{group}.name", default=None) if group != missing[0] else None
        which = f"{group}={name} needs " if name is not None else ""
        raise ConfigError(f"config error: {where}{which}{', '.join(missing)} (mandatory, no default); "
                          f"give {' '.join(f'{k}=...' for k in missing)} on the command line")
    try:
        if sweep:
            validate_sweep_job(config)
        validate(config)
    except ValueError as e:
        raise ConfigError(f"config error: {where}{e}") from None


def _sweep_jobs(config: DictConfig) -> list[list[str]] | None:
    """Overrides of every job of a basic-sweeper multirun, or None for other sweepers."""
    if config.hydra.sweeper.get("_target_") != _BASIC_SWEEPER:
        return None
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
    return [list(job) for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


def _exit_on_error(fn, *args) -> None:
    try:
        fn(*args)
    except ConfigError as e:
        sys.stderr.write(f"{e}\n")
        sys.stderr.flush()
        raise SystemExit(1) from None


def report_sweep_failures(sweep_dir: str | Path) -> list[dict]:
    """Write ``<sweep>/failed_jobs.json`` (always, ``[]`` when none failed) and print the failed jobs.

    Returns:
        The failure records (:func:`sweep_failures`).
    """
    from ipi.io import atomic_write_text

    failures = sweep_failures(sweep_dir)
    root = Path(sweep_dir)
    if root.is_dir():
        atomic_write_text(root / FAILED_JOBS_FILE, json.dumps(failures, indent=1) + "\n")
    if failures:
        jobs = job_overrides(root)
        common = set.intersection(*map(set, jobs)) if len(jobs) > 1 else set()
        lines = [f"sweep: {len(failures)} of {len(jobs)} jobs failed (listed in {root / FAILED_JOBS_FILE}):"]
        lines += [f"  job {r['job']} ({cell_name(r.get('overrides') or [], common)}): {r['error']}: "
                  f"{str(r['message']).splitlines()[0]}" for r in failures]
        sys.stderr.write("\n".join(lines) + "\n")
        sys.stderr.flush()
    return failures


class ConfigCheck(Callback):
    """Checks every job's config before anything runs (see the module docstring)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_on_error(check_config, config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            from hydra.core.global_hydra import GlobalHydra

            jobs = _sweep_jobs(config)
            loader = GlobalHydra.instance().config_loader()
        except (ImportError, AttributeError, ValueError) as e:  # a Hydra without these internals
            log.debug("ConfigCheck: cannot expand the sweep (%s); jobs are checked as they start", e)
            return
        if jobs is None:
            _exit_on_error(check_config, config, "", True)
            return
        for i, job in enumerate(jobs):
            job_cfg = loader.load_sweep_config(config, job)
            _exit_on_error(check_config, job_cfg, f"job {i} ({' '.join(job)}): ", True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if report_sweep_failures(config.hydra.sweep.dir):
            raise SystemExit(1)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Covers sweepers whose jobs are not known up front, and remote launchers.
        from hydra.types import RunMode

        mode = config.hydra.get("mode") if "hydra" in config else None
        _exit_on_error(check_config, config, "", mode == RunMode.MULTIRUN)
