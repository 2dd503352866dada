"""Detectors (docs/detectors.md): config group, hand-checked fits, head selection on training rows
only, the attention hook against an eager full forward, and composed runs whose score tables feed
the estimands exactly as the probe's do."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

from tests.conftest import mlp_detector, compose_train

DETECTORS = ("logistic", "diff_means", "mlp", "attention_focus", "external")


# ---------------------------------------------------------------- config group


def test_detector_group_composes_and_typos_fail(tmp_path):
    from hydra.errors import ConfigCompositionException, MissingConfigException
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError

    from ipi.run.schemas import DETECTOR_SCHEMAS, MLPDetectorConf

    assert compose_train(tmp_path).detector.name == "logistic"  # the default
    for name in DETECTORS:
        cfg = compose_train(tmp_path, [f"detector={name}"])
        assert cfg.detector.name == name
        assert OmegaConf.get_type(cfg.detector) is DETECTOR_SCHEMAS[name]
    with pytest.raises(ConfigCompositionException, match="detector.hiden"):
        compose_train(tmp_path, ["detector=mlp", "detector.hiden=3"])  # a typo of hidden
    with pytest.raises(ConfigCompositionException):
        compose_train(tmp_path, ["detector=mlp", "detector.hidden=many"])  # wrong type
    with pytest.raises(MissingConfigException, match="logsitic"):
        compose_train(tmp_path, ["detector=logsitic"])
    with pytest.raises(ConfigKeyError):  # a typo inside a detector YAML fails the same way
        OmegaConf.merge(OmegaConf.structured(MLPDetectorConf), {"patince": 3})


def test_build_detector_takes_probe_settings_and_mlp_settings(tmp_path):
    from ipi.detectors import LogisticDetector, MLPDetector
    from ipi.run.detection import build_detector, permutation_m

    det = build_detector(compose_train(tmp_path, ["probe.l2=0.5", "evaluation.permutation.m=7"]))
    assert isinstance(det, LogisticDetector) and det.l2 == 0.5
    cfg = compose_train(tmp_path, ["detector=mlp", "detector.hidden=8", "detector.permutation_m=3"])
    det = build_detector(cfg)
    assert isinstance(det, MLPDetector) and det.hidden == 8 and permutation_m(cfg, det) == 3


# ---------------------------------------------------------------- fits by hand


def _grouped_data(seed=0, n_traj=20, steps=4, d=6, signal=1.5):
    rng = np.random.default_rng(seed)
    rows, x = [], []
    for t in range(n_traj):
        off = rng.normal(0, 1, d)
        for s in range(steps):
            for v in ("clean", "attack", "c_scrambled"):
                rows.append({"trajectory_id": f"t{t:02d}", "step": s, "variant": v})
                x.append(off + rng.normal(0, 1, d) + (signal * np.eye(d)[0] if v == "attack" else 0)
                         + np.array([0, 0, 0, 0, 0, 50.0]))  # a constant offset feature scale
    return pd.DataFrame(rows), np.array(x)


def test_diff_means_matches_hand_computation():
    from ipi.detectors import DiffMeansDetector

    x = np.array([[1.0, 10.0, 3.0], [3.0, 14.0, 3.0], [2.0, 20.0, 3.0], [6.0, 12.0, 3.0]])
    y = np.array([0, 0, 1, 1])
    det = DiffMeansDetector().fit(x, y, np.array(["a", "a", "b", "b"]))
    mu = x.mean(axis=0)
    sd = x.std(axis=0)  # ddof=0
    sd[2] = 1.0  # a constant feature keeps scale 1
    z = (x - mu) / sd
    w = z[2:].mean(axis=0) - z[:2].mean(axis=0)
    # by hand: column 0 mean 3, sd sqrt(3.5); column 1 mean 14, sd sqrt(14)
    assert w[0] == pytest.approx((4.0 - 2.0) / np.sqrt(3.5))
    assert w[1] == pytest.approx((16.0 - 12.0) / np.sqrt(14.0))
    assert w[2] == 0.0
    x_new = np.array([[0.0, 0.0, 0.0], [5.0, 30.0, 1.0]])
    np.testing.assert_allclose(det.score(x_new), ((x_new - mu) / sd) @ w, rtol=1e-12, atol=1e-12)


def test_mlp_is_seeded_early_stopped_and_learns():

    meta, x = _grouped_data(signal=3.0)  # Bayes AUC along the signal ≈ Φ(3/2) ≈ 0.93
    lab = meta.variant.isin(["clean", "attack"]).to_numpy()
    tr = lab & meta.trajectory_id.isin([f"t{i:02d}" for i in range(14)]).to_numpy()
    te = lab & ~meta.trajectory_id.isin([f"t{i:02d}" for i in range(14)]).to_numpy()
    y = (meta.variant == "attack").to_numpy().astype(int)
    det = mlp_detector(hidden=16, max_epochs=60, patience=5)
    a = det.fit(x[tr], y[tr], meta.trajectory_id.to_numpy()[tr])
    b = det.fit(x[tr], y[tr], meta.trajectory_id.to_numpy()[tr])
    np.testing.assert_array_equal(a.score(x[te]), b.score(x[te]))  # seeded
    assert a.fit_info_["epochs"] <= 60
    # the inner validation rows are whole trajectories (GroupShuffleSplit: 20% of 14 -> 3 of 14)
    assert a.fit_info_["rows_inner_val"] == 3 * 4 * 2
    assert roc_auc_score(y[te], a.score(x[te])) > 0.85
    other = mlp_detector(hidden=16, max_epochs=60, patience=5, seed=1).fit(x[tr], y[tr], meta.trajectory_id.to_numpy()[tr])
    assert not np.array_equal(other.score(x[te]), a.score(x[te]))


def test_refit_null_uses_the_probe_permutations_and_refits_the_detector():
    """cross_fit: check 4's null comes from M refits of the detector on labels permuted
    within each training (trajectory, step), drawn as the probe's (same seed -> same labels)."""
    from ipi.detectors import DiffMeansDetector, cross_fit
    from ipi.metrics.permutation import permute_within
    from ipi.probe.folds import make_folds

    meta, x = _grouped_data()
    folds = make_folds(meta.trajectory_id, "holdout", test_fraction=0.3, seed=0)
    fits = cross_fit(DiffMeansDetector(), meta, x, folds, permuted=True, permutation_m=5,
                              permutation_seed=3)
    assert fits.null_scores.shape == (5, len(fits.test_index))
    # replicate 0 by hand
    lab = np.flatnonzero(meta.variant.isin(["clean", "attack"]).to_numpy())
    tid = meta.trajectory_id.to_numpy()
    y = (meta.variant.to_numpy()[lab] == "attack").astype(int)
    groups, _ = pd.factorize(pd.Series(tid[lab]) + "\x00" + meta.step.to_numpy()[lab].astype(str))
    y0 = permute_within(groups, y, np.random.default_rng(3))
    train_ids, test_ids = folds[0]
    fit = np.isin(tid[lab], list(train_ids))
    te = lab[np.isin(tid[lab], list(test_ids))]
    ref = DiffMeansDetector().fit(x[lab[fit]], y0[fit], tid[lab[fit]]).score(x[te])
    pos = {r: i for i, r in enumerate(fits.test_index)}
    np.testing.assert_allclose(fits.null_scores[0, [pos[r] for r in te]], ref, rtol=1e-12)
    # control rows are not part of E1: left unscored in the null
    ctrl = [pos[r] for r in fits.test_index if meta.variant.iloc[r] == "c_scrambled"]
    assert np.isnan(fits.null_scores[:, ctrl]).all()
    np.testing.assert_array_equal(fits.permutation["refit_scores"][[pos[r] for r in te]],
                                  fits.test_scores[[pos[r] for r in te]])


def test_attention_heads_are_chosen_on_training_trajectories_only():
    """Changing the test trajectories' attention leaves the chosen heads (and the training-side
    AUCs) unchanged; changing the training trajectories' attention changes them."""
    from ipi.detectors import AttentionFocusDetector, cross_fit
    from ipi.probe.folds import make_folds

    rng = np.random.default_rng(0)
    meta, _ = _grouped_data(n_traj=16, steps=3)
    n, heads = len(meta), 12
    r = rng.uniform(0.2, 0.8, (n, heads))
    attack = (meta.variant == "attack").to_numpy()
    r[attack, 3] -= 0.3  # head 3: less focus on the task under attack
    r[attack, 7] -= 0.2
    folds = make_folds(meta.trajectory_id, "holdout", test_fraction=0.3, seed=0)
    train_ids, test_ids = folds[0]
    is_te = meta.trajectory_id.isin(test_ids).to_numpy()
    det = AttentionFocusDetector(top_k=2)
    base = cross_fit(det, meta, r, folds).fitted[0]
    assert set(base.heads_) == {3, 7}

    r_test = r.copy()
    r_test[is_te & attack, 0] -= 0.9  # a head that separates perfectly, but only on TEST rows
    r_test[is_te] = r_test[is_te][:, rng.permutation(heads)]  # and scramble the rest of the test rows
    moved = cross_fit(det, meta, r_test, folds).fitted[0]
    np.testing.assert_array_equal(moved.heads_, base.heads_)
    np.testing.assert_array_equal(moved.train_auc_, base.train_auc_)

    r_train = r.copy()
    r_train[~is_te & attack, 0] -= 0.9  # the same head, now on TRAINING rows
    changed = cross_fit(det, meta, r_train, folds).fitted[0]
    assert 0 in set(changed.heads_)


def test_focus_ratio_uses_each_surface_untrusted_span():
    from ipi.detectors import focus_ratios
    from ipi.protocol import TOKEN_GROUPS

    mass = np.zeros((2, 1, len(TOKEN_GROUPS), 2))
    g = {k: TOKEN_GROUPS.index(k) for k in TOKEN_GROUPS}
    mass[:, 0, g["task"]] = [0.2, 0.1]
    mass[:, 0, g["image"]] = [0.6, 0.3]
    mass[:, 0, g["observation"]] = [0.2, 0.4]
    r = focus_ratios(mass, ["i_vis", "i_dom"])
    np.testing.assert_allclose(r[0], [0.2 / 0.8, 0.1 / 0.4], rtol=1e-9)
    np.testing.assert_allclose(r[1], [0.2 / 0.4, 0.1 / 0.5], rtol=1e-9)


@pytest.mark.needs_shared
def test_attention_hook_equals_eager_full_forward(small_backbone, trajectories):
    """The pre-hook's last-prompt-token attention mass per group equals the eager forward's
    ``output_attentions`` row summed over the group's tokens (and the forward stops early)."""
    from ipi.detectors.attention import AttentionFocusExtractor
    from ipi.extraction.datamodule import ReplayDataset, collate_rows
    from ipi.extraction.rows import build_rows
    from ipi.protocol import TOKEN_GROUPS
    from ipi.protocol import DEFAULT_SYSTEM_PROMPT

    from ipi.replay import count_plain_tokens

    def count(s):
        return count_plain_tokens(small_backbone.tokenizer, s)

    rows = build_rows([trajectories[0]], "i_dom", ["c_scrambled"], count_tokens=count)[:2] + \
        build_rows([trajectories[0]], "i_vis", ["c_occlusion"])[:1]
    layers = [0, 2]
    model = small_backbone.model
    before = model.config._attn_implementation
    for i, row in enumerate(rows):
        ds = ReplayDataset([row], small_backbone.processor, DEFAULT_SYSTEM_PROMPT, True,
                           small_backbone.image_size, small_backbone.image_token_id)
        batch = collate_rows([ds[0]], pad_token_id=0)
        ext = AttentionFocusExtractor(small_backbone, layers)
        ext.on_predict_start()
        try:
            out = ext.predict_step(batch)
        finally:
            ext.on_predict_end()
        assert out["features"].shape == (1, len(layers), len(TOKEN_GROUPS), model.config.text_config.num_attention_heads)
        model.set_attn_implementation("eager")
        try:
            with torch.inference_mode():
                full = model(**batch["inputs"], output_attentions=True)
        finally:
            model.set_attn_implementation(before)
        last = int(batch["groups"][0]["last_prompt"][0])
        for j, k in enumerate(layers):
            att = full.attentions[k][0, :, last, :].float()  # [heads, T]
            expected = torch.stack([att[:, batch["groups"][0][g]].sum(dim=-1) for g in TOKEN_GROUPS])  # [G, heads]
            torch.testing.assert_close(out["features"][0, j], expected, rtol=1e-4, atol=1e-5)
        assert float(out["features"][0, 0].sum()) > 0


# ---------------------------------------------------------------- composed runs


def _estimands_from_scores(scores: pd.DataFrame, controls) -> dict:
    ac = scores[scores.variant.isin(["attack", "clean"])]
    out = {"e1": roc_auc_score((ac.variant == "attack").astype(int), ac.score)}
    for c in controls:
        sub = scores[scores.variant.isin(["attack", c])]
        out[c] = roc_auc_score((sub.variant == "attack").astype(int), sub.score)
    return out


@pytest.mark.needs_shared
def test_detector_sweep_feeds_estimands_and_forwards_nothing_after_extraction(tmp_path, monkeypatch):
    """One extraction, then every detector: each score table gives results.json's E1/E3 exactly
    (sklearn), no hidden-state forward after the first run, the attention entry cached too;
    external scores reproduce the run that wrote them; the summary table carries the numbers."""
    import ipi.detectors.attention as att
    import ipi.extraction.forward as xrun
    from ipi.run.tasks import train

    ov = ["data.max_trajectories=4", "split.test_fraction=0.5", "evaluation.n_boot=100",
          "evaluation.min_clusters=2", "surface=i_dom", "evaluation.transfer=false",
          "evaluation.permutation.m=9", "report.plots=false", "report.html=false", "report.gallery=false",
          "detector.permutation_m=5"]

    def run(name, extra=()):
        out = tmp_path / name
        cfg = compose_train(tmp_path, [*ov, f"detector={name}", f"paths.output_dir={out}", *extra])
        res, _ = train(cfg)
        return res, out

    results = {}
    results["logistic"] = run("logistic")  # fills the hidden-state cache

    def no_forward(*a, **k):
        raise AssertionError("a backbone forward after the extraction")

    monkeypatch.setattr(xrun, "_forward_missing", no_forward)
    for name in ("diff_means", "mlp", "attention_focus"):
        results[name] = run(name)
    info = json.loads((results["attention_focus"][1] / "run_info.json").read_text())
    assert info["attention_rows_forwarded"] > 0  # its own extraction, once
    monkeypatch.setattr(att.AttentionFocusExtractor, "predict_step", no_forward)
    again, out = run("attention_focus")
    info = json.loads((out / "run_info.json").read_text())
    assert info["attention_rows_forwarded"] == 0 and info["rows_forwarded"] == 0
    assert again["e1"] == results["attention_focus"][0]["e1"]

    for name, (res, out) in results.items():
        assert res["run"]["detector"]["name"] == name
        scores = pd.read_csv(out / "scores.csv")
        want = _estimands_from_scores(scores, res["e3"])
        assert res["e1"]["estimate"] == pytest.approx(want["e1"], abs=1e-12), name
        for c in res["e3"]:
            assert res["e3"][c]["estimate"] == pytest.approx(want[c], abs=1e-12), (name, c)
        # the same baselines on the same rows, whatever the detector
        assert res["c1"] == results["logistic"][0]["c1"]
        assert res["collapse_only"] == results["logistic"][0]["collapse_only"]
        # check 4 ran for every trainable detector, with the refit procedure reproducing E1
        perm = res["permutation"]
        assert perm["m"] == 5  # detector.permutation_m overrides evaluation.permutation.m
        assert perm["e1_refit"] == pytest.approx(res["e1"]["estimate"], abs=1e-6)
        checks = {c["id"]: c for c in res["verdict"]["checks"]}
        assert sorted(checks) == [0, 1, 2, 3, 4, 5, 6] and checks[6]["status"] != "PASS"  # twin off here
        assert "permuted" in res
    heads = results["attention_focus"][0]["run"]["detector"]["chosen_heads"]
    assert len(heads) == 1 and len(heads[0]) == 4 and all({"layer", "head", "train_auc"} <= set(h) for h in heads[0])
    assert set(results["attention_focus"][0]["run"]["attention_cache_keys"]) == {"i_dom"}

    # external: the diff_means scores brought back in give the same E1/E3; check 4 NOT RUN
    ext, _ = run("external", [f"detector.scores={results['diff_means'][1] / 'scores.csv'}",
                              "detector.label=diff_means from a file"])
    dm = results["diff_means"][0]
    assert ext["e1"] == dm["e1"] and ext["e3"] == dm["e3"]
    assert ext["run"]["detector"]["label"] == "diff_means from a file"
    assert "permutation" not in ext and "permuted" not in ext
    assert next(c for c in ext["verdict"]["checks"] if c["id"] == 4)["status"] == "NOT RUN"
    with pytest.raises(ValueError, match="no finite score for"):
        part = pd.read_csv(results["diff_means"][1] / "scores.csv").iloc[3:]
        part.to_csv(tmp_path / "part.csv", index=False)
        run("external", [f"detector.scores={tmp_path / 'part.csv'}", "detector.label=x"])

    # summary table: one row per detector, the numbers of results.json, md/csv/tex
    from ipi.reporting.summary import write_summary_tables

    jobs = [(n, r) for n, (r, _) in results.items()] + [("external", ext)]
    paths = write_summary_tables(tmp_path, jobs=jobs)
    table = pd.read_csv(paths["summary_csv"])
    assert list(table.detector) == [*results, "external (diff_means from a file)"]
    for name, (res, _) in results.items():
        r = table[table.job == name].iloc[0]
        assert r["E1"] == pytest.approx(res["e1"]["estimate"]) and r["C1 E1"] == pytest.approx(res["c1"]["e1"]["estimate"])
        assert r["permutation p"] == pytest.approx(res["permutation"]["p_value"])
    md = paths["summary_md"].read_text()
    assert "| surface" in md and "attention_focus" in md and "E3 c_scrambled" in md
    tex = paths["summary_tex"].read_text()
    assert "\\toprule" in tex and "\\midrule" in tex and "\\bottomrule" in tex and "E3 c\\_scrambled" in tex


def test_summary_table_marks_not_reportable_cells(tmp_path):
    from ipi.reporting.summary import write_summary_tables

    def iv(e):
        return {"estimate": e, "ci_low": e - 0.1, "ci_high": e + 0.05, "n_boot_used": 100}

    res = {"e1": iv(0.8), "e2": iv(0.7), "e3": {"c_scrambled": iv(0.6)}, "c1": {"e1": iv(0.55)},
           "permuted": {"e1": iv(0.5)}, "collapse_only": {"e1": iv(0.52)},
           "permutation": {"p_value": 0.005},
           "verdict": {"claim": "none"},
           "reportability": {"estimands": {"e1": None, "e2": "too few clusters (2 < 5)", "e3.c_scrambled": None}},
           "run": {"surface": "i_dom", "detector": {"name": "diff_means"}, "layers_config": "six",
                   "token_groups": ["task"]}}
    paths = write_summary_tables(tmp_path, {"0": "none"}, jobs=[("0", res)])
    md = paths["summary_md"].read_text()
    assert "~~0.700 [0.600, 0.750]~~ n/r" in md and "0.800 [0.700, 0.850]" in md
    assert "| —" in md or "— |" in md  # transfer was not computed
    tex = paths["summary_tex"].read_text()
    assert "0.700 [0.600, 0.750]$^\\dagger$" in tex and "0.005" in tex
    csv = pd.read_csv(paths["summary_csv"])
    assert csv["E2 not_reportable"].iloc[0] == "too few clusters (2 < 5)"
    assert pd.isna(csv["transfer E1"].iloc[0])


@pytest.mark.needs_shared
def test_twin_refits_the_runs_hidden_state_detector_and_skips_attention(tmp_path):
    """Check 6 compares like with like: diff_means on the twin's features gives the twin's scores
    (E3 of scores_twin.csv by sklearn equals results.json's per-seed twin E3); attention_focus
    extracts no twin and leaves check 6 NOT RUN."""
    from ipi.run.tasks import train

    ov = ["data.max_trajectories=4", "split.test_fraction=0.5", "evaluation.n_boot=50",
          "evaluation.min_clusters=2", "surface=i_dom", "evaluation.transfer=false",
          "evaluation.permutation.m=0", "report.plots=false", "report.html=false", "report.gallery=false",
          "evaluation.random_twin=true", "evaluation.random_twin_seeds=[1]"]
    out = tmp_path / "dm"
    res, _ = train(compose_train(tmp_path, [*ov, "detector=diff_means", f"paths.output_dir={out}"]))
    twin = pd.read_csv(out / "scores_twin.csv")
    assert set(twin.twin_seed) == {1}
    want = _estimands_from_scores(twin.drop(columns="twin_seed"), res["e3"])
    by_seed = res["random_twin"]["by_seed"]
    seed_res = by_seed["1"] if "1" in by_seed else by_seed[1]
    for c in res["e3"]:
        assert seed_res["e3"][c]["estimate"] == pytest.approx(want[c], abs=1e-12)
    assert "e3_minus_mean_twin_e3" in res["differences"]

    out = tmp_path / "att"
    res, _ = train(compose_train(tmp_path, [*ov, "detector=attention_focus", f"paths.output_dir={out}"]))
    checks = {c["id"]: c for c in res["verdict"]["checks"]}
    # the tiny backbone is random itself (FAIL); a pretrained one would get NOT RUN: no twin either way
    assert checks[6]["status"] in ("FAIL", "NOT RUN") and "random_twin" not in res
    assert not (out / "scores_twin.csv").exists()
