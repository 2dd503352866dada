"""What the entry scripts share: input errors as one line, and where the results went.

An error caused by the user's input (a data folder, a score table, a cache, a split) ends the
command with one line naming the file / key and exit status 2; set ``HYDRA_FULL_ERROR=1`` for
the traceback. Anything else is a bug and keeps its full traceback. SIGTERM and SIGINT end the
command within seconds with status 128 + the signal (143, 130): see :mod:`ipi.interrupt`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from omegaconf import DictConfig

from ipi.data.schema import DataError
from ipi.extraction.activation_cache import CacheError
from ipi.interrupt import Interrupted, stop_on_signals
from ipi.probe.split import LeakageError


def _input_errors() -> tuple[type[BaseException], ...]:
    return (DataError, CacheError, LeakageError, FileNotFoundError, NotADirectoryError,
            IsADirectoryError, ValueError)


def run_entry(task: Callable[[DictConfig], tuple], cfg: DictConfig) -> tuple:
    """Run a task function; report input errors in one line (exit 2) and the output folder.

    Args:
        task: ``ipi.run.tasks.train`` / ``extract`` / ``evaluate``.
        cfg: The composed config.

    Returns:
        What the task returns.
    """
    try:
        with stop_on_signals():
            out = task(cfg)
    except Interrupted as e:
        print(f"{cfg.task_name}: {e}; stopped (no results written; finished cache shards kept, the same "
              "command resumes)", file=sys.stderr)
        sys.stderr.flush()
        sys.exit(e.exit_code)
    except _input_errors() as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {e}  ({type(e).__name__}; HYDRA_FULL_ERROR=1 shows the traceback)", file=sys.stderr)
        sys.exit(2)
    results = out[0] if isinstance(out, tuple) and out else None
    claim = (results or {}).get("verdict", {}).get("claim") if isinstance(results, dict) else None
    out_dir = cfg.paths.output_dir
    print(f"{cfg.task_name}: outputs in {out_dir}" + (f" — licensed claim: {claim}" if claim else ""),
          file=sys.stderr)
    return out
