"""Config values a library refuses, and mandatory values left out, end in one line (ipi.run.cli, ipi.run.hydra_callbacks)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO, SMALL_BACKBONE_OVERRIDES, compose_train


def test_int_for_a_float_in_the_model_config_names_the_key_and_the_fix():
    """transformers' strict config classes refuse ``initializer_range=30000`` (an int): the message
    becomes one line naming the config key and saying to write 30000.0; the same value as a float
    builds (the check is the model config's, not ours)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    from ipi.run.cli import input_error, message

    cfg = compose_train(REPO / "outputs" / "unused", ["+backbone.loader.text.initializer_range=30000"])
    with pytest.raises(InstantiationException) as e:
        instantiate(cfg.backbone.loader)
    inner = input_error(e.value)
    assert inner is not None  # an input error, not a bug
    msg = message(inner, cfg)
    assert "\n" not in msg
    assert msg.startswith("backbone.loader.text.initializer_range: ")
    assert "expected float, got int (value: 30000)" in msg and "e.g. 30000.0" in msg
    ok = compose_train(REPO / "outputs" / "unused", ["+backbone.loader.text.initializer_range=30000.0"])
    assert instantiate(ok.backbone.loader).n_layers == 4


def test_int_for_a_float_on_the_command_line_is_one_line_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "train.py", "data.max_trajectories=6", "split.test_fraction=0.5", "evaluation.transfer=false",
         "evaluation.random_twin=false", "logger=none", "quiet=true", "+backbone.loader.text.initializer_range=30000",
         f"hydra.run.dir={tmp_path / 'run'}", f"extract.cache_dir={tmp_path / 'cache'}", *SMALL_BACKBONE_OVERRIDES],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "InstantiationException" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: backbone.loader.text.initializer_range: ")
    assert "expected float, got int (value: 30000)" in line


def test_detector_external_without_label_is_a_one_line_config_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "train.py", "detector=external", f"detector.scores={tmp_path / 's.csv'}",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "config error: detector=external needs detector.label (mandatory, no default); "
        "give detector.label=... on the command line"]


def test_missing_mandatory_values_are_found_without_resolving_anything():
    from ipi.run.hydra_callbacks import ConfigError, _missing_keys, check_config

    cfg = compose_train(REPO / "outputs" / "unused", ["detector=external"])
    assert _missing_keys(cfg) == ["detector.label", "detector.scores"]
    with pytest.raises(ConfigError, match=r"detector=external needs detector.label, detector.scores"):
        check_config(cfg)
    # given both, nothing is missing (the check passes what it should)
    full = compose_train(REPO / "outputs" / "unused", ["detector=external", "detector.scores=/x.csv",
                                                        "detector.label=mine"])
    assert _missing_keys(full) == []
    assert _missing_keys(compose_train(REPO / "outputs" / "unused")) == []
    # interpolations to the hydra node are not resolved (they need a job), lists are walked
    node = OmegaConf.create({"hydra": {"x": "???"}, "a": {"b": ["???", 1], "c": "${hydra:runtime.output_dir}"}})
    assert _missing_keys(node) == ["a.b.0"]
