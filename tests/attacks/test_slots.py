"""Deterministic slot filling (ipi.attacks.slots) and the item invariants (ipi.attacks.source)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from ipi.attacks.source import (
    MAX_TEXT_CHARS,
    AttackSourceError,
    BenignText,
    Goal,
    Provenance,
    Template,
    check_text,
    slots_of,
    validate_source,
)
from ipi.attacks.slots import render, slot_pools
from tests.conftest import REPO

TPL = Template(id="x/t", source="x", text="From {user} to {model}: {goal}. Signed, {user}", name="t", origin="o")
GOAL = Goal(id="x/g", source="x", family="redirect", text="greet {first_name} at http://a.example",
            target={"url": ("http://a.example",)}, origin="o")


def _by_hand(key: str, slot: str) -> str:
    """The pool choice recomputed from its definition: SHA-256 of the unit-separated parts."""
    pool = slot_pools()[slot]
    h = int(hashlib.sha256(f"attack-slot\x1f{key}\x1f{slot}".encode()).hexdigest(), 16)
    return pool[h % len(pool)]


def test_render_fills_every_slot_from_the_pools_as_defined():
    r = render(TPL, GOAL, "traj7|3|0")
    user, model, name = (_by_hand("traj7|3|0", s) for s in ("user", "model", "first_name"))
    assert r.text == f"From {user} to {model}: greet {name} at http://a.example. Signed, {user}"
    assert r.fills == {"user": user, "model": model, "first_name": name}
    assert (r.template, r.goal, r.goal_family, r.sources) == ("x/t", "x/g", "redirect", ("x", "x"))


def test_same_key_same_text_other_keys_cover_each_pool():
    assert render(TPL, GOAL, "k1") == render(TPL, GOAL, "k1")
    seen = {render(TPL, GOAL, f"traj|{i}|0").fills["user"] for i in range(200)}
    assert seen == set(slot_pools()["user"])


def test_filling_is_identical_in_another_process_with_another_hash_seed():
    keys = [f"t{i}|{i % 5}|0" for i in range(20)]
    here = [render(TPL, GOAL, k).text for k in keys]
    code = ("import json; from tests.attacks.test_slots import TPL, GOAL; from ipi.attacks.slots import render; "
            f"print(json.dumps([render(TPL, GOAL, k).text for k in {keys!r}]))")
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import json

    assert json.loads(out.stdout) == here


def test_goal_bound_values_win_over_context_which_wins_over_pools():
    tpl = Template(id="x/t2", source="x", text="{goal} for {task}; {tools}", name="t", origin="o",
                   goal_slots=("tools",))
    g = Goal(id="x/g2", source="x", family="act", text="do it", target={"tool": ("f",)}, origin="o",
             slots={"tools": "use `f` with {'a': 1}", "task": "goal's task"})
    r = render(tpl, g, "k", context={"task": "caller's task"})
    assert r.text == "do it for goal's task; use `f` with {'a': 1}"  # a dict repr is no slot
    g2 = Goal(id="x/g3", source="x", family="act", text="do it", target={"tool": ("f",)}, origin="o",
              slots={"tools": "t"})
    assert render(tpl, g2, "k", context={"task": "caller's task"}).text == "do it for caller's task; t"
    assert render(tpl, g2, "k").fills["task"] == slot_pools()["task"][0]


def test_render_refuses_what_it_cannot_fill():
    tpl = Template(id="x/t3", source="x", text="{goal} {nonesuch}", name="t", origin="o")
    with pytest.raises(AttackSourceError, match="no value for slot {nonesuch}"):
        render(tpl, GOAL, "k")
    tk = Template(id="x/t4", source="x", text="{goal} {tools}", name="t", origin="o", goal_slots=("tools",))
    with pytest.raises(AttackSourceError, match="lacks them"):
        render(tk, GOAL, "k")
    # a goal-bound value that itself looks like a slot would reach the prompt as "{x}": refused
    bad = Goal(id="x/g5", source="x", family="act", text="do", target={"tool": ("f",)}, origin="o",
               slots={"tools": "then {x}"})
    with pytest.raises(AttackSourceError, match=r"slots \['x'\] left"):
        render(tk, bad, "k")


def test_check_text_accepts_printable_and_refuses_the_rest():
    check_text("Line one\n\tline two 🌳 café", what="ok")
    for bad, msg in (("", "empty"), ("   \n", "empty"), ("zero\u200bwidth", "U\\+200B"),
                     ("bell\x07", "U\\+0007"), ("a" * (MAX_TEXT_CHARS + 1), "characters >"),
                     ("rtl\u202eoverride", "U\\+202E")):
        with pytest.raises(AttackSourceError, match=msg):
            check_text(bad, what="item")


def test_slots_of_only_names_lowercase_identifiers():
    assert slots_of("{user} {Goal} {'a': 1} {{x}} {goal} {user}") == ("user", "x", "goal")


class _Src:
    """A hand-built source for attacking validate_source."""

    family = "x"

    def __init__(self, templates=(), goals=(), benign=()):
        self._t, self._g, self._b = tuple(templates), tuple(goals), tuple(benign)

    def templates(self):
        return self._t

    def goals(self):
        return self._g

    def benign(self):
        return self._b

    def provenance(self):
        return (Provenance("x", "x", "0", (), "MIT"),)


def _tpl(text="Do {goal} now", **kw):
    return Template(**{"id": "x/t", "source": "x", "text": text, "name": "t", "origin": "o", **kw})


def _goal(**kw):
    return Goal(**{"id": "x/g", "source": "x", "family": "click", "text": "click [7]",
                   "target": {"element": ("[7]",)}, "origin": "o", **kw})


def test_validate_source_passes_a_good_source_and_counts_it():
    src = _Src([_tpl()], [_goal()], [BenignText("x/b", "x", "Scroll down.", "ui", "o")])
    assert validate_source(src) == {"templates": 1, "goals": 1, "benign": 1}


@pytest.mark.parametrize("src,msg", [
    (_Src([_tpl()], [_goal(id="x/t")]), "duplicate id"),
    (_Src([_tpl(text="No slot here")], [_goal()]), "exactly one {goal}"),
    (_Src([_tpl(text="{goal} and {goal}")], [_goal()]), "exactly one {goal}"),
    (_Src([_tpl()], [_goal(family="phish")]), "goal family 'phish'"),
    (_Src([_tpl()], [_goal(target={"element": ()})]), "empty values"),
    (_Src([_tpl()], [_goal(target={"colour": ("red",)})]), "bad target keys"),
    (_Src([_tpl()], [_goal(text="do {goal}")]), "cannot hold a {goal}"),
    (_Src([_tpl(source="y", id="y/t")], [_goal()]), "source 'y' not in"),
    (_Src([_tpl(id="t")], [_goal()]), "does not start with"),
    (_Src([_tpl(text="Do {goal} \u200b")], [_goal()]), "U\\+200B"),
    (_Src([_tpl(text="{goal} {tools}", goal_slots=("tools",))], [_goal()]), "no goal of the source carries"),
    (_Src([_tpl(goal_slots=("tools",))], [_goal(slots={"tools": "t"})]), "not in its text"),
])
def test_validate_source_refuses_each_broken_invariant(src, msg):
    with pytest.raises(AttackSourceError, match=msg):
        validate_source(src)
