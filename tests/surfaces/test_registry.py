"""The surface protocol and registry: declarations checked, conf/surface read, nothing branches on names."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import ClassVar

import pytest

from ipi import protocol
from ipi.surfaces import registry
from ipi.surfaces.surface import Insertion, Surface, TextSurface
from ipi.surfaces.i_dom import ElementListSurface
from ipi.surfaces.i_tool import ToolResultSurface
from ipi.surfaces.i_vis import BannerSurface

REPO = Path(__file__).resolve().parents[2]


class _Line(Insertion):
    def __init__(self, step):
        self.original, self.meta = step.tool_result, {}

    def line(self, text):
        return text

    def apply(self, text):
        return (self.original, 0, 0) if text is None else (text + self.original, 0, len(text))


class _Extra(TextSurface):
    """A valid text surface that is not shipped (``i_extra``)."""

    name: ClassVar[str] = "i_extra"
    controls: ClassVar[tuple] = ("c_scrambled",)
    required_controls: ClassVar[tuple] = ("c_scrambled",)
    needs_image: ClassVar[bool] = False
    token_matched: ClassVar[bool] = True
    untrusted_group: ClassVar[str] = "observation"
    gallery_title: ClassVar[str] = "i_extra: test"
    field: ClassVar[str] = "tool_result"

    def insertion(self, trajectory_id, step):
        return _Line(step)


class _ExtraImage(_Extra):
    name: ClassVar[str] = "i_zoom"
    needs_image: ClassVar[bool] = True


def _variant_of(base: type, **attrs) -> type:
    return type("Bad", (base,), attrs)


@pytest.fixture
def fresh_registry(monkeypatch):
    """A copy of the registry that the test may extend; the process's own is left untouched."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    return registry


def test_the_shipped_surfaces_in_protocol_order_with_their_declarations():
    assert registry.surface_names() == ("i_vis", "i_dom", "i_tool") == protocol.SURFACES
    vis, dom, tool = registry.surfaces()
    assert (type(vis), type(dom), type(tool)) == (BannerSurface, ElementListSurface, ToolResultSurface)
    assert protocol.CONTROLS_BY_SURFACE == {"i_vis": ("c_scrambled", "c_imperative", "c_occlusion"),
                                            "i_dom": ("c_scrambled", "c_imperative"),
                                            "i_tool": ("c_scrambled", "c_imperative")}
    assert [s.required_controls for s in (vis, dom, tool)] == [("c_scrambled", "c_imperative")] * 3
    assert [(s.needs_image, s.token_matched, s.untrusted_group) for s in (vis, dom, tool)] == [
        (True, False, "image"), (False, True, "observation"), (False, True, "observation")]
    assert (dom.field, dom.new_line, tool.field, tool.new_line) == ("element_text", False, "tool_result", True)
    assert registry.get_surface("i_dom") is dom and registry.get_surface(dom) is dom
    assert "Δprompt length 0" in vis.construction_note()
    assert dom.construction_note().startswith("On i_dom the injected text lengthens the prompt")


def test_unknown_surface_names_the_registered_ones():
    with pytest.raises(ValueError, match=r"^unknown surface 'i_foo'; allowed: i_vis, i_dom, i_tool$"):
        registry.get_surface("i_foo")
    assert registry.find_surface("i_foo") is None and registry.find_surface(None) is None


@pytest.mark.parametrize(("attrs", "message"), [
    ({"name": "I_Extra"}, "is not lower-case letters"),
    ({"name": 3}, "is not lower-case letters"),
    ({"controls": ()}, "controls must be a non-empty tuple"),
    ({"controls": ["c_scrambled"]}, "controls must be a non-empty tuple"),
    ({"controls": ("c_scrambled", "c_scrambled")}, "controls must be a non-empty tuple of distinct"),
    ({"required_controls": ("c_imperative",)}, "required_controls ('c_imperative',) must be a tuple within"),
    ({"controls": ("c_scrambled", "c_imperative"), "required_controls": ("c_imperative",)},
     "required_controls must include c_scrambled"),
    ({"needs_image": 1}, "needs_image must be True or False"),
    ({"token_matched": None}, "token_matched must be True or False"),
    ({"untrusted_group": ""}, "untrusted_group must be a non-empty string"),
    ({"gallery_title": None}, "gallery_title must be a non-empty string"),
    ({"field": "task"}, "field must be one of element_text, tool_result"),
])
def test_an_inconsistent_declaration_is_refused_naming_the_attribute(attrs, message):
    _Extra().check()  # the declaration the bad ones are made from passes
    with pytest.raises(ValueError, match="surface class .*Bad") as e:
        _variant_of(_Extra, **attrs)().check()
    assert message in str(e.value)


def test_a_missing_attribute_is_named():
    class Half(Surface):
        name = "i_half"

        def make_variants(self, *a, **k):
            return []

        def construction_note(self):
            return ""

    with pytest.raises(ValueError, match="missing class attribute.*controls, required_controls"):
        Half().check()


@pytest.mark.parametrize(("attrs", "message"), [
    ({"controls": ("c_scrambled", "c_blur"), "required_controls": ("c_scrambled",)},
     "surface i_extra: unknown control 'c_blur'; allowed: c_scrambled, c_imperative, c_occlusion"),
    ({"untrusted_group": "pixels"},
     "surface i_extra: untrusted_group 'pixels' is not a token group; allowed: last_prompt, image, task"),
])
def test_the_protocol_vocabulary_is_enforced(attrs, message):
    assert protocol.check_surface(_Extra()).name == "i_extra"
    bad = _variant_of(_Extra, **attrs)()
    bad.check()  # consistent in itself: only the vocabulary is wrong
    with pytest.raises(ValueError) as e:
        protocol.check_surface(bad)
    assert str(e.value).startswith(message)


def test_register_is_idempotent_and_refuses_a_second_class_under_one_name(fresh_registry):
    extra = fresh_registry.register(_Extra)
    assert fresh_registry.register(_Extra) is extra
    assert fresh_registry.get_surface("i_extra") is extra
    with pytest.raises(ValueError, match="surface 'i_dom' is already ipi.surfaces.i_dom.ElementListSurface; rename"):
        fresh_registry.register(_variant_of(_Extra, name="i_dom"), "x.yaml")


def test_a_surface_from_elsewhere_is_found_by_name_but_never_listed(fresh_registry):
    """A run's sources and gallery must not depend on which surfaces other jobs of its sweep named."""
    fresh_registry.register(_Extra)
    fresh_registry.register(_ExtraImage)
    assert fresh_registry.surface_names() == ("i_vis", "i_dom", "i_tool")
    assert protocol.transfer_source_surfaces("i_vis", True) == ["i_dom", "i_tool"]
    assert protocol.transfer_source_surfaces("i_dom", False) == ["i_tool"]
    # a run on the surface from elsewhere trains its transfer probe on every shipped surface it can read
    assert protocol.transfer_source_surfaces("i_extra", True) == ["i_vis", "i_dom", "i_tool"]
    assert protocol.transfer_source_surfaces("i_extra", False) == ["i_dom", "i_tool"]
    assert fresh_registry.find_surface("i_zoom").needs_image


def _reload_from(monkeypatch, conf: Path):
    monkeypatch.setattr(registry, "_REGISTRY", {})
    monkeypatch.setattr(registry, "CONF_DIR", conf)
    registry._load.cache_clear()


@pytest.fixture
def conf_dir(tmp_path, monkeypatch):
    """An empty ``conf/surface`` the registry reads instead of the repository's (restored after)."""
    d = tmp_path / "surface"
    d.mkdir()
    _reload_from(monkeypatch, d)
    yield d
    registry._load.cache_clear()  # monkeypatch restores the real dict and CONF_DIR; the next call re-reads


def test_the_registry_reads_conf_surface(conf_dir):
    for f in (REPO / "conf" / "surface").glob("*.yaml"):
        (conf_dir / f.name).write_text(f.read_text())
    assert registry.surface_names() == ("i_vis", "i_dom", "i_tool")


def test_a_shipped_fourth_surface_is_listed_in_order_and_becomes_a_transfer_source(conf_dir):
    for f in (REPO / "conf" / "surface").glob("*.yaml"):
        (conf_dir / f.name).write_text(f.read_text())
    for cls in (_Extra, _ExtraImage):
        (conf_dir / f"{cls.name}.yaml").write_text(f"_target_: {__name__}.{cls.__qualname__}\nname: {cls.name}\n")
    # screenshot surfaces first, then text surfaces, by name within each
    assert registry.surface_names() == ("i_vis", "i_zoom", "i_dom", "i_extra", "i_tool")
    assert protocol.transfer_source_surfaces("i_vis", True) == ["i_zoom", "i_dom", "i_extra", "i_tool"]
    assert protocol.transfer_source_surfaces("i_dom", False) == ["i_extra", "i_tool"]


@pytest.mark.parametrize(("name", "text", "message"), [
    ("i_dom.yaml", "name: i_dom\n", "i_dom.yaml: no _target_ naming the surface's class"),
    ("i_dom.yaml", "_target_: ipi.surfaces.i_dom.ElementListSurface\nname: i_tool\n",
     "the file name, its name ('i_tool') and the class's name ('i_dom') must be the same"),
    ("i_tool.yaml", "_target_: ipi.surfaces.i_dom.ElementListSurface\nname: i_tool\n",
     "the file name, its name ('i_tool') and the class's name ('i_dom') must be the same"),
    ("i_dom.yaml", "_target_: ipi.surfaces.i_dom.Missing\nname: i_dom\n", "cannot import it"),
    ("i_dom.yaml", "_target_: [\n", "not valid YAML"),
])
def test_a_bad_surface_file_is_refused_naming_it(conf_dir, name, text, message):
    (conf_dir / name).write_text(text)
    with pytest.raises(ValueError) as e:
        registry.surfaces()
    assert str(e.value).startswith(str(conf_dir / name)) and message in str(e.value)


def test_an_empty_conf_dir_is_refused(conf_dir):
    with pytest.raises(ValueError, match="no surface config files"):
        registry.surfaces()


def _surface_name_literals(path: Path) -> list[int]:
    names = set(registry.surface_names())
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names]


def test_no_code_outside_the_surface_modules_names_a_surface():
    """Everything asks the surface object; a name written in code would be a branch on it.

    ``ipi/tools/simulate/truths.py`` labels its synthetic score table as an i_vis run (data, not a branch);
    the command-line tool ``bench`` names a default ``--surface`` and the
    known-answer matrix lists its cells (backbone × surface) the way a sweep's overrides would:
    data, never a branch on the name.
    """
    allowed = {Path("ipi/tools/simulate/truths.py"), Path("ipi/tools/bench.py"), Path("ipi/tools/known_answers.py")}
    found = {p.relative_to(REPO): _surface_name_literals(p) for p in sorted((REPO / "ipi").rglob("*.py"))
             if "surfaces" not in p.relative_to(REPO).parts[:2]}
    assert {str(p): lines for p, lines in found.items() if lines and p not in allowed} == {}
    # the check finds such a literal where there is one
    assert _surface_name_literals(REPO / "ipi" / "surfaces" / "i_vis.py")
