"""Results are read through key constants (ipi.metrics.keys) and ResultsView, never by string literal."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ipi.evaluation.results import ResultsView
from ipi.metrics import keys

ROOT = Path(__file__).resolve().parents[2]
#: Modules whose result reads go through the constants and the view (ipi/tools/ still reads literals).
TYPED = ("ipi/evaluation/verdict.py", "ipi/reporting/layout.py", "ipi/reporting/plots.py",
         "ipi/reporting/tracking.py", "ipi/reporting/summary.py", "ipi/reporting/attack_sections.py",
         "ipi/reporting/report.py", "ipi/reporting/sweep.py", "ipi/reporting/behaviour_sections.py",
         "ipi/evaluation/callbacks.py", "ipi/run/cli.py")

#: Mappings that are not results (the environment, a logger's keyword arguments, a failed job's record,
#: Hydra's job config).
NOT_RESULTS = frozenset({"os.environ", "kwargs", "failure", "hc.job"})


def literal_gets(source: str) -> list[tuple[int, str]]:
    """``(line, key)`` of every ``x.get("key", ...)`` whose key is a string literal."""
    return [(n.lineno, n.args[0].value) for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get"
            and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)
            and ast.unparse(n.func.value) not in NOT_RESULTS]


@pytest.mark.parametrize("module", TYPED)
def test_no_literal_key_reads(module):
    assert literal_gets((ROOT / module).read_text()) == []


def test_the_scan_catches_a_planted_literal_read():
    source = (ROOT / TYPED[1]).read_text() + '\n\ndef _planted(r):\n    return (r.get("run") or {}).get("surface")\n'
    assert sorted(k for _, k in literal_gets(source)) == ["run", "surface"]


def test_a_renamed_key_is_a_name_error_not_an_empty_section():
    # a constant that is gone breaks every reader at import/attribute time
    with pytest.raises(AttributeError):
        _ = keys.BACKBONE_WEIGHTZ  # noqa: B018
    view = ResultsView({keys.RUN: {keys.BACKBONE_WEIGHTS: "constructed"}, keys.BOOTSTRAP: {keys.LEVEL_KEY: 0.9}})
    assert view.backbone_weights == "constructed" and view.level == 0.9 and view.run == view.section(keys.RUN)
    assert ResultsView({}).section(keys.BEHAVIOUR) == {} and ResultsView({}).backbone_weights is None
