"""Layer resolution and decoder-layer discovery."""

from __future__ import annotations

import pytest

from ipi.backbone import find_decoder_layers
from ipi.protocol import resolve_layers


@pytest.mark.parametrize(
    ("spec", "n", "expected"),
    [
        ([1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0], 8, [1, 2, 3, 5, 6, 7]),
        ([1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0], 28, [4, 9, 13, 18, 23, 27]),
        ([1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0], 4, [0, 1, 2, 3]),  # collisions dedupe
        ([1.0], 36, [35]),
        ([0.01], 28, [0]),
        ([0, -1], 8, [0, 7]),
    ],
)
def test_resolve_layers(spec, n, expected):
    assert resolve_layers(spec, n) == expected


@pytest.mark.parametrize("bad", [[0.0], [1.5], [-0.2], [8], [-9], [True]])
def test_resolve_layers_rejects(bad):
    with pytest.raises(ValueError, match="layers"):
        resolve_layers(bad, 8)


@pytest.mark.needs_shared
def test_find_decoder_layers_on_real_class(small_backbone):
    layers = find_decoder_layers(small_backbone.model)
    assert layers is small_backbone.model.language_model.layers  # the base model: no LM head
    assert len(layers) == 4
    assert not any(p.requires_grad for p in small_backbone.model.parameters())
    assert not small_backbone.model.training
