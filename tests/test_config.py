"""Hydra composition: groups compose, typos and invalid combinations fail with a clear message."""

from __future__ import annotations

import shutil

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from ipi.run.validation import resolved_controls, validate
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
    from ipi.run.validation import run_surface

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


# ---------------------------------------------------------------- each default written once

import ast  # noqa: E402
import dataclasses  # noqa: E402
from pathlib import Path  # noqa: E402
from enum import Enum  # noqa: E402

import yaml  # noqa: E402
from omegaconf import MISSING  # noqa: E402

from ipi.run import schemas  # noqa: E402

#: conf/<group>/<option>.yaml -> the schema its values default to (a detector option: its own schema).
GROUP_SCHEMAS = {"probe": schemas.ProbeConf, "split": schemas.SplitConf, "evaluation": schemas.EvaluationConf,
                 "extract": schemas.ExtractConf, "report": schemas.ReportConf, "behaviour": schemas.BehaviourConf,
                 **{f"detector/{n}": s for n, s in schemas.DETECTOR_SCHEMAS.items()}}
#: The library files the run layer passes each schema's values to: none may write a literal default for them.
FED_BY = {
    schemas.SplitConf: ("ipi/probe/split.py", "ipi/probe/folds.py"),
    schemas.ProbeConf: ("ipi/probe/fit.py", "ipi/detectors/linear.py"),
    schemas.MLPDetectorConf: ("ipi/detectors/mlp.py",),
    schemas.AttentionFocusDetectorConf: ("ipi/detectors/attention.py",),
    schemas.EvaluationConf: ("ipi/evaluation/results.py", "ipi/metrics/bootstrap.py", "ipi/metrics/compare.py",
                             "ipi/metrics/twins.py", "ipi/metrics/operating_point.py", "ipi/metrics/permutation.py",
                             "ipi/metrics/estimands.py"),
    schemas.PermutationConf: ("ipi/evaluation/results.py", "ipi/metrics/permutation.py", "ipi/metrics/compare.py"),
}
#: Keys that name a thing (the option, its class, its kind) rather than set a value.
NOT_DEFAULTS = {"_target_", "name", "kind"}


def _plain(value):
    return value.value if isinstance(value, Enum) else value


def schema_defaults(schema) -> dict:
    """``{field: default}`` of a schema dataclass (nested schemas as dicts; MISSING fields left out)."""
    out = {}
    for f in dataclasses.fields(schema):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            continue
        if dataclasses.is_dataclass(value):
            value = schema_defaults(type(value))
        elif isinstance(value, list):
            value = [_plain(v) for v in value]
        if value is not MISSING:
            out[f.name] = _plain(value)
    return out


def yaml_mismatches(conf_dir: Path) -> list[str]:
    """Values of conf/<group>/*.yaml that differ from their schema's default (a schema default of
    None or MISSING is the option's to set; interpolations read another key and are not defaults)."""
    bad = []
    for group, schema in GROUP_SCHEMAS.items():
        group_dir, _, option = group.partition("/")
        for path in sorted((conf_dir / group_dir).glob(f"{option or '*'}.yaml")):
            values = yaml.safe_load(path.read_text()) or {}
            values.pop("defaults", None)
            bad += _compare(f"{path.relative_to(conf_dir)}", values, schema_defaults(schema))
    return bad


def _compare(where: str, values: dict, defaults: dict) -> list[str]:
    bad = []
    for key, value in values.items():
        if key in NOT_DEFAULTS or key not in defaults or defaults[key] is None:
            continue
        if isinstance(value, str) and "${" in value:
            continue
        if isinstance(value, dict) and isinstance(defaults[key], dict):
            bad += _compare(f"{where}:{key}", value, defaults[key])
        elif value != defaults[key]:
            bad.append(f"{where}: {key}={value!r}, schema default {defaults[key]!r}")
    return bad


def _literal(node: ast.expr | None) -> bool:
    """A default written as a value (a number, string, bool or a list/tuple of them); None, a named
    constant and a factory are not literals."""
    if node is None or (isinstance(node, ast.Constant) and node.value is None):
        return False
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    if isinstance(node, (ast.List, ast.Tuple)):
        return bool(node.elts) and all(_literal(e) for e in node.elts)
    return False


def literal_defaults(source: str, keys: set[str]) -> list[str]:
    """``function(key=value)`` and ``Class.key = value`` in ``source`` with ``key`` in ``keys`` and a
    literal value: a configured default written a second time."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            pairs = list(zip(a.args[len(a.args) - len(a.defaults):], a.defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
            out += [f"{node.name}({arg.arg}=...)" for arg, d in pairs if arg.arg in keys and _literal(d)]
        elif isinstance(node, ast.ClassDef):
            out += [f"{node.name}.{s.target.id}" for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id in keys
                    and _literal(s.value)]
    return out


def test_each_yaml_default_equals_its_schema_default():
    assert yaml_mismatches(REPO / "conf") == []


def test_a_yaml_default_that_drifts_from_its_schema_is_caught(tmp_path):
    shutil.copytree(REPO / "conf", tmp_path / "conf")
    path = tmp_path / "conf" / "evaluation" / "default.yaml"
    path.write_text(path.read_text().replace("min_clusters: 12", "min_clusters: 11"))
    mlp = tmp_path / "conf" / "detector" / "mlp.yaml"
    mlp.write_text(mlp.read_text().replace("patience: 10", "patience: 9"))
    assert sorted(yaml_mismatches(tmp_path / "conf")) == [
        "detector/mlp.yaml: patience=9, schema default 10",
        "evaluation/default.yaml: min_clusters=11, schema default 12"]


def test_the_library_writes_no_literal_default_for_a_configured_key():
    found = {}
    for schema, files in FED_BY.items():
        keys = {f.name for f in dataclasses.fields(schema)} - NOT_DEFAULTS
        for rel in files:
            hits = literal_defaults((REPO / rel).read_text(), keys)
            if hits:
                found.setdefault(rel, set()).update(hits)
    assert found == {}


def test_a_literal_library_default_is_found():
    source = ("from dataclasses import dataclass\n"
              "def holdout_split(ids, test_fraction: float = 0.3, seed=SEED, k=None): ...\n"
              "@dataclass\nclass P:\n    l2: float = 1.0\n    tol: float = TOL\n    grid: list = (0.1, -1.0)\n")
    assert literal_defaults(source, {"test_fraction", "seed", "k", "l2", "tol", "grid"}) == [
        "holdout_split(test_fraction=...)", "P.l2", "P.grid"]


#: ``.get(key, literal)`` receivers that are not config nodes: a simulation journal record, and
#: build_planted's plant (a loader argument no schema describes; its seed is read once).
NOT_CONFIG_NODES = {"record", "plant"}


def configured_keys() -> set[str]:
    """Every field name of every config schema (ipi.run.schemas), less the naming keys."""
    return {f.name for s in vars(schemas).values() if isinstance(s, type) and dataclasses.is_dataclass(s)
            for f in dataclasses.fields(s)} - NOT_DEFAULTS


def literal_fallbacks(source: str, keys: set[str]) -> list[str]:
    """``node.get("key", value)`` in ``source`` with ``key`` configured and a literal ``value``: the
    key's default written again as a fallback (the schema's own default is the one to read)."""
    return [ast.unparse(n) for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get"
            and len(n.args) == 2 and isinstance(n.args[0], ast.Constant) and n.args[0].value in keys
            and _literal(n.args[1]) and ast.unparse(n.func.value) not in NOT_CONFIG_NODES]


def test_no_configured_key_falls_back_to_a_literal_default():
    keys = configured_keys()
    found = {str(p.relative_to(REPO)): hits for p in sorted((REPO / "ipi").rglob("*.py"))
             if (hits := literal_fallbacks(p.read_text(), keys))}
    assert found == {}


def test_a_literal_fallback_is_found():
    source = ('def f(cfg, b, plant):\n    n = cfg.split.get("min_per_side", 2)\n'
              '    m = b.get("multimodal", True)\n    w = cfg.split.get("wording", SplitConf.wording)\n'
              '    s = plant.get("seed", 0)\n    u = cfg.get("not_configured", 1)\n    return cfg.get("seed")\n')
    assert literal_fallbacks(source, configured_keys()) == [
        "cfg.split.get('min_per_side', 2)", "b.get('multimodal', True)"]
