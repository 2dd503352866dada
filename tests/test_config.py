"""Hydra composition: groups compose, typos and invalid combinations fail with a clear message."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from ipi.run.config import resolved_controls, validate
from tests.conftest import REPO, compose_train


def test_default_composition(tmp_path):
    cfg = compose_train(tmp_path, small=False)
    assert cfg.surface.name == "i_vis"
    assert cfg.surface._target_ == "ipi.surfaces.i_vis.BannerSurface"
    assert resolved_controls(cfg) == ["c_scrambled", "c_imperative", "c_occlusion"]
    assert cfg.backbone.name == "tiny_qwen2_5_vl" and cfg.backbone.n_layers == 8
    assert [g.value for g in cfg.token_group.names] == ["last_prompt", "image", "task", "observation", "action"]
    assert len(cfg.layers.spec) == 6
    assert cfg.evaluation.n_boot == 1000
    validate(cfg)


@pytest.mark.parametrize("surface,controls", [
    ("i_vis", ["c_scrambled", "c_imperative", "c_occlusion"]),
    ("i_dom", ["c_scrambled", "c_imperative"]),
    ("i_tool", ["c_scrambled", "c_imperative"]),
])
def test_all_controls_that_apply(tmp_path, surface, controls):
    cfg = compose_train(tmp_path, [f"surface={surface}"])
    assert resolved_controls(cfg) == controls


def test_unknown_surface_fails_at_composition(tmp_path):
    """A surface with no config file fails in Hydra, which names the options it has."""
    with pytest.raises(ConfigCompositionException) as e:
        compose_train(tmp_path, ["surface=i_audio"])
    assert "surface/i_audio" in _chain(e.value)
    assert all(f"\t{s}\n" in _chain(e.value) + "\n" for s in ("i_vis", "i_dom", "i_tool")), _chain(e.value)


@pytest.mark.parametrize(("override", "message"), [
    ("surface.name=i_audio", "surface.name=i_audio is not the name of surface._target_=ipi.surfaces.i_vis.BannerSurface"),
    ("surface.name=i_dom", "surface.name=i_dom is not the name of surface._target_=ipi.surfaces.i_vis.BannerSurface"),
    ("surface._target_=ipi.surfaces.i_vis.Banner", "surface: _target_='ipi.surfaces.i_vis.Banner': cannot import it"),
    ("surface._target_=ipi.surfaces.surface.TextSurface", "is not a concrete subclass of ipi.surfaces.surface.Surface"),
    ("surface._target_=ipi.surfaces.registry.CONF_DIR", "is not a concrete subclass of ipi.surfaces.surface.Surface"),
    ("surface._target_=BannerSurface", "is not a dotted path"),
])
def test_a_surface_whose_class_and_name_disagree_is_refused_naming_the_surfaces(tmp_path, override, message):
    cfg = compose_train(tmp_path, [override])
    with pytest.raises(ValueError) as e:
        validate(cfg)
    assert message in str(e.value) and str(e.value).endswith("choose surface=<name>, one of: i_vis, i_dom, i_tool")


@pytest.mark.parametrize("surface", ["i_vis", "i_dom", "i_tool"])
def test_each_shipped_surface_file_names_its_own_class(tmp_path, surface):
    from ipi.run.config import run_surface

    assert run_surface(compose_train(tmp_path, [f"surface={surface}"])).name == surface


def _chain(exc: BaseException) -> str:
    """Messages of an exception and its causes (Hydra wraps OmegaConf's validation error)."""
    out = []
    while exc is not None:
        out.append(str(exc))
        exc = exc.__cause__
    return "\n".join(out)


def test_typo_in_key_fails_at_composition(tmp_path):
    with pytest.raises(ConfigCompositionException):
        compose_train(tmp_path, ["evaluation.n_bot=10"])


@pytest.mark.parametrize("override", ["+evaluation.n_bootstrap=10", "+probe.l3=2", "+surface.banner=red"])
def test_a_key_appended_with_plus_that_the_run_never_reads_is_refused(tmp_path, override):
    """Hydra's hint for a typo ('use +key=value') must not turn into a silently ignored setting."""
    cfg = compose_train(tmp_path, [override])
    key = override[1:].split("=")[0]
    with pytest.raises(ValueError, match=rf"{key}: unknown setting .* allows: "):
        validate(cfg)


def test_open_nodes_still_take_new_keys(tmp_path):
    cfg = compose_train(tmp_path, ["+backbone.loader.random_init_seed=4"])
    validate(cfg)  # the documented way to extract a twin's entry by hand (docs/extraction.md)


@pytest.mark.parametrize("value", ["1", "[1]"])
def test_the_retired_single_twin_seed_key_names_its_replacement(tmp_path, value):
    cfg = compose_train(tmp_path, [f"evaluation.random_twin_seed={value}"])
    with pytest.raises(ValueError, match=r"replaced by evaluation.random_twin_seeds"):
        validate(cfg)


def test_unknown_token_group_fails(tmp_path):
    with pytest.raises((ValidationError, ConfigCompositionException)) as e:
        compose_train(tmp_path, ["token_group.names=[pixels]"])
    assert "last_prompt" in _chain(e.value)


def test_control_that_does_not_apply(tmp_path):
    cfg = compose_train(tmp_path, ["surface=i_dom", "control=occlusion"])
    with pytest.raises(ValueError, match="control=c_occlusion does not apply to surface=i_dom"):
        validate(cfg)


@pytest.mark.parametrize("bad", ["[0.0]", "[1.5]", "[-0.1]"])
def test_layer_fraction_outside_unit_interval(tmp_path, bad):
    cfg = compose_train(tmp_path, [f"layers.spec={bad}"])
    with pytest.raises(ValueError, match=r"outside \(0, 1\]"):
        validate(cfg)


def test_text_only_backbone_rejects_image_group(tmp_path):
    cfg = compose_train(tmp_path, ["surface=i_dom", "backbone.multimodal=false"])
    with pytest.raises(ValueError, match="'image' is unavailable"):
        validate(cfg)


@pytest.mark.parametrize(("override", "message"), [
    ("data.max_trajectories=-1", "data.max_trajectories must be >= 1"),
    ("data.max_trajectories=0", "data.max_trajectories must be >= 1"),
    ("evaluation.level=1.5", r"evaluation.level must be in \(0, 1\)"),
    ("token_group.names=[]", "token_group.names: empty"),
    ("layers.spec=[]", "layers.spec: empty"),
    ("layers.spec=[99]", "index 99 out of range"),
])
def test_bad_values_are_refused_before_any_work(tmp_path, override, message):
    cfg = compose_train(tmp_path, [override])
    with pytest.raises(ValueError, match=message):
        validate(cfg)


def test_data_importer_is_a_target_node_and_a_misspelt_target_fails_before_any_work(tmp_path):
    cfg = compose_train(tmp_path, ["data=native", "data.root=x.jsonl"])
    assert cfg.data.importer._target_ == "ipi.data.load_native" and cfg.data.importer._partial_
    validate(cfg)
    cfg = compose_train(tmp_path, ["data.importer._target_=ipi.data.webvoyager.import_webvoyager_reprt"])
    with pytest.raises(ValueError, match=r"data.importer._target_='ipi.data.webvoyager.import_webvoyager_reprt' "
                                         r"\(data=webvoyager\): no such importer function"):
        validate(cfg)


def test_importer_binds_exactly_the_settings_each_format_takes(tmp_path):
    """The settings each conf/data node binds are the ones its function accepts (no per-kind branches)."""
    import inspect

    from ipi.run.stages import importer

    taken = {}
    for kind in ("webvoyager", "native", "browser_use", "online_mind2web", "multimodal_mind2web"):
        cfg = compose_train(tmp_path, [f"data={kind}", "data.root=r", "data.max_trajectories=3",
                                       "data.unknown_action=skip"])
        fn = importer(cfg.data, cfg.backbone)
        params = inspect.signature(fn.func).parameters
        assert set(fn.keywords) <= set(params), kind
        assert fn.keywords["on_bad_step"] == "skip" and type(fn.keywords["on_bad_step"]) is str
        assert fn.keywords["image_limits"] is not None
        taken[kind] = {k: fn.keywords.get(k) for k in ("unknown_action", "max_element_chars", "limit")}
    assert taken["webvoyager"] == {"unknown_action": "skip", "max_element_chars": 3000, "limit": 3}
    assert taken["native"] == {"unknown_action": "skip", "max_element_chars": None, "limit": 3}
    assert taken["online_mind2web"]["unknown_action"] is None and taken["online_mind2web"]["limit"] == 3
    assert taken["multimodal_mind2web"]["limit"] == 3  # through data.options.limit



def _multimodal(name: str) -> bool:
    import yaml

    return bool(yaml.safe_load((REPO / "conf" / "backbone" / f"{name}.yaml").read_text())["multimodal"])


@pytest.mark.parametrize("backbone", sorted(p.stem for p in (REPO / "conf" / "backbone").glob("*.yaml")))
def test_a_text_only_backbone_defaults_to_the_text_token_groups(tmp_path, backbone):
    """A text-only backbone composes with the groups it has (no image group); a multimodal one keeps
    the paper's five; a token group given on the command line still wins."""
    cfg = compose_train(tmp_path, [f"backbone={backbone}", "surface=i_dom"], small=False)
    assert cfg.token_group.name == ("five" if _multimodal(backbone) else "text")
    assert compose_train(tmp_path, [f"backbone={backbone}", "surface=i_dom", "token_group=task"],
                         small=False).token_group.name == "task"
