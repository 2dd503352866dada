"""Verdict check 6, selective vs S random-weight twins: the rank rule and the paired interval
(PROTOCOL.md §7.6), its level statement, the random/constructed backbone, the twin guards."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ipi.evaluation.verdict import (
    CLAIM_DETECTS,
    CLAIM_SEPARATES,
    FAIL,
    NOT_RUN,
    PASS,
    selectivity_check,
    twins_for_level,
    verdict,
)
from ipi.metrics.compare import compare_tables
from ipi.metrics.twins import twin_guards
from tests.evaluation.test_verdict import _iv, _results


def test_check6_passes_only_when_every_control_beats_every_twin():
    c = selectivity_check(_results(), pretrained=True)
    assert c["id"] == 6 and c["status"] == PASS
    assert "c_scrambled: E3 0.700 vs twins max 0.595 (0 of 19 at or above: rank p 0.050)" in c["detail"]
    assert "c_scrambled: E3 - mean twin E3 0.150 paired CI [0.080, 0.250]: CI low 0.080 > 0" in c["detail"]
    assert c["detail"].endswith("(rank test level 1/(S+1) = 0.050 with S = 19 twins)")
    assert verdict(_results())["claim"] == CLAIM_DETECTS  # pretrained unknown (a score table): not capped


def test_check6_rank_part_would_pass_wrongly_on_a_twin_at_or_above():
    # the paired interval alone is above 0, but one twin seed's E3 ties the trained one's
    r = _results()
    r["random_twin"]["by_seed"]["7"]["e3"]["c_imperative"] = _iv(0.75, 0.6, 0.85)
    v = verdict(r, pretrained=True)
    assert v["checks"][5]["status"] == FAIL and v["claim"] == CLAIM_SEPARATES
    assert "c_imperative: E3 0.750 vs twins max 0.750 (1 of 19 at or above: rank p 0.100)" in v["checks"][5]["detail"]


def test_check6_interval_part_would_pass_wrongly_on_rank_alone():
    r = _results()
    r["differences"]["e3_minus_mean_twin_e3"]["c_scrambled"] = _iv(0.02, -0.01, 0.05)
    c = selectivity_check(r, pretrained=True)
    assert c["status"] == FAIL and "CI low -0.010 <= 0" in c["detail"]


def test_check6_states_a_weaker_level_with_fewer_twins():
    c = selectivity_check(_results(s=3), pretrained=True)
    assert c["status"] == PASS
    assert "(rank test level 1/(S+1) = 0.250 with S = 3 twins; fewer twins than level 0.05 needs (19" in c["detail"]
    assert twins_for_level(0.05) == 19 and twins_for_level(0.1) == 9


def test_check6_random_backbone_caps_the_claim_and_constructed_does_not():
    v = verdict(_results(), pretrained=False)
    assert [c["status"] for c in v["checks"]] == [PASS] * 5 + [FAIL]
    assert v["claim"] == CLAIM_SEPARATES and "backbone.pretrained=false" in v["checks"][5]["detail"]
    r = _results()
    del r["random_twin"]
    assert selectivity_check(r, pretrained=False)["status"] == FAIL  # no twin spent: capped anyway
    # a constructed backbone (planted truth, random weights by construction) is judged with its twins
    v = verdict(_results(), pretrained=False, constructed=True)
    assert v["checks"][5]["status"] == PASS and v["claim"] == CLAIM_DETECTS
    assert "planted truth, not a model of any agent" in v["checks"][5]["detail"]
    assert "constructed backbone" in v["claim_note"]


def test_check6_not_run_without_twins_or_with_a_guard():
    r = _results()
    del r["random_twin"]
    assert selectivity_check(r, pretrained=True)["status"] == NOT_RUN
    r = _results()
    r["random_twin"]["guards"] = ["twin seeds 1 and 3: identical scores (one network counted twice)"]
    c = selectivity_check(r, pretrained=True)
    assert c["status"] == NOT_RUN and "seeds 1 and 3" in c["detail"]
    r = _results()
    del r["differences"]["e3_minus_mean_twin_e3"]["c_scrambled"]
    assert selectivity_check(r, pretrained=True)["status"] == NOT_RUN


# ---------------------------------------------------------------------------------------------
# Twin guards (issue 22): each with the input that would pass wrongly and one that should pass
# ---------------------------------------------------------------------------------------------


def _table(rng, n_traj=16, shift=1.5):
    rows = []
    for t in range(n_traj):
        for s in range(int(rng.integers(3, 8))):
            base = rng.normal(0, 1)
            rows.append((f"t{t:02d}", s, "clean", base + rng.normal(0, 1)))
            rows.append((f"t{t:02d}", s, "attack", base + shift + rng.normal(0, 1)))
            for c in ("c_scrambled", "c_imperative"):
                rows.append((f"t{t:02d}", s, c, base + 0.3 * shift + rng.normal(0, 1)))
    return pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])


def _twins(main, rng, n=3):
    out = {}
    for s in range(1, n + 1):
        t = main[["trajectory_id", "step", "variant"]].copy()
        t["score"] = rng.normal(0, 1, len(t))
        out[str(s)] = t
    return out


def test_twin_guard_identical_seeds():
    rng = np.random.default_rng(0)
    main = _table(rng)
    twins = _twins(main, rng)
    assert twin_guards(main, twins) == []  # distinct seeds: judged
    twins["3"] = twins["1"].copy()  # a byte-identical copy of seed 1: zero seed variation
    reasons = twin_guards(main, twins)
    assert len(reasons) == 1 and "seeds 1 and 3" in reasons[0] and "counted twice" in reasons[0]


def test_twin_guard_constant_twin_and_main_copy():
    rng = np.random.default_rng(1)
    main = _table(rng)
    twins = _twins(main, rng)
    twins["2"]["score"] = 0.25
    twins["3"] = main.copy()
    reasons = twin_guards(main, twins)
    assert any("seed 2" in r and "same score" in r for r in reasons)
    assert any("seed 3" in r and "identical to the trained" in r for r in reasons)


def test_twin_guard_rows_differ_from_main_reaches_the_verdict():
    rng = np.random.default_rng(2)
    main = _table(rng)
    twins = {k: v for k, v in _twins(main, rng, n=19).items()}
    full = compare_tables(main, {}, twins=twins, n_boot=200).to_dict()
    assert full["random_twin"]["guards"] == []
    assert "rank test level" in selectivity_check(full, pretrained=True)["detail"]
    keep = main.trajectory_id.isin(sorted(set(main.trajectory_id))[:8]).to_numpy()
    twins["1"] = twins["1"][keep].reset_index(drop=True)  # scores only half the trajectories
    part = compare_tables(main, {}, twins=twins, n_boot=200).to_dict()
    (reason,) = part["random_twin"]["guards"]
    assert "seed 1" in reason and "rows differ" in reason
    c = selectivity_check(part, pretrained=True, min_clusters=5)
    assert c["status"] == NOT_RUN and "rows differ" in c["detail"]


def test_mean_twin_difference_is_paired_on_the_shared_draws():
    rng = np.random.default_rng(3)
    main = _table(rng)
    twins = _twins(main, rng, n=4)
    out = compare_tables(main, {}, twins=twins, n_boot=300, interval="percentile").to_dict()
    d = out["differences"]["e3_minus_mean_twin_e3"]["c_scrambled"]
    mean_twin = np.mean([out["random_twin"]["by_seed"][k]["e3"]["c_scrambled"]["estimate"] for k in twins])
    assert d["estimate"] == pytest.approx(out["e3"]["c_scrambled"]["estimate"] - mean_twin, abs=1e-12)
    p = out["p_values"]["e3_minus_mean_twin_e3"]["c_scrambled"]
    assert 1 / 301 <= p <= 1.0
