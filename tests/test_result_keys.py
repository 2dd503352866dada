"""Results are written with the key constants (ipi.metrics.keys): a writer spelling a known key as a
literal could rename it under every reader, which reads through the constants (test_typed_reads)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ipi.metrics import keys

ROOT = Path(__file__).resolve().parents[1]
#: Every key string ipi.metrics.keys names.
KNOWN = frozenset(v for k, v in vars(keys).items() if k.isupper() and isinstance(v, str))
#: Modules that build results sections, each with the literals it keeps because they are no result key.
WRITERS = {
    "ipi/evaluation/verdict.py": {"checks"},  # check 0's numbers.refused.<key>.checks: check ids, not verdict.checks
    "ipi/evaluation/by_source.py": {"source", "note"},  # the rows' meta column; run.attack.provenance, read by none
    "ipi/evaluation/hijack.py": {"label"},  # the label table's column
    "ipi/evaluation/likelihood.py": set(),
    "ipi/evaluation/spread.py": set(),
    "ipi/evaluation/results.py": set(),
    "ipi/evaluation/reportable.py": set(),
    "ipi/metrics/bootstrap.py": set(),
    "ipi/metrics/permutation.py": set(),
    "ipi/metrics/operating_point.py": set(),
    # the label table's columns; the gate's keyword arguments; the stage's log record (info: rows, settings)
    "ipi/run/free_run.py": {"label", "c1", "min_clusters", "min_boot_fraction", "rows", "settings"},
    "ipi/run/likelihood_stage.py": {"c1"},  # the propensity table's column
}


def literal_keys(source: str) -> list[tuple[int, str]]:
    """``(line, key)`` of every dict-literal key and subscript that is a string literal naming a known key."""
    found = []
    for n in ast.walk(ast.parse(source)):
        cands = [k for k in n.keys if k is not None] if isinstance(n, ast.Dict) else \
            [n.slice] if isinstance(n, ast.Subscript) else []
        found += [(n.lineno, c.value) for c in cands if isinstance(c, ast.Constant) and c.value in KNOWN]
    return found


@pytest.mark.parametrize("module", WRITERS)
def test_no_literal_key_writes(module):
    allowed = WRITERS[module]
    assert allowed <= KNOWN  # a stale entry (a key keys no longer names) is dropped
    assert [(line, k) for line, k in literal_keys((ROOT / module).read_text()) if k not in allowed] == []


def test_the_scan_catches_a_planted_literal_write():
    planted = '\n\ndef _planted(r):\n    r["p_value"] = 1.0\n    return {"estimate": r["m"], "digest": r["unit"]}\n'
    source = (ROOT / "ipi/metrics/permutation.py").read_text() + planted
    assert sorted(k for _, k in literal_keys(source)) == ["estimate", "m", "p_value"]
