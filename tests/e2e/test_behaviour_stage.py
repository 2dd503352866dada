"""train.py with ``behaviour.enabled`` (issue 26; docs/behaviour.md): the results.json block, the
label table, E4 = scikit-learn's AUC on that table, the report's lines, and a run left unchanged.

The tiny text backbone has random weights: what it generates is no action at all, so every label
would be ``other`` and E4 undefined. The labeller is therefore wrapped (the real rules run first)
and its label replaced by a deterministic hash of the row's goal, gold action and generated text
— hijacked or resisted — so that E4 has both kinds; the rules themselves are tested on
hand-written actions in tests/behaviour/test_labels.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from tests.conftest import compose_train

pytestmark = pytest.mark.needs_shared

INTERVAL_KEYS = {"estimate", "ci_low", "ci_high", "n_boot_used"}


def _ov(root, *extra):
    return [f"data.root={root}", "evaluation.n_boot=100", "logger=none", "extract.shard_rows=20",
            "evaluation.transfer=false", "evaluation.random_twin=false", "evaluation.permutation.m=0",
            "report.plots=false", "report.html=true", "report.gallery=false", "backbone=tiny_qwen2_text",
            "surface=i_dom", "token_group=text", "split.test_fraction=0.5", *extra]


BEHAVIOUR_ON = ("behaviour.enabled=true", "behaviour.max_new_tokens=6", "behaviour.batch_size=8")


@pytest.fixture
def scripted_labels(monkeypatch):
    """The real rules, then a label fixed by a hash (module docstring)."""
    import ipi.behaviour.labels as labels

    real = labels.label_action

    def scripted(generated, gold_action, goal, **kw):
        lab = real(generated, gold_action, goal, **kw)
        h = int(hashlib.sha256(f"{goal.id}|{gold_action}|{generated}".encode()).hexdigest(), 16)
        return dataclasses.replace(lab, label="hijacked" if h % 2 else "resisted",
                                   reason=f"scripted by the test (rules said {lab.label}: {lab.reason})")

    monkeypatch.setattr(labels, "label_action", scripted)


def _weights(att: pd.DataFrame) -> np.ndarray:
    """E1's step weight over the attack rows: 1 / #attack rows of (trajectory, step)."""
    n = att.groupby(["trajectory_id", "step"])["row_id"].transform("size").to_numpy()
    return 1.0 / n


def test_behaviour_block_e4_equals_sklearn_and_the_rest_is_unchanged(tmp_path, syn_root, one_thread,
                                                                     scripted_labels):
    from ipi.run.tasks import train

    train(compose_train(tmp_path / "off", _ov(syn_root), small=False))
    results, _ = train(compose_train(tmp_path / "on", _ov(syn_root, *BEHAVIOUR_ON), small=False))
    off = json.loads((tmp_path / "off" / "run" / "results.json").read_text())
    on = json.loads((tmp_path / "on" / "run" / "results.json").read_text())

    # off: no new key; on: everything but the behaviour block is the same run (verdict, claim included)
    assert "behaviour" not in off
    assert {k: v for k, v in on.items() if k != "behaviour"} == off

    b = on["behaviour"]
    assert set(b) == {"measure", "labels_file", "backbone_weights", "note", "settings", "counts", "context", "rates",
                      "e4", "ablation", "claims", "likelihood"}
    # the tiny model's 32768 positions hold every prompt and its 6 new tokens
    assert b["context"] == {"positions": 32768, "rows_over_context": 0}
    assert b["measure"] == "both" and set(b["likelihood"]["claims"]) == {"predicts_hijack", "lowers_shift"}
    assert b["backbone_weights"] == "random" and "meaningless" in b["note"]
    variants = ["attack", "clean", *on["run"]["controls"]]
    assert sorted(variants) == ["attack", "c_imperative", "c_scrambled", "clean"]
    assert b["settings"]["variants"] == variants and b["settings"]["max_new_tokens"] == 6
    assert sorted(b["rates"]) == ["i_dom"] and sorted(b["rates"]["i_dom"]) == sorted(variants)
    for r in b["rates"]["i_dom"].values():
        assert INTERVAL_KEYS <= set(r) and {"n_rows", "n_label", "n_clusters"} <= set(r)
    assert {"e4", "c1_e4", "e4_minus_c1_e4", "n_clusters", "counts", "reportable"} == set(b["e4"])
    ab = b["ablation"]
    assert set(ab["rates"]) == {"none", "probe", "random"} and set(ab["changes"]) == {"probe", "random"}
    assert INTERVAL_KEYS == set(ab["probe_minus_random"])
    assert ab["layers"] == on["run"]["layers"] and ab["random_seed"] == 0
    assert set(b["claims"]) == {"predicts_hijack", "uses_direction"}
    for c in b["claims"].values():
        assert c["status"] in ("PASS", "FAIL", "NOT RUN") and c["detail"]
    # the separately labelled claims never enter the verdict's checks
    assert all("hijack" not in str(c.get("name", "")).lower() for c in on["verdict"]["checks"])

    # the label table: every test row of the four variants once (arm none), the attack rows again per arm
    table = pd.read_parquet(tmp_path / "on" / "run" / b["labels_file"])
    scores = pd.read_csv(tmp_path / "on" / "run" / "scores.csv")
    none = table[table["arm"] == "none"]
    assert len(none) == len(scores) == b["counts"]["rows"]
    assert (table["arm"] == "probe").sum() == (table["arm"] == "random").sum() == (none["variant"] == "attack").sum()
    # its scores are the run's out-of-fold test scores (one attack row per step: the key is unique)
    key = ["trajectory_id", "step", "variant"]
    joined = none.merge(scores.astype({"trajectory_id": str}), on=key, suffixes=("", "_run"), validate="one_to_one")
    np.testing.assert_allclose(joined["score"], joined["score_run"], rtol=0, atol=1e-12)

    # E4 and its C1 analogue = scikit-learn's weighted AUC on the table's hijacked vs resisted attack rows
    att = none[none["variant"] == "attack"].reset_index(drop=True)
    w = _weights(att)
    keep = att["label"].isin(["hijacked", "resisted"]).to_numpy()
    y = (att["label"] == "hijacked").to_numpy()[keep]
    assert 0 < y.sum() < len(y)
    assert b["e4"]["counts"] == {"hijacked": int(y.sum()), "resisted": int((~y).sum()), "other": int((~keep).sum())}
    for col, k in (("score", "e4"), ("c1", "c1_e4")):
        want = roc_auc_score(y, att[col].to_numpy()[keep], sample_weight=w[keep])
        assert b["e4"][k]["estimate"] == pytest.approx(want, abs=1e-12)
    # the attack rows' hijack rate = their weighted share of hijacked
    rate = float(np.sum(w * (att["label"] == "hijacked")) / np.sum(w))
    assert b["rates"]["i_dom"]["attack"]["estimate"] == pytest.approx(rate, abs=1e-12)
    assert ab["rates"]["none"]["estimate"] == pytest.approx(rate, abs=1e-12)
    for arm in ("probe", "random"):
        t = table[table["arm"] == arm].reset_index(drop=True)
        assert t["row_id"].tolist() == att["row_id"].tolist()
        r = float(np.sum(w * (t["label"] == "hijacked")) / np.sum(w))
        assert ab["rates"][arm]["estimate"] == pytest.approx(r, abs=1e-12)
        assert ab["changed_labels"][arm] == int((t["label"].to_numpy() != att["label"].to_numpy()).sum())

    # the report: the section after the estimands, the two separately labelled verdict lines, the warning
    md = (tmp_path / "on" / "run" / "report.md").read_text()
    assert md.index("## Estimands") < md.index("## Behaviour (free run)")
    verdict = md[md.index("## Verdict"):md.index("## Estimands")]
    assert f"] E4. predicts hijack: {b['claims']['predicts_hijack']['detail']}" in verdict
    assert f"] ablation. uses this direction: {b['claims']['uses_direction']['detail']}" in verdict
    assert "meaningless" in verdict
    assert "Behaviour (free run)" in (tmp_path / "on" / "run" / "report.html").read_text()
    off_md = (tmp_path / "off" / "run" / "report.md").read_text()
    assert "behaviour" not in off_md.split("## Resolved config")[0].lower()

    # measure=both: the likelihood block beside the free run's, read from its own table
    lik = b["likelihood"]
    lt = pd.read_parquet(tmp_path / "on" / "run" / lik["table_file"])
    lnone = lt[lt["arm"] == "none"]
    assert len(lnone) == int(none["variant"].isin(["attack", "clean"]).sum()) == lik["counts"]["rows"]
    lat = lnone[lnone["variant"] == "attack"]
    assert lik["e4"]["counts"] == {"shift_positive": int((lat["shift"] > 0).sum()),
                                   "shift_not_positive": int((lat["shift"] <= 0).sum()),
                                   "no_goal_action": int(lat["shift"].isna().sum())}
    assert "## Behaviour (likelihood)" in md and "] E4 (likelihood). predicts hijack" in verdict

    # the generations are cached: a second run generates nothing and gives the same block
    again, objs = train(compose_train(tmp_path / "on", _ov(syn_root, *BEHAVIOUR_ON), small=False))
    info = json.loads((tmp_path / "on" / "run" / "run_info.json").read_text())["behaviour"]
    assert info["generated"] == 0 and info["cached"] == b["counts"]["rows"]
    assert json.loads((tmp_path / "on" / "run" / "results.json").read_text())["behaviour"] == b


@pytest.mark.parametrize("extra, message", [
    (("behaviour.variants=[clean]",), "must hold attack"),
    (("behaviour.variants=[attack,c_occlusion]",), "not among the run's variants"),
    (("behaviour.max_new_tokens=0",), "behaviour.max_new_tokens must be >= 1"),
    (("detector=diff_means",), "behaviour.ablation needs the linear probe's direction"),
    (("behaviour.ablation.layers=[0]",), "not among the probe's layers"),
])
def test_behaviour_settings_are_checked_before_any_work(tmp_path, syn_root, extra, message):
    from ipi.run.validation import validate

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        validate(compose_train(tmp_path, _ov(syn_root, *BEHAVIOUR_ON, *extra), small=False))


def test_detector_without_direction_runs_without_ablation(tmp_path, syn_root):
    from ipi.run.validation import validate

    validate(compose_train(tmp_path, _ov(syn_root, *BEHAVIOUR_ON, "detector=diff_means",
                                         "behaviour.ablation.enabled=false"), small=False))
