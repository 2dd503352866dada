"""Verdict check 6, selective vs S random-weight twins: the rank rule and the paired interval
(PROTOCOL.md §7.6), NOT RUN below the twins its level needs, the random/constructed backbone, the
twin guards (copies, noisy copies, constant twins, rows differing)."""

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
    twins_for_level,
)
from ipi.metrics.compare import compare_tables
from ipi.metrics.twins import DISTINCT_MAX_RANK_CORRELATION, rank_correlations, twin_guards
from tests.conftest import check_of, run_verdict
from tests.evaluation.test_verdict import _iv, _results


def _six(results, **settings) -> dict:
    return check_of(run_verdict(results, **settings), 6)


def test_check6_passes_only_when_every_control_beats_every_twin():
    c = _six(_results(), pretrained=True)
    assert c["status"] == PASS
    assert ("c_scrambled: E3 point estimate 0.700 vs twins' max 0.595 (0 of 19 at or above: rank p 0.050)"
            in c["detail"])
    assert "c_scrambled: E3 - mean twin E3 0.150 paired CI [0.080, 0.250]: CI low 0.080 > 0" in c["detail"]
    assert c["detail"].endswith("(S = 19 twins: rank level 1/(S+1) = 0.050)")
    assert "S >= 19 distinct twins for level 0.05" in c["rule"]
    assert run_verdict(_results())["claim"] == CLAIM_DETECTS  # pretrained unknown (a score table): not capped


def test_check6_rank_part_would_pass_wrongly_on_a_twin_at_or_above():
    # the paired interval alone is above 0, but one twin seed's E3 ties the trained one's
    r = _results()
    r["random_twin"]["by_seed"]["7"]["e3"]["c_imperative"] = _iv(0.75, 0.6, 0.85)
    v = run_verdict(r, pretrained=True)
    assert check_of(v, 6)["status"] == FAIL and v["claim"] == CLAIM_SEPARATES
    assert ("c_imperative: E3 point estimate 0.750 vs twins' max 0.750 (1 of 19 at or above: rank p 0.100)"
            in check_of(v, 6)["detail"])


def test_check6_interval_part_would_pass_wrongly_on_rank_alone():
    r = _results()
    r["differences"]["e3_minus_mean_twin_e3"]["c_scrambled"] = _iv(0.02, -0.01, 0.05)
    c = _six(r, pretrained=True)
    assert c["status"] == FAIL and "CI low -0.010 <= 0" in c["detail"]


@pytest.mark.parametrize("s", [1, 3, 5, 10, 18])
def test_check6_is_not_run_below_the_twins_the_level_needs(s):
    # every part would pass (the trained E3 beats all S twins, the paired CI is above 0): with S < 19
    # the rank level 1/(S+1) is above 0.05, so the check decides nothing and "detects" is not licensed
    v = run_verdict(_results(s=s), pretrained=True)
    c = check_of(v, 6)
    assert c["status"] == NOT_RUN and v["claim"] == CLAIM_SEPARATES
    assert f"S = {s} twins: the rank test's level 1/(S+1) = {1 / (s + 1):.3f} is above 0.05" in c["detail"]
    assert "needs at least 19 twins" in c["detail"]
    assert c["numbers"]["twins_needed"] == 19 and c["numbers"]["level_bound"] == pytest.approx(1 / (s + 1))
    # a failing part below the need is not a FAIL either: nothing is decided with too few twins
    r = _results(s=s)
    r["differences"]["e3_minus_mean_twin_e3"]["c_scrambled"] = _iv(-0.1, -0.2, 0.0)
    assert _six(r, pretrained=True)["status"] == NOT_RUN
    # the level is the run's: at twin_level 1/(S+1) the same S is enough
    assert _six(_results(s=s), pretrained=True, twin_level=1 / (s + 1))["status"] == PASS
    assert twins_for_level(0.05) == 19 and twins_for_level(0.1) == 9 and twins_for_level(1 / (s + 1)) == s


def test_check6_passes_at_exactly_the_twins_the_level_needs():
    assert _six(_results(s=19), pretrained=True)["status"] == PASS
    assert _six(_results(s=25), pretrained=True)["status"] == PASS


def test_check6_random_backbone_caps_the_claim_and_constructed_does_not():
    v = run_verdict(_results(), pretrained=False)
    assert [c["status"] for c in v["checks"]] == [PASS] * 6 + [FAIL]
    assert v["claim"] == CLAIM_SEPARATES and "backbone.pretrained=false" in check_of(v, 6)["detail"]
    r = _results()
    del r["random_twin"]
    assert _six(r, pretrained=False)["status"] == FAIL  # no twin spent: capped anyway
    # a constructed backbone (planted truth, random weights by construction) is judged with its twins
    v = run_verdict(_results(), pretrained=False, constructed=True)
    assert check_of(v, 6)["status"] == PASS and v["claim"] == CLAIM_DETECTS
    assert "planted truth, not a model of any agent" in check_of(v, 6)["detail"]
    assert "constructed backbone" in v["claim_note"]


def test_check6_not_run_without_twins_or_with_a_guard():
    r = _results()
    del r["random_twin"]
    assert _six(r, pretrained=True)["status"] == NOT_RUN
    r = _results()
    r["random_twin"]["guards"] = ["twin seeds 1 and 3: their scores agree beyond what distinct random "
                                  "initialisations give"]
    c = _six(r, pretrained=True)
    assert c["status"] == NOT_RUN and "seeds 1 and 3" in c["detail"]
    r = _results()
    del r["differences"]["e3_minus_mean_twin_e3"]["c_scrambled"]
    assert _six(r, pretrained=True)["status"] == NOT_RUN


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


@pytest.mark.parametrize("noise", [1e-9, 1e-4, 1e-2, 0.05])
def test_twin_guard_copies_with_numeric_noise(noise):
    # the same twin scores under 19 seed labels with small numeric noise (a seed never applied):
    # exact equality misses them, the rank agreement does not, and every pair is named
    rng = np.random.default_rng(4)
    main = _table(rng)
    one = _twins(main, rng, n=1)["1"]
    twins = {str(k): one.assign(score=one.score + rng.normal(0, noise * one.score.std(), len(one)))
             for k in range(1, 20)}
    reasons = twin_guards(main, twins)
    assert len(reasons) == 19 * 18 // 2
    assert any("seeds 1 and 19" in r and "beyond what distinct random initialisations give" in r for r in reasons)
    res = compare_tables(main, {}, twins=twins, n_boot=100).to_dict()
    assert res["random_twin"]["guards"] == reasons


def test_twin_guard_passes_distinct_twins_that_share_the_signal():
    # distinct random networks on the same rows share the rows' structure (step and trajectory
    # effects, a length signal) and so correlate, but far below one network counted twice
    rng = np.random.default_rng(5)
    main = _table(rng)
    shared = rng.normal(0, 1, len(main)) + 1.5 * (main.variant == "attack").to_numpy()
    twins = {str(k): main[["trajectory_id", "step", "variant"]].assign(score=shared + rng.normal(0, 0.35, len(main)))
             for k in range(1, 20)}
    assert twin_guards(main, twins) == []
    rho = rank_correlations({k: t.score.to_numpy() for k, t in twins.items()})
    assert 0.8 < max(rho.values()) < DISTINCT_MAX_RANK_CORRELATION


def test_twin_guard_constant_twin_and_main_copy():
    rng = np.random.default_rng(1)
    main = _table(rng)
    twins = _twins(main, rng)
    twins["2"]["score"] = 0.25
    twins["3"] = main.copy()
    twins["4"] = main.assign(score=main.score * 2.0 + 1e-3 * rng.normal(0, 1, len(main)))  # rescaled, noisy copy
    twins["5"] = twins["1"].assign(score=-twins["1"].score)  # a sign-flipped copy of seed 1
    twins["6"] = main.assign(score=-main.score)  # the trained backbone read backwards
    reasons = twin_guards(main, twins)
    assert any("seeds 1 and 5" in r and "counted twice" in r for r in reasons)
    assert any("seed 6" in r and "agree with the trained backbone's" in r for r in reasons)
    assert any("seed 2" in r and "same score" in r for r in reasons)
    assert any("seed 3" in r and "agree with the trained backbone's" in r for r in reasons)
    assert any("seed 4" in r and "agree with the trained backbone's" in r for r in reasons)


def test_twin_guard_rows_differ_from_main_reaches_the_verdict():
    rng = np.random.default_rng(2)
    main = _table(rng)
    twins = {k: v for k, v in _twins(main, rng, n=19).items()}
    full = compare_tables(main, {}, twins=twins, n_boot=200).to_dict()
    assert full["random_twin"]["guards"] == []
    assert "rank level 1/(S+1) = 0.050" in _six(full, pretrained=True)["detail"]
    keep = main.trajectory_id.isin(sorted(set(main.trajectory_id))[:8]).to_numpy()
    twins["1"] = twins["1"][keep].reset_index(drop=True)  # scores only half the trajectories
    part = compare_tables(main, {}, twins=twins, n_boot=200).to_dict()
    (reason,) = part["random_twin"]["guards"]
    assert "seed 1" in reason and "rows differ" in reason
    c = _six(part, pretrained=True, min_clusters=5)
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
