"""Property tests of the weighted AUC and E2 (PROTOCOL.md §5)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score

from ipi.metrics import bootstrap_weighted_auc, estimands, weighted_auc

SETTINGS = settings(max_examples=60, deadline=None)

# Scores on a coarse grid (quarters in [-5, 5]) so that ties are frequent and strictly increasing
# transforms stay injective in floating point.
scores = st.integers(-20, 20).map(lambda k: k / 4.0)
weights = st.floats(0.05, 10.0, allow_nan=False, allow_infinity=False)


@st.composite
def weighted_sides(draw, max_size=25):
    n_pos = draw(st.integers(1, max_size))
    n_neg = draw(st.integers(1, max_size))
    fp = np.array(draw(st.lists(scores, min_size=n_pos, max_size=n_pos)))
    fn = np.array(draw(st.lists(scores, min_size=n_neg, max_size=n_neg)))
    wp = np.array(draw(st.lists(weights, min_size=n_pos, max_size=n_pos)))
    wn = np.array(draw(st.lists(weights, min_size=n_neg, max_size=n_neg)))
    return fp, fn, wp, wn


@SETTINGS
@given(weighted_sides())
def test_equals_sklearn_roc_auc_with_sample_weight(sides):
    fp, fn, wp, wn = sides
    y = np.r_[np.ones(fp.size), np.zeros(fn.size)]
    ref = roc_auc_score(y, np.r_[fp, fn], sample_weight=np.r_[wp, wn])
    assert weighted_auc(fp, fn, wp, wn) == pytest.approx(ref, abs=1e-9)


@SETTINGS
@given(weighted_sides())
def test_swapping_sides_complements(sides):
    fp, fn, wp, wn = sides
    swapped = weighted_auc(fn, fp, wn, wp)
    assert weighted_auc(fp, fn, wp, wn) == pytest.approx(1.0 - swapped, abs=1e-12)


@SETTINGS
@given(weighted_sides(), st.sampled_from(["exp", "cubic", "affine"]))
def test_invariant_under_strictly_increasing_transform(sides, name):
    fp, fn, wp, wn = sides
    transform = {
        "exp": np.exp,
        "cubic": lambda x: x**3 + x,
        "affine": lambda x: 3.0 * x - 7.0,
    }[name]
    assert weighted_auc(transform(fp), transform(fn), wp, wn) == pytest.approx(
        weighted_auc(fp, fn, wp, wn), abs=1e-12
    )


@SETTINGS
@given(weighted_sides(max_size=12), st.data())
def test_bootstrap_replicate_equals_reweighted_auc(sides, data):
    fp, fn, wp, wn = sides
    f = np.r_[fp, fn]
    y = np.r_[np.ones(fp.size, bool), np.zeros(fn.size, bool)]
    w = np.r_[wp, wn]
    m = np.array(data.draw(st.lists(st.integers(0, 3), min_size=f.size, max_size=f.size)))
    rep = bootstrap_weighted_auc(f, y, w, m[None, :])[0]
    ref = weighted_auc(f[y], f[~y], (w * m)[y], (w * m)[~y])
    assert (np.isnan(rep) and np.isnan(ref)) or rep == pytest.approx(ref, abs=1e-12)


step_pairs = st.lists(
    st.tuples(st.integers(0, 4), scores, scores),  # (trajectory, attack score, clean score)
    min_size=1,
    max_size=30,
)


@SETTINGS
@given(step_pairs)
def test_e2_with_one_pair_per_step_is_share_of_steps_won(pairs):
    rows = []
    wins = 0.0
    for k, (traj, attack, clean) in enumerate(pairs):
        rows.append((f"t{traj}", k, "attack", attack))
        rows.append((f"t{traj}", k, "clean", clean))
        wins += 1.0 if attack > clean else 0.5 if attack == clean else 0.0
    table = pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])
    res = estimands(table, n_boot=2, seed=0)
    assert res.e2.estimate == pytest.approx(wins / len(pairs), abs=1e-12)
