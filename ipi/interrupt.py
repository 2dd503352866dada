"""Stopping a run when told: SIGTERM and SIGINT end the run within seconds (docs/reliability.md).

A scheduler's time limit or preemption, ``timeout``, ``docker stop`` and ``kill`` send SIGTERM;
Ctrl-C sends SIGINT. :func:`stop_on_signals` (entered by :func:`ipi.run.cli.run_entry` around every
task) turns either into :class:`Interrupted`, an exception that is *not* an ``Exception``, so no
``except Exception`` on the way swallows it:

* Lightning installs its own SIGTERM handler while a ``Trainer`` runs (it logs "Received SIGTERM"
  and carries on) but keeps a handler that was installed before it and calls it after its own
  (``_SignalConnector.register_signal_handlers``), so ours still raises inside
  ``Trainer.predict``; Lightning then runs its ``on_exception`` hooks and re-raises
  (``_call_and_handle_interrupt`` handles ``KeyboardInterrupt`` by ``sys.exit(1)``, which is why
  SIGINT is turned into :class:`Interrupted` too, not left as ``KeyboardInterrupt``).
* Every file is written through :mod:`ipi.io` (temporary name, then rename), and the exception
  unwinds through those context managers, so no half-written file is left; finished cache shards
  stay and the same command forwards only the rows they lack. The cache-entry lock is released.

The entry script then exits with the shell's convention: 128 + the signal number (143 for
SIGTERM, 130 for SIGINT). A second signal while the run unwinds is ignored (logged); SIGKILL
remains the hammer, and is safe too (docs/reliability.md, *Interrupted runs*).

Under SLURM with the submitit launcher, submitit installs its handlers (SIGTERM ignored, the
``hydra.launcher`` timeout signal checkpoints and requeues) before the job runs; those are left
in place (docs/sweeps.md, *Preemption and time limits*).
"""

from __future__ import annotations

import logging
import signal
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
def stop_on_signals(signals=STOP_SIGNALS) -> Iterator[None]:
    """Raise :class:`Interrupted` in the main thread on SIGTERM / SIGINT while the block runs.

    Handlers that submitit installed (a SLURM job run by ``hydra/launcher=slurm``) are kept, so
    its requeue on preemption works. Outside the main thread (where Python cannot install signal
    handlers) this does nothing. The previous handlers are restored on exit.

    Args:
        signals: Signals to handle.

    Yields:
        Nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    state = {"raised": None}

    def handler(signum, _frame):
        if state["raised"] is not None:
            log.warning("received %s while stopping after %s; still stopping (SIGKILL ends it now)",
                        signal.Signals(signum).name, signal.Signals(state["raised"]).name)
            return
        state["raised"] = signum
        raise Interrupted(signum)

    previous = {s: signal.getsignal(s) for s in signals}
    mine = [s for s in signals if not _is_foreign(previous[s])]
    for s in mine:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s in mine:
            signal.signal(s, previous[s])


__all__ = ["Interrupted", "STOP_SIGNALS", "stop_on_signals"]
