"""``behaviour.measure``: its typed values, its default, and which measures the stage runs."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from tests.conftest import compose_train


@pytest.mark.parametrize("value, expected", [(None, (True, True)), ("both", (True, True)),
                                             ("free_run", (True, False)), ("likelihood", (False, True))])
def test_measure_picks_the_measures(tmp_path, value, expected):
    from ipi.run.likelihood_stage import behaviour_measures

    ov = ["behaviour.enabled=true", *([f"behaviour.measure={value}"] if value else [])]
    cfg = compose_train(tmp_path, ov)
    assert cfg.behaviour.measure.value == (value or "both")  # the default is written once, in BehaviourConf
    assert behaviour_measures(cfg) == expected


def test_unknown_measure_is_refused(tmp_path):
    with pytest.raises((ConfigCompositionException, ValidationError), match="measure"):
        compose_train(tmp_path, ["behaviour.measure=generate"])
