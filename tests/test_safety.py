"""Safety of the package: nothing executes, fetches or unpickles; remote code off; offline runs."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import (
    PY,
    REPO,
    _cli,
    _env,
    compose_train,
)

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
    ("ipi/tools/bench.py", "subprocess"): "peak-RSS measurement in fresh processes",
    # warm_run_s / sweep30_s time the real entry scripts (train.py, extract.py) as child
    # processes: fixed argv built from the repo's own paths, no shell, no attack text.
    ("ipi/tools/extraction_timing.py", "subprocess"): "timing the entry scripts in child processes",
    ("ipi/tools/known_answers.py", "subprocess"): ("running train.py itself, as a user does, on constructed backbones; "
                                                  "git rev-parse/diff (fixed argv) so that a rerun after a code change reruns"),
    # The surface registry imports the class a conf/surface/*.yaml names in _target_ (a config
    # file or override, the trust level of every _target_ Hydra instantiates); never attack text.
    ("ipi/surfaces/registry.py", "importlib.import_module"): "the class a surface config's _target_ names",
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
