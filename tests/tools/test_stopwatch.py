"""The benchmarks' one timer (ipi.tools.stopwatch)."""

from __future__ import annotations

import subprocess
import sys
import time

from ipi.tools.stopwatch import Stopwatch, best_of


def test_wall_and_cpu_seconds_of_a_block():
    with Stopwatch() as idle:
        time.sleep(0.2)
    assert 0.2 <= idle.wall_s < 2.0 and idle.cpu_s < 0.15  # sleeping costs no CPU
    with Stopwatch() as busy:
        c_end = time.process_time() + 0.2  # 0.2 s of this process's CPU, however loaded the machine
        while time.process_time() < c_end:
            pass
    assert busy.cpu_s > 0.15 and busy.wall_s >= busy.cpu_s - 0.05
    frozen = busy.wall_s
    time.sleep(0.05)
    assert busy.wall_s == frozen  # read after the block: fixed


def test_children_counts_a_finished_subprocess():
    code = "import time\nt = time.process_time() + 0.3\nwhile time.process_time() < t: pass"
    with Stopwatch(children=True) as sw:
        subprocess.run([sys.executable, "-c", code], check=True)
    assert sw.cpu_s > 0.25 and sw.wall_s >= 0.25


def test_best_of_returns_the_fewest_seconds_and_the_result():
    delays = iter([0.15, 0.02, 0.1])

    def nap():
        d = next(delays)
        time.sleep(d)
        return d

    best, last = best_of(nap, 3)
    assert 0.02 <= best < 0.1 and last == 0.1
