"""The random-weight twins' estimands on the shared draws: per seed and the envelope (max over seeds)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from ipi.metrics import evaluate_tables, make_draws

# ---------------------------------------------------------------------------------------------
# Estimands: the twin on the shared draws
# ---------------------------------------------------------------------------------------------


def _table(seed: int, shift_clean: float, shift_ctrl: float, n_traj: int = 12) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(n_traj):
        for s in range(3):
            rows.append((f"t{t:02d}", s, "clean", rng.normal()))
            rows.append((f"t{t:02d}", s, "attack", rng.normal() + shift_clean))
            rows.append((f"t{t:02d}", s, "c_scrambled", rng.normal() + shift_clean - shift_ctrl))
            if s != 2:
                rows.append((f"t{t:02d}", s, "c_imperative", rng.normal() + shift_clean - shift_ctrl))
    return pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])


def _e3_replicates(table: pd.DataFrame, control: str, draws) -> np.ndarray:
    """E3[control] on every bootstrap draw, by scikit-learn (rows of steps that have the control)."""
    both = table.groupby(["trajectory_id", "step"]).variant.transform(lambda v: (v == control).any())
    sub = table[table.variant.isin(["attack", control]) & both]
    col = draws.columns(sub.trajectory_id)
    y = (sub.variant == "attack").astype(int).to_numpy()
    return np.array([roc_auc_score(y, sub.score, sample_weight=draws.multiplicity[b, col])
                     for b in range(draws.n_boot)])


def test_twin_differences_are_paired_on_the_shared_draws():
    """E3 − twin E3 per seed and against the envelope (max over seeds per draw): recomputed with
    scikit-learn on the documented draws (paired replicates)."""
    main, twin, twin2 = _table(0, 1.5, 1.0), _table(1, 1.5, 0.3), _table(2, 1.5, 0.6)
    out = evaluate_tables(main, {}, n_boot=300, seed=3, twins={7: twin, 9: twin2}, interval="percentile")
    draws = make_draws(main.trajectory_id, n_boot=300, seed=3)

    def reps(table, control):
        return _e3_replicates(table, control, draws)

    def auc(table, control):
        sub = table[table.variant.isin(["attack", control])]
        both = sub.groupby(["trajectory_id", "step"]).variant.transform("nunique") == 2
        return roc_auc_score((sub.variant[both] == "attack").astype(int), sub.score[both])

    assert out["random_twin"]["seeds"] == ["7", "9"]
    for c in ("c_scrambled", "c_imperative"):
        r_main, r7, r9 = reps(main, c), reps(twin, c), reps(twin2, c)
        for seed, r_tw in (("7", r7), ("9", r9)):  # each seed's own paired difference
            iv = out["differences"]["e3_minus_twin_e3_by_seed"][seed][c]
            lo, hi = np.quantile(r_main - r_tw, [0.025, 0.975])
            assert iv["ci_low"] == pytest.approx(lo, abs=1e-9) and iv["ci_high"] == pytest.approx(hi, abs=1e-9)
        # The envelope: per draw the larger twin; the estimate is the larger twin estimate.
        env = out["random_twin"]["e3"][c]
        assert env["estimate"] == pytest.approx(max(auc(twin, c), auc(twin2, c)), abs=1e-12)
        d = r_main - np.maximum(r7, r9)
        iv = out["differences"]["e3_minus_twin_e3"][c]
        assert iv["estimate"] == pytest.approx(out["e3"][c]["estimate"] - env["estimate"])
        lo, hi = np.quantile(d, [0.025, 0.975])
        assert iv["ci_low"] == pytest.approx(lo, abs=1e-9) and iv["ci_high"] == pytest.approx(hi, abs=1e-9)
        # "CI low of E3 − envelope > 0" is "beats every seed on the same draws": never weaker
        # than any one seed's paired CI low.
        assert iv["ci_low"] <= min(out["differences"]["e3_minus_twin_e3_by_seed"][s][c]["ci_low"] for s in ("7", "9"))
    # Each twin's own estimands are those of its table alone on the same draws.
    alone = evaluate_tables(twin, {}, n_boot=300, seed=3, interval="percentile")
    assert out["random_twin"]["by_seed"]["7"] == {k: alone[k] for k in ("e1", "e2", "e3")}
    # One twin: the envelope is that twin.
    one = evaluate_tables(main, {}, n_boot=300, seed=3, twins={7: twin}, interval="percentile")
    assert {k: one["random_twin"][k] for k in ("e1", "e2", "e3")} == {k: alone[k] for k in ("e1", "e2", "e3")}
    # A twin whose scores equal the probe's: every paired difference is exactly 0, CI [0, 0].
    same = evaluate_tables(main, {}, n_boot=100, twins={1: main.copy()})
    for iv in [same["differences"]["e1_minus_twin_e1"], *same["differences"]["e3_minus_twin_e3"].values()]:
        assert (iv["estimate"], iv["ci_low"], iv["ci_high"]) == (0.0, 0.0, 0.0)
    # BCa: the envelope's jackknife is the per-value max too; the intervals are defined.
    bca = evaluate_tables(main, {}, n_boot=200, seed=3, interval="bca", twins={7: twin, 9: twin2})
    assert all(bca["differences"]["e3_minus_twin_e3"][c]["ci_low"] is not None for c in ("c_scrambled", "c_imperative"))
    with pytest.raises(TypeError, match="one table per twin seed"):
        evaluate_tables(main, {}, n_boot=10, twins=twin)


def test_seed_predictive_difference_recomputed_by_hand():
    """E3 − mean twin E3 ∓ t_{S−1,0.975}·sd·sqrt(1 + 1/S) (Student-t prediction interval of a new
    random draw on the same rows), its one-sided t p-value, and beside it the paired percentile
    interval of E3 − mean_s E3_s on the shared draws from scikit-learn replicates
    (docs/estimands.md, check 6)."""
    main = _table(0, 1.5, 1.0)
    twins = {7: _table(1, 1.5, 0.3), 9: _table(2, 1.5, 0.6), 11: _table(3, 1.5, 0.45)}
    out = evaluate_tables(main, {}, n_boot=300, seed=3, twins=twins)
    draws = make_draws(main.trajectory_id, n_boot=300, seed=3)
    t_2_0975 = 4.302652729911275  # Student t, 2 degrees of freedom, 97.5% (printed tables)

    for c in ("c_scrambled", "c_imperative"):
        est = [out["random_twin"]["by_seed"][s]["e3"][c]["estimate"] for s in ("7", "9", "11")]
        d = out["e3"][c]["estimate"] - np.mean(est)
        scale = np.std(est, ddof=1) * np.sqrt(1 + 1 / 3)
        h = t_2_0975 * scale
        iv = out["differences"]["e3_minus_twin_e3_predictive"][c]
        assert iv["estimate"] == pytest.approx(d, abs=1e-10) and iv["n_seeds"] == 3
        assert iv["seed_half_width"] == pytest.approx(h, rel=1e-9)
        assert (iv["ci_low"], iv["ci_high"]) == (pytest.approx(d - h, abs=1e-10), pytest.approx(d + h, abs=1e-10))
        # t with 2 d.f. has the closed-form survival function 1/2 − x / (2 sqrt(2 + x²))
        x = d / scale
        assert out["p_values"]["e3_minus_twin_e3_predictive"][c] == pytest.approx(0.5 - x / (2 * np.sqrt(2 + x * x)))
        mean_reps = np.mean([_e3_replicates(t, c, draws) for t in twins.values()], axis=0)
        lo, hi = np.quantile(_e3_replicates(main, c, draws) - mean_reps, [0.025, 0.975])
        assert (iv["data_ci_low"], iv["data_ci_high"]) == (pytest.approx(lo, abs=1e-9), pytest.approx(hi, abs=1e-9))
    assert "p_value" not in out["differences"]["e3_minus_twin_e3_predictive"]["c_scrambled"]
    # One seed: no SD, so no interval (check 6 then fails: docs/estimands.md).
    one = evaluate_tables(main, {}, n_boot=50, seed=3, twins={7: twins[7]})
    assert one["differences"]["e3_minus_twin_e3_predictive"]["c_scrambled"]["ci_low"] is None
    bca = evaluate_tables(main, {}, n_boot=200, seed=3, interval="bca", twins=twins)
    assert bca["differences"]["e1_minus_twin_e1_predictive"]["data_ci_low"] is not None


@pytest.mark.parametrize("n_seeds", [2, 3, 5])
def test_seed_predictive_bound_holds_its_level_when_the_trained_net_is_another_draw(n_seeds):
    """Planted truth: the trained network's estimate is exchangeable with the S twins' (normal init
    effect on top of a test-set effect all networks share, and bootstrap noise). "CI low > 0" must
    then happen at rate (1 − level)/2 = 0.025 whatever the test set."""
    from ipi.metrics import seed_predictive_difference

    rng = np.random.default_rng(0)
    n_sim, hits = 4000, 0
    for _ in range(n_sim):
        e = 0.6 + 0.1 * rng.standard_normal() + 0.05 * rng.standard_normal(n_seeds + 1)
        reps = e[:, None] + 0.03 * rng.standard_normal((n_seeds + 1, 20))
        iv = seed_predictive_difference(e[0], reps[0], e[1:], reps[1:])
        hits += iv.ci_low > 0
    rate = hits / n_sim
    # binomial SD at 0.025 with 4000 draws is 0.0025: 4 SD either side
    assert abs(rate - 0.025) < 0.01, rate


def test_seed_predictive_p_value_matches_its_interval():
    """p < 0.025 exactly when the 95% seed-predictive interval's low end is above 0."""
    from ipi.metrics import seed_predictive_difference

    rng = np.random.default_rng(4)
    for _ in range(200):
        twins = 0.55 + rng.normal(0, 0.04, size=3)
        iv = seed_predictive_difference(0.7, 0.7 + 0.03 * rng.standard_normal(400), twins,
                                        twins[:, None] + 0.03 * rng.standard_normal((3, 400)))
        assert 0.0 < iv.p_value < 1.0
        assert (iv.ci_low > 0) == (iv.p_value < 0.025)
