"""Every word of the verdict comes from the rule that decided it (PROTOCOL.md §7).

Each check's description is written once, beside the check (``ipi.evaluation.verdict.CHECKS``),
with the thresholds of the settings the run used; results.json stores it, and the reports, W&B
and docs/estimands.md show that stored text. These tests render a run's report and compare every
check's line with the rule and the numbers that decided it, and keep the docs' tables equal to the
code's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ipi.evaluation.results import Settings
from ipi.evaluation.verdict import CHECKS, checks_markdown
from ipi.reporting.report import html_escape, render_html, render_report
from tests.conftest import REPO, check_of, run_verdict
from tests.evaluation.test_verdict import _iv, _results

DOC = REPO / "docs" / "estimands.md"


def _block(text: str, name: str) -> str:
    m = re.search(rf"<!-- checks:{name} -->\n(.*?)\n<!-- /checks:{name} -->", text, re.S)
    assert m, f"docs/estimands.md lacks the checks:{name} block"
    return m.group(1)


def test_docs_checklist_is_the_codes():
    text = DOC.read_text()
    assert _block(text, "holdout") == checks_markdown(Settings(split="holdout"))
    assert _block(text, "kfold") == checks_markdown(Settings(split="kfold"), (1, 4))


@pytest.mark.parametrize("settings", [dict(), dict(split="kfold", alpha=0.01, min_clusters=20, c1_max=0.9,
                                                    collapse_ceiling=0.55, twin_level=0.1, level=0.9)])
def test_each_rule_states_the_thresholds_the_run_used(settings):
    s = Settings(**settings)
    text = {r.id: r.describe(s) for r in CHECKS}
    assert f"at least {s.min_clusters:g} effective test trajectories" in text[0]
    assert f"{s.level:.0%} cluster-bootstrap CI low above 0.5" in text[1]
    assert (f"permutation p <= {s.alpha:g}" in text[1]) == (s.split == "kfold")
    assert f"point estimate below {s.c1_max:g}" in text[2]
    assert f"ceiling {s.collapse_ceiling:g}" in text[5]
    need = 19 if s.twin_level == 0.05 else 9
    assert f"S >= {need} distinct twins for level {s.twin_level:g}" in text[6]
    assert f"<= {s.alpha:g}" in text[4]


def _statement_numbers(detail: str) -> list[str]:
    return re.findall(r"-?\d+\.\d{3}", detail)


@pytest.mark.parametrize("surface", ["i_vis", "i_dom"])
def test_report_states_every_check_as_the_verdict_applied_it(surface):
    """report.md and report.html carry, for every check, its status, its rule (the verdict's text)
    and its detail; every number in the detail is one of the numbers that decided it."""
    r = _results()
    r["collapse_only"]["e3"]["c_scrambled"] = _iv(0.6, 0.55, 0.66)  # check 5 straddles: INCONCLUSIVE
    r["c1"]["e3"]["c_imperative"] = _iv(0.97, 0.9, 0.99)  # check 2 FAILs on C1's point estimate
    r["verdict"] = run_verdict(r, pretrained=True, split="holdout")
    r["run"] = {"surface": surface}
    md, html = render_report(r), render_html(r)
    for c in r["verdict"]["checks"]:
        assert c["rule"] == next(rule.describe(Settings(split="holdout")) for rule in CHECKS if rule.id == c["id"])
        assert f"- [{c['status']}] {c['id']}. {c['name']}: {c['detail']}" in md
        assert f"  - rule: {c['rule']}" in md
        escaped = html_escape(c["rule"])
        assert escaped in html
    two, five = check_of(r["verdict"], 2), check_of(r["verdict"], 5)
    assert two["status"] == "FAIL" and "c_imperative: C1 E3 point estimate 0.970 >= 0.95" in two["detail"]
    assert five["status"] == "INCONCLUSIVE" and "straddles ceiling 0.600" in five["detail"]
    # every number printed in a detail is in the check's numbers (the ones that decided it)
    flat = repr(r["verdict"]["checks"])
    for c in r["verdict"]["checks"]:
        for x in _statement_numbers(c["detail"]):
            v = float(x)
            assert any(abs(v - float(y)) < 5e-4 for y in re.findall(r"-?\d+\.\d+", repr(c["numbers"]))) \
                or x in flat, (c["id"], x)


def test_no_retired_rule_is_described_anywhere():
    """Words of rules the verdict no longer applies (docs, README, report strings in ipi/)."""
    retired = [
        r"passed by construction", r"five checks", r"six checks", r"needs ≥ 2 seeds",
        r"1, 2, 3 by default", r"S = 3 \(the default\)", r"not gated \(no verdict check uses it\)",
        r"`min_clusters` \(5\)", r"percentile or bca", r"not yet in train\.py", r"C1 E1 below 0\.95",
        r"seed-predictive", r"envelope", r"max over twin seeds",
    ]
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "ipi").rglob("*.py"))]
    hits = []
    for f in files:
        text = f.read_text()
        for pat in retired:
            for m in re.finditer(pat, text):
                line = text.count("\n", 0, m.start()) + 1
                hits.append(f"{Path(f).relative_to(REPO)}:{line}: {pat}")
    assert hits == []
