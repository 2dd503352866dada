"""extract.py fills every random-weight twin's cache entry that train.py then reads."""

from __future__ import annotations

import pytest

from tests.conftest import compose_train

@pytest.mark.needs_shared
def test_extract_fills_the_twin_entry_train_reads(tmp_path):
    """extract.py fills the backbone's and the twin's entries of the surface (not the transfer
    sources' twins); the train run that follows forwards nothing."""
    import json

    from ipi.run import tasks

    ov = ["evaluation.random_twin=true", "evaluation.random_twin_seeds=[1,2]", "data.max_trajectories=2", "split.min_per_side=1", "surface=i_dom",
          "evaluation.transfer=false",
          "split.test_fraction=0.5", "evaluation.n_boot=50", "logger=none", "report.plots=false",
          "report.gallery=false"]
    info, objs = tasks.extract(compose_train(tmp_path, ov))
    tw = objs["extraction_random_twin"]
    assert set(tw) == {"1", "2"} and len({t["cache_key"] for t in tw.values()} | {info["cache_key"]}) == 3
    assert all(t["rows_forwarded"] == info["rows_forwarded"] > 0 for t in tw.values())
    assert len([p for p in (tmp_path / "cache").iterdir() if p.is_dir()]) == 3
    results, _ = tasks.train(compose_train(tmp_path, ov))
    run_info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert run_info["extraction"]["rows_forwarded"] == 0
    assert all(t["cache_hit"] for t in run_info["extraction_random_twin"].values())
    assert results["run"]["random_twin"]["cache_keys"] == {s: t["cache_key"] for s, t in tw.items()}
