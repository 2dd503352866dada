"""Killed and signalled runs (ipi.interrupt, ipi.io atomic writes): no partial results; the same command resumes.

Runs on the synthetic corpus and reference run of ``tests/conftest.py``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import (
    N_ROWS,
    PY,
    REPO,
    _base,
    _cli,
    _env,
    _wait_for,
)

# ----------------------------------------------------------------------------- killed runs


@pytest.mark.slow  # the longest fast tests (54-95 s at load 4); run by `make test-all`
@pytest.mark.needs_shared
def test_sigkill_during_extraction_then_same_command_resumes_to_identical_results(
        tmp_path, syn_root, reference):
    run, cache = tmp_path / "run", tmp_path / "cache"
    cmd = [PY, "train.py", *_cli(_base(syn_root), run, cache)]
    with open(tmp_path / "log1", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT)
        _wait_for(lambda: len(list(cache.glob("*/shard-*.safetensors"))) >= 3, proc, "3 shards")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    (entry,) = [p for p in cache.iterdir() if p.is_dir()]
    assert [p.name for p in cache.glob("*.lock")] == [f"{entry.name}.lock"]  # stale: its holder is dead
    assert not (entry / "manifest.json").exists()
    assert not (run / "results.json").exists()
    n_done = 5 * len(list(entry.glob("shard-*.safetensors")))
    assert 15 <= n_done < N_ROWS

    proc = subprocess.run(cmd, cwd=REPO, env=_env(PYTHONHASHSEED="8"), capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads((run / "run_info.json").read_text())["extraction"]
    assert info["cache_hit"] is False and info["rows_forwarded"] == N_ROWS - n_done
    assert list(cache.glob("*.lock")) == []  # the stale lock was broken, the new one released
    # Byte-identical to the uninterrupted in-process run (another process, another hash seed).
    assert (run / "results.json").read_bytes() == (reference / "run" / "results.json").read_bytes()
    assert (run / "scores.csv").read_bytes() == (reference / "run" / "scores.csv").read_bytes()


_KILL_DRIVER = textwrap.dedent("""
    import os, pathlib, runpy, sys, time
    marker = pathlib.Path(os.environ["IPI_TEST_MARKER"])
    if os.environ["IPI_TEST_WHERE"] == "bootstrap":
        import ipi.evaluation.callbacks as cb
        original = cb.assess
        def assess(*a, **k):
            marker.write_text("bootstrap started")
            return original(*a, **k)
        cb.assess = assess
    elif os.environ["IPI_TEST_WHERE"] == "import":
        import ipi.run.stages as tasks
        original = tasks.importer
        def importer(*a, **k):
            read = original(*a, **k)
            def read_then_wait(*a, **k):
                out = read(*a, **k)
                marker.write_text("import")
                time.sleep(600)
                return out
            return read_then_wait
        tasks.importer = importer
    else:  # slow down the write of results.json so the kill lands inside it
        import ipi.reporting.report as rep
        from ipi.io import atomic_path
        original_write = rep.atomic_write_text
        def atomic_write_text(path, text):
            if pathlib.Path(path).name != "results.json":
                return original_write(path, text)
            with atomic_path(path) as tmp:
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(text[: len(text) // 2]); f.flush(); os.fsync(f.fileno())
                    marker.write_text(str(tmp))
                    time.sleep(600)
                    f.write(text[len(text) // 2:])
            return pathlib.Path(path)
        rep.atomic_write_text = atomic_write_text
    sys.argv = ["train.py", *sys.argv[1:]]
    runpy.run_path("train.py", run_name="__main__")
""")


@pytest.mark.needs_shared
@pytest.mark.parametrize("where", ["bootstrap", "results_write"])
def test_sigkill_during_bootstrap_leaves_no_partial_results(tmp_path, syn_root, reference, where):
    run, marker = tmp_path / "run", tmp_path / "marker"
    n_boot = 100_000 if where == "bootstrap" else 50
    cmd = [PY, "-c", _KILL_DRIVER, *_cli(_base(syn_root, n_boot), run, reference / "cache")]
    with open(tmp_path / "log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                env=_env(IPI_TEST_MARKER=str(marker), IPI_TEST_WHERE=where))
        _wait_for(marker.exists, proc, f"the {where} marker")
        time.sleep(0.3)
        assert proc.poll() is None, "the run finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (run / "results.json").exists()
    # results.json is written last: scores.csv, run_info.json and the reports may exist, never it.
    assert "results.json" not in [p.name for p in run.glob("*.json")]
    stray = sorted(run.glob(".results.json.*.tmp"))
    if where == "results_write":
        # The half-written text exists only under the hidden temporary name, and is not JSON.
        assert [str(p) for p in stray] == [marker.read_text()]
        with pytest.raises(json.JSONDecodeError):
            json.loads(stray[0].read_text())
    else:
        assert stray == []


# ------------------------------------------------------------------- stopped by a signal


def _no_temporaries(*folders: Path) -> list[str]:
    return sorted(str(p) for d in folders if d.exists() for p in d.rglob(".*.tmp"))


@pytest.mark.slow  # the longest fast tests (54-95 s at load 4); run by `make test-all`
@pytest.mark.needs_shared
def test_sigterm_during_extraction_stops_within_seconds_then_same_command_resumes_to_identical_results(
        tmp_path, syn_root, reference):
    run, cache = tmp_path / "run", tmp_path / "cache"
    cmd = [PY, "train.py", *_cli(_base(syn_root), run, cache)]
    with open(tmp_path / "log1", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT)
        _wait_for(lambda: len(list(cache.glob("*/shard-*.safetensors"))) >= 3, proc, "3 shards")
        t_signal = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # what timeout, SLURM's time limit, docker stop send
        proc.wait(timeout=60)
        stop_s = time.monotonic() - t_signal
    log_text = (tmp_path / "log1").read_text()
    assert proc.returncode == 128 + signal.SIGTERM == 143, log_text[-3000:]
    assert stop_s < 10, f"took {stop_s:.1f} s to stop"
    assert "train: interrupted by SIGTERM; stopped" in log_text and "Traceback" not in log_text
    (entry,) = [p for p in cache.iterdir() if p.is_dir()]
    assert not (entry / "manifest.json").exists()
    assert not (run / "results.json").exists()
    assert _no_temporaries(run, cache) == []
    assert list(cache.glob("*.lock")) == []  # the writer lock was released
    n_done = 5 * len(list(entry.glob("shard-*.safetensors")))
    assert 15 <= n_done < N_ROWS

    proc = subprocess.run(cmd, cwd=REPO, env=_env(PYTHONHASHSEED="8"), capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert b"LeafSpec" not in proc.stderr and b"Warning" not in proc.stderr, proc.stderr[-3000:]
    info = json.loads((run / "run_info.json").read_text())
    assert info["rows_forwarded"] == N_ROWS - n_done
    assert (run / "results.json").read_bytes() == (reference / "run" / "results.json").read_bytes()
    assert (run / "scores.csv").read_bytes() == (reference / "run" / "scores.csv").read_bytes()


@pytest.mark.needs_shared
@pytest.mark.parametrize(("where", "sig"), [("import", signal.SIGINT), ("bootstrap", signal.SIGTERM),
                                            ("results_write", signal.SIGTERM)])
def test_signal_in_any_stage_exits_128_plus_signal_with_no_results(tmp_path, syn_root, reference, where, sig):
    run, marker = tmp_path / "run", tmp_path / "marker"
    n_boot = 100_000 if where == "bootstrap" else 50
    cmd = [PY, "-c", _KILL_DRIVER, *_cli(_base(syn_root, n_boot), run, reference / "cache")]
    with open(tmp_path / "log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                env=_env(IPI_TEST_MARKER=str(marker), IPI_TEST_WHERE=where))
        _wait_for(marker.exists, proc, f"the {where} marker")
        time.sleep(0.3)
        assert proc.poll() is None, "the run finished before the signal"
        t_signal = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=60)
        stop_s = time.monotonic() - t_signal
    log_text = (tmp_path / "log").read_text()
    assert proc.returncode == 128 + sig, log_text[-3000:]
    assert stop_s < 10, f"took {stop_s:.1f} s to stop"
    assert f"interrupted by {signal.Signals(sig).name}" in log_text and "Traceback" not in log_text
    assert not (run / "results.json").exists()
    assert _no_temporaries(run) == []  # the half-written results.json went with its temporary name


@pytest.mark.needs_shared
def test_ctrl_c_with_dataloader_workers_prints_one_line_and_exits_130(tmp_path, syn_root):
    """Ctrl-C signals the whole foreground process group, DataLoader workers included: the run
    prints one line and exits 130; no worker prints a traceback (nor torch's "DataLoader worker
    exited unexpectedly")."""
    import os

    run, cache = tmp_path / "run", tmp_path / "cache"
    cmd = [PY, "train.py", *_cli(_base(syn_root), run, cache), "extract.num_workers=2"]
    with open(tmp_path / "log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own group, as a terminal's foreground job
        _wait_for(lambda: len(list(cache.glob("*/shard-*.safetensors"))) >= 1, proc, "a shard")
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    text = (tmp_path / "log").read_text()
    assert proc.returncode == 130, text[-3000:]
    assert "Traceback" not in text and "DataLoader worker" not in text, text[-3000:]
    after = text[text.index("train: interrupted by SIGINT"):].strip().splitlines()
    assert len(after) == 1 and after[0].startswith("train: interrupted by SIGINT; stopped")
    assert not (run / "results.json").exists()


def test_worker_ignores_stop_signals_and_only_a_connection_lost_after_one_is_quiet(capsys):
    from ipi import interrupt

    interrupt._WORKER_STOPPING.clear()
    try:
        interrupt._worker_excepthook(ConnectionResetError, ConnectionResetError(104, "reset"), None)
        assert "ConnectionResetError" in capsys.readouterr().err  # no signal yet: printed
        interrupt._worker_signal(signal.SIGINT, None)
        interrupt._worker_excepthook(ConnectionResetError, ConnectionResetError(104, "reset"), None)
        assert capsys.readouterr().err == ""
        interrupt._worker_excepthook(KeyError, KeyError("k"), None)
        assert "KeyError" in capsys.readouterr().err  # anything else still shows
        interrupt._WORKER_STOPPING.clear()
        # the fd-sharing thread's broken connection, before the signal handler ran
        import multiprocessing.resource_sharer as rs

        def _serve():
            raise ConnectionResetError(104, "reset")

        _serve.__code__ = _serve.__code__.replace(co_filename=rs.__file__)
        try:
            _serve()
        except ConnectionResetError as e:
            interrupt._worker_excepthook(type(e), e, e.__traceback__.tb_next)
        assert capsys.readouterr().err == ""
    finally:
        interrupt._WORKER_STOPPING.clear()
