"""Inputs of cache keys and memos are keyed by content; importer outputs are never shared between data roots.

Two browser-use data roots with the same trajectory ids (two agents' runs of the same tasks)
used to write their screenshots to the same files, and file digests were memoised by path, so a
sweep over both scored one agent's rows for the other under one cache key.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import REPO, SMALL_BACKBONE_OVERRIDES, compose_train


def _png(seed: int, size=(96, 64)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def browser_use_root(root: Path, agent: int, n: int = 6) -> Path:
    """``n`` browser-use histories (older schema: base64 screenshots), ids ``run0..``; the same ids,
    tasks and actions for every ``agent``, only the screenshots differ."""
    for i in range(n):
        steps = []
        for k, action in enumerate([{"click_element_by_index": {"index": 3}}, {"done": {"text": "ok"}}]):
            steps.append({
                "model_output": {"current_state": {"evaluation_previous_goal": "Start.", "memory": "",
                                                   "next_goal": f"Goal {k}."}, "action": [action]},
                "result": [{"is_done": k == 1, "extracted_content": f"did {k}"}],
                "state": {"url": "https://x.example/", "title": "X", "tabs": [], "interacted_element": [None],
                          "screenshot": base64.b64encode(_png(1000 * agent + 10 * i + k)).decode()},
                "metadata": {"step_number": k}})
        root.mkdir(parents=True, exist_ok=True)
        (root / f"run{i}.json").write_text(json.dumps({"task": f"Find item {i}.", "history": steps}))
    return root


def test_two_roots_with_equal_ids_get_their_own_screenshot_files(tmp_path):
    from ipi.data.browser_use import import_browser_use_report

    a, b = browser_use_root(tmp_path / "a", 1, 2), browser_use_root(tmp_path / "b", 2, 2)
    image_dir = tmp_path / "images"
    ta, _ = import_browser_use_report(a, image_dir=image_dir)
    tb, _ = import_browser_use_report(b, image_dir=image_dir)
    assert [t.trajectory_id for t in ta] == [t.trajectory_id for t in tb] == ["run0", "run1"]
    for x, y in zip(ta, tb, strict=True):
        for sx, sy in zip(x.steps, y.steps, strict=True):
            assert sx.screenshot != sy.screenshot
            assert Path(sx.screenshot).read_bytes() != Path(sy.screenshot).read_bytes()
    # importing a again after b still gives a's own bytes
    ta2, _ = import_browser_use_report(a, image_dir=image_dir)
    first = json.loads((a / "run0.json").read_text())["history"][0]["state"]["screenshot"]
    assert Path(ta2[0].steps[0].screenshot).read_bytes() == base64.b64decode(first)


def test_digest_memo_follows_the_content_not_the_path(tmp_path):
    from ipi.io import content_digest, stat_fingerprint

    p = tmp_path / "s.png"
    p.write_bytes(b"A" * 100)
    st = p.stat()
    d1 = content_digest(p)
    # an in-place rewrite with the same size and the old mtime put back: ctime still moves
    with open(p, "r+b") as f:
        f.write(b"B" * 100)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert content_digest(p) != d1
    # an atomic rewrite (temporary file, rename), same size, same mtime: a new inode
    tmp = tmp_path / ".s.tmp"
    tmp.write_bytes(b"C" * 100)
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    before = stat_fingerprint(p)
    os.replace(tmp, p)
    assert stat_fingerprint(p) != before
    import hashlib

    assert content_digest(p) == hashlib.sha256(b"C" * 100).hexdigest()


def test_row_fingerprint_and_tree_fingerprint_see_a_rewritten_screenshot(tmp_path):
    from ipi.data.images import write_image_bytes
    from ipi.data.schema import Step
    from ipi.extraction.rows import ReplayRow, row_fingerprint
    from ipi.io import tree_fingerprint
    from ipi.surfaces.variants import make_variants

    shot = tmp_path / "root" / "t" / "0.png"
    write_image_bytes(shot, _png(1, (96, 64)))
    step = Step(step=0, screenshot=str(shot), element_text="", element_text_omitted=True, tool_result="x",
                thought="", action="ANSWER; x", action_type="answer", history=())
    v = make_variants("t", step, "i_vis", [])[0]
    row = ReplayRow("t|0|i_vis|clean|-1", "t", "Find.", 1, step, v)
    fp1, tree1 = row_fingerprint(row, "sys", True), tree_fingerprint(tmp_path / "root")
    same_size = _png(2)
    assert len(same_size) == len(_png(1))  # equal size, other bytes: a size check alone would keep the old file
    write_image_bytes(shot, same_size)
    assert shot.read_bytes() == same_size
    assert row_fingerprint(row, "sys", True) != fp1 and tree_fingerprint(tmp_path / "root") != tree1
    write_image_bytes(shot, same_size)  # the same bytes again: the file is left alone
    assert tree_fingerprint(tmp_path / "root") == tree_fingerprint(tmp_path / "root")


def test_image_processor_backend_enters_the_key_only_when_not_the_default(tmp_path, monkeypatch):
    """PIL and torchvision give other pixel values: a PIL-backend entry has its own key; the
    torchvision backend (every existing entry's) keeps the key the spec gave before."""
    from ipi.extraction import forward as run
    from ipi.extraction.activation_cache import keyed_form, stable_hash
    from ipi.extraction.rows import row_fingerprint
    from ipi.run.stages import load_data, make_rows

    cfg = compose_train(tmp_path, ["data.max_trajectories=2"])
    trajs = load_data(cfg)[0]
    rows = make_rows(cfg, trajs, "i_vis")
    assert run.image_processor_backend(cfg.backbone) == "torchvision"  # this environment
    key_tv, spec_tv = run.cache_key(cfg.backbone, rows, [0, 1], ["task"])
    assert "image_processor_backend" not in spec_tv
    # the key as it was computed before the backend entered it
    b = run._plain(cfg.backbone)
    old_spec = {"extraction_version": run.EXTRACTION_VERSION,
                "backbone": {k: b[k] for k in ("name", "loader", "image_size", "tokenizer_path", "multimodal")},
                "system_prompt": b["system_prompt"], "layers": [0, 1], "token_groups": ["task"],
                "dtype": b["cache_dtype"]}
    fps = [row_fingerprint(r, b["system_prompt"], b["multimodal"]) for r in rows]
    assert key_tv == stable_hash({**keyed_form(old_spec), "rows": fps})
    monkeypatch.setattr(run, "image_processor_backend", lambda backbone: "pil")
    key_pil, spec_pil = run.cache_key(cfg.backbone, rows, [0, 1], ["task"])
    assert spec_pil["image_processor_backend"] == "pil" and key_pil != key_tv


def test_the_backend_is_resolved_as_the_processor_is_loaded():
    from transformers import AutoImageProcessor

    from ipi.extraction.forward import _backend_of
    from tests.conftest import PROCESSOR

    got = _backend_of(str(PROCESSOR), "c", ())
    assert got == AutoImageProcessor.from_pretrained(str(PROCESSOR)).backend
    assert AutoImageProcessor.from_pretrained(str(PROCESSOR), backend="pil").backend == "pil"


def _cli(root: Path, cache: Path, extra: list[str]) -> list[str]:
    return ["data=browser_use", f"data.root={root}", "split.test_fraction=0.5", "evaluation.n_boot=50",
            "evaluation.random_twin=false", "evaluation.transfer=false", "evaluation.permutation.m=19", "logger=none",
            "report.plots=false", "report.html=false", "quiet=true", f"extract.cache_dir={cache}",
            *SMALL_BACKBONE_OVERRIDES, *extra]


@pytest.mark.slow
def test_two_root_sweep_keys_and_scores_equal_standalone_runs(tmp_path):
    """``train.py -m data=browser_use data.root=A,B`` over two agents' runs with equal ids: the
    jobs get different cache keys, and each job's scores equal the standalone run on its root."""
    a, b = browser_use_root(tmp_path / "agent_a", 1), browser_use_root(tmp_path / "agent_b", 2)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    sweep = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "train.py", "-m", *_cli(Path(f"{a},{b}"), tmp_path / "cache", []),
                           f"hydra.sweep.dir={sweep}"], cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    keys = [json.loads((sweep / j / "run_info.json").read_text())["extraction"]["cache_key"] for j in ("0", "1")]
    assert keys[0] != keys[1]
    for j, root in (("0", a), ("1", b)):
        alone = tmp_path / f"alone_{j}"
        p = subprocess.run([sys.executable, "train.py", *_cli(root, tmp_path / f"cache_{j}", []),
                            f"hydra.run.dir={alone}"], cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        info = json.loads((alone / "run_info.json").read_text())["extraction"]
        assert info["cache_key"] == keys[int(j)] and info["cache_hit"] is False
        assert (alone / "scores.csv").read_bytes() == (sweep / j / "scores.csv").read_bytes()
    assert (sweep / "0" / "scores.csv").read_bytes() != (sweep / "1" / "scores.csv").read_bytes()
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)
