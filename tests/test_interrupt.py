"""ipi.interrupt: signal handlers installed and restored, submitit's kept."""

from __future__ import annotations

import os
import signal
import time

import pytest


def test_stop_on_signals_keeps_submitit_handlers_and_restores_previous():
    from ipi.interrupt import Interrupted, stop_on_signals

    before = signal.getsignal(signal.SIGTERM)
    with stop_on_signals():
        with pytest.raises(Interrupted) as e:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        assert e.value.exit_code == 143
    assert signal.getsignal(signal.SIGTERM) is before

    class SignalHandler:  # what submitit installs in a SLURM job (it requeues on its own signal)
        def bypass(self, signum, frame):
            return None
    SignalHandler.__module__ = "submitit.core.job_environment"
    bypass = SignalHandler().bypass
    signal.signal(signal.SIGTERM, bypass)
    try:
        with stop_on_signals():
            assert signal.getsignal(signal.SIGTERM) == bypass
            assert signal.getsignal(signal.SIGINT) != signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, before)
