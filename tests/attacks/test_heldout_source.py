"""Held out by source (split.wording=source), estimands by source and the transfer table (issue 25)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from sklearn.metrics import roc_auc_score

from ipi.attacks.pool import AttackPool, pool_from_config
from ipi.attacks.source import BenignText, Goal, Template
from ipi.evaluation.by_source import estimands_by, row_counts, step_attribute, transfer_table
from ipi.evaluation.results import Settings
from ipi.probe.folds import make_folds
from ipi.attacks.wording import source_owner, source_wording_plan, wording_overlap

REPO = Path(__file__).resolve().parents[2]
IDS = [f"traj/{i:02d}" for i in range(24)]


@pytest.fixture(scope="module")
def mix() -> AttackPool:
    return pool_from_config(OmegaConf.load(REPO / "conf" / "attack" / "mix.yaml"))


@pytest.fixture(scope="module")
def plan_rows(mix):
    folds = make_folds(IDS, "kfold", k=4, seed=0)
    plan = source_wording_plan(folds, 0, mix)
    rows = []
    for t in IDS:
        fam = plan.family(t).bind("Buy a kettle")
        for step in range(3):
            text, meta = fam.attacks(t, step, 1)[0]
            rows.append({"trajectory_id": t, "step": step, "variant": "attack", "attack_index": 0,
                         "text": text, **meta})
    return folds, plan, rows


def test_one_family_per_source_with_its_own_wording(mix, plan_rows):
    _, plan, _ = plan_rows
    assert list(plan.families) == ["agentdojo", "garak", "injecagent", "project"]
    shared = next(i for i, t in enumerate(mix.templates) if t.id == "agentdojo/injecagent")
    assert shared in plan.families["injecagent"].templates  # AgentDojo copied it: InjecAgent's wording
    assert shared not in plan.families["agentdojo"].templates
    for name, fam in plan.families.items():
        owners = {source_owner(mix)[i] for i in fam.templates}
        assert owners == {name}
        assert {mix.goals[j].source for j in fam.goals} == {name}
    benign = {n: {mix.benign[m].text for m in f.imperatives} for n, f in plan.families.items()}
    assert {mix.benign[m].source for m in plan.families["project"].imperatives} == {"project"}
    assert {mix.benign[m].source for m in plan.families["garak"].imperatives} == {"notinject"}
    names = list(benign)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not benign[a] & benign[b], (a, b)
    notinject = {b.text for b in mix.benign if b.source == "notinject"}
    assert benign["garak"] | benign["injecagent"] == notinject  # dealt out, none lost


def test_no_test_source_wording_in_training_rows(mix, plan_rows):
    folds, plan, rows = plan_rows
    for i, (train, test) in enumerate(folds):
        held = sorted(plan.families)[i]
        te = [r for r in rows if r["trajectory_id"] in test]
        tr = [r for r in rows if r["trajectory_id"] in train]
        assert {source_owner(mix)[r["template"]] for r in te} == {held}
        assert {r["goal_source"] for r in te} == {held}
        held_goals = {mix.goals[r["goal"]].text for r in te}
        held_templates = {mix.templates[r["template"]].text for r in te}
        for r in tr:  # no held-out goal or template text, not even inside another rendered text
            assert mix.goals[r["goal"]].text not in held_goals
            assert mix.templates[r["template"]].text not in held_templates
            assert not any(g in r["text"] for g in held_goals)
        tr_imp = {mix.benign[m].text for t in train for m in plan.family(t).imperatives}
        te_imp = {mix.benign[m].text for t in test for m in plan.family(t).imperatives}
        assert not tr_imp & te_imp
    rec = wording_overlap(rows, folds, plan)
    assert rec["heldout"] and rec["overlap"] == 0 and rec["scheme"] == "source"


def test_overlap_counts_a_text_shared_by_two_sources(mix, plan_rows):
    # The check the plan must pass, attacked: AgentDojo's copy on a training row and InjecAgent's
    # enhanced prefix on a test row are one wording, counted although their ids differ.
    folds, plan, _ = plan_rows
    idx = {t.id: i for i, t in enumerate(mix.templates)}
    train, test = folds[0]
    g = 0
    rows = [{"trajectory_id": sorted(train)[0], "variant": "attack", "template": idx["agentdojo/injecagent"], "goal": g},
            {"trajectory_id": sorted(test)[0], "variant": "attack", "template": idx["injecagent/enhanced"], "goal": g + 1}]
    rec = wording_overlap(rows, folds, plan)
    assert rec["per_fold"][0]["templates"]["shared"] == 1


def test_a_shared_text_without_an_owner_is_refused():
    b = (BenignText("a/b", "a", "Read on.", "ui", "o"),)
    ga = Goal("a/g", "a", "say", "print hi", {"answer": ("hi",)}, "o")
    gb = Goal("b/g", "b", "say", "print ho", {"answer": ("ho",)}, "o")
    pool = AttackPool("m", (Template("a/t", "a", "Do {goal}", "t", "o"), Template("b/t", "b", "Do {goal}", "t", "o")),
                      (ga, gb), b, ("a",))
    with pytest.raises(ValueError, match="one template text in families"):
        source_owner(pool)


def test_source_plan_refuses_wrong_folds(mix):
    with pytest.raises(ValueError, match="split.k=4"):
        source_wording_plan(make_folds(IDS, "kfold", k=3, seed=0), 0, mix)
    garak = pool_from_config(OmegaConf.load(REPO / "conf" / "attack" / "garak.yaml"))
    with pytest.raises(ValueError, match=">= 2 sources"):
        source_wording_plan(make_folds(IDS, "kfold", k=4, seed=0), 0, garak)


def test_validate_split_wording_source(tmp_path):
    from ipi.run.validation import validate
    from tests.conftest import compose_train

    validate(compose_train(tmp_path, ["attack=mix", "split=kfold", "split.k=4", "split.wording=source"]))
    with pytest.raises(ValueError, match="split=kfold split.k=4"):
        validate(compose_train(tmp_path, ["attack=mix", "split.wording=source"]))
    with pytest.raises(ValueError, match="use attack=mix"):
        validate(compose_train(tmp_path, ["attack=garak", "split=kfold", "split.k=4", "split.wording=source"]))
    with pytest.raises(ValueError, match="heldout_wording=true"):
        validate(compose_train(tmp_path, ["attack=mix", "split=kfold", "split.k=4", "split.wording=source",
                                          "evaluation.heldout_wording=false"]))
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose_train(tmp_path, ["split.wording=sources"])


# ------------------------------------------------------------------------- estimands by source


def _table(rng, n_traj=12, shift=None):
    rows, labels = [], {}
    for i in range(n_traj):
        t = f"t{i:02d}"
        src = "a" if i % 2 else "b"
        for step in range(2):
            labels[(t, step)] = src
            d = (shift or {}).get(src, 1.0)
            rows += [(t, step, "clean", rng.normal()), (t, step, "attack", rng.normal() + d),
                     (t, step, "c_scrambled", rng.normal() + d / 2)]
    return pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"]), labels


def test_estimands_by_source_equal_sklearn_on_each_slice():
    rng = np.random.default_rng(0)
    table, labels = _table(rng, shift={"a": 2.0, "b": 0.0})
    out = estimands_by(table, labels, Settings(n_boot=200, min_clusters=3))
    assert list(out) == ["a", "b"]
    for src, rec in out.items():
        sub = table[[labels[(t, s)] == src for t, s in zip(table.trajectory_id, table.step)]]
        ac = sub[sub.variant.isin(["attack", "clean"])]
        assert rec["estimands"]["e1"]["estimate"] == pytest.approx(roc_auc_score(ac.variant == "attack", ac.score))
        asc = sub[sub.variant.isin(["attack", "c_scrambled"])]
        assert rec["estimands"]["e3"]["c_scrambled"]["estimate"] == pytest.approx(
            roc_auc_score(asc.variant == "attack", asc.score))
        assert rec["n_trajectories"] == 6
        lo, hi = rec["estimands"]["e1"]["ci_low"], rec["estimands"]["e1"]["ci_high"]
        assert lo <= rec["estimands"]["e1"]["estimate"] <= hi
    assert out["a"]["estimands"]["e1"]["estimate"] > out["b"]["estimands"]["e1"]["estimate"]
    few = estimands_by(table, labels, Settings(n_boot=50, min_clusters=7))
    assert few["a"]["estimands"] is None and few["a"]["n_trajectories"] == 6


def test_transfer_table_trains_and_tests_on_disjoint_trajectories():
    groups = {"a": [f"a{i}" for i in range(8)], "b": [f"b{i}" for i in range(8)]}
    calls = []

    def fit_score(train, test):
        calls.append((set(train), set(test)))
        assert not set(train) & set(test)
        rows = []
        for t in sorted(test):
            good = t[0] == "a" and next(iter(train))[0] == "a"  # separates only a->a
            rows += [(t, 0, "clean", 0.0), (t, 0, "attack", 1.0 if good else 0.0)]
        return pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])

    out = transfer_table(groups, fit_score, Settings(n_boot=100, min_clusters=3))
    assert out["sources"] == ["a", "b"]
    assert out["e1"]["a"]["a"]["estimate"] == 1.0 and out["e1"]["a"]["b"]["estimate"] == 0.5
    assert out["e1"]["b"]["a"]["estimate"] == 0.5
    diag = [c for c in calls if next(iter(c[0]))[0] == next(iter(c[1]))[0] == "a"]
    assert len(diag) == 2 and diag[0][0] == diag[1][1] and diag[0][0] | diag[0][1] == set(groups["a"])
    with pytest.raises(ValueError, match="shares trajectories"):
        transfer_table({"a": ["x"], "b": ["x"]}, fit_score, Settings())


def test_row_counts_and_step_attribute():
    rows = [{"trajectory_id": "t", "step": 0, "variant": "clean", "attack_index": -1},
            {"trajectory_id": "t", "step": 0, "variant": "attack", "attack_index": 0, "source": "garak",
             "adapted": True, "text_fits": False},
            {"trajectory_id": "t", "step": 0, "variant": "c_imperative", "attack_index": 0, "source": "garak",
             "token_delta": 2},
            {"trajectory_id": "t", "step": 1, "variant": "attack", "attack_index": 0, "source": "project",
             "adapted": False}]
    c = row_counts(rows)
    assert c == {"attack_rows": {"garak": 1, "project": 1}, "adapted_rows": {"garak": 1},
                 "banner_overflow_rows": {"garak": 1}, "control_token_mismatches": {"garak": 1}}
    assert step_attribute(rows, "source") == {("t", 0): "garak", ("t", 1): "project"}
