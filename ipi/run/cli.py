"""What the entry scripts share: input errors as one line, failed sweep jobs, where the results went.

An error caused by the user's input ends the command with one line naming the file / key and
exit status 2 (``HYDRA_FULL_ERROR=1`` for the traceback); anything else is a bug and keeps its
traceback. Signals: :mod:`ipi.interrupt`.

**A job of a ``-m`` sweep that fails does not end the sweep** (docs/sweeps.md, *Failed jobs*):
the failure is written to the job's folder as :data:`FAILED_FILE`, one line goes to stderr, and
the next job starts. :class:`ipi.run.hydra_callbacks.ConfigCheck` then lists the failed jobs in
``<sweep>/failed_jobs.json`` and on stderr and ends the command with status 1."""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from ipi.data.schema import DataError
from ipi.evaluation.results import ResultsView
from ipi.extraction.activation_cache import CacheError
from ipi.interrupt import Interrupted, stop_on_signals
from ipi.metrics.keys import CLAIM, VERDICT
from ipi.probe.split import LeakageError
from ipi.sweep_records import FAILED_FILE  # a failed sweep job's record, in its own folder

log = logging.getLogger(__name__)


def _input_errors() -> tuple[type[BaseException], ...]:
    from huggingface_hub.errors import StrictDataclassError
    from omegaconf.errors import MissingMandatoryValue

    return (DataError, CacheError, LeakageError, FileNotFoundError, NotADirectoryError,
            IsADirectoryError, ValueError, StrictDataclassError, MissingMandatoryValue)


def _paths_of(cfg, field: str, prefix: str = "") -> list[str]:
    """Dotted paths in ``cfg`` (a config tree, read without resolving) whose last key is ``field``."""
    out = []
    if isinstance(cfg, DictConfig):
        for k in cfg.keys():
            if k == "hydra":
                continue
            if k == field:
                out.append(f"{prefix}{k}")
            child = cfg._get_node(k)
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_interpolation():
                out += _paths_of(child, field, f"{prefix}{k}.")
    return out


def message(e: BaseException, cfg: DictConfig | None = None) -> str:
    """``e``'s message for a person, with a hint where the fix is mechanical.

    An error raised in a DataLoader worker is reported by its own last line. A transformers
    config class refusing an ``int`` where a ``float`` is expected is put on one line naming the
    config key (found in ``cfg``), with the hint to write e.g. ``30000.0``.

    Args:
        e: The error.
        cfg: The run's config, to name the key of a field a model config class refused.

    Returns:
        The message (one line for a refused field).
"""
    import re

    from huggingface_hub.errors import StrictDataclassError

    msg = str(e)
    lines = msg.strip().splitlines()
    if lines and lines[0].startswith("Caught ") and "DataLoader worker" in lines[0]:
        # torch re-raises a worker's error with the worker's traceback as its message: keep the
        # error's own line (``DataError: <file>: step k: cannot decode screenshot (...)``)
        msg = lines[-1].split(": ", 1)[1] if ": " in lines[-1] else lines[-1]
    if isinstance(e, StrictDataclassError):
        msg = " ".join(part.strip() for part in msg.splitlines() if part.strip())
        field = re.search(r"field '([^']+)'", msg)
        keys = _paths_of(cfg, field.group(1)) if field and cfg is not None else []
        if keys:
            msg = f"{' or '.join(keys)}: {msg}"
    if "expected float, got int" in msg:
        msg += " (write the number with a decimal point, e.g. 30000.0)"
    return msg


def input_error(e: BaseException) -> BaseException | None:
    """The input error behind ``e`` (``e`` itself, or what ``instantiate`` wrapped), or None for a bug."""
    from hydra.errors import InstantiationException

    while isinstance(e, InstantiationException) and e.__cause__ is not None:  # what instantiate wrapped
        e = e.__cause__
    return e if isinstance(e, _input_errors()) else None


def in_multirun() -> bool:
    """Whether this process runs the jobs of a Hydra ``-m`` sweep (``hydra.mode=MULTIRUN``)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    except (ImportError, ValueError):
        return False


def _job_identity() -> tuple[str, list[str]]:
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    return str(hc.job.get("num", "?")), [str(o) for o in hc.overrides.task]


def record_failure(out_dir: str | os.PathLike, e: BaseException, cfg: DictConfig | None = None) -> dict:
    """Write :data:`FAILED_FILE` for a failed sweep job into ``out_dir``; return the record.

    Args:
        out_dir: The job's output folder.
        e: What ended the job.
        cfg: The job's config (:func:`message`).

    Returns:
        ``{"job", "overrides", "error", "message", "input_error", "traceback"}``.
    """
    from ipi.io import atomic_write_text

    inner = input_error(e)
    shown = inner if inner is not None else e
    job, overrides = _job_identity()
    record = {
        "job": job,
        "overrides": overrides,
        "error": type(shown).__name__,
        "message": message(shown, cfg),
        "input_error": inner is not None,
        "traceback": None if inner is not None else "".join(traceback.format_exception(e)),
    }
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(out_dir) / FAILED_FILE, json.dumps(record, indent=1) + "\n")
    return record


def run_entry(task: Callable[[DictConfig], tuple], cfg: DictConfig) -> tuple | None:
    """Run a task function; report input errors in one line (exit 2) and the output folder.

    Under ``-m`` a failed job is recorded (:func:`record_failure`) and the sweep goes on (module
    docstring); a signal still ends the whole sweep.

    Args:
        task: ``ipi.run.tasks.train`` / ``extract`` / ``evaluate``.
        cfg: The composed config.

    Returns:
        What the task returns (None for a failed job of a sweep).
    """
    sweep = in_multirun()
    out_dir = cfg.paths.output_dir
    if sweep:  # a rerun into the same sweep folder: an old failure is not this job's
        Path(out_dir, FAILED_FILE).unlink(missing_ok=True)
    try:
        with stop_on_signals():
            out = task(cfg)
    except Interrupted as e:
        print(f"{cfg.task_name}: {e}; stopped (no results written; finished cache shards kept, the same "
              "command resumes)", file=sys.stderr)
        sys.stderr.flush()
        sys.exit(e.exit_code)
    except Exception as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        inner = input_error(e)
        if sweep:
            rec = record_failure(out_dir, e, cfg)
            if inner is None:  # a bug: its traceback goes to the job's log file too
                log.error("job %s failed", rec["job"], exc_info=e)
            print(f"job {rec['job']} failed: {rec['error']}: {rec['message'].splitlines()[0]} (recorded in "
                  f"{Path(out_dir) / FAILED_FILE}; the sweep goes on)", file=sys.stderr)
            sys.stderr.flush()
            return None
        if inner is None:
            raise
        print(f"error: {message(inner, cfg)}  ({type(inner).__name__}; HYDRA_FULL_ERROR=1 shows the traceback)",
              file=sys.stderr)
        sys.exit(2)
    results = out[0] if isinstance(out, tuple) and out else None
    claim = ResultsView(results).get(VERDICT, CLAIM) if isinstance(results, dict) else None
    print(f"{cfg.task_name}: outputs in {out_dir}" + (f" — licensed claim: {claim}" if claim else ""),
          file=sys.stderr)
    return out
