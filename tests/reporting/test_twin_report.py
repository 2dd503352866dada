"""The report's trained-vs-twins tables (every seed, the envelope, per-seed differences)."""

from __future__ import annotations

from ipi.evaluation.verdict import verdict
from ipi.reporting.report import render_html, render_report
from tests.evaluation.test_verdict import _iv, _results as _results_19


def _results():
    r = _results_19(s=2)
    r["differences"]["e3_minus_twin_e3"] = {"c_scrambled": _iv(0.2, 0.1, 0.3), "c_imperative": _iv(0.25, 0.1, 0.3)}
    r["differences"]["e3_minus_twin_e3_predictive"] = {"c_scrambled": _iv(0.2, 0.08, 0.32),
                                                       "c_imperative": _iv(0.25, 0.09, 0.31)}
    r["random_twin"]["e3"] = {"c_scrambled": _iv(0.5, 0.4, 0.6), "c_imperative": _iv(0.5, 0.4, 0.6)}
    return r

def test_report_shows_trained_every_twin_seed_and_the_envelope():
    r = _results()
    r["random_twin"]["seeds"] = ["1", "2"]
    r["random_twin"]["by_seed"] = {
        "1": {"e1": _iv(0.8, 0.7, 0.9), "e2": _iv(0.8, 0.7, 0.9),
              "e3": {"c_scrambled": _iv(0.5, 0.4, 0.6), "c_imperative": _iv(0.45, 0.4, 0.6)}},
        "2": {"e1": _iv(0.7, 0.6, 0.8), "e2": _iv(0.7, 0.6, 0.8),
              "e3": {"c_scrambled": _iv(0.42, 0.4, 0.6), "c_imperative": _iv(0.5, 0.4, 0.6)}}}
    r["differences"]["e3_minus_twin_e3_by_seed"] = {
        "1": {"c_scrambled": _iv(0.2, 0.1, 0.3), "c_imperative": _iv(0.3, 0.2, 0.4)},
        "2": {"c_scrambled": _iv(0.28, 0.2, 0.35), "c_imperative": _iv(0.25, 0.1, 0.3)}}
    r["verdict"] = verdict(r, pretrained=False)
    r["run"] = {"surface": "i_dom", "random_twin": {"seeds": [1, 2], "backbone_pretrained": False}}
    md = render_report(r)
    assert ("| estimand | trained [95% CI] | twin seed 1 [95% CI] | twin seed 2 [95% CI] | max over twin seeds "
            "[95% CI] | trained − max over twin seeds, paired [95% CI] | trained − new twin, seed-predictive "
            "[95% CI] |") in md
    assert ("| E3 attack vs c_scrambled | 0.700 [0.600, 0.800] | 0.500 [0.400, 0.600] | 0.420 [0.400, 0.600] | "
            "0.500 [0.400, 0.600] | 0.200 [0.100, 0.300] | 0.200 [0.080, 0.320] |") in md
    assert "| E2 paired step |" in md and "seed-predictive CI of E3 − mean twin E3 above 0" in md
    assert "| E2 paired step | 0.800 [0.700, 0.900] | 0.800 [0.700, 0.900] | 0.700 [0.600, 0.800] | 0.800" in md
    assert "| E3 attack vs c_imperative | 0.300 [0.200, 0.400] | 0.250 [0.100, 0.300] |" in md  # per-seed diffs
    assert "backbone.pretrained=false" in md and "2 random-weight twins (seeds 1, 2)" in md and "1/3" in md
    html = render_html(r)
    assert "trained − max over twin seeds, paired [CI]" in html and "0.200 [0.100, 0.300]" in html
    assert "trained − twin seed 2, paired [CI]" in html
    r["run"]["random_twin"] = None  # twin off: no table, no error
    del r["random_twin"]
    assert "random-weight twin (check 6)" not in render_report(r)


def test_report_says_a_constructed_backbone_is_planted_truth():
    r = _results_19()
    r["verdict"] = verdict(r, pretrained=False, constructed=True)
    r["run"] = {"surface": "i_dom", "backbone_weights": "constructed"}
    md, html = render_report(r), render_html(r)
    assert r["verdict"]["claim"] == "detects malicious content"  # not capped: judged against its twins
    for text in (md, html):
        assert "Constructed backbone (backbone.constructed=true)" in text and "not a model of any agent" in text
    r["run"]["backbone_weights"] = "pretrained"
    assert "Constructed backbone" not in render_report(r)
