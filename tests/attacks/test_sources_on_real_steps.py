"""Every attack source on real WebVoyager steps (issue 25's must-show; docs/surfaces.md).

1. Every source's rows render on every surface, and on the token-matched surfaces the injected
   text has an exact token span in the prompt the backbone reads: the full prompt is tokenised
   here a second time with the plain tokenizer (``tok(text, return_offsets_mapping=True)``), the
   injected text is located by searching for its wrapped line (not from the row's recorded
   offsets), and its tokens must be the pipeline's ids, lie inside the ``observation`` group, and
   reach past the text only into the wrapper's punctuation. A matched control shifts the prompt's
   length by exactly its recorded ``token_delta``.
2. Held out by source (``split.wording=source``) on real rows of all three surfaces: no text of a
   held-out source (a goal, a template's fixed wording, a benign sentence) occurs in any training
   row of its fold, checked by **text** after the ``i_dom`` adaptation, independently of the
   rows' recorded indices.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ipi.attacks.pool import AttackPool, attack_key, pool_from_config
from ipi.attacks.slots import render
from ipi.attacks.wording import source_owner, source_wording_plan, wording_overlap
from ipi.extraction.rows import build_rows
from ipi.probe.folds import make_folds
from ipi.protocol import DEFAULT_SYSTEM_PROMPT
from ipi.replay import _tokenise
from ipi.surfaces.i_tool import TOOL_NOTICE_PREFIX

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("project", "agentdojo", "injecagent", "garak", "mix")
IMAGE_SIZE = {"shortest_edge": 3136, "longest_edge": 200704}  # conf/backbone/tiny_qwen2_5_vl.yaml
CONTROLS = ("c_scrambled", "c_imperative")

pytestmark = pytest.mark.needs_shared


def _pool(name: str) -> AttackPool:
    return pool_from_config(OmegaConf.load(REPO / "conf" / "attack" / f"{name}.yaml"))


def _adapt(text: str) -> str:
    """The i_dom entry's one-line form, written out here (docs/attacks.md): ``"`` -> ``'``, runs of
    whitespace -> one space."""
    return " ".join(text.replace('"', "'").split())


@pytest.fixture(scope="module")
def steps(trajectories):
    """Six real trajectories cut to their first two steps (12 steps, different pages and tasks)."""
    from dataclasses import replace

    picked = [t for t in trajectories if len(t.steps) >= 2][::7][:6]
    return [replace(t, steps=t.steps[:2]) for t in picked]


@pytest.fixture(scope="module")
def image_token_id(processor):
    return processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")


def _wrapped(row) -> str:
    """The injected line as the surface prints it, rebuilt here from the surface's format."""
    v = row.variant
    if v.surface == "i_dom":
        return f'[{v.meta["label"]}]: "{v.injected_text}";'
    return TOOL_NOTICE_PREFIX + v.injected_text


@pytest.mark.parametrize("surface", ["i_dom", "i_tool"])
@pytest.mark.parametrize("name", SOURCES)
def test_rows_have_exact_token_spans_in_the_prompt(name, surface, steps, processor, image_token_id):
    from PIL import Image

    tok = processor.tokenizer
    pool = _pool(name)
    count = lambda s: len(tok(s, add_special_tokens=False).input_ids)  # noqa: E731
    rows = build_rows(steps, surface, CONTROLS, count_tokens=count, pool=pool)
    images: dict[str, dict] = {}
    seen_sources, by_step = set(), {}
    for row in rows:
        v = row.variant
        shot = row.step.screenshot
        if shot not in images:
            out = processor.image_processor(images=[Image.open(shot).convert("RGB")], return_tensors="pt",
                                            size=IMAGE_SIZE)
            images[shot] = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
        tr, _, _ = _tokenise(processor, row.parts(DEFAULT_SYSTEM_PROMPT, True), image_inputs=images[shot],
                             image_size=IMAGE_SIZE, image_token_id=image_token_id)
        by_step.setdefault((row.trajectory_id, row.step.step), {})[v.variant] = tr
        if v.variant == "clean":
            continue
        # the attack text is the source's template filled with its goal (i_tool: as published;
        # i_dom: the one-line adaptation), never anything else
        if v.variant == "attack":
            m = v.meta
            seen_sources.add(m["source"])
            assert m["source"] in pool.sources and pool.templates[m["template"]].id == m["template_id"]
            published = render(pool.templates[m["template"]], pool.goals[m["goal"]],
                                attack_key(row.trajectory_id, row.step.step, 0), {"task": row.task}).text
            assert v.injected_text == (_adapt(published) if surface == "i_dom" else published)
            assert m["adapted"] is (surface == "i_dom" and published != v.injected_text)
        # the prompt as the backbone reads it, tokenised independently: the plain tokenizer on the
        # expanded text (image pads expanded) gives the pipeline's ids
        n_img = int(images[shot]["image_grid_thw"].prod()) // processor.image_processor.merge_size ** 2
        text = tok.decode(tr.inputs["input_ids"][0].tolist(), skip_special_tokens=False)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        assert enc.input_ids == tr.inputs["input_ids"][0].tolist()
        assert enc.input_ids.count(image_token_id) == n_img
        line = _wrapped(row)
        assert text.count(line) == 1, "the injected line occurs exactly once in the prompt"
        a = text.index(line) + line.index(v.injected_text)
        b = a + len(v.injected_text)
        inside = [i for i, (s, e) in enumerate(enc.offset_mapping) if s < b and e > a and e > s]
        assert inside == list(range(inside[0], inside[-1] + 1))  # one contiguous run of tokens
        s0, e1 = enc.offset_mapping[inside[0]][0], enc.offset_mapping[inside[-1]][1]
        left, right = text[s0:a], text[b:e1]
        assert len(left) <= 2 and len(right) <= 2 and not re.search(r"\w", left + right), (left, right)
        assert set(inside) <= set(tr.groups["observation"].tolist())
    assert seen_sources, "attack rows were built"
    if name != "mix":
        assert seen_sources == {name}
    # token-matched controls: the prompt is longer or shorter than the attack's by the row's
    # recorded token_delta exactly (0 for an exact match). The observation group (every token
    # overlapping the fields) may differ by the one token that straddles the field's end and the
    # template (i_tool: an attack's final "." merged with the template's newline into ".\n").
    n_scrambled_exact = 0
    for (tid, step), trs in by_step.items():
        deltas = {r.variant.variant: r.variant.meta["token_delta"] for r in rows
                  if (r.trajectory_id, r.step.step) == (tid, step)}
        for c in CONTROLS:
            assert trs[c].seq_len - trs["attack"].seq_len == deltas[c], (tid, step, c)
            d_obs = trs[c].groups["observation"].numel() - trs["attack"].groups["observation"].numel()
            assert abs(d_obs - deltas[c]) <= (1 if surface == "i_tool" else 0), (tid, step, c, d_obs)
        # scrambled text is exact but for rare steps the search budget misses by one (counted in
        # results.json as control_token_mismatches; 3 of 355 AgentDojo i_tool steps)
        assert abs(deltas["c_scrambled"]) <= 1
        n_scrambled_exact += deltas["c_scrambled"] == 0
    assert n_scrambled_exact >= len(by_step) - 1


@pytest.mark.parametrize("name", SOURCES)
def test_rows_render_on_the_screenshot_surface(name, steps):
    import numpy as np
    from PIL import Image

    pool = _pool(name)
    rows = build_rows(steps[:3], "i_vis", ("c_scrambled", "c_imperative", "c_occlusion"), pool=pool)
    by_step: dict = {}
    for r in rows:
        by_step.setdefault((r.trajectory_id, r.step.step), []).append(r)
    for rs in by_step.values():
        shot = np.asarray(Image.open(rs[0].step.screenshot).convert("RGB"))
        box = rs[0].variant.banner.box
        drawn = {}
        for r in rs:
            v = r.variant
            assert v.banner.box == box  # one box per step, whatever the text
            img = np.asarray(v.image(r.step))
            diff = np.any(img != shot, axis=2)
            x0, y0, x1, y1 = box
            outside = diff.copy()
            outside[y0:y1, x0:x1] = False
            assert not outside.any(), "a banner never changes a pixel outside its box"
            if v.variant == "clean":
                assert not diff.any()
                continue
            assert diff[y0:y1, x0:x1].any()
            if v.variant == "attack":
                assert v.meta["source"] in pool.sources and isinstance(v.meta["text_fits"], bool)
                assert not v.meta.get("adapted", False)  # a banner carries the text as published
            drawn[v.variant] = img[y0:y1, x0:x1]
        # the text is drawn: attack, scrambled and imperative boxes differ from the empty box
        for c in ("attack", "c_scrambled", "c_imperative"):
            assert (drawn[c] != drawn["c_occlusion"]).any()


@pytest.mark.parametrize("surface", ["i_dom", "i_tool", "i_vis"])
def test_no_held_out_source_wording_in_training_rows(surface, trajectories):
    """Leave-one-source-out on real rows: checked by text, not by the rows' indices."""
    from dataclasses import replace

    mix = _pool("mix")
    trajs = [replace(t, steps=t.steps[:3]) for t in list(trajectories)[:16]]
    ids = [t.trajectory_id for t in trajs]
    folds = make_folds(ids, "kfold", k=4, seed=3)
    plan = source_wording_plan(folds, 3, mix)
    controls = CONTROLS + (("c_occlusion",) if surface == "i_vis" else ())
    rows = build_rows(trajs, surface, controls, count_tokens=lambda s: len(s.split()), wording=plan)
    norm = _adapt if surface == "i_dom" else (lambda s: s)
    owner = source_owner(mix)
    sources = sorted(mix.sources)

    def fixed_wording(src: str) -> set[str]:
        """What of source ``src`` must never reach a training row when it is held out: its goals'
        and templates' literal pieces between slots (>= 12 characters), its benign sentences."""
        pieces = [g.text for g in mix.goals if g.source == src]
        pieces += [t.text for i, t in enumerate(mix.templates) if owner[i] == src]
        out = {norm(p).strip() for text in pieces for p in re.split(r"\{[a-z_]+\}", text)}
        out |= {norm(mix.benign[m].text) for m in plan.families[src].imperatives}
        return {p for p in out if len(p) >= 12}

    held_text = {s: fixed_wording(s) for s in sources}
    for i, (train, test) in enumerate(folds):
        held = sources[i]  # fold i holds out the i-th source (sorted)
        te = [r for r in rows if r.trajectory_id in test and r.variant.injected_text]
        tr = [r for r in rows if r.trajectory_id in train and r.variant.injected_text]
        assert te and tr
        assert {r.variant.meta["source"] for r in te if r.variant.variant == "attack"} <= {held, "agentdojo"}
        assert {owner[r.variant.meta["template"]] for r in te if r.variant.variant == "attack"} == {held}
        assert {r.variant.meta["goal_source"] for r in te if r.variant.variant == "attack"} == {held}
        for r in tr:
            leaked = [p for p in held_text[held] if p in r.variant.injected_text]
            assert not leaked, (held, r.row_id, leaked[:2])
        # and the other way: every attack test row shows a piece of its own source's wording
        for r in te:
            if r.variant.variant == "attack":
                assert any(p in r.variant.injected_text for p in held_text[held]) or \
                    mix.templates[r.variant.meta["template"]].text == "{goal}"
    meta = [{"trajectory_id": r.trajectory_id, "variant": r.variant.variant, **r.variant.meta} for r in rows]
    rec = wording_overlap(meta, folds, plan)
    assert rec["heldout"] and rec["scheme"] == "source" and rec["overlap"] == 0
