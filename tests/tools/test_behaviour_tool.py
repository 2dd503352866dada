"""The free-run tool end to end on a tiny text-only backbone (random weights: the numbers are meaningless)."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from tests.behaviour.conftest import text_backbone  # noqa: F401  (fixture)

pytestmark = pytest.mark.needs_shared


def test_run_behaviour_writes_rates_e4_and_ablation(text_backbone, trajectories, tmp_path):  # noqa: F811
    from ipi.tools.behaviour import run_behaviour

    trajs = [replace(t, steps=tuple(t.steps)[:1]) for t in sorted(trajectories, key=lambda t: t.trajectory_id)[:4]]
    s = run_behaviour(text_backbone, trajs, "i_dom", tmp_path, layers=[1], max_new_tokens=4, batch_size=4,
                      n_boot=50, log=lambda m: None)
    on_disk = json.loads((tmp_path / "behaviour.json").read_text())
    assert on_disk["n_rows"] == s["n_rows"] == 8 and on_disk["n_trajectories"] == 4
    assert set(on_disk["hijack_rates"]) == {"attack", "clean"}
    assert on_disk["e4"]["counts"]["hijacked"] + on_disk["e4"]["counts"]["resisted"] + \
        on_disk["e4"]["counts"]["other"] == 4
    assert on_disk["ablation"]["n_rows"] == 4 and on_disk["uses_direction"][0] == "NOT RUN"  # 4 clusters < 5
    labels = pd.read_csv(tmp_path / "labels.csv")
    assert sorted(labels["arm"].value_counts().items()) == [("none", 8), ("probe", 4), ("random", 4)]
    # the generation cache: 8 plain generations + 4 per ablation arm
    assert sum(1 for _ in (tmp_path / "generations.jsonl").open()) == 16
