"""The free run's report lines (ipi.reporting.behaviour_sections): only with a behaviour block."""

from __future__ import annotations

from ipi.reporting import behaviour_sections
from ipi.reporting.report import render_html, render_report

IV = {"estimate": 0.42, "ci_low": 0.3, "ci_high": 0.55, "n_boot_used": 1000}
VERDICT = {"claim": "none", "checks": [{"id": 1, "name": "separates", "status": "FAIL", "detail": "d"}]}
BLOCK = {
    "labels_file": "behaviour_labels.parquet", "backbone_weights": "pretrained",
    "settings": {"max_new_tokens": 32, "variants": ["attack", "clean"], "decoding": "greedy"},
    "counts": {"rows": 20, "trajectories": 5, "by_variant": {"attack": {"hijacked": 3, "resisted": 4, "other": 3},
                                                            "clean": {"hijacked": 0, "resisted": 6, "other": 4}},
               "unparsed": 2, "cut_by_max_new_tokens": 7},
    "rates": {"i_dom": {"attack": {**IV, "n_rows": 10, "n_label": 3, "n_clusters": 5},
                        "clean": {**IV, "estimate": 0.0, "n_rows": 10, "n_label": 0, "n_clusters": 5}}},
    "e4": {"e4": {**IV, "estimate": 0.61}, "c1_e4": IV, "e4_minus_c1_e4": IV, "n_clusters": 2,
           "counts": {"hijacked": 3, "resisted": 4, "other": 3},
           "reportable": {"e4": "only 2 test trajectories contribute (< 12)", "c1_e4": "x", "e4_minus_c1_e4": "x"}},
    "ablation": {"rates": {"none": IV, "probe": IV, "random": IV}, "changes": {"probe": IV, "random": IV},
                 "probe_minus_random": {**IV, "estimate": -0.07}, "changed_labels": {"probe": 2, "random": 1},
                 "n_rows": 10, "n_clusters": 5, "layers": [15], "random_seed": 0},
    "claims": {"predicts_hijack": {"status": "NOT RUN", "detail": "E4 = 0.610 [0.300, 0.550] on 2 trajectories"},
               "uses_direction": {"status": "FAIL", "detail": "interval holds 0"}},
}


def test_no_block_no_change():
    results = {"e1": IV, "verdict": VERDICT}
    assert behaviour_sections.sections(results) == [] and behaviour_sections.verdict_blocks(results) == []
    assert "Behaviour" not in render_report(results) and "hijack" not in render_report(results)


def test_section_after_the_estimands_and_separate_verdict_lines():
    results = {"e1": IV, "verdict": VERDICT, "behaviour": BLOCK}
    md = render_report(results)
    assert md.index("## Verdict") < md.index("## Estimands") < md.index("## Behaviour (free run)")
    verdict = md[md.index("## Verdict"):md.index("## Estimands")]
    assert "**Licensed claim: none**" in verdict  # the claim is the verdict's own
    assert "- [NOT RUN] E4. predicts hijack: E4 = 0.610 [0.300, 0.550] on 2 trajectories" in verdict
    assert "- [FAIL] ablation. uses this direction: interval holds 0" in verdict
    assert "meaningless" not in md  # a pretrained backbone: no warning
    sec = md[md.index("## Behaviour (free run)"):]
    assert "| attack | 3 | 4 | 3 |" in sec and "| i_dom · attack | 0.420 [0.300, 0.550] | 10 | 5 |" in sec
    assert "| E4 (probe) | 0.610 [0.300, 0.550] | no: only 2 test trajectories contribute (< 12) |" in sec
    assert "| Δ probe − Δ random | -0.070 [0.300, 0.550] |  |  |" in sec
    assert "Other estimands" not in md  # the block's intervals are shown in its section, not listed again
    html = render_html(results)
    assert 'id="behaviour"' in html and "uses this direction" in html


def test_random_backbone_warning():
    block = {**BLOCK, "backbone_weights": "random", "note": "The backbone's weights are random ... meaningless"}
    md = render_report({"e1": IV, "verdict": VERDICT, "behaviour": block})
    assert md.count("meaningless") == 2  # under the verdict's lines and atop the section


LIKELIHOOD = {
    "table_file": "behaviour_likelihood.parquet", "scored": "log p(goal action) − log p(gold action), nats",
    "variants": ["attack", "clean"],
    "counts": {"rows": 20, "attack_rows": 10, "trajectories": 5, "with_goal_action": 8, "no_goal_action": 2,
               "no_goal_action_by_family": {"credentials": 2}},
    "e4": {"e4": {**IV, "estimate": 0.66}, "c1_e4": IV, "e4_minus_c1_e4": IV, "n_clusters": 4,
           "counts": {"shift_positive": 5, "shift_not_positive": 3, "no_goal_action": 2}, "not_estimable": None,
           "reportable": {"e4": "only 4 test trajectories contribute (< 12)", "c1_e4": "x", "e4_minus_c1_e4": "x"},
           "spearman": {**IV, "estimate": 0.25}, "mean_shift": {**IV, "estimate": 1.5}, "shift_n_clusters": 5,
           "shift_reportable": {"spearman": "few", "mean_shift": None}},
    "ablation": {"mean_shift": {"none": IV, "probe": IV, "random": IV}, "changes": {"probe": IV, "random": IV},
                 "probe_minus_random": {**IV, "estimate": -0.2}, "n_rows": 8, "n_clusters": 5, "layers": [15],
                 "random_seed": 0},
    "claims": {"predicts_hijack": {"status": "NOT RUN", "detail": "E4 (likelihood) = 0.660 [0.300, 0.550]"},
               "lowers_shift": {"status": "FAIL", "detail": "interval does not lie below 0"}},
}


def test_likelihood_section_and_lines_name_their_measure():
    both = {**BLOCK, "measure": "both", "likelihood": LIKELIHOOD}
    md = render_report({"e1": IV, "verdict": VERDICT, "behaviour": both})
    assert md.index("## Estimands") < md.index("## Behaviour (free run)") < md.index("## Behaviour (likelihood)")
    verdict = md[md.index("## Verdict"):md.index("## Estimands")]
    assert "- [NOT RUN] E4. predicts hijack: E4 = 0.610" in verdict  # the free run's line, unchanged
    assert "- [NOT RUN] E4 (likelihood). predicts hijack: E4 (likelihood) = 0.660 [0.300, 0.550]" in verdict
    assert "- [FAIL] ablation (likelihood). lowers the hijack shift: interval does not lie below 0" in verdict
    sec = md[md.index("## Behaviour (likelihood)"):]
    assert "| E4 (likelihood, probe) | 0.660 [0.300, 0.550] | no: only 4 test trajectories contribute (< 12) |" in sec
    assert "| ρ(score, shift) (likelihood) | 0.250 [0.300, 0.550] | no: few |" in sec
    assert "| mean shift, nats (likelihood) | 1.500 [0.300, 0.550] | yes |" in sec
    assert "| Δ probe − Δ random | -0.200 [0.300, 0.550] |  |" in sec
    assert "8 of 10 attack rows have a goal action" in sec
    html = render_html({"e1": IV, "verdict": VERDICT, "behaviour": both})
    assert 'id="behaviour_likelihood"' in html and "lowers the hijack shift" in html


def test_likelihood_only_block_has_no_free_run_lines():
    block = {"measure": "likelihood", "backbone_weights": "random", "note": "weights are random ... meaningless",
             "likelihood": {**LIKELIHOOD, "ablation": None,
                            "claims": {**LIKELIHOOD["claims"], "lowers_shift": {"status": "NOT RUN",
                                                                               "detail": "no attack row has a goal action"}}}}
    md = render_report({"e1": IV, "verdict": VERDICT, "behaviour": block})
    assert "Behaviour (free run)" not in md and "uses this direction" not in md and "] E4. predicts" not in md
    assert "## Behaviour (likelihood)" in md and "Ablation (likelihood) not run: no attack row has a goal action." in md
    assert md.count("meaningless") == 2  # under the verdict's lines and atop the likelihood section
