"""train.py on published attack sources (issue 25): the run records its source, held out by source."""

from __future__ import annotations

import json

from tests.conftest import compose_train


def _ov(root, *extra):
    return [f"data.root={root}", "evaluation.n_boot=100", "logger=none", "extract.shard_rows=10",
            "evaluation.transfer=false", "evaluation.random_twin=false", "evaluation.permutation.m=0",
            "report.plots=false", "report.html=false", "report.gallery=false", *extra]


def test_leave_one_source_out_run(tmp_path, syn_root, one_thread):
    from ipi.run.tasks import train

    train(compose_train(tmp_path, _ov(syn_root, "surface=i_dom", "attack=mix", "split=kfold",
                                                   "split.k=4", "split.wording=source",
                                                   "evaluation.min_clusters=2")))
    on_disk = json.loads((tmp_path / "run" / "results.json").read_text())
    att = on_disk["run"]["attack"]
    sources = ["agentdojo", "garak", "injecagent", "project"]
    assert att["name"] == "mix" and sorted(att["sources"]) == sources and att["heldout_source"] is True
    w = on_disk["run"]["wording"]
    assert w["heldout"] and w["scheme"] == "source" and w["overlap"] == 0
    assert sorted(w["families"]) == sources
    # one held-out source per fold: every source's test steps are its fold's trajectories
    assert sorted(att["by_source"]) == sources
    for s in sources:
        assert att["by_source"][s]["n_trajectories"] == w["families"][s]["trajectories"]
    t = att["transfer"]
    assert t["sources"] == sources and all(sorted(t["e1"][a]) == sources for a in sources)
    assert sum(att["counts"]["attack_rows"].values()) == 10 * 2  # N_TRAJ x 2 steps, one attack each
    assert att["counts"]["adapted_rows"]  # garak's and AgentDojo's quotes and newlines on i_dom, counted


def test_project_attack_adds_no_record(tmp_path, syn_root, one_thread):
    from ipi.run.tasks import train

    results, _ = train(compose_train(tmp_path, _ov(syn_root, "surface=i_tool", "split.test_fraction=0.5")))
    assert "attack" not in results["run"]
