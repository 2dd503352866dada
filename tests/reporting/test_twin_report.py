"""The report's trained-vs-twins section: one transposed table (rows: trained, each twin seed;
columns: E1, E2, E3 per control), then check 6's paired difference E3 − mean twin E3."""

from __future__ import annotations

from tests.conftest import check_of, run_verdict
from ipi.reporting.layout import Estimate, Grid, report_sections
from ipi.reporting.report import render_html, render_report
from tests.evaluation.test_verdict import _iv, _results as _results_19


def _results():
    return _results_19(s=2)


def _two_seeds():
    r = _results()
    r["random_twin"]["seeds"] = ["1", "2"]
    r["random_twin"]["by_seed"] = {
        "1": {"e1": _iv(0.8, 0.7, 0.9), "e2": _iv(0.8, 0.7, 0.9),
              "e3": {"c_scrambled": _iv(0.5, 0.4, 0.6), "c_imperative": _iv(0.45, 0.4, 0.6)}},
        "2": {"e1": _iv(0.7, 0.6, 0.8), "e2": _iv(0.7, 0.6, 0.8),
              "e3": {"c_scrambled": _iv(0.42, 0.4, 0.6), "c_imperative": _iv(0.5, 0.4, 0.6)}}}
    r["verdict"] = run_verdict(r, pretrained=False)
    r["run"] = {"surface": "i_dom", "random_twin": {"seeds": [1, 2], "backbone_pretrained": False}}
    return r


def _twin_grids(r):
    (twins,) = [s for s in report_sections(r) if s.id == "twins"]
    return [b for b in twins.blocks if isinstance(b, Grid)]


def test_twin_table_is_transposed_seeds_are_rows_estimands_columns():
    r = _two_seeds()
    auc, diff = _twin_grids(r)
    cols = ("E1 attack vs clean", "E2 paired step", "E3 attack vs c_imperative", "E3 attack vs c_scrambled")
    assert auc.head == ("AUC", *cols)
    assert [row[0] for row in auc.rows] == ["trained", "twin seed 1", "twin seed 2"]  # no envelope row
    # Each cell holds the interval of results.json at its key, read here by hand.
    by_seed = r["random_twin"]["by_seed"]
    expect = [[r["e1"], r["e2"], r["e3"]["c_imperative"], r["e3"]["c_scrambled"]],
              [by_seed["1"]["e1"], by_seed["1"]["e2"], by_seed["1"]["e3"]["c_imperative"],
               by_seed["1"]["e3"]["c_scrambled"]],
              [by_seed["2"]["e1"], by_seed["2"]["e2"], by_seed["2"]["e3"]["c_imperative"],
               by_seed["2"]["e3"]["c_scrambled"]]]
    assert [[c.iv for c in row[1:]] for row in auc.rows] == expect
    assert auc.rows[2][4].key == "random_twin.by_seed.2.e3.c_scrambled"
    # The difference check 6 reads: E3 per control, against the mean over the seeds.
    assert diff.head == ("trained − …", "E3 attack vs c_imperative", "E3 attack vs c_scrambled")
    assert [row[0] for row in diff.rows] == ["mean over twin seeds (paired; check 6)"]
    assert diff.rows[0][2].iv == r["differences"]["e3_minus_mean_twin_e3"]["c_scrambled"]


def test_more_seeds_add_rows_not_columns():
    r = _two_seeds()
    for s in ("3", "4", "5", "6", "7"):
        r["random_twin"]["by_seed"][s] = r["random_twin"]["by_seed"]["1"]
    r["random_twin"]["seeds"] = ["1", "2", "3", "4", "5", "6", "7"]
    auc, _ = _twin_grids(r)
    assert len(auc.head) == 4 + 1 and len(auc.rows) == 7 + 1


def test_twin_section_in_both_reports():
    r = _two_seeds()
    md = render_report(r)
    assert "| AUC | E1 attack vs clean | E2 paired step | E3 attack vs c_imperative | E3 attack vs c_scrambled |" in md
    assert "| twin seed 2 | 0.700 [0.600, 0.800] | 0.700 [0.600, 0.800] | 0.500 [0.400, 0.600] | " \
           "0.420 [0.400, 0.600] |" in md
    assert "| mean over twin seeds (paired; check 6) | 0.200 [0.100, 0.300] | 0.150 [0.080, 0.250] |" in md
    assert "seed-predictive" not in md and "max over twin seeds" not in md and "envelope" not in md
    assert "backbone.pretrained=false" in md and "2 random-weight twins (seeds 1, 2)" in md
    html = render_html(r)
    assert '<td class="iv" data-key="differences.e3_minus_mean_twin_e3.c_scrambled"><span class="est">0.150</span> ' \
           '<span class="ci">[0.080, 0.250]</span></td>' in html
    assert 'id="twins"' in html and "<h2>Trained vs random-weight twins (check 6)</h2>" in html
    r["run"]["random_twin"] = None  # twin off: no section, no error
    del r["random_twin"]
    assert "random-weight twins (check 6)" not in render_report(r)
    assert 'id="twins"' not in render_html(r)


def test_twin_guards_are_shown_in_the_twin_section():
    r = _two_seeds()
    r["random_twin"]["guards"] = ["twin seeds 1 and 2: their scores agree beyond what distinct random "
                                  "initialisations give (|Spearman| 0.9990 >= 0.99)"]
    r["verdict"] = run_verdict(r, pretrained=True)
    assert check_of(r["verdict"], 6)["status"] == "NOT RUN"
    md = render_report(r)
    assert "Refused (check 6 NOT RUN): twin seeds 1 and 2" in md


def test_unreportable_twin_cells_are_struck_and_listed():
    r = _two_seeds()
    r["reportability"] = {"estimands": {"random_twin.by_seed.1.e2": "only 2 test trajectories contribute (< 5)"}}
    auc, _ = _twin_grids(r)
    cell = auc.rows[1][2]
    assert isinstance(cell, Estimate) and cell.why == "only 2 test trajectories contribute (< 5)"
    assert all(c.why is None for row in auc.rows for c in row[1:] if c is not cell)
    md = render_report(r)
    assert "~~0.800 [0.700, 0.900]~~" in md
    assert "- only 2 test trajectories contribute (< 5): random twin seed 1 E2" in md
    html = render_html(r)
    assert html.count('class="iv unreportable"') == 1


def test_report_says_a_constructed_backbone_is_planted_truth():
    r = _results_19()
    r["verdict"] = run_verdict(r, pretrained=False, constructed=True)
    r["run"] = {"surface": "i_dom", "backbone_weights": "constructed"}
    md, html = render_report(r), render_html(r)
    assert r["verdict"]["claim"] == "detects malicious content"  # not capped: judged against its twins
    for text in (md, html):
        assert "Constructed backbone (backbone.constructed=true)" in text and "not a model of any agent" in text
    r["run"]["backbone_weights"] = "pretrained"
    assert "Constructed backbone" not in render_report(r)


def test_a_constructed_backbone_is_not_called_random_or_trained():
    """A constructed backbone (issue 23: pretrained false, planted weights; the verdict may license
    "detects") is judged against its twins like a trained one: its twins' section must not say its
    weights are random and capped at "separates" (before: it did, under a "detects" verdict), nor
    call it "trained"; a plain random backbone still gets the note."""
    from ipi.reporting.layout import RANDOM_BACKBONE_NOTE, Text

    def section(r):
        (twins,) = [s for s in report_sections(r) if s.id == "twins"]
        return twins, [b.text for b in twins.blocks if isinstance(b, Text)]

    r = _two_seeds()
    r.pop("verdict")
    r["verdict"] = run_verdict(r, pretrained=False, constructed=True)
    r["run"] = {"surface": "i_dom", "backbone_weights": "constructed",
                "random_twin": {"seeds": [1, 2], "backbone_pretrained": False, "backbone_weights": "constructed"}}
    twins, texts = section(r)
    assert RANDOM_BACKBONE_NOTE not in texts
    auc, diff = _twin_grids(r)
    assert auc.rows[0][0] == "constructed" and diff.head[0] == "constructed − …"
    assert twins.title == "Constructed vs random-weight twins (check 6)"
    assert RANDOM_BACKBONE_NOTE not in render_report(r)
    _, texts = section(_two_seeds())  # the tiny random backbone: the note stays
    assert RANDOM_BACKBONE_NOTE in texts
