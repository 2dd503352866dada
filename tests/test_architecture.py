"""The code's shape: the import contract (pyproject's [tool.importlinter]), unique module
basenames, and ``cfg`` read only in ``ipi/run`` (docs/README.md, the code map)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def duplicate_basenames(package: Path) -> dict[str, list[str]]:
    """Module file names (``__init__``/``__main__`` aside) that occur more than once under ``package``."""
    paths = [p for p in package.rglob("*.py") if p.stem not in ("__init__", "__main__")]
    counts = Counter(p.name for p in paths)
    return {n: sorted(str(p.relative_to(package)) for p in paths if p.name == n) for n, c in counts.items() if c > 1}


def functions_taking(source: str, name: str) -> list[str]:
    """Names of the functions (and methods, lambdas aside) in ``source`` with a parameter called ``name``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            params = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
            params += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
            if name in params:
                out.append(node.name)
    return out


def cfg_functions_outside_run(package: Path) -> list[str]:
    """``path:function`` of every function outside ``<package>/run`` that takes a parameter named ``cfg``."""
    out = []
    for p in sorted(package.rglob("*.py")):
        rel = p.relative_to(package)
        if rel.parts[0] == "run":
            continue
        out += [f"{rel}:{f}" for f in functions_taking(p.read_text(), "cfg")]
    return out


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the checkout at ``root`` (its pyproject's contracts, its ``ipi``)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)


def test_import_contract_is_kept():
    """Every contract of pyproject's [tool.importlinter] (the layers, no cycles between siblings) holds."""
    assert LINT_IMPORTS.exists(), "import-linter is not installed (pip install -e '.[test]')"
    res = lint_imports(ROOT)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout


@pytest.mark.parametrize("where, line, contract", [
    # a low layer reaching up into the run layer
    ("ipi/metrics/auc.py", "import ipi.run.tasks  # noqa", "layers"),
    # two sibling modules of ipi.run importing each other (stages already imports detection)
    ("ipi/run/detection.py", "import ipi.run.stages  # noqa", "no cycles"),
    # siblings of one layer that must stay independent
    ("ipi/probe/split.py", "import ipi.extraction.rows  # noqa", "layers"),
])
def test_import_contract_catches_a_violation(tmp_path, where, line, contract):
    """The same contracts on a copy of the checkout with one offending import added: broken."""
    shutil.copytree(ROOT / "ipi", tmp_path / "ipi", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / where
    target.write_text(target.read_text() + f"\n{line}\n")
    res = lint_imports(tmp_path)
    assert res.returncode != 0, res.stdout[-3000:]
    broken = [ln for ln in res.stdout.splitlines() if ln.rstrip().endswith("BROKEN")]
    assert any(contract in ln for ln in broken), res.stdout[-3000:]


def test_module_basenames_are_unique():
    """No two modules of ipi share a file name (``grep``-able, unambiguous in tracebacks and logs)."""
    assert duplicate_basenames(ROOT / "ipi") == {}


def test_duplicate_basenames_are_found(tmp_path):
    for rel in ("a/run.py", "b/run.py", "a/__init__.py", "b/__init__.py", "c/other.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert duplicate_basenames(tmp_path) == {"run.py": ["a/run.py", "b/run.py"]}


def test_only_the_run_layer_takes_cfg():
    """No function outside ipi/run takes the composed config (a parameter named ``cfg``): the
    run layer turns it into typed settings (ipi.run.settings) before calling below."""
    assert cfg_functions_outside_run(ROOT / "ipi") == []


def test_cfg_parameters_are_found(tmp_path):
    src = ("def a(cfg): pass\n"
           "def b(x, *, cfg=None): pass\n"
           "async def c(cfg, /): pass\n"
           "class K:\n    def m(self, cfg): pass\n"
           "def d(config, cfg_like): pass\n"
           "def e(*cfg): pass\n")
    assert sorted(functions_taking(src, "cfg")) == ["a", "b", "c", "e", "m"]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tasks.py").write_text("def train(cfg): pass\n")
    (tmp_path / "metrics.py").write_text("def f(cfg): pass\n")
    assert cfg_functions_outside_run(tmp_path) == ["metrics.py:f"]


# ----------------------------------------------------------------------------- function length

#: The longest a function may be (its ``def`` to its last line, docstring included).
MAX_FUNCTION_LINES = 120
#: The longest ``train`` may be: a straight list of stages (ipi/run/tasks.py).
MAX_TRAIN_LINES = 60


def function_lengths(package: Path) -> dict[str, int]:
    """``{"path::name": lines}`` of every function and method under ``package`` (AST line spans)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = f"{path.relative_to(package.parent)}::{node.name}"
                out[key] = max(out.get(key, 0), node.end_lineno - node.lineno + 1)
    return out


def test_no_function_is_over_120_lines():
    lengths = function_lengths(ROOT / "ipi")
    too_long = {k: n for k, n in lengths.items() if n > MAX_FUNCTION_LINES}
    assert too_long == {}, too_long


def test_train_is_a_short_list_of_stages():
    assert function_lengths(ROOT / "ipi")["ipi/run/tasks.py::train"] <= MAX_TRAIN_LINES


def test_function_lengths_are_line_spans(tmp_path):
    (tmp_path / "pkg").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(130))
    (tmp_path / "pkg" / "m.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n")
    assert function_lengths(tmp_path / "pkg") == {"pkg/m.py::long": 131, "pkg/m.py::short": 2}
