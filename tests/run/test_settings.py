"""ipi.run.settings: the typed settings the layers below the run layer receive instead of cfg."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from tests.conftest import compose_train


def test_extract_settings_carry_every_extract_option_and_are_frozen(tmp_path):
    """Every ``extract.*`` option of the schema reaches the extraction (a new option the builder
    forgets fails here), with the composed values, and the settings cannot be changed later."""
    from ipi.extraction.forward import ExtractSettings, extraction_layers
    from ipi.run.schemas import ExtractConf
    from ipi.run.settings import extract_settings

    cfg = compose_train(tmp_path, ["extract.shard_rows=7", "extract.force=true", "extract.prefix_reuse=false",
                                   "extract.layers=[0,2]", "quiet=true"])
    s = extract_settings(cfg)
    carried = {f.name for f in dataclasses.fields(ExtractSettings)}
    assert {f.name for f in dataclasses.fields(ExtractConf)} <= carried
    assert (s.shard_rows, s.force, s.prefix_reuse, s.layers, s.quiet) == (7, True, False, (0, 2), True)
    assert s.cache_dir == cfg.extract.cache_dir and s.precision == cfg.extract.precision
    assert extraction_layers(s, [1, 2]) == [0, 1, 2]  # the superset [0, 2] plus the run's block 1
    assert s.backbone == OmegaConf.to_container(cfg.backbone, resolve=True, enum_to_str=True)
    assert isinstance(s.backbone["loader"], dict) and "${" not in str(s.backbone)  # plain, resolved
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.force = False


@pytest.mark.needs_shared
def test_extract_settings_key_the_cache_entry_of_the_config(tmp_path, trajectories):
    """The cache key from the settings' plain backbone is the key of the config node (so existing
    cache entries stay valid); a random twin's settings key another entry."""
    from ipi.extraction.forward import cache_key
    from ipi.extraction.rows import build_rows
    from ipi.run.settings import extract_settings
    from ipi.run.twin import twin_config

    cfg = compose_train(tmp_path, ["evaluation.random_twin=true"])
    rows = build_rows(trajectories[:1], "i_vis", ["c_scrambled"])
    s, twin = extract_settings(cfg), extract_settings(twin_config(cfg, 1))
    key = cache_key(s.backbone, rows, [0], ["last_prompt"])
    assert key == cache_key(cfg.backbone, rows, [0], ["last_prompt"])
    assert cache_key(twin.backbone, rows, [0], ["last_prompt"])[0] != key[0]
    assert twin.backbone["loader"]["random_init_seed"] == 1 and "random_init_seed" not in s.backbone["loader"]
