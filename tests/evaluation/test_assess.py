"""The one assessment path: assess(tables, settings) -> Results (numbers, verdict, reportability)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from ipi.evaluation import evaluate_score_table
from ipi.evaluation.assess import DEFAULTS, ScoreTables, Settings, assess
from ipi.evaluation.reportable import mark, not_evidence, reportability
from ipi.evaluation.results import ResultsView
from ipi.evaluation.verdict import NOT_RUN
from tests.conftest import check_of, run_verdict
from ipi.metrics import compare_tables

REPO = Path(__file__).resolve().parents[2]


def _table(seed: int, n_traj: int, shift: float = 1.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(n_traj):
        for s in range(3):
            rows += [(f"t{t:02d}", s, "clean", rng.normal()), (f"t{t:02d}", s, "attack", rng.normal() + shift),
                     (f"t{t:02d}", s, "c_scrambled", rng.normal() + shift / 2)]
    return pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])


def _tables(n_traj: int = 8, twins: int = 2, m: int = 19) -> ScoreTables:
    main = _table(0, n_traj)
    rng = np.random.default_rng(9)
    labelled = main.variant.isin(["attack", "clean"]).to_numpy()
    null = np.where(labelled[None, :], rng.normal(size=(m, len(main))), np.nan)
    return ScoreTables(main, {"c1": _table(1, n_traj, 0.1), "collapse_only": _table(2, n_traj, 0.2)},
                       {s: _table(10 + s, n_traj, 0.9) for s in range(1, twins + 1)},
                       {"null_scores": null, "seed": 4, "unit": "unit text"})


def test_results_are_the_numbers_then_the_verdict_then_the_marks():
    """assess() = the numbers (every table on the same draws), then the verdict on them, then the
    reportability marks, in results.json's key order; the typed tree and its dict agree."""
    tables = _tables()
    settings = Settings(n_boot=150, seed=3, pretrained=True, min_clusters=4, min_boot_fraction=0.8, alpha=0.1)
    res = assess(tables, settings)
    d = res.to_dict()
    assert list(d) == ["e1", "e1_paired", "e2", "e3", "c1", "collapse_only", "random_twin", "differences", "p_values",
                       "permutation", "bootstrap", "verdict", "reportability"]
    assert list(d["differences"]) == ["e1_minus_c1_e1", "e1_minus_collapse_only_e1", "e3_minus_c1_e3",
                                      "e3_minus_collapse_only_e3", "e1_minus_e3", "e3_minus_mean_twin_e3"]
    assert list(d["p_values"]) == ["e1", "e1_paired", "e3", "e1_minus_c1_e1", "e1_minus_collapse_only_e1",
                                   "e3_minus_c1_e3", "e3_minus_collapse_only_e3", "e3_minus_mean_twin_e3"]
    assert list(d["random_twin"]) == ["seeds", "guards", "by_seed"]  # no envelope: it decides nothing
    assert all(p is None or p > 0 for p in d["p_values"]["e3"].values())  # (1 + k)/(B + 1): never 0
    assert list(d["bootstrap"]) == ["n_boot", "seed", "level", "n_clusters", "interval", "clusters_by_estimand",
                                    "effective_clusters_by_estimand"]
    assert list(d["bootstrap"]["clusters_by_estimand"]) == ["e1", "e1_paired", "e2", "e3", "c1", "collapse_only",
                                                            "random_twin", "differences"]
    # The numbers are the metrics layer's, on the settings' draws; the permutation level is the settings'.
    numbers = compare_tables(tables.main, tables.baselines, n_boot=150, seed=3, permutation=tables.permutation,
                              twins=tables.twins, alpha=0.1).to_dict()
    assert {k: d[k] for k in numbers} == numbers
    assert d["permutation"]["alpha"] == 0.1 and d["permutation"]["unit"] == "unit text"
    # ... the verdict and the marks use every threshold of the settings.
    assert d["verdict"] == run_verdict(numbers, min_clusters=4, pretrained=True, min_boot_fraction=0.8, alpha=0.1)
    assert d["reportability"] == mark(numbers, Settings(min_clusters=4, min_boot_fraction=0.8)).to_dict()
    # Typed access reads the same values.
    assert res.estimates.main.e1.estimate == d["e1"]["estimate"]
    assert res.estimates.random_twin.seeds == ["1", "2"] == d["random_twin"]["seeds"]
    assert res.estimates.differences.twin.e3_mean["c_scrambled"].value.ci_low == \
        d["differences"]["e3_minus_mean_twin_e3"]["c_scrambled"]["ci_low"]
    assert res.verdict.claim == d["verdict"]["claim"]
    assert [c.status for c in res.verdict.checks] == [c["status"] for c in d["verdict"]["checks"]]
    assert res.reportability.not_reportable == d["reportability"]["not_reportable"]
    # E1 is scikit-learn's AUC on the main table (one value computed independently).
    t = tables.main[tables.main.variant.isin(["attack", "clean"])]
    assert d["e1"]["estimate"] == pytest.approx(roc_auc_score(t.variant == "attack", t.score))
    json.dumps(d, allow_nan=False)  # JSON-ready as it stands


def test_settings_reach_the_verdict_and_the_marks():
    """The cluster gate, the pretrained flag and the replicate threshold come from the settings: the
    same tables give NOT RUN with 4 test trajectories under the default min_clusters 12 (on the
    Kish count), and a decided check with min_clusters 4 (4 trajectories of equal weight: Kish 4)."""
    tables = _tables(n_traj=4, twins=0)
    default = assess(tables, Settings(n_boot=100)).to_dict()
    lowered = assess(tables, Settings(n_boot=100, min_clusters=4)).to_dict()
    assert check_of(default["verdict"], 1)["status"] == NOT_RUN
    assert check_of(lowered["verdict"], 1)["status"] != NOT_RUN
    assert "only 4.0 effective test trajectories (Kish, from the weights it uses; 4 contribute) (< min_clusters 12)" \
        in default["reportability"]["estimands"]["e1"]
    assert "test trajector" not in (lowered["reportability"]["estimands"]["e1"] or "")
    capped = assess(tables, Settings(n_boot=100, min_clusters=4, pretrained=False)).to_dict()
    assert check_of(capped["verdict"], 6)["status"] == "FAIL"  # a random backbone: at most "separates"
    strict = assess(tables, Settings(n_boot=100, min_clusters=4, min_boot_fraction=1.01)).to_dict()
    assert "bootstrap replicates usable" in strict["reportability"]["estimands"]["e1"]


def test_evaluate_score_table_takes_settings_and_refuses_an_unknown_override(tmp_path):
    path = tmp_path / "scores.csv"
    _table(0, 6).to_csv(path, index=False)
    out = evaluate_score_table(path, n_boot=60, min_clusters=3)
    assert out["bootstrap"]["n_boot"] == 60 and out["verdict"]["min_clusters"] == 3
    assert out["reportability"]["min_clusters"] == 3 and out["source"] == str(path)
    same = evaluate_score_table(path, settings=Settings(n_boot=60, min_clusters=3))
    assert same == out
    with pytest.raises(TypeError, match="n_boots"):
        evaluate_score_table(path, n_boots=60)  # a misspelt setting is an error, never ignored


def test_defaults_are_the_settings_defaults():
    """Every evaluation function that takes a threshold defaults to Settings' value (one place)."""
    for fn, names in ((reportability, ("min_clusters", "min_boot_fraction")),
                      (not_evidence, ("min_clusters", "min_boot_fraction"))):
        params = inspect.signature(fn).parameters
        for name in names:
            assert params[name].default == getattr(DEFAULTS, name), (fn.__name__, name)
    assert Settings() == DEFAULTS and DEFAULTS.min_clusters == 12 and DEFAULTS.n_boot == 1000
    assert DEFAULTS.interval == "expanded"


def test_results_view_reads_missing_entries_as_none():
    view = ResultsView({"e1": {"estimate": 0.7}, "differences": {}})
    assert view.e1 == {"estimate": 0.7} and view.e3 is None
    assert view.difference("e1_minus_c1_e1") is None and view.twin_seeds == [] and view.permutation is None
    assert view.get("e1", "estimate") == 0.7 and view.get("e1", "estimate", "deeper") is None


def test_evaluation_imports_nothing_from_reporting_and_metrics_nothing_from_evaluation():
    """The layer contract: metrics <- evaluation <- reporting (a fresh interpreter, so nothing
    imported by other tests hides an import)."""
    code = ("import sys, ipi.metrics, ipi.metrics.compare\n"
            "bad = sorted(m for m in sys.modules if m.startswith(('ipi.evaluation', 'ipi.reporting')))\n"
            "import ipi.evaluation, ipi.evaluation.assess, ipi.evaluation.callbacks, ipi.evaluation.spread\n"
            "bad += sorted(m for m in sys.modules if m.startswith('ipi.reporting'))\n"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
