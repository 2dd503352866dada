"""The extraction bench says when its ratios should not be quoted."""

from __future__ import annotations

from ipi.tools.extraction_timing import measurement_warnings


def test_quiet_machine_and_three_repetitions_give_no_warning():
    assert measurement_warnings(3, (0.84, 0.97, 1.07), (1.61, 1.2, 1.15), n_cpus=2) == []


def test_one_repetition_and_a_busy_machine_are_named():
    w = measurement_warnings(1, (2.07, 1.5, 1.2), (1.5, 1.4, 1.3), n_cpus=2)
    assert len(w) == 2
    assert w[0].startswith("reps=1: ") and "--reps 3" in w[0]
    assert "2.07 on 2 CPUs" in w[1]
    # the bench's own load (about one unit) does not count as a busy machine; more than half the
    # CPUs on top of it does
    assert measurement_warnings(5, (2.0, 0, 0), (0, 0, 0), n_cpus=2) == []
    assert len(measurement_warnings(5, (2.01, 0, 0), (0, 0, 0), n_cpus=2)) == 1
    assert measurement_warnings(5, (4.9, 0, 0), (0, 0, 0), n_cpus=8) == []
