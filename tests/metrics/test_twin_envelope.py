"""The random-weight twins' estimands on the shared draws: per seed and the envelope (max over seeds)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from ipi.metrics.estimands import evaluate_tables, make_draws

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


def test_twin_differences_are_paired_on_the_shared_draws():
    """E3 − twin E3 per seed and against the envelope (max over seeds per draw): recomputed with
    scikit-learn on the documented draws (paired replicates)."""
    main, twin, twin2 = _table(0, 1.5, 1.0), _table(1, 1.5, 0.3), _table(2, 1.5, 0.6)
    out = evaluate_tables(main, {}, n_boot=300, seed=3, twins={7: twin, 9: twin2})
    draws = make_draws(main.trajectory_id, n_boot=300, seed=3)

    def reps(table, control):
        both = table.groupby(["trajectory_id", "step"]).variant.transform(lambda v: (v == control).any())
        sub = table[table.variant.isin(["attack", control]) & both]
        col = draws.columns(sub.trajectory_id)
        y = (sub.variant == "attack").astype(int).to_numpy()
        return np.array([roc_auc_score(y, sub.score, sample_weight=draws.multiplicity[b, col])
                         for b in range(draws.n_boot)])

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
    alone = evaluate_tables(twin, {}, n_boot=300, seed=3)
    assert out["random_twin"]["by_seed"]["7"] == {k: alone[k] for k in ("e1", "e2", "e3")}
    # One twin: the envelope is that twin.
    one = evaluate_tables(main, {}, n_boot=300, seed=3, twins={7: twin})
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
