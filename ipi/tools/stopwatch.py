"""The one timer of the benchmarks (:mod:`ipi.tools.bench`, :mod:`ipi.tools.extraction_timing`,
:mod:`ipi.tools.bootstrap_timing`): wall-clock and CPU seconds of a block."""

from __future__ import annotations

import resource
import time


class Stopwatch:
    """Wall and CPU seconds of a ``with`` block (``with Stopwatch() as sw: ...``; then
    ``sw.wall_s``, ``sw.cpu_s``); it can also be read while running.

    Args:
        children: Count the CPU (user + system) of finished child processes instead of this
            process's own.
    """

    def __init__(self, children: bool = False):
        self._who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
        self._t0 = self._c0 = 0.0
        self._wall: float | None = None
        self._cpu: float | None = None

    def _cpu_now(self) -> float:
        r = resource.getrusage(self._who)
        return r.ru_utime + r.ru_stime

    def __enter__(self) -> Stopwatch:
        self._wall = self._cpu = None
        self._t0, self._c0 = time.perf_counter(), self._cpu_now()
        return self

    def __exit__(self, *exc) -> None:
        self._wall, self._cpu = time.perf_counter() - self._t0, self._cpu_now() - self._c0

    @property
    def wall_s(self) -> float:
        """Wall-clock seconds of the block (so far, while it runs)."""
        return time.perf_counter() - self._t0 if self._wall is None else self._wall

    @property
    def cpu_s(self) -> float:
        """CPU seconds (user + system) of the block (so far, while it runs)."""
        return self._cpu_now() - self._c0 if self._cpu is None else self._cpu


def best_of(fn, reps: int) -> tuple[float, object]:
    """``(fewest wall seconds of reps calls of fn(), the last call's result)``."""
    best, out = float("inf"), None
    for _ in range(reps):
        with Stopwatch() as sw:
            out = fn()
        best = min(best, sw.wall_s)
    return best, out
