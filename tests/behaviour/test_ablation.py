"""Directional ablation: the hook removes the direction exactly, leaves no trace, and the probe's direction."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ipi.behaviour.ablation import (
    ProjectOut,
    probe_direction,
    probe_directions,
    project_out,
    random_directions,
    raw_weights,
    run_ablation,
)
from ipi.behaviour.generate import GenerationCache, GenerationSettings, generate, requests_of_rows
from ipi.behaviour.labels import label_tasks
from tests.behaviour.conftest import SYSTEM


def test_project_out_is_orthogonal_to_1e6():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 17, 64, generator=g) * 50 + 3
    u = torch.randn(64, generator=g, dtype=torch.float64)
    u_hat = u / u.norm()
    out = project_out(h, u_hat)
    assert out.dtype == torch.float32 and out.shape == h.shape
    along = (out.double() @ u_hat).abs()
    assert float((along / out.double().norm(dim=-1)).max()) < 1e-6
    # nothing but the component along u changed
    removed = h.double() - out.double()
    np.testing.assert_allclose(removed.numpy(), ((h.double() @ u_hat)[..., None] * u_hat).numpy(), atol=1e-4)
    assert float((h.double() @ u_hat).abs().max()) > 1.0  # the check above can fail: h had a component


def _ids(backbone):
    tok = backbone.tokenizer
    return torch.tensor([tok.encode("Thought: click the search box. Action: Click [3]")])


def _capture(layer, store):
    return layer.register_forward_hook(lambda m, i, o: store.append((o[0] if isinstance(o, tuple) else o).detach()))


@pytest.mark.parametrize("which", ["text_backbone", "gen_backbone"])
def test_hook_removes_the_direction_at_every_position_and_leaves_no_trace(which, request):
    bb, k = request.getfixturevalue(which), 1
    u = np.random.default_rng(3).standard_normal(bb.hidden_size) * 7
    u_hat = torch.from_numpy(u / np.linalg.norm(u))
    ids = _ids(bb)
    with torch.inference_mode():
        before = bb.model(input_ids=ids).logits.clone()
    seen, seen_next = [], []
    inter = ProjectOut({k: u}, "test")
    with inter.applied(bb):
        h1 = _capture(bb.layers[k], seen)  # registered after the ablation: sees its output
        h2 = bb.layers[k + 1].register_forward_pre_hook(lambda m, a, kw: seen_next.append(
            (a[0] if a else kw["hidden_states"]).detach()), with_kwargs=True)
        with torch.inference_mode():
            during = bb.model(input_ids=ids).logits.clone()
        h1.remove()
        h2.remove()
    for h in (seen[0], seen_next[0]):
        rel = (h.double() @ u_hat).abs() / h.double().norm(dim=-1)
        assert h.shape[1] == ids.shape[1] and float(rel.max()) < 1e-6
    assert not torch.equal(before, during)
    # removed: no hook left, the same logits bit for bit
    assert all(len(layer._forward_hooks) == 0 for layer in bb.layers)
    with torch.inference_mode():
        after = bb.model(input_ids=ids).logits
    assert torch.equal(before, after)
    # the state without ablation does have a component along u (the test can fail)
    plain = []
    h = _capture(bb.layers[k], plain)
    with torch.inference_mode():
        bb.model(input_ids=ids)
    h.remove()
    assert float(((plain[0].double() @ u_hat).abs() / plain[0].double().norm(dim=-1)).max()) > 1e-3


def test_hook_removed_on_error_and_refusals(text_backbone):
    bb = text_backbone
    u = np.ones(bb.hidden_size)
    with pytest.raises(RuntimeError, match="boom"), ProjectOut({0: u, 2: u}, "x").applied(bb):
        raise RuntimeError("boom")
    assert all(len(layer._forward_hooks) == 0 for layer in bb.layers)
    with pytest.raises(ValueError, match="outside"), ProjectOut({9: u}, "x").applied(bb):
        pass
    with pytest.raises(ValueError, match="width"), ProjectOut({0: np.ones(5)}, "x").applied(bb):
        pass
    assert all(len(layer._forward_hooks) == 0 for layer in bb.layers)
    with pytest.raises(ValueError, match="zero"):
        ProjectOut({0: np.zeros(4)}, "x")
    a, b = ProjectOut({0: u}, "probe").identity(), ProjectOut({0: 2 * u}, "probe").identity()
    assert a == b  # the unit direction is what acts
    assert a != ProjectOut({1: u}, "probe").identity() != ProjectOut({0: -u + 1e-3}, "probe").identity()


def test_probe_direction_sums_the_layer_block_over_token_groups():
    layers, groups, hidden = [1, 3], ["task", "observation", "action"], 4
    w = np.arange(len(layers) * len(groups) * hidden, dtype=float)
    # feature order: layer outer, group, hidden inner -> layer 3 holds entries 12..23
    np.testing.assert_array_equal(probe_direction(w, layers, groups, hidden, 3),
                                  w[12:16] + w[16:20] + w[20:24])
    assert set(probe_directions(w, layers, groups, hidden)) == {1, 3}
    with pytest.raises(ValueError, match="not among"):
        probe_direction(w, layers, groups, hidden, 2)
    with pytest.raises(ValueError, match="entries"):
        probe_direction(w[:-1], layers, groups, hidden, 1)


def test_probe_direction_is_the_logit_gradient_of_a_shift_of_every_token():
    """Shifting every token's layer-k state by δ changes the fitted probe's logit by δ · u_k."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    layers, groups, hidden, n_tok = [0, 2], ["a", "b"], 5, 6

    def features(states, members):  # states [L, T, H]; group g = mean over its tokens
        return np.stack([np.stack([states[li][members[g]].mean(0) for g in groups]) for li in range(len(layers))]
                        ).reshape(-1)

    members = {"a": [0, 1, 2], "b": [3, 4]}  # token 5 is in no group
    x = np.stack([features(rng.normal(size=(2, n_tok, hidden)), members) for _ in range(60)])
    y = (x[:, 0] + x[:, 7] > 0).astype(int)
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(x * 3 + 1, y)
    w = raw_weights(probe)
    states = rng.normal(size=(2, n_tok, hidden))
    delta = rng.normal(size=hidden)
    shifted = states.copy()
    shifted[1] += delta  # every token of layer 2
    df = probe.decision_function([features(shifted, members), features(states, members)])
    u = probe_direction(w, layers, groups, hidden, 2)
    assert df[0] - df[1] == pytest.approx(float(delta @ u), rel=1e-9)
    with pytest.raises(TypeError):
        raw_weights(object())


def test_random_directions_equal_norm_and_seeded():
    d = {3: np.arange(8.0), 1: np.ones(8) * 2}
    r = random_directions(d, seed=5)
    for k in d:
        assert np.linalg.norm(r[k]) == pytest.approx(np.linalg.norm(d[k]))
    np.testing.assert_array_equal(random_directions({3: d[3]}, seed=5)[3], r[3])  # independent of the others
    assert not np.allclose(random_directions(d, seed=6)[3], r[3])
    assert abs(float(r[3] @ d[3])) < np.linalg.norm(d[3]) ** 2  # not the direction itself


@pytest.mark.needs_shared
def test_run_ablation_three_arms_on_the_same_rows(text_backbone, dom_rows, tmp_path):
    bb = text_backbone
    reqs = requests_of_rows(bb, dom_rows, SYSTEM)
    tasks = label_tasks(dom_rows)
    settings = GenerationSettings(max_new_tokens=5, batch_size=3)
    direction = {1: np.random.default_rng(1).standard_normal(bb.hidden_size)}
    cache = GenerationCache(tmp_path / "g.jsonl")
    run = run_ablation(bb, reqs, tasks, direction, settings=settings, cache=cache, seed=0, n_boot=50)
    assert set(run.labels) == {"none", "probe", "random"}
    for table in run.labels.values():
        assert table["row_id"].tolist() == [t.row_id for t in tasks]
    plain = generate(bb, reqs, settings)
    assert run.labels["none"]["generated"].tolist() == [g.text for g in plain]
    assert len(GenerationCache(tmp_path / "g.jsonl")) == 3 * len(reqs)  # each arm under its own keys
    assert np.linalg.norm(run.directions["random"][1]) == pytest.approx(np.linalg.norm(direction[1]))
    assert run.effects.n_rows == sum(t.variant == "attack" for t in tasks)
    assert all(len(layer._forward_hooks) == 0 for layer in bb.layers)
    with pytest.raises(ValueError, match="same rows"):
        run_ablation(bb, reqs[::-1], tasks, direction, settings=settings)
