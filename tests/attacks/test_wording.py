"""Held-out attack wording (ipi.attacks.wording; PROTOCOL.md §7 check 3; docs/surfaces.md)."""

from __future__ import annotations

import pytest

from ipi.probe.folds import make_folds
from ipi.surfaces.bank import (
    ATTACK_GOAL_LIST,
    ATTACK_TEMPLATES,
    BENIGN_IMPERATIVES,
    attack_text,
    stable_int,
)
from ipi.surfaces.controls import benign_imperative
from ipi.attacks.wording import full_family, wording_overlap, wording_plan
from tests.conftest import WEBVOYAGER

IDS = [f"traj{i:02d}" for i in range(20)]


def _partition(plan, bank_len, key):
    seen = [i for f in plan.families.values() for i in getattr(f, key)]
    assert sorted(seen) == list(range(bank_len)), key  # a partition: each entry in exactly one family


@pytest.mark.parametrize("kind,k", [("holdout", None), ("kfold", 5), ("kfold", 3)])
def test_families_partition_every_bank_and_follow_the_split(kind, k):
    folds = make_folds(IDS, kind, test_fraction=0.3, k=k or 5, seed=7)
    plan = wording_plan(folds, 7)
    _partition(plan, len(ATTACK_TEMPLATES), "templates")
    _partition(plan, len(ATTACK_GOAL_LIST), "goals")
    _partition(plan, len(BENIGN_IMPERATIVES), "imperatives")
    for i, (train, test) in enumerate(folds):
        test_fams = {plan.family_of[t] for t in test}
        train_fams = {plan.family_of[t] for t in train}
        assert len(test_fams) == 1 and not (test_fams & train_fams)
    if kind == "holdout":
        assert len(plan.families["test"].templates) == round(0.3 * len(ATTACK_TEMPLATES))
        # goals are interleaved across goal families: the 6 test goals cover all 5 intents
        assert len({ATTACK_GOAL_LIST[j][0] for j in plan.families["test"].goals}) == 5
    # deterministic in the seed, different for another seed
    assert wording_plan(folds, 7) == plan
    assert wording_plan(folds, 8).families != plan.families


def test_too_many_folds_is_a_clear_error():
    folds = make_folds([f"t{i}" for i in range(25)], "kfold", k=21, seed=0)
    with pytest.raises(ValueError, match="heldout_wording=false"):
        wording_plan(folds, 0)


def test_defaults_reproduce_the_shared_bank_choice():
    """Without a family the choice is the pre-family formula (estimands unchanged when off)."""
    for tid, step, k in [("a", 0, 0), ("x/y", 7, 1), ("examples/taskAmazon--0", 3, 2)]:
        h0 = stable_int("attack-template", tid, step)
        i = (h0 + k) % len(ATTACK_TEMPLATES)
        j = stable_int("attack-goal", tid, step, k) % len(ATTACK_GOAL_LIST)
        text, meta = attack_text(tid, step, k)
        assert (meta["template"], meta["goal"]) == (i, j)
        assert text == ATTACK_TEMPLATES[i].format(goal=ATTACK_GOAL_LIST[j][1])
        assert attack_text(tid, step, k, templates=full_family().templates, goals=full_family().goals) == (text, meta)
    assert benign_imperative(120, "k") == benign_imperative(120, "k", BENIGN_IMPERATIVES)


def test_family_restricts_every_choice():
    fam_t, fam_g = (3, 11, 17), (0, 9)
    for s in range(40):
        for k in range(3):
            _, meta = attack_text("t", s, k, templates=fam_t, goals=fam_g)
            assert meta["template"] in fam_t and meta["goal"] in fam_g
    bank = BENIGN_IMPERATIVES[:4]
    text = benign_imperative(400, "seed", bank)
    assert len(text) == 400
    others = [b for b in BENIGN_IMPERATIVES if b not in bank]
    assert not any(o in text for o in others) and all(b in text for b in bank)


def _sentences(text: str) -> set[int]:
    """Indices of bank imperatives whose full sentence occurs in ``text``."""
    return {i for i, b in enumerate(BENIGN_IMPERATIVES) if b in text}


@pytest.mark.needs_shared
@pytest.mark.parametrize("surface,kind", [("i_vis", "holdout"), ("i_dom", "kfold"), ("i_tool", "holdout")])
def test_no_test_row_wording_appears_in_any_training_row(trajectories, surface, kind):
    """Real trajectories, real rows: test rows' templates, goals and imperatives never appear in training rows."""
    from ipi.extraction.rows import build_rows

    if not WEBVOYAGER.exists():
        pytest.skip("no shared data")
    trajs = list(trajectories)[:6]
    ids = [t.trajectory_id for t in trajs]
    folds = make_folds(ids, kind, test_fraction=0.5, k=3, seed=1)
    plan = wording_plan(folds, 1)
    controls = ("c_scrambled", "c_imperative") + (("c_occlusion",) if surface == "i_vis" else ())
    rows = build_rows(trajs, surface, controls, n_attacks=2,
                      count_tokens=(lambda s: len(s.split())) if surface != "i_vis" else None, wording=plan)
    # each text of an attack row is its template filled with its goal
    for r in rows:
        if r.variant.variant == "attack":
            m = r.variant.meta
            assert r.variant.injected_text == ATTACK_TEMPLATES[m["template"]].format(goal=ATTACK_GOAL_LIST[m["goal"]][1])
    for train, test in folds:
        def used(side):
            tpl, gls, imp = set(), set(), set()
            for r in rows:
                if r.trajectory_id not in side or r.variant.variant == "clean":
                    continue
                tpl.add(r.variant.meta["template"])
                gls.add(r.variant.meta["goal"])
                if r.variant.variant == "c_imperative":
                    imp |= _sentences(r.variant.injected_text)
            return tpl, gls, imp
        a, b = used(train), used(test)
        assert all(b_ for b_ in b), "test rows use templates, goals and imperatives"
        for x, y in zip(a, b):
            assert not (x & y)
        # every full imperative sentence a row shows belongs to its own family
        for r in rows:
            if r.variant.variant == "c_imperative":
                assert _sentences(r.variant.injected_text) <= set(plan.family(r.trajectory_id).imperatives)
    meta = [{"trajectory_id": r.trajectory_id, "variant": r.variant.variant, **r.variant.meta} for r in rows]
    rec = wording_overlap(meta, folds, plan)
    assert rec["heldout"] and rec["overlap"] == 0
    # the shared bank (held-out wording off) does overlap on these rows, and the record says so
    shared = build_rows(trajs, surface, controls, n_attacks=2,
                        count_tokens=(lambda s: len(s.split())) if surface != "i_vis" else None)
    meta = [{"trajectory_id": r.trajectory_id, "variant": r.variant.variant, **r.variant.meta} for r in shared]
    off = wording_overlap(meta, folds, None)
    assert not off["heldout"] and off["overlap"] > 0
