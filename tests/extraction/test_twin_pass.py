"""The random-weight twins in one data pass: the same cache entries and features as one extraction per twin."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import compose_train


def _rows(cfg, trajectories, n_traj=2):
    from ipi.run.stages import make_rows

    return make_rows(cfg, trajectories[:n_traj], "i_dom", wording=None)


@pytest.mark.needs_shared
def test_shared_pass_equals_one_extraction_per_twin(tmp_path, trajectories):
    """Two twins forwarded on the same batches write exactly the entries (keys, row ids, features to
    float rounding) that two separate extractions write; the data side runs once."""
    from ipi.extraction.forward import extract_features
    from ipi.extraction.twin_pass import extract_twin_features
    from ipi.run.settings import extract_settings
    from ipi.run.twin import twin_config

    ov = ["evaluation.random_twin=true", "evaluation.random_twin_seeds=[1,2]", "evaluation.heldout_wording=false",
          "surface=i_dom"]
    cfg = compose_train(tmp_path / "a", ov)
    rows = _rows(cfg, trajectories)
    layers = [1]
    shared, infos = extract_twin_features({s: extract_settings(twin_config(cfg, s)) for s in (1, 2)}, rows, layers,
                                          ["observation", "task"])
    assert all(i["shared_pass"] == [1, 2] and i["rows_forwarded"] == len(rows) for i in infos.values())
    assert all(i["layers"] == [1] for i in infos.values())  # the probe's block only, not the superset
    cfg_b = compose_train(tmp_path / "b", ov)
    for s in (1, 2):
        alone, info = extract_features(extract_settings(twin_config(cfg_b, s)), rows, layers, ["observation", "task"],
                                       exact_layers=True)
        assert info["cache_key"] == infos[s]["cache_key"]
        assert alone.row_ids == shared[s].row_ids
        torch.testing.assert_close(alone.features, shared[s].features, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(alone.collapse, shared[s].collapse, rtol=1e-4, atol=1e-5)
    # the two twins differ (another seed, other weights): a pass that wrote one twin's rows twice fails here
    assert not torch.allclose(shared[1].features, shared[2].features)
    # a second call reads both entries: nothing forwarded
    again, infos2 = extract_twin_features({s: extract_settings(twin_config(cfg, s)) for s in (1, 2)}, rows, layers,
                                          ["observation", "task"])
    assert all(i["cache_hit"] and i["rows_forwarded"] == 0 for i in infos2.values())


@pytest.mark.needs_shared
def test_twin_reads_a_complete_superset_entry(tmp_path, trajectories):
    """A twin whose superset entry is already complete (extract.py) reads it and forwards nothing;
    without it, only the probe's block is read (a smaller entry of its own)."""
    from ipi.extraction.forward import extraction_layers
    from ipi.extraction.twin_pass import extract_twin_features, twin_layers
    from ipi.run.settings import extract_settings
    from ipi.run.twin import twin_config

    cfg = compose_train(tmp_path, ["evaluation.random_twin=true", "evaluation.random_twin_seeds=[1,2]",
                                   "evaluation.heldout_wording=false", "surface=i_dom"])
    rows = _rows(cfg, trajectories, 1)
    tc = {s: extract_settings(twin_config(cfg, s)) for s in (1, 2)}
    sup = extraction_layers(tc[1], [1])
    assert sup != [1] and twin_layers(tc[1], rows, [1], ["task"]) == [1]
    _, filled = extract_twin_features(tc, rows, [1], ["task"], superset=True)
    assert all(i["layers"] == sup for i in filled.values())
    assert twin_layers(tc[1], rows, [1], ["task"]) == sup
    _, infos = extract_twin_features(tc, rows, [1], ["task"])
    assert all(i["cache_hit"] and i["layers"] == sup for i in infos.values())


def test_twins_per_pass_setting():
    from ipi.extraction.twin_pass import twins_per_pass

    assert twins_per_pass("auto", 19, "cpu") == 19
    assert twins_per_pass("auto", 19, "gpu", twin_bytes=16 * 2**30, free_bytes=140 * 2**30) == 6
    assert twins_per_pass("auto", 3, "gpu", twin_bytes=10 * 2**30, free_bytes=2**30) == 1
    assert twins_per_pass(4, 19) == 4 and twins_per_pass("25", 19) == 19
    for bad in (0, -1, "two", 1.5):
        with pytest.raises(ValueError, match="twins_per_pass"):
            twins_per_pass(bad, 3)
