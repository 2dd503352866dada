"""Verdict check 6, selective vs the random-weight twins (docs/estimands.md)."""

from __future__ import annotations

from ipi.evaluation.verdict import CLAIM_DETECTS, CLAIM_SEPARATES, FAIL, NOT_RUN, PASS, selectivity_check, verdict

# ---------------------------------------------------------------------------------------------
# Verdict check 6
# ---------------------------------------------------------------------------------------------


def _iv(est, lo, hi):
    return {"estimate": est, "ci_low": lo, "ci_high": hi, "n_boot_used": 1000}


def _pred(est, lo, hi, n_seeds=3):
    return {**_iv(est, lo, hi), "twin_mean": 0.5, "seed_sd": 0.01, "seed_half_width": 0.05, "n_seeds": n_seeds}


def _results(diff_scr=(0.2, 0.1, 0.3), diff_imp=(0.25, 0.1, 0.3), pred_scr=(0.2, 0.08, 0.32),
             pred_imp=(0.25, 0.09, 0.31), seeds=("1", "2", "3")):
    return {
        "e1": _iv(0.85, 0.71, 0.93), "e2": _iv(0.8, 0.7, 0.9),
        "e3": {"c_scrambled": _iv(0.7, 0.6, 0.8), "c_imperative": _iv(0.75, 0.65, 0.85)},
        "c1": {"e1": _iv(0.7, 0.6, 0.8)}, "collapse_only": {"e1": _iv(0.55, 0.5, 0.58)},
        "permutation": {"m": 199, "e1": 0.85, "null_mean": 0.5, "null_sd": 0.04, "null_q025": 0.42,
                        "null_q975": 0.58, "p_value": 0.005, "alpha": 0.05, "tolerance": 0.02, "n_ge": 0},
        "random_twin": {"e1": _iv(0.8, 0.7, 0.9), "e2": _iv(0.8, 0.7, 0.9),
                        "e3": {"c_scrambled": _iv(0.5, 0.4, 0.6), "c_imperative": _iv(0.5, 0.4, 0.6)},
                        "seeds": list(seeds)},
        "differences": {"e1_minus_c1_e1": _iv(0.15, 0.05, 0.25), "e1_minus_twin_e1": _iv(0.05, -0.02, 0.1),
                        "e3_minus_twin_e3": {"c_scrambled": _iv(*diff_scr), "c_imperative": _iv(*diff_imp)},
                        "e3_minus_twin_e3_predictive": {"c_scrambled": _pred(*pred_scr, n_seeds=len(seeds)),
                                                        "c_imperative": _pred(*pred_imp, n_seeds=len(seeds))}},
    }


def test_check6_passes_only_when_every_control_beats_the_twin():
    c = selectivity_check(_results(), pretrained=True)
    assert c["id"] == 6 and c["status"] == PASS
    assert ("c_scrambled: E3 0.700 vs max twin (3 seeds) 0.500, E3 - max twin (3 seeds) E3 0.200 paired CI "
            "[0.100, 0.300]: CI low 0.100 > 0") in c["detail"]
    assert verdict(_results(), pretrained=True)["claim"] == CLAIM_DETECTS
    assert verdict(_results())["claim"] == CLAIM_DETECTS  # pretrained unknown (a score table): not capped
    # One control's interval reaching 0 is enough to withhold "detects" (E1 − twin E1 is not used).
    r = _results(diff_imp=(0.02, -0.01, 0.05))
    v = verdict(r, pretrained=True)
    assert v["checks"][5]["status"] == FAIL and v["claim"] == CLAIM_SEPARATES
    assert ("c_imperative: E3 0.750 vs max twin (3 seeds) 0.500, E3 - max twin (3 seeds) E3 0.020 paired CI "
            "[-0.010, 0.050]: CI low -0.010 <= 0") in v["checks"][5]["detail"]


def test_check6_random_backbone_caps_the_claim_and_says_why():
    v = verdict(_results(), pretrained=False)
    assert [c["status"] for c in v["checks"]] == [PASS] * 5 + [FAIL]
    assert v["claim"] == CLAIM_SEPARATES
    assert "backbone.pretrained=false" in v["checks"][5]["detail"] and "at most" in v["checks"][5]["detail"]
    r = _results()
    del r["random_twin"]
    assert selectivity_check(r, pretrained=False)["status"] == FAIL


def test_check6_not_run_without_twin_or_with_undefined_difference():
    r = _results()
    del r["random_twin"], r["differences"]["e3_minus_twin_e3"]
    c = selectivity_check(r, pretrained=True)
    assert c["status"] == NOT_RUN and "evaluation.random_twin=false" in c["detail"]
    assert verdict(r, pretrained=True)["claim"] == CLAIM_SEPARATES  # never "detects" without the twin
    r = _results(diff_scr=(None, None, None))
    assert selectivity_check(r, pretrained=True)["status"] == NOT_RUN
    r = _results(diff_scr=(None, None, None), diff_imp=(0.0, -0.1, 0.1))
    assert selectivity_check(r, pretrained=True)["status"] == FAIL  # a defined failure wins


def test_check6_needs_the_seed_predictive_interval_above_zero_too():
    """Beating the S observed twins is not enough: a new random draw (init-seed variance) too."""
    assert "c_scrambled: E3 - mean twin E3 0.200, seed-predictive CI [0.080, 0.320] (init-seed SD 0.010 over 3 " \
        "seeds): CI low 0.080 > 0" in selectivity_check(_results(), pretrained=True)["detail"]
    r = _results(pred_imp=(0.25, -0.02, 0.52))  # the envelope still passes on both controls
    c = selectivity_check(r, pretrained=True)
    assert c["status"] == FAIL
    assert "c_imperative: E3 - mean twin E3 0.250, seed-predictive CI [-0.020, 0.520]" in c["detail"]
    assert "the half-width is 5.00 twin SDs with 3 seeds (more evaluation.random_twin_seeds" in c["detail"]
    assert verdict(r, pretrained=True)["claim"] == CLAIM_SEPARATES
    assert c["numbers"]["c_imperative"]["difference_seed_predictive"]["ci_low"] == -0.02


def test_check6_one_twin_seed_cannot_pass():
    c = selectivity_check(_results(seeds=("1",)), pretrained=True)
    assert c["status"] == FAIL and "needs >= 2 evaluation.random_twin_seeds" in c["detail"]


def test_check6_without_the_seed_predictive_interval_is_not_run():
    """A results.json written before the seed-predictive interval existed licenses nothing new."""
    r = _results()
    del r["differences"]["e3_minus_twin_e3_predictive"]
    c = selectivity_check(r, pretrained=True)
    assert c["status"] == NOT_RUN and "seed-predictive) interval missing" in c["detail"]
