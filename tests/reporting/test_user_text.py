"""User-given strings in figures are drawn as plain text, never as mathtext (ipi.reporting.plots)."""

from __future__ import annotations

import json

import matplotlib.text
import numpy as np
import pandas as pd
import pytest

from ipi.reporting import plots
from ipi.reporting.sweep import main

#: Strings matplotlib would parse as mathtext (an unbalanced or empty ``$...$``, TeX commands) or
#: render differently (``_``, ``^`` inside dollars).
LABELS = ["$$", "$x^$", r"$\frac{a}{b}$ probe", "layer_1", "a^b", r"\frac", "cost $5 and $6"]


def _texts_of_saved_figure(monkeypatch) -> list[matplotlib.text.Text]:
    """Capture every Text artist of the next figure :func:`plots.save_figure` writes."""
    seen: list[matplotlib.text.Text] = []
    real = plots.save_figure

    def capture(fig, path):
        fig.canvas.draw()  # the tick labels and legend entries exist once the figure is drawn
        seen.extend(fig.findobj(matplotlib.text.Text))
        return real(fig, path)

    monkeypatch.setattr(plots, "save_figure", capture)
    return seen


def test_heatmap_draws_labels_and_title_as_given(tmp_path, monkeypatch):
    grid = pd.DataFrame(np.array([[0.9, 0.4], [0.6, np.nan]]), index=LABELS[:2], columns=LABELS[2:4])
    texts = _texts_of_saved_figure(monkeypatch)
    title = " · ".join(LABELS)
    path = plots.plot_heatmap(grid, tmp_path / "h.png", title)
    assert path.stat().st_size > 0
    drawn = {t.get_text(): t for t in texts}
    for s in LABELS[:4] + [title]:
        assert s in drawn, s
        assert drawn[s].get_parse_math() is False and drawn[s]._preprocess_math(s) == (s, False)


def test_roc_draws_title_as_given(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    n = 40
    table = pd.DataFrame({"trajectory_id": [f"t{i // 4}" for i in range(2 * n)],
                          "step": [i % 4 for i in range(2 * n)],
                          "variant": ["attack"] * n + ["clean"] * n,
                          "label": [1] * n + [0] * n,
                          "score": np.r_[rng.normal(1, 1, n), rng.normal(0, 1, n)]})
    texts = _texts_of_saved_figure(monkeypatch)
    plots.plot_roc(table, tmp_path / "roc.png", title="$x^$ on data_root $$")
    assert "$x^$ on data_root $$" in {t.get_text() for t in texts}
    assert (tmp_path / "roc.png").stat().st_size > 0


def test_sweep_report_with_a_dollar_detector_label(tmp_path):
    """A label holding ``$$`` used to stop the sweep report after sweep.csv (mathtext ParseException)."""
    label, other = "$$ my_probe^2", "lin/mean $x^$"
    cells = [("six_1", "task", label), ("six_2", "task", label), ("six_1", "last_prompt", label),
             ("six_1", "task", other)]
    for n, (layers, group, name) in enumerate(cells):
        job = tmp_path / str(n)
        (job / ".hydra").mkdir(parents=True)
        res = {"e1": {"estimate": 0.8, "ci_low": 0.7, "ci_high": 0.9, "n_boot_used": 100},
               "verdict": {"claim": "none", "checks": [{"id": 1, "status": "FAIL"}]},
               "bootstrap": {"level": 0.95, "n_boot": 1999},
               "run": {"surface": "i_vis", "backbone": "tiny", "layers_config": layers, "layers": [n],
                       "token_groups": [group], "detector": {"name": "external", "label": name},
                       "data_root": "/data/$root_x^"}}
        (job / "results.json").write_text(json.dumps(res))
        from omegaconf import OmegaConf

        OmegaConf.save(OmegaConf.create({"token_group": {"name": group}}), job / ".hydra" / "config.yaml")
        OmegaConf.save(OmegaConf.create([f"layers={layers}", f"token_group={group}"]),
                       job / ".hydra" / "overrides.yaml")
    assert main([str(tmp_path)]) == 0
    # one heatmap per detector; a "/" in a label does not become a folder
    heatmaps = sorted(p.name for p in tmp_path.glob("heatmap_*.png"))
    assert len(heatmaps) == 2 and all(p.startswith("heatmap_e1_i_vis_tiny_external_") for p in heatmaps), heatmaps
    md = (tmp_path / "sweep_report.md").read_text()
    assert f"external ({label})" in md and f"external ({other})" in md
    assert (tmp_path / "sweep_report.html").is_file()
    assert sorted(pd.read_csv(tmp_path / "sweep.csv")["detector"]) == [f"external ({label})"] * 3 + [
        f"external ({other})"]


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
