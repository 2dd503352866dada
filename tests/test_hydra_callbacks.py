"""Config errors at composition (ipi.run.hydra_callbacks.ConfigCheck): one line, before any heavy import."""

from __future__ import annotations

import dataclasses
import subprocess
import textwrap

import pytest

from ipi.run.schemas import ProbeConf
from tests.conftest import (
    PY,
    REPO,
    _env,
)

# --------------------------------------------------------------- config errors at composition

_DRIVER = textwrap.dedent("""
    import atexit, runpy, sys
    heavy = ("torch", "lightning", "transformers")
    atexit.register(lambda: sys.stderr.write(
        "heavy modules imported: " + (",".join(m for m in heavy if m in sys.modules) or "none") + "\\n"))
    sys.argv = ["train.py", *sys.argv[1:]]
    runpy.run_path("train.py", run_name="__main__")
""")


@pytest.mark.parametrize(("overrides", "line"), [
    (["surface=i_dom", "control=occlusion"],
     "config error: control=c_occlusion does not apply to surface=i_dom; allowed: c_scrambled, c_imperative"),
    (["layers.spec=[0.5,1.5]"], "config error: layers.spec: fraction 1.5 outside (0, 1]"),
    (["layers.spec=[0.0]"], "config error: layers.spec: fraction 0.0 outside (0, 1]"),
    (["surface=i_dom", "backbone.multimodal=false"],
     "config error: token_group: 'image' is unavailable with the text-only backbone=tiny_qwen2_5_vl; "
     "choose one of last_prompt, task, observation, action"),
    (["-m", "surface=i_vis,i_dom", "control=occlusion"],
     "config error: job 1 (surface=i_dom control=occlusion): control=c_occlusion does not apply to "
     "surface=i_dom; allowed: c_scrambled, c_imperative"),
    (["-m", "surface=i_vis,i_dom", "extract.devices=2", "evaluation.transfer=false"],
     "config error: job 0 (surface=i_vis extract.devices=2 evaluation.transfer=False): extract.devices>1 "
     "(DDP) inside a -m sweep: Lightning's DDP launcher re-runs the whole command in every extra process, "
     "so each would run the whole sweep again; instead extract each surface with DDP first "
     "(`python extract.py surface=<s> evaluation.transfer=false extract.devices=N`), then run the sweep "
     "on one device (docs/sweeps.md)"),
    (["surface.name=i_audio"],
     ("config error: surface.name=i_audio is not the name of surface._target_=ipi.surfaces.i_vis.BannerSurface "
      "(i_vis); choose surface=<name>, one of: i_vis, i_dom, i_tool")),
    (["surface=i_vis", "backbone.multimodal=false", "token_group=text"],
     "config error: surface=i_vis needs a multimodal backbone; backbone=tiny_qwen2_5_vl is text-only"),
    (["+probe.l3=2"],
     "config error: probe.l3: unknown setting (a '+' override adds keys the run never reads); ProbeConf allows: "
     + ", ".join(f.name for f in dataclasses.fields(ProbeConf))),
], ids=["control", "fraction-high", "fraction-zero", "text-only-image", "sweep-job-1", "ddp-in-sweep",
        "surface-name", "text-only-surface", "plus-key"])
def test_cross_field_errors_are_one_line_before_any_heavy_import(tmp_path, overrides, line):
    proc = subprocess.run([PY, "-c", _DRIVER, *overrides, f"hydra.run.dir={tmp_path / 'run'}",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [line, "heavy modules imported: none"], proc.stderr
    assert not (tmp_path / "sweep").exists() or not any((tmp_path / "sweep").iterdir())


def test_evaluate_refuses_a_plus_key_before_reading_scores(tmp_path):
    proc = subprocess.run([PY, "evaluate.py", f"scores={tmp_path / 'none.csv'}", "+evaluation.n_bootstrap=3",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=_env())
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1].startswith(
        "config error: evaluation.n_bootstrap: unknown setting (a '+' override adds keys the run never reads); "
        "EvaluationConf allows: n_boot, "), proc.stderr


@pytest.mark.parametrize(("override", "key", "allowed"), [
    ("control.names=[c_blur]", "control.names[0]", "[c_scrambled, c_imperative, c_occlusion]"),
    ("token_group.names=[pixels]", "token_group.names[0]", "[last_prompt, image, task, observation, action]"),
    ("data.unknown_action=drop", "data.unknown_action", "[keep, skip, error]"),
    ("data.on_bad_step=ignore", "data.on_bad_step", "[skip, error]"),
])
def test_unknown_values_fail_at_composition_naming_key_and_allowed(tmp_path, override, key, allowed):
    proc = subprocess.run([PY, "-c", _DRIVER, override, f"hydra.run.dir={tmp_path}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 1
    assert f"full_key: {key}" in proc.stderr and f"expected one of {allowed}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == "heavy modules imported: none"
