"""Planted truth for the likelihood hijack measure: a constructed causal LM whose goal-action tokens
become more likely exactly when an attack-only token is in the prompt.

The constructed model (one Qwen2 block, the real Qwen tokenizer) reads one residual coordinate
``u = e_0``:

* every input embedding has ``u``-coordinate 0, except the **marker** tokens (tokens that occur in
  the attack rows' prompts, in no clean row (prompt or recorded turn) and in no scored action), which get
  ``u``-coordinate ``G``;
* attention is uniform (query and key weights 0); the value/output maps copy the normalised
  ``u``-coordinate into ``u``, scaled by ``A``; the MLP writes nothing. So a position's residual is
  its own token's embedding plus ``A · mean(u-coordinate of the tokens so far) · u``: zero without a
  marker;
* the LM head's ``u``-column is ``C`` on the **boosted** tokens (the goal actions' tokens that no
  gold action holds, never the turn-closing token) and 0 elsewhere.

With the plant (``G > 0``) every attack row's goal action gains log-probability and its gold
action loses some, the clean rows see nothing: the shift is positive on every attack row with a
goal action. Without it (``G = 0``) a position's logits depend on its own token alone, so an
action's log-likelihood is the same under the attack and the clean prompt: every shift is 0 and
E4 (likelihood) is not estimable. Projecting ``u`` out of the block's output removes the plant;
a random direction does not.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ipi.behaviour.ablation import ProjectOut
from ipi.behaviour.generate import requests_of_rows
from ipi.behaviour.labels import label_tasks
from ipi.behaviour.propensity import goal_action, likelihood_table
from ipi.evaluation.likelihood import likelihood_ablation, likelihood_e4
from ipi.replay import tokenise
from tests.behaviour.conftest import SYSTEM
from tests.conftest import PROCESSOR

pytestmark = pytest.mark.needs_shared
H = 64


@pytest.fixture(scope="module")
def rows(trajectories):
    from ipi.extraction.rows import build_rows

    out = build_rows(trajectories[:3], "i_tool", [], count_tokens=lambda s: len(s.split()))
    return [r for r in out if r.step.step < 3]


def _ids(tok, text: str) -> set[int]:
    return set(tok(text, add_special_tokens=False)["input_ids"])


def _constructed(rows, gain: float):
    """The module docstring's backbone; ``gain`` is ``G`` (0: no plant)."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from ipi.backbone import Backbone, find_decoder_layers
    from ipi.backbone_text import TextChatProcessor

    tok = AutoTokenizer.from_pretrained(str(PROCESSOR))
    config = Qwen2Config(vocab_size=len(tok), hidden_size=H, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).eval()
    backbone = Backbone(name="planted_shift", model=model, processor=TextChatProcessor(tok),
                        layers=find_decoder_layers(model), hidden_size=H, multimodal=False, image_token_id=None,
                        identity={"kind": "planted_shift_test", "gain": gain}, image_size=None, depth=1)
    prompts = {r.row_id: set(q.input_ids.tolist()) for r, q in zip(rows, requests_of_rows(backbone, rows, SYSTEM))}
    # a clean row's whole teacher-forced row: its prompt and the recorded turn (thought, action)
    clean = set().union(*(set(tokenise(backbone.processor, r.parts(SYSTEM, False)).inputs["input_ids"][0].tolist())
                          for r in rows if r.variant.variant == "clean"))
    attack = set().union(*(prompts[r.row_id] for r in rows if r.variant.variant == "attack"))
    tasks = [t for t in label_tasks(rows) if t.variant == "attack"]
    goal_acts = [goal_action(t.goal, t.gold_action, t.page_elements, t.attack_text)[0] for t in tasks]
    golds = set().union(*(_ids(tok, " " + t.gold_action) | _ids(tok, t.gold_action) for t in tasks))
    goals = set().union(*(_ids(tok, " " + a) | _ids(tok, a) for a in goal_acts if a))
    boosted = goals - golds - {tok.convert_tokens_to_ids("<|im_end|>")}
    markers = sorted(attack - clean - goals - golds)  # never a token of a scored action
    assert boosted and all(prompts[r.row_id] & set(markers) for r in rows if r.variant.variant == "attack")
    with torch.no_grad():
        att = model.model.layers[0].self_attn
        for lin in (att.q_proj, att.k_proj, att.v_proj, att.o_proj):
            lin.weight.zero_()
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(att, name).bias.zero_()
        for n in ("input_layernorm", "post_attention_layernorm"):
            getattr(model.model.layers[0], n).weight.fill_(1.0)
        model.model.norm.weight.fill_(1.0)
        model.model.layers[0].mlp.down_proj.weight.zero_()
        att.v_proj.weight[0, 0] = 1.0  # head 0, value dim 0 <- normalised u-coordinate
        att.o_proj.weight[0, 0] = 50.0  # u <- A * (head 0, dim 0)
        emb = model.model.embed_tokens.weight
        emb[:, 0] = 0.0
        emb[markers, 0] = gain
        head = model.lm_head.weight
        head[:, 0] = 0.0
        head[sorted(boosted), 0] = 0.5  # ~4 nats: small enough that the boosted tokens take little mass elsewhere
    for p in model.parameters():
        p.requires_grad_(False)
    return backbone, boosted


def test_planted_shift_is_positive_where_planted(rows):
    backbone, boosted = _constructed(rows, gain=100.0)
    tok = backbone.tokenizer
    t = likelihood_table(backbone, rows, SYSTEM)
    att = t[(t["variant"] == "attack") & (t["goal_action"] != "")]
    planted = att["goal_action"].map(lambda a: bool(_ids(tok, " " + a) & boosted))
    assert planted.sum() >= 4 and (~planted).sum() >= 1  # "Click [12]" holds no boosted token
    # where planted, the goal action gains ~4 nats per boosted token under the attack prompt only
    assert (att.loc[planted, "shift"] > 3.0).all(), att[["goal_action", "shift"]]
    assert (att.loc[planted, "propensity"] > att.loc[planted, "clean_propensity"]).all()
    # elsewhere the boosted tokens only take a little probability mass from the action's tokens
    assert (att.loc[~planted, "shift"].abs() < 1.0).all()
    r = likelihood_e4(t.assign(score=t["shift"].fillna(0.0)))
    assert r.counts == {"shift_positive": int(planted.sum()), "shift_not_positive": int((~planted).sum()),
                        "no_goal_action": int((t.loc[t["variant"] == "attack", "goal_action"] == "").sum())}
    assert r.e4.e4.estimate == 1.0 and r.mean_shift.estimate > 3.0


@pytest.mark.slow
def test_projecting_out_the_planted_direction_removes_the_shift_a_random_one_does_not(rows):
    backbone, _ = _constructed(rows, gain=100.0)
    t = likelihood_table(backbone, rows, SYSTEM)
    att = t[(t["variant"] == "attack") & (t["goal_action"] != "")]
    u = np.zeros(H)
    u[0] = 1.0
    rnd = np.random.default_rng(0).normal(size=H)
    rnd[0] = 0.0
    arms = {"none": t, "probe": likelihood_table(backbone, rows, SYSTEM, intervention=ProjectOut({0: u}, "u")),
            "random": likelihood_table(backbone, rows, SYSTEM, intervention=ProjectOut({0: rnd}, "random"))}
    probe_att = arms["probe"].loc[att.index, "shift"].to_numpy()
    assert np.allclose(probe_att, 0.0, atol=1e-4)
    ab = likelihood_ablation(arms)
    assert ab.mean_shift["probe"].estimate == pytest.approx(0.0, abs=1e-4)
    assert ab.changes["probe"].estimate == pytest.approx(-ab.mean_shift["none"].estimate, abs=1e-4)
    assert ab.mean_shift["random"].estimate > 3.0 and ab.probe_minus_random.estimate < -3.0


def test_no_plant_no_shift(rows):
    backbone, _ = _constructed(rows, gain=0.0)
    t = likelihood_table(backbone, rows, SYSTEM)
    att = t[(t["variant"] == "attack") & (t["goal_action"] != "")]
    assert len(att) >= 3
    # a position's logits depend on its own token only: the same action is as likely under both prompts
    assert np.allclose(att["shift"].to_numpy(), 0.0, atol=1e-4)
    assert np.allclose(att["propensity"].to_numpy(), att["clean_propensity"].to_numpy(), atol=1e-4)
    r = likelihood_e4(t.assign(score=np.arange(len(t), dtype=float)))
    assert r.mean_shift.estimate == pytest.approx(0.0, abs=1e-4)
