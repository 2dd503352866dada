"""Reliability: config errors at composition, killed runs, determinism, leakage, offline safety.

Pipeline tests run on a small synthetic corpus (ten 2-step WebVoyager task folders with small
screenshots, built under ``tmp_path``) with the small tiny backbone of ``tests/conftest.py`` and
one torch thread (``OMP_NUM_THREADS=1``: on a shared 2-core machine two intra-op threads are
far slower, and a fixed thread count keeps float reductions identical between processes).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, SMALL_BACKBONE_OVERRIDES, compose_train
from tests.test_bad_inputs import messages, task_folder

PY = sys.executable
ACTIONS = ["Type [1]; cats", "ANSWER; done"]
N_TRAJ = 10
N_ROWS = N_TRAJ * 2 * 5  # trajectories x steps x variants (clean, attack, 3 controls on i_vis)


def _env(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "7",
            "PYTHONPATH": str(REPO), **extra}


def _base(root: Path, n_boot: int = 200) -> list[str]:
    return [f"data.root={root}", f"evaluation.n_boot={n_boot}", "logger=none", "extract.shard_rows=5",
            "split.test_fraction=0.5", "evaluation.transfer=false", "evaluation.random_twin=false"]


def _cli(overrides: list[str], run: Path, cache: Path) -> list[str]:
    return [*overrides, *SMALL_BACKBONE_OVERRIDES, "quiet=true", f"hydra.run.dir={run}",
            f"extract.cache_dir={cache}"]


def _wait_for(cond, proc: subprocess.Popen, what: str, timeout: float = 300.0) -> None:
    t0 = time.monotonic()
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"process ended (rc={proc.returncode}) before {what}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def one_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def syn_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("syn")
    for i in range(N_TRAJ):
        task_folder(root / f"t{i}", messages(ACTIONS, task=f"Find thing {i}."), {1: None, 2: None},
                    seed=i + 1)
    return root


@pytest.fixture(scope="module")
def reference(tmp_path_factory, syn_root, one_thread) -> Path:
    """An uninterrupted in-process run: ``<dir>/run/results.json`` and a warm ``<dir>/cache``."""
    from ipi.tasks import train

    d = tmp_path_factory.mktemp("reference")
    train(compose_train(d, _base(syn_root)))
    return d


# --------------------------------------------------------------- config errors at composition

_DRIVER = textwrap.dedent("""
    import atexit, runpy, sys
    heavy = ("torch", "lightning", "transformers")
    atexit.register(lambda: sys.stderr.write(
        "heavy modules imported: " + (",".join(m for m in heavy if m in sys.modules) or "none") + "\\n"))
    sys.argv = ["train.py", *sys.argv[1:]]
    runpy.run_path("train.py", run_name="__main__")
""")


@pytest.mark.parametrize(("overrides", "line"), [
    (["surface=i_dom", "control=occlusion"],
     "config error: control=c_occlusion does not apply to surface=i_dom; allowed: c_scrambled, c_imperative"),
    (["layers.spec=[0.5,1.5]"], "config error: layers.spec: fraction 1.5 outside (0, 1]"),
    (["layers.spec=[0.0]"], "config error: layers.spec: fraction 0.0 outside (0, 1]"),
    (["surface=i_dom", "backbone.multimodal=false"],
     "config error: token_group: 'image' is unavailable with the text-only backbone=tiny_qwen2_5_vl; "
     "choose one of last_prompt, task, observation, action"),
    (["-m", "surface=i_vis,i_dom", "control=occlusion"],
     "config error: job 1 (surface=i_dom control=occlusion): control=c_occlusion does not apply to "
     "surface=i_dom; allowed: c_scrambled, c_imperative"),
    (["-m", "surface=i_vis,i_dom", "extract.devices=2", "evaluation.transfer=false"],
     "config error: job 0 (surface=i_vis extract.devices=2 evaluation.transfer=False): extract.devices>1 "
     "(DDP) inside a -m sweep: Lightning's DDP launcher re-runs the whole command in every extra process, "
     "so each would run the whole sweep again; instead extract each surface with DDP first "
     "(`python extract.py surface=<s> evaluation.transfer=false extract.devices=N`), then run the sweep "
     "on one device (docs/sweeps.md)"),
], ids=["control", "fraction-high", "fraction-zero", "text-only-image", "sweep-job-1", "ddp-in-sweep"])
def test_cross_field_errors_are_one_line_before_any_heavy_import(tmp_path, overrides, line):
    proc = subprocess.run([PY, "-c", _DRIVER, *overrides, f"hydra.run.dir={tmp_path / 'run'}",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [line, "heavy modules imported: none"], proc.stderr
    assert not (tmp_path / "sweep").exists() or not any((tmp_path / "sweep").iterdir())


@pytest.mark.parametrize(("override", "key", "allowed"), [
    ("surface.name=i_audio", "surface.name", "[i_vis, i_dom, i_tool]"),
    ("control.names=[c_blur]", "control.names[0]", "[c_scrambled, c_imperative, c_occlusion]"),
    ("token_group.names=[pixels]", "token_group.names[0]", "[last_prompt, image, task, observation, action]"),
    ("data.unknown_action=drop", "data.unknown_action", "[keep, skip, error]"),
    ("data.on_bad_step=ignore", "data.on_bad_step", "[skip, error]"),
])
def test_unknown_values_fail_at_composition_naming_key_and_allowed(tmp_path, override, key, allowed):
    proc = subprocess.run([PY, "-c", _DRIVER, override, f"hydra.run.dir={tmp_path}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 1
    assert f"full_key: {key}" in proc.stderr and f"expected one of {allowed}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == "heavy modules imported: none"


# ----------------------------------------------------------------------------- killed runs


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
        original = cb.evaluate_tables
        def evaluate_tables(*a, **k):
            marker.write_text("bootstrap started")
            return original(*a, **k)
        cb.evaluate_tables = evaluate_tables
    elif os.environ["IPI_TEST_WHERE"] == "import":
        import ipi.tasks as tasks
        original = tasks.load_trajectories
        def load_trajectories(*a, **k):
            out = original(*a, **k)
            marker.write_text("import")
            time.sleep(600)
            return out
        tasks.load_trajectories = load_trajectories
    else:  # slow down the write of results.json so the kill lands inside it
        import ipi.evaluation.report as rep
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


# ------------------------------------------------------------------ several runs, one cache


@pytest.mark.needs_shared
def test_two_extract_runs_started_together_forward_each_row_once(tmp_path, syn_root):
    cache = tmp_path / "cache"
    procs = []
    for i in range(2):
        cmd = [PY, "extract.py", *_cli(_base(syn_root), tmp_path / f"run{i}", cache)]
        log = open(tmp_path / f"log{i}", "wb")
        procs.append((subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT), log))
    for p, log in procs:
        p.wait(timeout=600)
        log.close()
    logs = [(tmp_path / f"log{i}").read_text() for i in range(2)]
    assert [p.returncode for p, _ in procs] == [0, 0], logs
    infos = [json.loads((tmp_path / f"run{i}" / "run_info.json").read_text()) for i in range(2)]
    forwarded = sorted(i["rows_forwarded"] for i in infos)
    assert forwarded == [0, N_ROWS], forwarded  # every row once, between the two runs
    waiter = next(i for i in infos if i["rows_forwarded"] == 0)
    assert waiter["extraction"]["lock_wait_s"] > 0 and waiter["extraction"]["cache_hit"] is True
    (entry,) = [p for p in cache.iterdir() if p.is_dir()]
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["n_rows"] == N_ROWS and manifest["duplicates_ignored"] == 0
    assert list(cache.glob("*.lock")) == []
    assert any("is being written by pid" in text for text in logs)
    assert not any("LeafSpec" in text or "Received SIGTERM" in text for text in logs)


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


def test_cache_list_into_a_closed_pipe_is_quiet(tmp_path):
    cache = tmp_path / "cache"
    for i in range(3000):  # more output than a pipe buffer holds, so `head` closes it mid-write
        (cache / f"{i:024x}").mkdir(parents=True)
    proc = subprocess.run(f"{PY} -m ipi.cache --cache-dir {cache} list | head -2", shell=True, cwd=REPO,
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines()[0] == f"cache: {cache}"
    assert proc.stderr == "", proc.stderr


# ----------------------------------------------------------------------------- determinism


def _intervals(obj, path=""):
    """Every ``{estimate, ci_low, ci_high, n_boot_used}`` interval in results, by dotted path."""
    if isinstance(obj, dict):
        if "estimate" in obj and "ci_low" in obj:
            yield path, obj
        for k, v in obj.items():
            yield from _intervals(v, f"{path}.{k}" if path else k)


def _without_intervals_and_bootstrap(obj):
    if isinstance(obj, dict):
        if "estimate" in obj and "ci_low" in obj:
            return {"estimate": obj["estimate"]}
        return {k: _without_intervals_and_bootstrap(v) for k, v in obj.items()
                if k not in ("bootstrap", "verdict", "p_values", "reportability")}
    if isinstance(obj, list):
        return [_without_intervals_and_bootstrap(v) for v in obj]
    return obj


@pytest.mark.needs_shared
def test_same_command_twice_fresh_caches_bit_identical(tmp_path, syn_root, reference, one_thread):
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    from ipi.tasks import train

    train(compose_train(tmp_path, _base(syn_root)))
    assert (tmp_path / "run" / "results.json").read_bytes() == \
        (reference / "run" / "results.json").read_bytes()
    assert (tmp_path / "run" / "scores.csv").read_bytes() == (reference / "run" / "scores.csv").read_bytes()
    (a,) = (reference / "cache").iterdir()
    (b,) = (tmp_path / "cache").iterdir()
    assert a.name == b.name  # same key
    shards = sorted(p.name for p in a.glob("shard-*.safetensors"))
    assert shards == sorted(p.name for p in b.glob("shard-*.safetensors")) and len(shards) == N_ROWS // 5
    for name in shards:
        ta, tb = load_file(a / name), load_file(b / name)
        assert ta.keys() == tb.keys() == {"features", "collapse", "prompt_len", "seq_len"}
        for k in ta:
            assert ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape
            # bit-identical, not merely close
            assert ta[k].contiguous().view(torch.uint8).equal(tb[k].contiguous().view(torch.uint8)), (name, k)
        with safe_open(str(a / name), "pt") as fa, safe_open(str(b / name), "pt") as fb:
            assert fa.metadata() == fb.metadata()  # same row ids, same key
    # (The shard files' bytes may differ: safetensors writes its header metadata in hash order.)


@pytest.mark.needs_shared
def test_other_bootstrap_seed_changes_only_the_intervals(tmp_path, syn_root, reference, one_thread):
    from ipi.tasks import train

    (tmp_path / "cache").symlink_to(reference / "cache")
    train(compose_train(tmp_path, [*_base(syn_root), "evaluation.seed=1"]))
    r0 = json.loads((reference / "run" / "results.json").read_text())
    r1 = json.loads((tmp_path / "run" / "results.json").read_text())
    assert _without_intervals_and_bootstrap(r0) == _without_intervals_and_bootstrap(r1)
    i0, i1 = dict(_intervals(r0)), dict(_intervals(r1))
    assert i0.keys() == i1.keys() and len(i0) >= 8
    changed = [k for k in i0 if (i0[k]["ci_low"], i0[k]["ci_high"]) != (i1[k]["ci_low"], i1[k]["ci_high"])]
    assert len(changed) >= len(i0) // 2, changed
    assert (tmp_path / "run" / "scores.csv").read_bytes() == (reference / "run" / "scores.csv").read_bytes()


# -------------------------------------------------------------------------------- leakage


@pytest.mark.needs_shared
def test_a_trajectory_on_both_sides_is_refused(tmp_path, syn_root, reference, one_thread, monkeypatch):
    from ipi import tasks
    from ipi.probe import crossfit
    from ipi.probe.split import LeakageError

    (tmp_path / "cache").symlink_to(reference / "cache")
    real_split = crossfit.holdout_split

    def leaky(ids, test_fraction, seed):
        train_ids, test_ids = real_split(ids, test_fraction, seed)
        return train_ids | {"t3"}, test_ids | {"t3"}

    monkeypatch.setattr(crossfit, "holdout_split", leaky)
    with pytest.raises(LeakageError, match=r"1 trajectory id\(s\) appear in both train and test: 't3'"):
        tasks.train(compose_train(tmp_path, _base(syn_root)))
    # Second line of defence: the rows actually fed to the probe and scored are checked too.
    monkeypatch.setattr(crossfit, "assert_trajectory_disjoint", lambda a, b: None)
    with pytest.raises(LeakageError, match="'t3'"):
        tasks.train(compose_train(tmp_path, _base(syn_root)))
    assert not (tmp_path / "run" / "results.json").exists()


# --------------------------------------------------------------------------- cache hygiene


def _cache_copy(reference: Path, dst: Path) -> Path:
    """Copy the reference run's cache entry (only that one) into ``dst``; return the copy.

    Other tests of this module add entries beside it in the reference cache (another split gives
    other held-out wording, hence other rows), so the entry is picked by the run's cache key.
    """
    import shutil

    key = json.loads((reference / "run" / "results.json").read_text())["run"]["cache_key"]
    (src,) = [p for p in (reference / "cache").iterdir() if p.is_dir() and key.startswith(p.name)]
    dst.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree(src, dst / src.name))


@pytest.mark.needs_shared
@pytest.mark.parametrize("tamper", ["removed_shard", "extra_shard", "resized_shard", "edited_rows",
                                    "edited_layers", "manifest_not_json"])
def test_cache_whose_manifest_does_not_match_is_refused(tmp_path, syn_root, reference, one_thread,
                                                        monkeypatch, tamper):
    from ipi import tasks
    from ipi.cache import scan
    from ipi.extraction import run as run_mod
    from ipi.extraction.cache import CacheError

    entry = _cache_copy(reference, tmp_path / "cache")
    shards = sorted(entry.glob("shard-*.safetensors"))
    manifest = json.loads((entry / "manifest.json").read_text())
    if tamper == "removed_shard":
        shards[3].unlink()
        match = r"shard shard-r0-00003\.safetensors missing or changed since the manifest"
    elif tamper == "extra_shard":
        (entry / "shard-r0-99999.safetensors").write_bytes(shards[0].read_bytes())
        match = "shards on disk do not match the manifest"
    elif tamper == "resized_shard":
        shards[0].write_bytes(shards[0].read_bytes() + b"\0")
        match = "missing or changed since the manifest"
    elif tamper == "edited_rows":
        manifest["n_rows"] -= 5
        match = f"manifest says {N_ROWS - 5} rows, its shards hold {N_ROWS}"
    elif tamper == "edited_layers":
        manifest["layers"] = [0, 1, 2, 2]
        match = "manifest field 'layers' does not match this entry's key"
    else:
        (entry / "manifest.json").write_text('{"key": ')
        match = "manifest .* unreadable"
    if tamper.startswith("edited"):
        (entry / "manifest.json").write_text(json.dumps(manifest))

    def no_backbone(*a, **k):
        raise AssertionError("the backbone was built: the tampered entry was treated as a miss")

    monkeypatch.setattr(run_mod, "instantiate", no_backbone)
    with pytest.raises(CacheError, match=match):
        tasks.extract(compose_train(tmp_path, _base(syn_root)))
    (found,) = scan(tmp_path / "cache")
    if tamper != "edited_layers":  # the CLI does not know the spec a run expects
        assert found.status.startswith("invalid: "), found.status


def _cli_cache(*args, subprocess_run: bool = False) -> subprocess.CompletedProcess:
    """``python -m ipi.cache ARGS``: in a subprocess, or in-process (same ``main``) to save imports."""
    if subprocess_run:
        return subprocess.run([PY, "-m", "ipi.cache", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=120, env=_env())
    import contextlib
    import io

    from ipi.cache import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return subprocess.CompletedProcess(["ipi.cache", *args], rc, out.getvalue(), err.getvalue())


@pytest.mark.needs_shared
def test_cache_cli_lists_and_prunes(tmp_path, reference):
    import shutil

    cache = tmp_path / "cache"
    good = _cache_copy(reference, cache)
    total = sum(p.stat().st_size for p in good.iterdir())
    # An interrupted extraction: shards, a leftover temporary file, no manifest.
    partial = cache / ("0" * 24)
    partial.mkdir()
    shutil.copy(next(good.glob("shard-*.safetensors")), partial / "shard-r0-00000.safetensors")
    (partial / ".shard-r0-00001.safetensors.abc.tmp").write_bytes(b"\0" * 10)
    # A stale entry: manifest written 10 days ago; and a folder that is not an entry.
    old = cache / ("f" * 24)
    shutil.copytree(good, old)
    m = json.loads((old / "manifest.json").read_text())
    m["key"] = "f" * 64
    (old / "manifest.json").write_text(json.dumps(m))
    ten_days = time.time() - 10 * 86400
    os.utime(old / "manifest.json", (ten_days, ten_days))
    (cache / "not-an-entry").mkdir()

    proc = _cli_cache("--cache-dir", str(cache), "list", "--verify", subprocess_run=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"cache: {cache}"
    assert lines[1].split() == ["key", "status", "rows", "bytes", "layers", "backbone", "created"]
    by_key = {ln.split()[0]: ln.split() for ln in lines[2:-1]}
    assert set(by_key) == {good.name, partial.name, old.name}
    assert by_key[good.name][1:3] == ["ok", str(N_ROWS)] and by_key[good.name][5:7] == ["0,1,2,3", "tiny_qwen2_5_vl"]
    assert by_key[partial.name][1:3] == ["incomplete", "-"]
    assert by_key[old.name][1] == "ok"
    assert lines[-1].startswith("3 entries, ")
    from ipi.cache import scan

    sizes = {e.key: e.bytes for e in scan(cache)}
    assert sizes[good.name] == total and sizes[partial.name] == (
        sum(p.stat().st_size for p in partial.iterdir()))

    # prune needs a selector; --dry-run removes nothing.
    assert _cli_cache("--cache-dir", str(cache), "prune").returncode == 2
    proc = _cli_cache("--cache-dir", str(cache), "prune", "--incomplete", "--older-than", "7", "--dry-run")
    assert proc.stdout.splitlines()[-1].startswith("would remove 2 of 3 entries")
    assert partial.exists() and old.exists()
    proc = _cli_cache("--cache-dir", str(cache), "prune", "--incomplete", "--older-than", "7")
    assert proc.returncode == 0 and not partial.exists() and not old.exists() and good.exists()
    proc = _cli_cache("--cache-dir", str(cache), "prune", "--key", good.name[:8])
    out = proc.stdout.splitlines()
    assert len(out) == 2 and out[0].startswith(f"removed {good.name} (ok, ")
    assert out[1].startswith("removed 1 of 1 entries")
    assert not good.exists() and (cache / "not-an-entry").exists()


# ----------------------------------------------------------------------------------- safety

#: Calls that could execute something, reach the network or unpickle, and where they may appear.
#: The injected attack text is data only: nothing in the package runs a command, opens a URL or
#: evaluates text (docs/reliability.md). Add an entry here only with a reason.
FORBIDDEN_MODULES = {"subprocess", "webbrowser", "requests", "urllib.request", "http.client", "socket",
                     "pickle", "dill", "cloudpickle", "shelve", "marshal", "pty", "ctypes"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__", "os.system", "os.popen", "os.execv",
                   "os.execvp", "os.spawnv", "os.startfile", "torch.load", "np.load", "numpy.load",
                   "pd.read_pickle", "pandas.read_pickle"}
ALLOWED: dict[tuple[str, str], str] = {
    # The benchmark measures peak RSS of the extraction path in fresh Python processes
    # (its own module, fixed argv, no shell); nothing there touches attack text.
    ("ipi/bench.py", "subprocess"): "peak-RSS measurement in fresh processes",
}


def _python_files() -> list[Path]:
    return sorted((REPO / "ipi").rglob("*.py")) + [REPO / f for f in ("train.py", "extract.py", "evaluate.py")]


def _dotted(node) -> str:
    import ast

    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _violations(tree, rel: str) -> list[str]:
    import ast

    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif (isinstance(node, ast.Call) and _dotted(node.func) in ("__import__", "importlib.import_module")
              and node.args and isinstance(node.args[0], ast.Constant)):
            names = [node.args[0].value]  # a literal module name: judged like an import
        for n in names:
            if n in FORBIDDEN_MODULES and (rel, n) not in ALLOWED:
                found.append(f"{rel}:{node.lineno}: import {n}")
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        literal_import = name in ("__import__", "importlib.import_module") and node.args and isinstance(
            node.args[0], ast.Constant)
        if (name in FORBIDDEN_CALLS or name == "importlib.import_module") and not literal_import \
                and (rel, name) not in ALLOWED:
            found.append(f"{rel}:{node.lineno}: {name}()")
        for kw in node.keywords:
            value = kw.value
            if kw.arg == "trust_remote_code" and not (
                    isinstance(value, ast.Name) or (isinstance(value, ast.Constant) and value.value is False)):
                found.append(f"{rel}:{node.lineno}: trust_remote_code={ast.unparse(value)}")
            if kw.arg == "shell" and not (isinstance(value, ast.Constant) and value.value is False):
                found.append(f"{rel}:{node.lineno}: shell={ast.unparse(value)}")
            if kw.arg == "weights_only" and not (isinstance(value, ast.Constant) and value.value is True):
                found.append(f"{rel}:{node.lineno}: weights_only={ast.unparse(value)}")
    return found


def test_package_never_executes_fetches_or_unpickles():
    import ast

    found = []
    for path in _python_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found += _violations(tree, path.relative_to(REPO).as_posix())
    assert found == []
    # The scan is not vacuous: it flags each kind of violation.
    bad = ast.parse("import subprocess\nfrom urllib.request import urlopen\neval(s)\n__import__(name)\n"
                    "__import__('pickle')\nf(trust_remote_code=True)\ntorch.load(p)\n"
                    "g(shell=True)\nh(weights_only=False)\nos.system('x')\n__import__('json')\n")
    assert [v.split(": ", 1)[1] for v in _violations(bad, "x.py")] == [
        "import subprocess", "import urllib.request", "eval()", "__import__()", "import pickle",
        "trust_remote_code=True", "torch.load()", "shell=True", "weights_only=False", "os.system()"]


def test_remote_code_off_and_wandb_offline_in_every_config(tmp_path, monkeypatch):
    import yaml

    for path in sorted((REPO / "conf").rglob("*.yaml")):
        text = path.read_text()
        doc = yaml.safe_load(text) or {}
        loader = doc.get("loader", {}) if isinstance(doc, dict) else {}
        if isinstance(loader, dict) and "trust_remote_code" in loader:
            assert loader["trust_remote_code"] is False, path
        assert "trust_remote_code: true" not in text.lower(), path
    for name in ("qwen2_5_vl_7b", "qwen2_5_vl_3b"):
        cfg = compose_train(tmp_path, [f"backbone={name}"], small=False)
        assert cfg.backbone.loader.trust_remote_code is False
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = compose_train(tmp_path, ["logger=wandb"])
    assert cfg.logger.wandb.mode == "offline" and cfg.logger.wandb.log_model is False
    assert cfg.logger.wandb.upload_screenshots is False


_OFFLINE_DRIVER = textwrap.dedent("""
    import os, runpy, socket, sys
    attempts = []
    def refuse(self, address, *a, **k):
        attempts.append(address)
        raise OSError(f"network access attempted: {address}")
    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.create_connection = lambda address, *a, **k: refuse(None, address)
    from ipi.backbone import build_pretrained_qwen2_5_vl
    try:
        build_pretrained_qwen2_5_vl("Qwen/Qwen2.5-VL-7B-Instruct")
        print("hub model loaded?!")
    except OSError as e:
        print("hub model refused offline:", type(e).__name__)
    sys.argv = ["train.py", *sys.argv[1:]]
    try:
        runpy.run_path("train.py", run_name="__main__")
    finally:
        print("network attempts:", len(attempts))
""")


@pytest.mark.needs_shared
def test_tiny_backbone_runs_with_hf_offline_and_no_network(tmp_path, syn_root):
    """HF_HUB_OFFLINE=1 and every socket refused: the tiny path runs; a hub id fails without trying."""
    run = tmp_path / "run"
    ov = [f"data.root={syn_root}", "data.max_trajectories=4", "split.test_fraction=0.5", "surface=i_dom",
          "evaluation.n_boot=20", "logger=none"]
    proc = subprocess.run([PY, "-c", _OFFLINE_DRIVER, *_cli(ov, run, tmp_path / "cache")], cwd=REPO,
                          capture_output=True, text=True, timeout=600, env=_env(HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hub model refused offline: OSError" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "network attempts: 0"
    assert json.loads((run / "results.json").read_text())["run"]["surface"] == "i_dom"
