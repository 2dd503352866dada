"""The report's layout (docs/outputs.md, "report.html"): verdict and headline estimands first, every
interval of results.json shown somewhere, no table wider than MAX_COLUMNS, a verdict rendered from
each check's status, detail and numbers whatever the check is."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest

from ipi.evaluation.assess import ScoreTables, Settings, assess
from ipi.reporting.layout import (
    MAX_COLUMNS,
    EstimandTable,
    Grid,
    Side,
    interval_keys,
    report_sections,
    shown_keys,
    split_columns,
)
from ipi.reporting.report import render_html, render_report


def _table(rng, controls, shift=0.8, n_traj=12):
    rows = []
    for t in range(n_traj):
        for s in range(3):
            rows.append((f"t{t}", s, "clean", rng.normal()))
            rows.append((f"t{t}", s, "attack", rng.normal() + shift))
            rows += [(f"t{t}", s, c, rng.normal() + shift / 2) for c in controls]
    return pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])


def _full(controls=("c_imperative", "c_occlusion", "c_scrambled"), seeds=(1, 2, 3)):
    """A results dict from the one assess path: every baseline, twins, permutation test."""
    rng = np.random.default_rng(0)
    main = _table(rng, controls)
    base = {name: _table(rng, controls, shift=s)
            for name, s in (("c1", 0.0), ("collapse_only", 0.5), ("permuted", 0.0), ("transfer", 0.2))}
    twins = {s: _table(rng, controls, shift=0.3) for s in seeds}
    perm = {"null_scores": rng.normal(size=(19, len(main))), "seed": 0}
    r = assess(ScoreTables(main, base, twins, perm), Settings(n_boot=50, seed=0)).to_dict()
    r["counts"] = {"trajectories": 12, "rows": len(main), "skipped_steps": [{"step": 1, "reason": "x"}]}
    r["run"] = {"surface": "i_vis", "backbone": "tiny", "random_twin": {"seeds": list(seeds)}}
    return r


def _intervals_by_hand(r, prefix=()):
    """Dotted keys of every {estimate, ci_low, ci_high} dict outside the verdict's own blocks."""
    skip = {"verdict", "reportability", "split_spread", "permutation", "p_values", "bootstrap", "counts", "run"}
    out = []
    for k, v in r.items():
        if not prefix and k in skip:
            continue
        if isinstance(v, dict) and {"estimate", "ci_low", "ci_high"} <= set(v):
            out.append(".".join(map(str, (*prefix, k))))
        elif isinstance(v, dict):
            out += _intervals_by_hand(v, (*prefix, k))
    return out


class _Tables(HTMLParser):
    """Cells per row of every <table>, and the data-key of every cell."""

    def __init__(self):
        super().__init__()
        self.rows, self.keys, self.h2 = [], [], []
        self._in_h2 = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr":
            self.rows.append(0)
        elif tag in ("td", "th"):
            self.rows[-1] += 1
            if "data-key" in a:
                self.keys.append(a["data-key"])
        elif tag == "h2":
            self._in_h2 = True

    def handle_endtag(self, tag):
        if tag == "h2":
            self._in_h2 = False

    def handle_data(self, data):
        if self._in_h2:
            self.h2.append(data)


def _parse(html):
    p = _Tables()
    p.feed(html)
    return p


def test_verdict_then_headline_first_and_the_headline_holds_e1_e2_e3():
    r = _full()
    sections = report_sections(r, {"roc": "roc.png", "forest": "forest.png"}, "seed: 0\n")
    assert [s.id for s in sections][:2] == ["verdict", "estimands"]
    assert [s.folded for s in sections] == [False, False] + [True] * (len(sections) - 2)
    (side,) = [b for b in sections[1].blocks if isinstance(b, Side)]
    (table,) = [b for col in side.columns for b in col if isinstance(b, EstimandTable)]
    assert [row[0] for row in table.rows] == ["e1", "e1_paired", "e2", "e3.c_imperative", "e3.c_occlusion",
                                              "e3.c_scrambled"]
    assert table.rows[0][2] == r["e1"] and table.rows[5][2] == r["e3"]["c_scrambled"]
    # HTML: the seven checks (0-6) and the headline table come before the first folded section.
    html = render_html(r, config_yaml="seed: 0\n")
    first_fold = html.index("<section id=\"figures\"") if 'id="figures"' in html else html.index("<details><summary><h2>")
    assert html.count('<details class="check">') == 7
    assert html.rindex('<details class="check">') < html.index('data-key="e1"') < first_fold
    assert html.index('data-key="e3.c_scrambled"') < first_fold
    assert f'{r["e1"]["estimate"]:.3f}' in html[:first_fold]
    # report.md: the same sections in the same order.
    md_titles = re.findall(r"^## (.+)$", render_report(r, config_yaml="seed: 0\n"), re.M)
    assert md_titles == [s.title for s in report_sections(r, None, "seed: 0\n")]
    assert _parse(html).h2 == md_titles


def test_every_interval_of_results_json_appears_in_the_html():
    r = _full()
    by_hand = _intervals_by_hand(r)
    assert len(by_hand) > 40 and "collapse_only.e3.c_occlusion" in by_hand  # check 5's estimand
    assert sorted(interval_keys(r)) == sorted(by_hand)
    assert shown_keys(report_sections(r)) >= set(by_hand)
    html = render_html(r)
    keys = _parse(html).keys
    assert set(keys) >= set(by_hand)
    # Each shown once, except where the twins' section repeats one beside the twins: the trained
    # backbone's E1, E2, E3 (its first row) and the differences trained − twin.
    twice = {k for k in keys if keys.count(k) > 1}
    assert twice == {"e1", "e2", *(f"e3.{c}" for c in r["e3"]),
                     *(k for k in by_hand if k.startswith("differences.e3_minus_mean_twin_e3"))}
    assert max(keys.count(k) for k in keys) == 2
    # A cell shows its own interval: check one of each kind by hand.
    for key in ("e1", "c1.e3.c_scrambled", "random_twin.by_seed.2.e3.c_occlusion",
                "differences.e3_minus_mean_twin_e3.c_imperative"):
        iv = r
        for part in key.split("."):
            iv = iv[part]
        cell = re.search(rf'data-key="{re.escape(key)}">(.*?)</td>', html).group(1)
        assert f"{iv['estimate']:.3f}" in cell, key
    # Every estimand is gated, and its row says which checks it decides: check 5 reads the
    # collapse-only E3, check 2 C1's E3 (a point estimate) and E3 − C1 E3; E1 − E3 decides nothing.
    assert re.search(r"C2 collapse-only E3 attack vs c_occlusion</td>.*?<td>check 5</td>", html)
    assert re.search(r"C1 metadata baseline E3 attack vs c_scrambled</td>.*?<td>check 2</td>", html)
    assert re.search(r"E3 attack vs c_scrambled</td>.*?<td>checks 3, 6</td>", html)
    assert re.search(r"e1_minus_e3 c_scrambled\)</td>.*?<td>nothing</td>", html)
    assert "not gated" not in html


def test_an_unknown_kind_of_estimand_still_appears():
    r = _full()
    r["new_probe"] = {"e1": {"estimate": 0.613, "ci_low": 0.5, "ci_high": 0.7, "n_boot_used": 50}}
    (other,) = [s for s in report_sections(r) if s.id == "other"]
    assert other.blocks[0].rows[0][:3] == ("new_probe.e1", "new_probe.e1", r["new_probe"]["e1"])
    assert 'data-key="new_probe.e1"' in render_html(r) and "0.613" in render_report(r)
    assert "other" not in [s.id for s in report_sections(_full())]  # no empty section otherwise


@pytest.mark.parametrize("n_controls", [1, 3, 8])
def test_no_table_has_more_than_max_columns(n_controls):
    r = _full(controls=tuple(f"c_{i}" for i in range(n_controls)), seeds=(1, 2, 3, 4, 5))
    html = render_html(r)
    widths = _parse(html).rows
    assert widths and max(widths) <= MAX_COLUMNS
    md_widths = [line.count(" | ") + 1 for line in render_report(r).splitlines() if line.startswith("| ")]
    assert max(md_widths) <= MAX_COLUMNS
    if n_controls == 8:  # 2 + 8 estimand columns: the twins' table is cut, labels repeated
        assert html.count("<th>AUC</th>") == 2


def test_split_columns_keeps_every_cell_and_repeats_the_labels():
    g = Grid(("", *"abcdefghij"), (("r1", *range(10)), ("r2", *range(10, 20))))
    parts = split_columns(g, max_columns=4)
    assert [len(p.head) for p in parts] == [4, 4, 4, 2]
    assert all(p.head[0] == "" and [row[0] for row in p.rows] == ["r1", "r2"] for p in parts)
    assert sum((p.head[1:] for p in parts), ()) == g.head[1:]
    assert [sum((p.rows[i][1:] for p in parts), ()) for i in range(2)] == [tuple(range(10)), tuple(range(10, 20))]
    assert split_columns(g, max_columns=11) == [g]  # fits: unchanged
    with pytest.raises(ValueError, match="max_columns must be at least 2"):
        split_columns(g, max_columns=1)


def test_verdict_renders_any_check_from_status_detail_and_numbers():
    r = _full()
    r["verdict"]["checks"].append({
        "id": 7, "name": "a rule nobody wrote yet", "status": "NOT RUN", "detail": "why it did not run: <no input>",
        "numbers": {"level": 0.05, "rank": 3, "per_control": {"c_a": {"rank": 1}, "c_b": {"rank": 2}}}})
    r["verdict"]["checks"].append({"id": 8, "name": "bare", "status": "PASS", "detail": "no numbers"})
    html = render_html(r)
    assert html.count('<details class="check">') == 9
    assert ('<span class="status NOTRUN">NOT RUN</span><span class="cname">7. a rule nobody wrote yet</span>'
            '<span class="lead">why it did not run: &lt;no input&gt;</span>') in html
    assert "<th>per_control.c_a.rank</th><td>1</td>" in html and "<th>level</th><td>0.05</td>" in html
    md = render_report(r)
    assert "- [NOT RUN] 7. a rule nobody wrote yet: why it did not run: <no input>" in md
    assert "  - numbers: level 0.05; rank 3; per_control.c_a.rank 1; per_control.c_b.rank 2" in md
    assert "- [PASS] 8. bare: no numbers" in md


def test_check_numbers_per_control_become_one_grid():
    r = _full()
    (check3,) = [c for c in r["verdict"]["checks"] if c["id"] == 3]
    html = render_html(r)
    block = html[html.index(f'<span class="cname">3. {check3["name"]}</span>'):]
    block = block[:block.index("</details>")]
    assert "<th>c_imperative</th><th>c_occlusion</th><th>c_scrambled</th>" in block
    iv = check3["numbers"]["c_occlusion"]["e3"]
    assert f'{iv["estimate"]:.3f} [{iv["ci_low"]:.3f}, {iv["ci_high"]:.3f}]' in block
