"""A fourth surface is one new module and one YAML file: no file of the repository changes for it.

The test writes, under ``tmp_path`` only, a module with a :class:`~ipi.surfaces.surface.TextSurface`
subclass (``i_title``: a page-title line above the page's element list) and
``conf/surface/i_title.yaml`` naming it, puts the folder on ``PYTHONPATH`` and the conf folder on
Hydra's search path, and runs ``train.py surface=i_title`` end to end on real WebVoyager
trajectories. Everything runs in subprocesses, so the surface never joins this process's registry
(other tests see the three surfaces that ship).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from tests.conftest import REPO, SMALL_BACKBONE_OVERRIDES

pytestmark = pytest.mark.needs_shared

MODULE = textwrap.dedent('''
    """i_title: a page-title line above the page's element list (a fourth surface, written by a test)."""

    from typing import ClassVar

    from ipi.surfaces.surface import Insertion, TextSurface

    PREFIX = "[page title] "


    class _TitleLine(Insertion):
        def __init__(self, step):
            self.original = step.element_text
            self.meta = {}

        def line(self, text):
            return PREFIX + text

        def apply(self, text):
            if text is None:
                return self.original, 0, 0
            tail = "\\n" + self.original if self.original else ""
            return PREFIX + text + tail, len(PREFIX), len(PREFIX) + len(text)


    class PageTitleSurface(TextSurface):
        name: ClassVar[str] = "i_title"
        controls: ClassVar[tuple] = ("c_scrambled", "c_imperative")
        required_controls: ClassVar[tuple] = ("c_scrambled", "c_imperative")
        needs_image: ClassVar[bool] = False
        token_matched: ClassVar[bool] = True
        untrusted_group: ClassVar[str] = "observation"
        gallery_title: ClassVar[str] = "i_title: a page-title line above the element list (same token count)"
        field: ClassVar[str] = "element_text"

        def insertion(self, trajectory_id, step):
            return _TitleLine(step)
''')

YAML = textwrap.dedent("""
    # A fourth surface: its class, its name, the attack rows per step.
    _target_: title_surface.PageTitleSurface
    name: i_title
    n_attacks: 1
""")


@pytest.fixture
def new_surface(tmp_path):
    """``(env, searchpath override)`` for a run that knows ``i_title`` from ``tmp_path`` alone."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "title_surface.py").write_text(MODULE)
    (tmp_path / "conf" / "surface").mkdir(parents=True)
    (tmp_path / "conf" / "surface" / "i_title.yaml").write_text(YAML)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "pkg")]), "IPI_CACHE_DIR": str(tmp_path / "cache")}
    return env, f"hydra.searchpath=[file://{tmp_path / 'conf'}]"


def test_a_fourth_surface_from_one_module_and_one_yaml_runs_end_to_end(tmp_path, new_surface):
    env, searchpath = new_surface
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "train.py", "surface=i_title", searchpath, "data.max_trajectories=4",
         "split.test_fraction=0.5", "evaluation.n_boot=50", "evaluation.random_twin=false",
         "evaluation.permutation.m=0", "evaluation.transfer=false", "logger=none", "quiet=true",
         *SMALL_BACKBONE_OVERRIDES, f"hydra.run.dir={run}", f"extract.cache_dir={tmp_path / 'cache'}"],
        cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((run / "results.json").read_text())

    # The run is on the new surface, with the controls its class declares.
    assert res["run"]["surface"] == "i_title"
    assert res["run"]["controls"] == ["c_scrambled", "c_imperative"]
    assert set(res["e3"]) == {"c_scrambled", "c_imperative"}
    for iv in (res["e1"], res["e2"], *res["e3"].values(), res["c1"]["e1"]):
        assert set(iv) == {"estimate", "ci_low", "ci_high", "n_boot_used"}
        assert 0.0 <= iv["ci_low"] <= iv["estimate"] <= iv["ci_high"] <= 1.0
    counts = res["counts"]
    assert counts["rows_by_variant"] == {v: counts["steps"] for v in ("attack", "c_imperative", "c_scrambled", "clean")}
    assert counts["control_token_mismatches"] == 0  # the token-matched controls are exact here too

    # E1 and E3 recomputed from the written scores (one row per step and variant: unit weights).
    scores = pd.read_csv(run / "scores.csv")
    assert set(scores.variant) == {"clean", "attack", "c_scrambled", "c_imperative"}
    for key, neg in (("e1", "clean"), ("c_scrambled", "c_scrambled"), ("c_imperative", "c_imperative")):
        sub = scores[scores.variant.isin(["attack", neg])]
        auc = roc_auc_score((sub.variant == "attack").astype(int), sub.score)
        got = res["e1"] if key == "e1" else res["e3"][key]
        assert got["estimate"] == pytest.approx(auc, abs=1e-12)

    # The title line lengthens the prompt: C1 separates attack from clean by construction, and
    # the report's note comes from the surface object (TextSurface.construction_note).
    assert res["c1"]["e1"]["estimate"] == 1.0
    assert "On i_title the injected text lengthens the prompt" in (run / "report.md").read_text()
    assert (run / "gallery.png").stat().st_size > 0


def test_a_typo_in_the_new_surface_fails_at_composition_naming_every_surface(tmp_path, new_surface):
    env, searchpath = new_surface
    proc = subprocess.run([sys.executable, "train.py", "surface=i_titel", searchpath, f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 1
    assert "Could not find 'surface/i_titel'" in proc.stderr
    options = proc.stderr.split("Available options in 'surface':")[1].split("Config search path")[0].split()
    assert sorted(options) == ["i_dom", "i_title", "i_tool", "i_vis"]
    assert not (tmp_path / "run").exists()
