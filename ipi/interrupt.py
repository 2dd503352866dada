"""Stopping a run when told: SIGTERM and SIGINT end the run within seconds (docs/reliability.md).

:func:`stop_on_signals` (entered by :func:`ipi.run.cli.run_entry` around every task) turns either
signal into :class:`Interrupted`, an exception that is *not* an ``Exception``, so no
``except Exception`` on the way swallows it. Lightning calls a handler installed before its own,
so ours still raises inside ``Trainer.predict``. Files are written through :mod:`ipi.io`, so no
half-written file is left, and the cache-entry lock is released.

DataLoader workers ignore both signals (:func:`ignore_stop_signals`). The entry script exits with
128 + the signal number; a second signal while the run unwinds is ignored (logged). submitit's
handlers under SLURM are left in place (docs/sweeps.md, *Preemption and time limits*)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

#: Signals that stop a run.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):
    """The run was told to stop by a signal.

    Attributes:
        signum: The signal number.
        exit_code: ``128 + signum`` (143 for SIGTERM, 130 for SIGINT).
    """

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(f"interrupted by {signal.Signals(self.signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _is_foreign(handler) -> bool:
    """Whether ``handler`` is submitit's (kept: it requeues a preempted SLURM job)."""
    owner = getattr(handler, "__self__", None)  # submitit installs bound methods of its SignalHandler
    modules = (getattr(handler, "__module__", None), type(owner).__module__ if owner is not None else None)
    return any(str(m or "").startswith("submitit") for m in modules)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Raise :class:`Interrupted` in the main thread on SIGTERM / SIGINT while the block runs.

    Handlers that submitit installed (a SLURM job run by ``hydra/launcher=slurm``) are kept, so
    its requeue on preemption works. Outside the main thread (where Python cannot install signal
    handlers) this does nothing. The previous handlers are restored on exit.

    Yields:
        Nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    state = {"raised": None}
    owner = os.getpid()

    def handler(signum, _frame):
        if os.getpid() != owner:
            # A forked child (a DataLoader worker) inherits this handler. Ctrl-C signals the whole
            # process group: the run's own process stops and shuts its workers down; a worker
            # raising too would print one traceback per worker.
            return
        if state["raised"] is not None:
            log.warning("received %s while stopping after %s; still stopping (SIGKILL ends it now)",
                        signal.Signals(signum).name, signal.Signals(state["raised"]).name)
            return
        state["raised"] = signum
        raise Interrupted(signum)

    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    mine = [s for s in STOP_SIGNALS if not _is_foreign(previous[s])]
    for s in mine:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s in mine:
            signal.signal(s, previous[s])


#: Set in a DataLoader worker once a stop signal reached it (:func:`ignore_stop_signals`).
_WORKER_STOPPING = threading.Event()


def _worker_signal(_signum, _frame) -> None:
    _WORKER_STOPPING.set()


def _from_fd_sharing(tb) -> bool:
    """Whether a traceback starts in multiprocessing's fd-sharing server thread (``resource_sharer._serve``)."""
    code = tb.tb_frame.f_code if tb is not None else None
    return code is not None and code.co_name == "_serve" and code.co_filename.endswith("resource_sharer.py")


def _worker_excepthook(kind, value, tb) -> None:
    # When the run's own process exits (a stop signal) while it receives a batch, the worker's
    # fd-sharing thread (multiprocessing.resource_sharer) loses its connection and would print it
    # as a traceback: dropped once the signal came, or whenever that thread's connection to the
    # run's process breaks (the signal handler may not have run yet: it runs between bytecodes of
    # the worker's main thread). Anything else is printed.
    if issubclass(kind, (ConnectionError, EOFError)) and (_WORKER_STOPPING.is_set() or _from_fd_sharing(tb)):
        return
    sys.__excepthook__(kind, value, tb)


def ignore_stop_signals(_worker_id: int | None = None) -> None:
    """Leave SIGTERM and SIGINT to the run's own process: the ``worker_init_fn`` of DataLoader workers.

    The run's own process stops (:func:`stop_on_signals`) and shuts its workers down; a worker
    here only notes the signal and carries on until it is shut down, so it prints no traceback
    of its own. Workers started with ``spawn`` are told here too.

    Args:
        _worker_id: The DataLoader's worker id (unused).
"""
    for s in STOP_SIGNALS:
        signal.signal(s, _worker_signal)
    sys.excepthook = _worker_excepthook


__all__ = ["Interrupted", "STOP_SIGNALS", "ignore_stop_signals", "stop_on_signals"]
