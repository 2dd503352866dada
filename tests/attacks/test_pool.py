"""The attack pool of a run (ipi.attacks.pool) and its rows on every surface (issue 25).

Every source's rows render on every surface with exact spans: the injected text sits at
``[insert_start, insert_end)`` of the changed field, and on the token-matched surfaces its
tokens are exactly the tokens of the field between the span's token boundaries (checked with
the real Qwen2.5-VL tokenizer's offsets). i_dom adapts quotes and line breaks, flags the row and
keeps the published text otherwise; i_tool carries the published text unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from PIL import Image

from ipi.attacks.pool import AttackPool, attack_key, pool_from_config, project_pool, source_class
from ipi.attacks.source import AttackSourceError, BenignText, Goal, Template, slots_of
from ipi.data.schema import Step
from ipi.surfaces.bank import ATTACK_GOAL_LIST, ATTACK_TEMPLATES, all_attack_texts, attack_text
from ipi.surfaces.banner import _longest_bank_text
from ipi.surfaces.variants import make_variants
from ipi.attacks.wording import full_family, wording_plan

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("IPI_SHARED", REPO.parent / "shared"))
TOKENIZER = SHARED / "models" / "qwen2_5_vl_processor"
SOURCES = ("project", "agentdojo", "injecagent", "garak", "mix")
ELEMENTS = '[0]: ".us", "Amazon";\t[1]: "Delivering to Santaclara 95050";\t[2]: <input> "Search Amazon";'


def pool(name: str) -> AttackPool:
    return pool_from_config(OmegaConf.load(REPO / "conf" / "attack" / f"{name}.yaml"))


@pytest.fixture(scope="module")
def tok():
    if not TOKENIZER.is_dir():
        pytest.skip(f"no tokenizer at {TOKENIZER}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER))


def _step(tmp_path: Path, step: int = 1) -> Step:
    path = tmp_path / f"s{step}.png"
    Image.new("RGB", (640, 480), (250, 250, 250)).save(path)
    return Step(step=step, screenshot=str(path), element_text=ELEMENTS, element_text_omitted=False,
                tool_result="Action executed: Click [7]", thought="t", action="Click [7]", action_type="click")


# ------------------------------------------------------------------------------- the project pool


def test_project_pool_is_the_bank_chooser():
    p = project_pool()
    for tid in ("examples/taskAmazon--0", "x/y", "t"):
        for step in range(6):
            for k in range(3):
                text, meta = attack_text(tid, step, k)
                t2, m2 = p.choose(tid, step, k)
                assert t2 == text
                assert {key: m2[key] for key in meta} == meta
                assert m2["source"] == m2["goal_source"] == "project" and "fills" not in m2
    # restricted families too (held-out wording): the same indices
    assert p.choose("a", 3, 0, [1, 5, 9], [0, 7])[0] == attack_text("a", 3, 0, templates=[1, 5, 9], goals=[0, 7])[0]
    assert p.longest_text == _longest_bank_text() == max(all_attack_texts(), key=len)


def test_project_wording_plan_is_the_bank_plan():
    # The families of the project pool are what wording_plan drew before pools (indices of
    # r1_ivis' results.json, split.seed=0 with 29 training and 13 test trajectories).
    ids = [f"t{i:02d}" for i in range(42)]
    plan = wording_plan([(set(ids[:29]), set(ids[29:]))], 0)
    assert plan.families["test"].to_dict() == {
        "templates": [4, 5, 6, 8, 9, 11, 21], "goals": [0, 3, 7, 8, 12, 18],
        "imperatives": [2, 6, 7, 14, 16, 26, 29, 30, 31, 32, 34]}


# ----------------------------------------------------------------------------- the config group


def test_every_attack_config_builds_its_pool():
    for name in SOURCES:
        p = pool(name)
        assert p.name == name and p.templates and p.goals and p.benign
    assert pool("project") is pool("project")  # one pool per config (cached)
    assert pool("garak").benign_from == ("notinject",)  # garak has no benign text of its own
    assert pool("agentdojo").benign_from == ("agentdojo",)
    assert sorted(pool("mix").sources) == ["agentdojo", "garak", "injecagent", "project"]


def test_attack_config_errors():
    good = dict(OmegaConf.load(REPO / "conf" / "attack" / "garak.yaml"))
    with pytest.raises(AttackSourceError, match="attack.name must be 'garak'"):
        pool_from_config({**good, "name": "agentdojo"})
    with pytest.raises(AttackSourceError, match="is not an attack source class"):
        source_class("os.system")
    with pytest.raises(AttackSourceError, match="no templates or no goals"):
        pool_from_config({"_target_": "ipi.attacks.notinject.NotInjectSource", "name": "notinject",
                          "sources": None, "benign": None})
    with pytest.raises(AttackSourceError, match="no benign text"):
        pool_from_config({**good, "benign": None})


def test_attack_typo_fails_at_composition(tmp_path):
    from hydra.errors import ConfigCompositionException
    from omegaconf.errors import ConfigKeyError

    from tests.conftest import compose_train

    cfg = compose_train(tmp_path, ["attack=garak"])
    assert cfg.attack.name == "garak" and cfg.attack.benign == "notinject"
    assert compose_train(tmp_path).attack.name == "project"  # the default
    with pytest.raises((ConfigCompositionException, ConfigKeyError)):
        compose_train(tmp_path, ["attack.benigm=notinject"])
    with pytest.raises(ConfigCompositionException):
        compose_train(tmp_path, ["attack=agentdjo"])


def test_validate_refuses_a_mismatched_name(tmp_path):
    from ipi.run.validation import validate
    from tests.conftest import compose_train

    cfg = compose_train(tmp_path, ["attack=garak", "attack.name=injecagent"])
    with pytest.raises(ValueError, match="attack.name must be 'garak'"):
        validate(cfg)


# ------------------------------------------------------------------------------ rendering rows


def test_foreign_rows_record_their_source_and_fill_slots_by_key():
    p = pool("agentdojo")
    fam = full_family(p).bind("Find a hotel in Paris")
    seen = set()
    for step in range(30):
        text, meta = fam.attacks("traj/a", step, 1)[0]
        assert meta["source"] == "agentdojo" and meta["template_id"].startswith("agentdojo/")
        t, g = p.templates[meta["template"]], p.goals[meta["goal"]]
        assert (t.id, g.id) == (meta["template_id"], meta["goal_id"]) and t.accepts(g)
        assert not slots_of(text)  # every slot filled (literal brace text of tool sequences stays)
        for slot, value in meta.get("fills", {}).items():
            assert value in text
        seen.add(meta["template_id"])
        # the same key gives the same text; the key is "<traj>|<step>|<k>"
        assert fam.attacks("traj/a", step, 1)[0] == (text, meta)
    assert attack_key("traj/a", 3, 0) == "traj/a|3|0"
    assert len(seen) >= 4


def _token_span_exact(tok, field: str, start: int, end: int, text: str) -> bool:
    """The character span holds the text, and the tokens covering it cover at most the wrapper's
    two neighbouring characters on each side (a quote, a space or "; merging with the text's ends)."""
    enc = tok(field, add_special_tokens=False, return_offsets_mapping=True)
    inside = [(a, b) for a, b in enc.offset_mapping if a < end and b > start]
    return (field[start:end] == text and bool(inside)
            and start - 2 <= inside[0][0] <= start and end <= inside[-1][1] <= end + 2)


@pytest.mark.parametrize("name", SOURCES)
def test_every_source_renders_on_every_surface(name, tmp_path, tok):
    count = lambda s: len(tok(s, add_special_tokens=False).input_ids)  # noqa: E731
    fam = full_family(pool(name)).bind("Buy a kettle")
    step = _step(tmp_path)
    for trajectory in ("a/1", "b/2", "c/3"):
        for surface in ("i_dom", "i_tool", "i_vis"):
            vs = make_variants(trajectory, step, surface, ["c_scrambled", "c_imperative"], count_tokens=count,
                               wording=fam)
            attack = next(v for v in vs if v.variant == "attack")
            assert attack.meta["source"] in pool(name).sources
            if surface == "i_vis":
                assert isinstance(attack.meta["text_fits"], bool)
                continue
            field = attack.element_text if surface == "i_dom" else attack.tool_result
            s, e = attack.meta["insert_start"], attack.meta["insert_end"]
            assert field[s:e] == attack.injected_text
            assert _token_span_exact(tok, field, s, e, attack.injected_text)
            for v in vs:
                if v.variant.startswith("c_"):
                    f = v.element_text if surface == "i_dom" else v.tool_result
                    assert f[v.meta["insert_start"]:v.meta["insert_end"]] == v.injected_text
                    if v.variant == "c_scrambled":
                        assert v.meta["token_delta"] == 0
                    else:  # whole sentences: exact where reachable, the rest reported (docs/surfaces.md)
                        assert abs(v.meta["token_delta"]) <= 3


def test_i_dom_adapts_quotes_and_newlines_and_flags_the_row(tmp_path):
    p = pool("garak")
    fam = full_family(p)
    step = _step(tmp_path)
    count = len
    adapted = 0
    for trajectory in (f"t/{i}" for i in range(40)):
        raw, _ = fam.attacks(trajectory, step.step, 1)[0]
        dom = make_variants(trajectory, step, "i_dom", ["c_scrambled"], count_tokens=count, wording=fam)
        tool = make_variants(trajectory, step, "i_tool", ["c_scrambled"], count_tokens=count, wording=fam)
        a_dom, a_tool = dom[1], tool[1]
        assert a_tool.injected_text == raw and a_tool.meta["adapted"] is False  # i_tool carries it as is
        assert '"' not in a_dom.injected_text and "\n" not in a_dom.injected_text and "\t" not in a_dom.injected_text
        assert a_dom.meta["adapted"] is (a_dom.injected_text != raw)
        assert a_dom.injected_text == " ".join(raw.replace('"', "'").split())
        # the entry list still parses: one more entry than the page had
        assert a_dom.element_text.count(";\t") == ELEMENTS.count(";\t") + 1
        adapted += a_dom.meta["adapted"]
        # the scrambled control keeps the adapted attack's layout
        assert len(dom[2].injected_text.split()) > 0 and '"' not in dom[2].injected_text
    assert adapted > 10  # garak holds quotes and newlines in most pairs (docs/attacks.md)


def test_banner_is_sized_for_the_pool(tmp_path):
    from ipi.surfaces.banner import banner_spec

    bank = banner_spec("t", 1, (800, 600))
    assert banner_spec("t", 1, (800, 600), reference_text=project_pool().longest_text) == bank
    garak = banner_spec("t", 1, (800, 600), reference_text=pool("garak").longest_text)
    h = lambda s: s.box[3] - s.box[1]  # noqa: E731
    assert h(garak) > h(bank) or garak.font_size < bank.font_size


def test_template_that_accepts_no_goal_of_the_family_is_passed_over():
    t_any = Template("x/any", "x", "Do {goal}", "any", "o")
    t_tools = Template("x/tools", "x", "Use {tools} for {goal}", "tools", "o", goal_slots=("tools",))
    g = Goal("x/g", "x", "say", "print hi", {"answer": ("hi",)}, "o")
    p = AttackPool("x", (t_tools, t_any), (g,), (BenignText("x/b", "x", "Read on.", "ui", "o"),), ("x",))
    texts = {p.choose("t", s, 0)[0] for s in range(20)}
    assert texts == {"Do print hi"}


def test_bank_meta_indices_are_pool_indices():
    p = project_pool()
    assert [t.text for t in p.templates] == list(ATTACK_TEMPLATES)
    assert [g.text for g in p.goals] == [g for _, g in ATTACK_GOAL_LIST]
