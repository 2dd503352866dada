"""The random-weight twins' estimands on the shared draws: per seed, and E3 − mean twin E3 (check 6)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from ipi.metrics import compare_tables, make_draws

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


def test_mean_twin_difference_is_paired_on_the_shared_draws():
    """E3 − mean twin E3 (check 6's paired interval): recomputed with scikit-learn on the
    documented draws, the seeds' replicates averaged per draw (paired with the trained probe's)."""
    main, twin, twin2 = _table(0, 1.5, 1.0), _table(1, 1.5, 0.3), _table(2, 1.5, 0.6)
    out = compare_tables(main, {}, n_boot=300, seed=3, twins={7: twin, 9: twin2}, interval="percentile").to_dict()
    draws = make_draws(main.trajectory_id, n_boot=300, seed=3)

    def auc(table, control):
        sub = table[table.variant.isin(["attack", control])]
        both = sub.groupby(["trajectory_id", "step"]).variant.transform("nunique") == 2
        return roc_auc_score((sub.variant[both] == "attack").astype(int), sub.score[both])

    assert out["random_twin"]["seeds"] == ["7", "9"]
    assert set(out["random_twin"]) == {"seeds", "guards", "by_seed"}  # no envelope: it decides nothing
    for c in ("c_scrambled", "c_imperative"):
        r_main = _e3_replicates(main, c, draws)
        r_mean = (_e3_replicates(twin, c, draws) + _e3_replicates(twin2, c, draws)) / 2
        iv = out["differences"]["e3_minus_mean_twin_e3"][c]
        assert iv["estimate"] == pytest.approx(auc(main, c) - (auc(twin, c) + auc(twin2, c)) / 2, abs=1e-12)
        lo, hi = np.quantile(r_main - r_mean, [0.025, 0.975])
        assert iv["ci_low"] == pytest.approx(lo, abs=1e-9) and iv["ci_high"] == pytest.approx(hi, abs=1e-9)
    # Each twin's own estimands are those of its table alone on the same draws.
    alone = compare_tables(twin, {}, n_boot=300, seed=3, interval="percentile").to_dict()
    assert out["random_twin"]["by_seed"]["7"] == {k: alone[k] for k in ("e1", "e2", "e3")}
    # A twin whose scores equal the probe's: the paired difference is exactly 0, CI [0, 0], and the
    # guard refuses it.
    same = compare_tables(main, {}, n_boot=100, twins={1: main.copy()}).to_dict()
    for iv in same["differences"]["e3_minus_mean_twin_e3"].values():
        assert (iv["estimate"], iv["ci_low"], iv["ci_high"]) == (0.0, 0.0, 0.0)
    assert "agree with the trained backbone's" in same["random_twin"]["guards"][0]
    # BCa: the mean's jackknife is the per-value mean; the intervals are defined.
    bca = compare_tables(main, {}, n_boot=200, seed=3, interval="bca", twins={7: twin, 9: twin2}).to_dict()
    assert all(bca["differences"]["e3_minus_mean_twin_e3"][c]["ci_low"] is not None
               for c in ("c_scrambled", "c_imperative"))
    with pytest.raises(TypeError, match="one table per twin seed"):
        compare_tables(main, {}, n_boot=10, twins=twin).to_dict()
