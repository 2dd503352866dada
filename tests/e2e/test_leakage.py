"""Leakage (ipi.probe.split): a trajectory on both sides of a split is refused in a run."""

from __future__ import annotations

import pytest

from tests.conftest import (
    _base,
    compose_train,
)

# -------------------------------------------------------------------------------- leakage


@pytest.mark.needs_shared
def test_a_trajectory_on_both_sides_is_refused(tmp_path, syn_root, reference, one_thread, monkeypatch):
    from ipi.run import tasks
    from ipi.probe import folds as crossfit
    from ipi.probe.split import LeakageError

    (tmp_path / "cache").symlink_to(reference / "cache")
    real_split = crossfit.holdout_split

    def leaky(ids, test_fraction, seed):
        train_ids, test_ids = real_split(ids, test_fraction, seed)
        return train_ids | {"t3"}, test_ids | {"t3"}

    monkeypatch.setattr(crossfit, "holdout_split", leaky)
    with pytest.raises(LeakageError, match=r"1 trajectory id\(s\) appear in both train and test: 't3'"):
        tasks.train(compose_train(tmp_path, _base(syn_root)))
    # Second line of defence: the rows actually fed to the probe and scored are checked too.
    monkeypatch.setattr(crossfit, "assert_trajectory_disjoint", lambda a, b: None)
    with pytest.raises(LeakageError, match="'t3'"):
        tasks.train(compose_train(tmp_path, _base(syn_root)))
    assert not (tmp_path / "run" / "results.json").exists()
