"""Records of a multirun's failed jobs: where they are written and how a sweep folder is read.

A job that fails under ``-m`` writes :data:`FAILED_FILE` into its own folder
(:func:`ipi.run.cli.record_failure`); the end of the sweep lists them in :data:`FAILED_JOBS_FILE`
(:func:`ipi.run.hydra_callbacks.report_sweep_failures`) and the sweep report names the failed cells
(:func:`ipi.reporting.sweep.failed_cells`). Torch-free and below both, so the config check and the
report read one format.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

#: Written by :func:`ipi.run.cli.record_failure` into a failed job's folder (kept here: no torch import).
FAILED_FILE = "failed.json"
#: The sweep's list of failed jobs, in the sweep folder.
FAILED_JOBS_FILE = "failed_jobs.json"


def sweep_failures(sweep_dir: str | Path) -> list[dict]:
    """The failure records of a sweep's jobs (``<sweep>/<n>/failed.json``), in job order.

    :func:`ipi.run.cli.run_entry` removes a job's old record when the job starts again (a rerun into
    the same sweep folder), so a record present is from this sweep.

    Args:
        sweep_dir: The multirun folder.

    Returns:
        ``[{"job", "overrides", "error", "message", "input_error", "traceback", "folder"}]``; an
        unreadable record is reported with ``error = "unreadable failed.json"``.
    """
    out = []
    root = Path(sweep_dir)
    if not root.is_dir():
        return out
    for f in root.glob(f"*/{FAILED_FILE}"):
        try:
            rec = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            rec = {"job": f.parent.name, "overrides": [], "error": "unreadable failed.json", "message": str(e)}
        out.append({**rec, "folder": str(f.parent)})
    return sorted(out, key=lambda r: (0, int(r["job"])) if str(r.get("job")).isdigit() else (1, str(r.get("job"))))


def job_overrides(sweep_dir: str | Path) -> list[list[str]]:
    """The overrides of every job folder of a sweep (``<n>/.hydra/overrides.yaml``)."""
    return [[str(o) for o in OmegaConf.load(f)] for f in sorted(Path(sweep_dir).glob("*/.hydra/overrides.yaml"))]


def cell_name(overrides: list[str], common: set[str]) -> str:
    """The overrides of one job that not every job of its sweep shares (the swept values)."""
    return " ".join(o for o in overrides if o not in common) or " ".join(overrides)
