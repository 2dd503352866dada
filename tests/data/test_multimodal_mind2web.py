"""Online-Mind2Web and Multimodal-Mind2Web importers on fixtures built in their exact layouts."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from ipi.data import DataError, import_multimodal_mind2web_report, read_native, write_native
from ipi.data.multimodal_mind2web import html_to_element_text
from ipi.data.online_mind2web import mind2web_action_type


def _png_bytes(colour=(200, 30, 30), size=(64, 48), fmt="PNG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format=fmt)
    return buf.getvalue()


# Online-Mind2Web: tests/data/test_online_mind2web.py


def test_mind2web_action_type():
    assert mind2web_action_type("[combobox]  Enter pick up city -> TYPE: Brooklyn") == "type"
    assert mind2web_action_type("[heading]  CAR -> CLICK") == "click"
    assert mind2web_action_type("[svg]   -> HOVER") == "hover"
    assert mind2web_action_type("scroll down") == "scroll"
    assert mind2web_action_type("Thinking about it") == "unknown"
    # Online-Mind2Web v2 verbs and compact call forms.
    assert mind2web_action_type("-> NAVIGATE: https://www.united.com") == "navigate"
    assert mind2web_action_type("<body> -> PRESS_KEY: Enter") == "press"
    assert mind2web_action_type("-> GO_BACK") == "goback"
    assert mind2web_action_type("-> GO_FORWARD") == "goforward"
    assert mind2web_action_type("-> REFRESH") == "refresh"
    assert mind2web_action_type("click_at(412, 88)") == "click"
    assert mind2web_action_type('type_at(120, 40, "boots")') == "type"
    assert mind2web_action_type('press_key("Enter")') == "press"
    assert mind2web_action_type('navigate("https://example.com/a->b")') == "navigate"
    assert mind2web_action_type("TASK_COMPLETE -> ANSWER: 42 -> 43") == "answer"


# ---------------------------------------------------------------------------------------------
# Multimodal-Mind2Web: Parquet rows as on the Hugging Face hub (data/<split>-*.parquet)
# ---------------------------------------------------------------------------------------------

HTML = ('<html backend_node_id="1"><body backend_node_id="2"><div backend_node_id="3">'
        '<h1 backend_node_id="4">Rent a  car</h1><input backend_node_id="5" type="text" '
        'aria_label="Pick-up location"/><button backend_node_id="6">Search</button>'
        '<select backend_node_id="7" name="age"><option backend_node_id="8">25+</option></select>'
        '</div></body></html>')


def _m2w_rows():
    reprs_a = ["[heading]  CAR -> CLICK", "[combobox]  Pick-up location -> TYPE: Brooklyn",
               "[button]  Search -> CLICK"]
    reprs_b = ["[link]  Deals -> CLICK", "[span]  Mon -> CLICK"]
    rows = []

    def row(aid, task, reprs, k, op, image):
        rows.append({
            "action_uid": f"{aid}-uid{k}", "raw_html": "<html>raw</html>", "cleaned_html": HTML,
            "operation": json.dumps({"original_op": op, "value": "", "op": op}),
            "pos_candidates": [], "neg_candidates": [], "website": "united", "domain": "Travel",
            "subdomain": "Airlines", "annotation_id": aid, "confirmed_task": task,
            "screenshot": image, "action_reprs": reprs, "target_action_index": str(k),
            "target_action_reprs": reprs[k],
        })

    # task "aaa": steps 2 then 0 (shuffled order), step 1 absent from the split
    row("aaa", "rent a car in Brooklyn", reprs_a, 2, "CLICK", {"bytes": _png_bytes((0, 0, 200)), "path": None})
    row("aaa", "rent a car in Brooklyn", reprs_a, 0, "CLICK", {"bytes": _png_bytes(fmt="JPEG"), "path": None})
    row("bbb", "find deals", reprs_b, 0, "CLICK", {"bytes": _png_bytes((0, 90, 0)), "path": None})
    row("bbb", "find deals", reprs_b, 1, "CLICK", {"bytes": b"\x89PNG broken", "path": None})
    row("ccc", "third task", ["[a]  x -> CLICK"], 0, "CLICK", {"bytes": _png_bytes(), "path": None})
    return rows


def _write_parquet(path, rows):
    from datasets import Dataset, Features, Sequence, Value
    from datasets import Image as HFImage

    feats = Features({
        "action_uid": Value("string"), "raw_html": Value("string"), "cleaned_html": Value("string"),
        "operation": Value("string"), "pos_candidates": Sequence(Value("string")),
        "neg_candidates": Sequence(Value("string")), "website": Value("string"),
        "domain": Value("string"), "subdomain": Value("string"), "annotation_id": Value("string"),
        "confirmed_task": Value("string"), "screenshot": HFImage(),
        "action_reprs": Sequence(Value("string")), "target_action_index": Value("string"),
        "target_action_reprs": Value("string"),
    })
    cols = {k: [r[k] for r in rows] for k in feats}
    path.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_dict(cols, features=feats).to_parquet(str(path))


@pytest.fixture()
def m2w_root(tmp_path):
    pytest.importorskip("datasets")
    rows = _m2w_rows()
    root = tmp_path / "Multimodal-Mind2Web"
    _write_parquet(root / "data" / "test_task-00000-of-00002.parquet", rows[:3])
    _write_parquet(root / "data" / "test_task-00001-of-00002.parquet", rows[3:])
    _write_parquet(root / "data" / "train-00000-of-00001.parquet", [dict(rows[0], annotation_id="zzz")])
    return root


def test_multimodal_mind2web_parquet(m2w_root, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    img = tmp_path / "images"
    trajs, skipped = import_multimodal_mind2web_report(m2w_root, split="test_task",
                                       image_dir=img, max_element_chars=None)
    assert skipped == []
    assert [t.trajectory_id for t in trajs] == ["aaa", "bbb", "ccc"]  # train's "zzz" not read
    a, b, _ = trajs
    assert a.task == "rent a car in Brooklyn" and a.horizon == 3 and a.source == "multimodal_mind2web"
    assert [s.step for s in a.steps] == [0, 2]
    assert [(k.step, k.reason) for k in a.skipped] == [(1, "no row for this action in the loaded split")]
    s0, s2 = a.steps
    assert s0.action == "[heading]  CAR -> CLICK" and s0.action_type == "click" and s0.thought == ""
    assert s2.history == ("[heading]  CAR -> CLICK", "[combobox]  Pick-up location -> TYPE: Brooklyn")
    assert s2.tool_result == "Action executed: [combobox]  Pick-up location -> TYPE: Brooklyn"
    assert s0.tool_result == "No previous action."
    # Screenshots are the dataset's bytes, unchanged (JPEG stays JPEG).
    # ... written to the data root's own folder under image_dir (never shared with another root)
    from ipi.data.images import root_image_dir

    assert s0.screenshot == str(root_image_dir(img, m2w_root) / "aaa" / "aaa-uid0.jpg")
    assert Path(s0.screenshot).read_bytes() == _png_bytes(fmt="JPEG")
    assert Path(s2.screenshot).read_bytes() == _png_bytes((0, 0, 200))
    assert s0.element_text == html_to_element_text(HTML)
    assert [(k.step, k.reason) for k in b.skipped] == [(1, "unreadable screenshot: UnidentifiedImageError")]
    # limit: only the first N annotation ids (sorted) are materialised.
    trajs2, _ = import_multimodal_mind2web_report(m2w_root, split="test_task",
                                  image_dir=tmp_path / "img2", limit=2)
    assert [t.trajectory_id for t in trajs2] == ["aaa", "bbb"]
    assert [p.name for p in (root_image_dir(tmp_path / "img2", m2w_root)).iterdir()] != []
    assert not (root_image_dir(tmp_path / "img2", m2w_root) / "ccc").exists()
    # No split: every Parquet file.
    trajs3, _ = import_multimodal_mind2web_report(m2w_root, image_dir=img)
    assert [t.trajectory_id for t in trajs3] == ["aaa", "bbb", "ccc", "zzz"]
    write_native(trajs, tmp_path / "n.jsonl")
    assert read_native(tmp_path / "n.jsonl") == trajs


def test_multimodal_mind2web_save_to_disk_and_errors(m2w_root, tmp_path):
    from datasets import load_dataset

    ds = load_dataset("parquet", data_files=str(m2w_root / "data" / "test_task-*.parquet"), split="train")
    ds.save_to_disk(str(tmp_path / "saved"))
    trajs, _ = import_multimodal_mind2web_report(tmp_path / "saved", image_dir=tmp_path / "i")
    assert [t.trajectory_id for t in trajs] == ["aaa", "bbb", "ccc"]
    with pytest.raises(FileNotFoundError, match="no Parquet files for split 'test_website'"):
        import_multimodal_mind2web_report(m2w_root, split="test_website", image_dir=tmp_path / "i")
    bad = tmp_path / "bad" / "x.parquet"
    bad.parent.mkdir()
    import pandas as pd

    pd.DataFrame({"annotation_id": ["a"]}).to_parquet(bad)
    with pytest.raises(DataError, match=r"x.parquet: missing column\(s\) confirmed_task"):
        import_multimodal_mind2web_report(bad, image_dir=tmp_path / "i")
    with pytest.raises(DataError, match="bbb: two rows for step 0"):
        rows = _m2w_rows()
        _write_parquet(tmp_path / "dup" / "test_task-0.parquet", rows + [rows[2]])
        import_multimodal_mind2web_report(tmp_path / "dup", image_dir=tmp_path / "i")


def test_html_to_element_text():
    assert html_to_element_text(HTML) == (
        '[0]: <h1> "Rent a car";\t[1]: <input> "Pick-up location";\t[2]: <button> "Search";\t'
        '[3]: <select> "age";\t[4]: <option> "25+"'  # a text-less form element: its name
    )
    assert html_to_element_text(HTML, max_chars=10) == '[0]: <h1> '
    assert html_to_element_text("") == ""
