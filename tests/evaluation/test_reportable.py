"""Reportability: estimates the verdict could not use are marked everywhere (table, figure, W&B)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


def _iv(est, lo, hi, used=100):
    return {"estimate": est, "ci_low": lo, "ci_high": hi, "n_boot_used": used}


def _results(n_clusters=8, **over):
    res = {"e1": _iv(0.8, 0.7, 0.9), "e2": _iv(0.9, 0.85, 0.95),
           "e3": {"c_scrambled": _iv(0.6, 0.5, 0.7), "c_imperative": _iv(0.7, 0.6, 0.8)},
           "c1": {"e1": _iv(0.55, 0.45, 0.65)},
           "differences": {"e1_minus_c1_e1": _iv(0.25, 0.1, 0.4),
                           "e1_minus_e3": {"c_scrambled": _iv(0.2, 0.1, 0.3)}},
           "bootstrap": {"n_boot": 100, "seed": 0, "level": 0.95, "n_clusters": n_clusters}}
    res.update(over)
    return res


def test_reportability_rules_hand_worked():
    from ipi.evaluation.reportable import reportability

    marks = reportability(_results(), min_clusters=5)
    assert list(marks) == ["e1", "e2", "e3.c_imperative", "e3.c_scrambled", "c1.e1",
                           "differences.e1_minus_c1_e1", "differences.e1_minus_e3.c_scrambled"]
    assert set(marks.values()) == {None}
    # Too few clusters: every estimate, with the count in words.
    few = reportability(_results(n_clusters=2))
    assert set(few.values()) == {"only 2 test trajectories contribute (< min_clusters 12)"}
    assert reportability(_results(n_clusters=2), min_clusters=2)["e1"] is None
    # A degenerate interval and too few usable replicates, each only where it occurs.
    res = _results(e2=_iv(1.0, 1.0, 1.0), e1=_iv(0.8, 0.7, 0.9, used=89))
    marks = reportability(res, min_clusters=5)
    assert marks["e2"] == "degenerate interval [1.000, 1.000] (every replicate gave the same value)"
    both = reportability({**res, "bootstrap": {**res["bootstrap"], "n_clusters": 3}}, min_clusters=5)
    assert both["e2"] == ("only 3 test trajectories contribute (< min_clusters 5); degenerate interval [1.000, 1.000] "
                          "(every replicate gave the same value)")
    assert marks["e1"] == "only 89 of 100 bootstrap replicates usable (< 90%)"
    assert reportability(res, min_clusters=5, min_boot_fraction=0.85)["e1"] is None
    # Equal up to float rounding is degenerate too (a paired difference of AUCs, seen in a real run).
    near = reportability(_results(e2=_iv(0.1389, 0.13888888888888884, 0.13888888888888895)), min_clusters=5)
    assert near["e2"] == "degenerate interval [0.139, 0.139] (every replicate gave the same value)"
    assert sum(v is not None for v in marks.values()) == 2
    # Undefined: no estimate, or no interval.
    marks = reportability(_results(e1=_iv(None, None, None, 0), e2=_iv(0.9, None, None, 0)))
    assert marks["e1"] == "undefined (no estimate)" and marks["e2"] == "undefined interval"


def test_reportability_uses_per_estimand_cluster_counts_when_present():
    from ipi.evaluation.reportable import reportability

    res = _results(n_clusters=8)
    res["bootstrap"]["clusters_by_estimand"] = {"e3": {"c_scrambled": 3}, "e2": 4,
                                                "differences.e1_minus_e3.c_scrambled": 3}
    marks = reportability(res, min_clusters=5)
    assert marks["e3.c_scrambled"] == "only 3 test trajectories contribute (< min_clusters 5)"
    assert marks["e2"] == "only 4 test trajectories contribute (< min_clusters 5)"
    assert marks["differences.e1_minus_e3.c_scrambled"] == "only 3 test trajectories contribute (< min_clusters 5)"
    # with Kish counts recorded, the gate reads them (here a 3-trajectory E1 whose weight sits on 1.5)
    res["bootstrap"]["effective_clusters_by_estimand"] = {"e1": 1.5}
    assert reportability(res, min_clusters=5)["e1"] == \
        "only 1.5 effective test trajectories (Kish, from the weights it uses; 8 contribute) (< min_clusters 5)"
    assert marks["e1"] is None and marks["e3.c_imperative"] is None  # not listed: the run's 8


def _two_trajectory_table():
    rng = np.random.default_rng(1)
    rows = [(f"t{t}", s, v, float(rng.normal() + (v == "attack") * 3))
            for t in range(2) for s in range(3) for v in ("clean", "attack", "c_scrambled")]
    return pd.DataFrame(rows, columns=["trajectory_id", "step", "variant", "score"])


def test_report_marks_every_estimate_of_a_two_trajectory_run(tmp_path):
    """The issue's run: 2 test trajectories, NOT RUN verdict; no number looks like a result."""
    import matplotlib.pyplot as plt

    import ipi.reporting.plots as plots
    from ipi.reporting.report import write_run_report
    from ipi.evaluation.assess import ScoreTables, Settings, assess

    table = _two_trajectory_table()
    res = assess(ScoreTables(table), Settings(n_boot=200, seed=0)).to_dict()
    assert res["e2"]["ci_low"] == res["e2"]["ci_high"] == 1.0  # degenerate, as in the issue
    figs, extents = {}, {}
    real_save = plots.save_figure

    def keep(fig, path):
        figs[str(path)] = fig
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        extents[str(path)] = (max((t.get_window_extent(renderer).x1 for a in fig.axes for t in a.texts),
                                  default=0.0), fig.bbox.x1)
        return real_save(fig, path)

    plots.save_figure = keep
    try:
        write_run_report(res, tmp_path, scores=table)
    finally:
        plots.save_figure = real_save
    n = len(res["reportability"]["estimands"])
    md = (tmp_path / "report.md").read_text()
    assert md.count("| **no**: only 2.0 effective test trajectories (Kish, from the weights it uses; 2 contribute) "
                    "(< min_clusters 12)") == n
    assert ("| **no**: only 2.0 effective test trajectories (Kish, from the weights it uses; 2 contribute) (< min_clusters 12); "
            "degenerate interval") in md  # E2 1.000 [1.000, 1.000]
    assert f"{n} of {n} estimates are marked not reportable" in md
    html = (tmp_path / "report.html").read_text()
    assert html.count('<tr class="unreportable">') == n and "no: only 2.0 effective test trajectories" in html
    # Forest plot: hollow grey points, no interval bars, the reason written beside each.
    fig = figs[str(tmp_path / "forest.png")]
    ax = fig.axes[0]
    bars = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 2 and ln.get_linestyle() == "-"]
    assert bars == []
    points = [ln for ln in ax.get_lines() if ln.get_marker() == "o"]
    assert len(points) == len([k for k in res["reportability"]["estimands"] if not k.startswith("differences")])
    assert all(p.get_markerfacecolor() == "white" for p in points)
    texts = [t.get_text() for t in ax.texts]
    assert len(texts) == len(points) and all("not reportable: 2.0 effective trajectories < 12" in t for t in texts)
    # The reasons are inside the saved image: the figure grew to hold them (no clipped text).
    right, width = extents[str(tmp_path / "forest.png")]
    assert 0 < right <= width
    plt.close("all")


def test_forest_points_at_one_are_whole_and_roc_legend_is_off_the_curves(tmp_path):
    import ipi.reporting.plots as plots

    res = _results(e1=_iv(1.0, 0.97, 1.0), e2=_iv(1.0, 0.98, 1.0))
    figs = {}
    real_save = plots.save_figure

    def keep(fig, path):
        fig.canvas.draw()
        figs[path.name if hasattr(path, "name") else str(path)] = fig
        return real_save(fig, path)

    plots.save_figure = keep
    try:
        plots.plot_forest(res, tmp_path / "forest.png")
        table = _two_trajectory_table()
        plots.plot_roc(pd.concat([table, table.assign(trajectory_id=table.trajectory_id + "b")]),
                       tmp_path / "roc.png")
    finally:
        plots.save_figure = real_save
    ax = figs["forest.png"].axes[0]
    lo, hi = ax.get_xlim()
    assert lo < 0.0 and hi > 1.0  # a point at AUC 1.0 is drawn whole, inside the axes
    marker_px = 6 / 72 * figs["forest.png"].dpi / 2
    x1 = ax.transData.transform((1.0, 0))[0]
    assert x1 + marker_px <= ax.get_window_extent().x1
    roc = figs["roc.png"]
    ax = roc.axes[0]
    legend = ax.get_legend().get_window_extent()
    assert legend.y1 <= ax.get_window_extent().y0  # below the axes, never over the curves


def test_html_figures_open_full_size_on_click(tmp_path):
    from PIL import Image

    from ipi.reporting.report import render_html

    Image.new("RGB", (3000, 900), "white").save(tmp_path / "gallery.png")
    html = render_html(_results(), {"gallery": "gallery.png"}, base_dir=tmp_path)
    assert 'id="lightbox"' in html and "addEventListener('click'" in html
    assert "Click the figure for full size." in html
    assert "max-width:none" in html  # the opened figure is shown at its own size (scrollable)


@pytest.mark.parametrize("text, match", [
    ("trajectory_id,step,variant,score\na,0,clean,0.1\na,0,attack,1\na,0,c_scrambld,0.3\n",
     r"row 2 \(line 4\): unknown control 'c_scrambld' \(did you mean 'c_scrambled'\?"),
    ("trajectory_id,step,variant,score,weight\na,0,clean,0.1,0\na,0,attack,1,1\nb,0,clean,0.2,0\n",
     r"column 'weight': every 'clean' row has weight 0"),
])
def test_score_table_wrong_inputs_are_errors_naming_the_row(tmp_path, text, match):
    from ipi.evaluation.scoretable import read_score_table

    p = tmp_path / "s.csv"
    p.write_text(text)
    with pytest.raises(ValueError, match=match) as e:
        read_score_table(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_zero_weights_fail_before_anything_is_written(tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO

    p = tmp_path / "s.csv"
    p.write_text("trajectory_id,step,variant,score,weight\n"
                 + "".join(f"t{i},0,clean,0.{i},1\nt{i},0,attack,1.{i},0\n" for i in range(6)))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "evaluate.py", f"scores={p}", f"hydra.run.dir={out}",
                           "evaluation.n_boot=10"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "every 'attack' row has weight 0" in proc.stderr
    assert sorted(f.name for f in out.iterdir() if f.name != ".hydra" and not f.name.endswith(".log")) == []
