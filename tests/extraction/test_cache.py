"""ipi.extraction.cache: the writer lock of a cache entry."""

from __future__ import annotations

import subprocess
import textwrap
import time

from tests.conftest import (
    PY,
    REPO,
    _env,
)


def test_writer_lock_waits_for_a_live_holder_and_breaks_a_dead_ones(tmp_path, caplog):
    from ipi.extraction.cache import ActivationCache

    entry = ActivationCache(tmp_path, "ab" * 32, {})
    holder = textwrap.dedent(f"""
        import sys, time
        from ipi.extraction.cache import ActivationCache
        with ActivationCache({str(tmp_path)!r}, {"ab" * 32!r}, {{}}).writer_lock():
            print("held", flush=True)
            time.sleep(float(sys.argv[1]))
    """)
    # A live holder: the second writer waits, names it, then gets the lock once it is released.
    proc = subprocess.Popen([PY, "-c", holder, "2"], cwd=REPO, env=_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    assert entry.lock_holder().startswith(f"pid {proc.pid} on host ")
    with caplog.at_level("WARNING", logger="ipi.extraction.cache"):
        with entry.writer_lock() as waited:
            assert waited > 1.0
    assert proc.wait(timeout=30) == 0
    assert f"being written by pid {proc.pid}" in caplog.text
    assert not entry.lock_path.exists()
    # A holder killed with SIGKILL (no cleanup ran): its lock file stays, and is broken at once.
    proc = subprocess.Popen([PY, "-c", holder, "600"], cwd=REPO, env=_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    proc.kill()
    proc.wait()
    assert entry.lock_path.exists()
    t0 = time.monotonic()
    with entry.writer_lock() as waited:
        assert waited < 5
    assert time.monotonic() - t0 < 5 and not entry.lock_path.exists()
