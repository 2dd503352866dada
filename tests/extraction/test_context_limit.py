"""Prompts longer than the backbone's context: every row's tokens (image tokens included) are compared
with ``max_position_embeddings`` of the backbone's model config before any forward pass, and a step
that does not fit is a counted skip (``extract.over_context=skip``) or a one-line error (``error``).

RoPE models raise nothing past their context: they return states at positions never trained. The
backbones here are the tiny ones built from config with a small ``max_position_embeddings``.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import PROCESSOR, compose_train
from tests.e2e.test_bad_inputs import png_bytes

pytestmark = pytest.mark.needs_shared

N_TRAJ = 8
CONTEXT = 1024  # positions of the tiny text backbone in these tests
LONG = "".join(f'[{i}]: <a> "Product {i} in stock, ships today";\t' for i in range(400))  # ~19k characters


def _root(tmp_path, long_at: int | None):
    """One-step trajectories in the native schema; trajectory ``long_at`` has a ~19k-character element list."""
    root = tmp_path / "data"
    root.mkdir(parents=True)
    with (root / "trajectories.jsonl").open("w", encoding="utf-8") as f:
        for i in range(N_TRAJ):
            shot = root / f"shot{i}.png"
            shot.write_bytes(png_bytes(i + 1))
            f.write(json.dumps({
                "trajectory_id": f"t{i}", "task": f"Find thing {i}.", "source": "native", "horizon": 1,
                "steps": [{"step": 0, "screenshot": str(shot),
                           "element_text": LONG if i == long_at else '[0]: "Home";\t[1]: <input> "q";',
                           "element_text_omitted": False, "tool_result": "No previous action.",
                           "thought": f"Look for thing {i}.", "action": "ANSWER; done", "action_type": "answer",
                           "history": []}]}) + "\n")
    return root / "trajectories.jsonl"


def _cfg(tmp_path, root, *more):
    return compose_train(tmp_path, [
        "backbone=tiny_qwen2_text", "data=native", "surface=i_dom", "token_group=observation", "layers=last",
        f"data.root={root}", "split.test_fraction=0.5", "evaluation.n_boot=20", "evaluation.permutation.m=0",
        "evaluation.transfer=false", "logger=none", "report.plots=false", "report.html=false", "report.gallery=false",
        "backbone.loader.text.num_hidden_layers=2", "backbone.n_layers=2",
        f"backbone.loader.text.max_position_embeddings={CONTEXT}", *more], small=False)


def _full_lengths(cfg, trajs) -> dict[str, int]:
    """Each row's forwarded length from the replay's own tokenisation (:func:`ipi.replay.tokenise`)."""
    from ipi.backbone import load_processor
    from ipi.backbone_text import TextChatProcessor
    from ipi.extraction.rows import build_rows
    from ipi.replay import tokenise
    from ipi.run.validation import resolved_controls
    from ipi.run.stages import split_folds, token_counter

    proc = TextChatProcessor(load_processor(str(PROCESSOR)).tokenizer)
    _, plan = split_folds(cfg, trajs)  # the run's wording plan: the same attack texts
    rows = build_rows(trajs, "i_dom", resolved_controls(cfg), count_tokens=token_counter(cfg), wording=plan)
    return {r.row_id: tokenise(proc, r.parts(str(cfg.backbone.system_prompt), False)).seq_len for r in rows}


@pytest.mark.slow
def test_a_step_over_the_context_is_a_counted_skip_in_results_and_report(tmp_path):
    from ipi.run import stages, tasks

    root = _root(tmp_path, long_at=3)
    cfg = _cfg(tmp_path, root)
    trajs, _, _ = stages.load_data(cfg)
    lengths = _full_lengths(cfg, trajs)
    over = {rid.split("|")[0] for rid, n in lengths.items() if n > CONTEXT}
    assert over == {"t3"} and max(n for rid, n in lengths.items() if not rid.startswith("t3|")) <= CONTEXT

    results, _ = tasks.train(cfg)
    c = results["counts"]
    assert c["context"] == {"positions": CONTEXT, "longest_row_tokens": max(lengths.values()),
                            "rows_over_context": sum(n > CONTEXT for n in lengths.values()),
                            "steps_over_context": 1, "action": "skip", "steps_truncated": []}
    (skip,) = [s for s in c["skipped_steps"] if s["trajectory_id"] == "t3"]
    assert skip["step"] == 0 and "over the backbone's context" in skip["reason"] and f"{CONTEXT} positions" in skip["reason"]
    assert c["rows"] == len(lengths) - sum(rid.startswith("t3|") for rid in lengths)  # the whole step left out
    report = (tmp_path / "run" / "report.md").read_text()
    assert "context" in report and "over the backbone's context" in report


def test_over_context_error_is_one_line_at_row_building(tmp_path):
    from ipi.run import stages

    root = _root(tmp_path, long_at=5)
    cfg = _cfg(tmp_path, root, "extract.over_context=error")
    trajs, _, _ = stages.load_data(cfg)
    with pytest.raises(ValueError) as e:
        stages.make_rows(cfg, trajs, "i_dom")
    msg = str(e.value)
    assert "\n" not in msg and "trajectory t5 step 0" in msg and f"context {CONTEXT} positions" in msg
    assert "backbone=tiny_qwen2_text" in msg and "extract.over_context=skip" in msg
    # the same data within the context: nothing left out
    ok = _cfg(tmp_path / "ok", _root(tmp_path / "ok", long_at=None), "extract.over_context=error")
    record: dict = {}
    rows = stages.make_rows(ok, stages.load_data(ok)[0], "i_dom", context=record)
    assert len(rows) == N_TRAJ * (2 + len(stages.resolved_controls(ok)))
    assert record["steps_over_context"] == 0 and record["skipped_steps"] == []


def test_image_tokens_count_toward_the_prompt(tmp_path):
    """Qwen2.5-VL: the screenshot's image tokens are in each row's count (equal to the replay's own
    sequence length with the image processed), so a context that holds the text alone is too short."""
    from ipi.backbone import load_processor
    from ipi.data.images import load_rgb
    from ipi.extraction.rows import sequence_lengths
    from ipi.replay import tokenise
    from ipi.run import stages

    cfg = compose_train(tmp_path, ["data.max_trajectories=1", "surface=i_vis"])
    trajs, _, _ = stages.load_data(cfg)
    rows = stages.make_rows(cfg, trajs[:1], "i_vis")[:5]
    proc = load_processor(str(PROCESSOR))
    size = dict(cfg.backbone.image_size)
    lengths = sequence_lengths(rows, proc, str(cfg.backbone.system_prompt), True, size)
    for r, (n, n_image) in zip(rows, lengths):
        image = r.variant.image(r.step, load_rgb(r.step.screenshot, r.step.step))
        t = tokenise(proc, r.parts(str(cfg.backbone.system_prompt), True), image, image_size=size,
                     image_token_id=proc.tokenizer.convert_tokens_to_ids("<|image_pad|>"))
        assert n == t.seq_len and n_image == t.groups["image"].numel() > 0
    # a context longer than every row's text but shorter than text + image: every step left out
    text_only = max(n - n_image for n, n_image in lengths)
    short = compose_train(tmp_path / "short", ["data.max_trajectories=1", "surface=i_vis",
                                               f"backbone.loader.text.max_position_embeddings={text_only + 1}"])
    record: dict = {}
    kept = stages.make_rows(short, trajs[:1], "i_vis", context=record)
    assert kept == [] and record["steps_over_context"] == len(trajs[0].steps)
    assert all("image tokens" in s["reason"] for s in record["skipped_steps"])


def test_every_shipped_backbone_names_its_config_reader():
    """The context is read before any model is built: every loader of conf/backbone has a reader."""
    from hydra.utils import get_method
    from omegaconf import OmegaConf

    from tests.conftest import REPO

    for path in sorted((REPO / "conf" / "backbone").glob("*.yaml")):
        loader = OmegaConf.load(path).loader
        assert callable(getattr(get_method(loader._target_), "model_config", None)), path.name


def test_pretrained_qwen2_5_vl_context_is_its_text_config_read_without_weights(tmp_path):
    """A checkpoint folder holding only config.json: the context is its text config's
    max_position_embeddings (what a Qwen2.5-VL checkpoint declares), read offline."""
    from transformers import Qwen2_5_VLConfig

    from ipi.backbone import context_positions, model_config

    Qwen2_5_VLConfig(text_config={"max_position_embeddings": 4321, "num_hidden_layers": 2},
                     vision_config={"depth": 1}).save_pretrained(tmp_path)
    loader = {"_target_": "ipi.backbone.build_pretrained_qwen2_5_vl", "_convert_": "all", "name": "x",
              "model_id": str(tmp_path), "revision": None, "dtype": "bfloat16", "device_map": None,
              "trust_remote_code": False, "quantization": "none", "attn_implementation": "auto"}
    assert context_positions(model_config(loader)) == 4321
    assert not any(p.suffix in (".safetensors", ".bin") for p in tmp_path.iterdir())  # nothing but the config


def test_truncate_cuts_the_page_text_until_every_variant_fits(tmp_path):
    from ipi.backbone import load_processor
    from ipi.backbone_text import TextChatProcessor
    from ipi.replay import tokenise
    from ipi.run import stages

    cfg = _cfg(tmp_path, _root(tmp_path, long_at=3), "extract.over_context=truncate")
    trajs = stages.load_data(cfg)[0]
    record: dict = {}
    rows = stages.make_rows(cfg, trajs, "i_dom", context=record)
    per_step = 2 + len(stages.resolved_controls(cfg))
    assert len(rows) == N_TRAJ * per_step and record["skipped_steps"] == []  # nothing left out
    (cut,) = record["steps_truncated"]
    assert cut["trajectory_id"] == "t3" and cut["element_chars"][0] == len(LONG) and 0 < cut["element_chars"][1] < len(LONG)
    proc = TextChatProcessor(load_processor(str(PROCESSOR)).tokenizer)
    t3 = [r for r in rows if r.trajectory_id == "t3"]
    assert len(t3) == per_step and {r.step.element_text for r in t3} == {LONG[:cut["element_chars"][1]]}
    lengths = [tokenise(proc, r.parts(str(cfg.backbone.system_prompt), False)).seq_len for r in rows]
    assert max(lengths) <= CONTEXT
    # the rows keep their order: each step's variants together, trajectories in order
    assert [r.trajectory_id for r in rows] == [f"t{i}" for i in range(N_TRAJ) for _ in range(per_step)]


def test_image_tokens_of_an_exif_tagged_screenshot_are_the_replays_read_from_the_header(tmp_path, monkeypatch):
    """The count is the processor's on the pixels the replay feeds (as stored: no EXIF rotation),
    and it reads the header only: asking a PNG for its EXIF decoded every pixel (the PNG's eXIf
    chunk may follow the image data), three quarters of the context check's time on a warm run."""
    from PIL import Image, ImageFile

    from ipi.backbone import load_processor
    from ipi.data.images import load_rgb
    from ipi.extraction.rows import image_tokens

    proc = load_processor(str(PROCESSOR))
    size = {"shortest_edge": 3136, "longest_edge": 802816}
    path = tmp_path / "tall.png"
    exif = Image.Exif()
    exif[0x0112] = 6  # shown rotated by 90 degrees
    Image.new("RGB", (290, 1410), (200, 30, 30)).save(path, exif=exif)
    rgb = load_rgb(str(path), 0)
    assert rgb.size == (290, 1410)  # stored, not rotated
    grid = proc.image_processor(images=[rgb], size=size, return_tensors="pt")["image_grid_thw"][0]
    expected = int(grid.prod()) // proc.image_processor.merge_size ** 2

    def no_decode(self):
        raise AssertionError("image_tokens decoded the pixels")

    plain = tmp_path / "plain.png"  # no EXIF in the header: Pillow looked for an eXIf chunk after the pixels
    Image.new("RGB", (290, 1410), (20, 30, 200)).save(plain)
    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decode)
    assert image_tokens(proc, str(path), size) == expected == image_tokens(proc, str(plain), size)
