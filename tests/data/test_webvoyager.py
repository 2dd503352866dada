"""Tests of the WebVoyager importer (ipi/data/webvoyager.py) and the importer registry.

Real data: ``../shared/data/webvoyager`` next to the repo, or ``$IPI_SHARED/data/webvoyager``.
Bad inputs are built in ``tmp_path``; nothing from ``shared/`` is written into the repo.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import REPO
from ipi.data import (
    DataError,
    Skip,
    import_webvoyager,
    import_webvoyager_report,
    load_native,
    read_native,
    write_native,
)


def _shared() -> Path:
    env = os.environ.get("IPI_SHARED")
    return Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared"


WV = _shared() / "data" / "webvoyager"
needs_data = pytest.mark.skipif(not WV.is_dir(), reason=f"shared WebVoyager data not at {WV}")

FAIL_MSG = (
    "The action you have chosen cannot be exected. Please double-check if you have selected the "
    "wrong Numerical Label or Action or Action format. Then provide the revised Thought and Action."
)
FORMAT_MSG = "Format ERROR: Both 'Thought' and 'Action' should be included in your reply."
PREAMBLE = (
    "please analyze the attached screenshot and give the Thought and Action. I've provided the "
    "tag name of each element and the text it contains (if text exists). Note that <textarea> or "
    "<input> may be textbox, but not exactly. Please focus more on the screenshot and then refer "
    "to the textual information.\n"
)
OMITTED = "Observation: A screenshot and some texts. (Omitted in context.)"


# ---------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def real():
    trajs, skipped = import_webvoyager_report(WV)
    return {t.trajectory_id: t for t in trajs}, trajs, skipped


def _independent_counts(root: Path) -> tuple[int, int, int, int]:
    """(trajectories, usable steps, missing screenshots, assistant turns), counted directly."""
    n_traj = n_steps = n_missing = n_turns = 0
    for log in root.rglob("interact_messages.json"):
        msgs = json.loads(log.read_text(encoding="utf-8"))
        k = sum(m["role"] == "assistant" for m in msgs)
        n_traj += 1
        n_turns += k
        for i in range(1, k + 1):
            if (log.parent / f"screenshot{i}.png").exists():
                n_steps += 1
            else:
                n_missing += 1
    return n_traj, n_steps, n_missing, n_turns


@needs_data
def test_counts_match_independent_count(real):
    by_id, trajs, skipped = real
    assert skipped == []
    n_traj, n_steps, n_missing, n_turns = _independent_counts(WV)
    assert (n_traj, n_steps, n_missing, n_turns) == (42, 355, 13, 368)  # measured once by hand
    assert len(trajs) == n_traj
    assert sum(len(t.steps) for t in trajs) == n_steps
    reasons = Counter(s.reason for t in trajs for s in t.skipped)
    assert reasons == Counter({"missing screenshot": n_missing})
    assert sum(t.horizon for t in trajs) == n_turns
    for t in trajs:
        assert t.source == "webvoyager"
        assert sorted([s.step for s in t.steps] + [k.step for k in t.skipped]) == list(
            range(t.horizon)
        )
        for s in t.steps:
            assert Path(s.screenshot).is_absolute() and Path(s.screenshot).is_file()
            assert Path(s.screenshot).name == f"screenshot{s.step + 1}.png"
            assert len(s.history) == s.step
            if s.element_text_omitted:
                assert s.element_text == ""


@needs_data
def test_ids_sorted_unique_and_relative(real):
    by_id, trajs, _ = real
    ids = [t.trajectory_id for t in trajs]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(i.startswith(("examples/task", "nocnoc/task")) for i in ids)
    assert "examples/taskGoogle Flights--8" in by_id


@needs_data
def test_subfolders_import_alone():
    ex, sk = import_webvoyager_report(WV / "examples")
    assert (len(ex), sum(len(t.steps) for t in ex), sum(len(t.skipped) for t in ex)) == (15, 90, 0)
    assert sk == []
    assert ex[0].trajectory_id == "taskAllrecipes--4"
    nn = import_webvoyager(WV / "nocnoc")
    assert len(nn) == 27
    one = import_webvoyager(WV / "examples" / "taskAmazon--0")
    assert [t.trajectory_id for t in one] == ["taskAmazon--0"]


@needs_data
def test_amazon_step0_exact(real):
    t = real[0]["examples/taskAmazon--0"]
    assert t.task == "Search an Xbox Wireless controller with green color and rated above 4 stars."
    assert t.horizon == 3 and len(t.steps) == 3 and t.skipped == ()
    s = t.steps[0]
    assert s.step == 0
    assert s.screenshot == str(WV / "examples" / "taskAmazon--0" / "screenshot1.png")
    assert s.action == "Type [2]; green Xbox Wireless controller 4 stars"
    assert s.action_type == "type"
    assert s.thought.startswith("The task is to search for a green Xbox Wireless controller")
    assert s.thought.endswith("depicted by the numerical label [2].")
    assert s.element_text.startswith('[0]: ".us", "Amazon";\t[1]: "Delivering to Santaclara')
    assert s.element_text.endswith('[22]: "Shop nowShop now";\t[23]: "Shop nowShop now";')
    assert not s.element_text_omitted
    assert s.tool_result == "No previous action."
    assert s.history == ()
    s1, s2 = t.steps[1], t.steps[2]
    assert s1.action == "Click [33]" and s1.action_type == "click"
    assert s1.tool_result == "Action executed: Type [2]; green Xbox Wireless controller 4 stars"
    assert s2.action.startswith("ANSWER; The green Xbox Wireless controller")
    assert s2.action_type == "answer"
    assert s2.history == ("Type [2]; green Xbox Wireless controller 4 stars", "Click [33]")


@needs_data
def test_omitted_and_kept_element_text(real):
    t = real[0]["examples/taskAllrecipes--4"]  # 6 turns: the first three observations omitted
    assert t.horizon == 6
    assert [s.element_text_omitted for s in t.steps] == [True] * 3 + [False] * 3
    for s in t.steps[:3]:
        assert s.element_text == ""
    for s in t.steps[3:]:
        assert s.element_text.startswith("[")
    assert t.task.startswith("Find a recipe for Baked Salmon") and t.task.endswith("reviews.")


@needs_data
def test_warning_in_observation_goes_to_tool_result(real):
    s = real[0]["examples/taskCoursera--16"].steps[4]
    assert s.tool_result == (
        "note: The web element you're trying to type may not be a textbox, "
        "and its tag name is <button>, type is button."
    )
    assert not s.element_text_omitted
    assert s.element_text.startswith('[0]: <button> "List", "Open Navigation Menu";')


@needs_data
def test_nocnoc_feedback_and_missing_screenshots(real):
    t = real[0]["nocnoc/taskNocNoc--0"]
    assert t.horizon == 15
    assert [k.step for k in t.skipped] == [8, 9, 10, 11, 12]
    assert all(k.reason == "missing screenshot" for k in t.skipped)
    assert t.skipped[0].path.endswith("taskNocNoc--0/screenshot9.png")
    by_step = {s.step: s for s in t.steps}
    # warning appended to the omitted first observation, and to a later one
    assert by_step[0].tool_result.startswith("Please change the approach which completely")
    assert by_step[5].tool_result.startswith("Please change the approach which completely")
    # reflection prompt (a user turn without observation) before the observation of step 3
    assert by_step[3].tool_result.startswith("You have just completed a web search step")
    assert "4. Recommendation:" in by_step[3].tool_result
    # an assistant turn without "Action:" (a refusal): empty action, unknown type
    assert by_step[7].action == "" and by_step[7].action_type == "unknown"
    assert by_step[7].thought.startswith("I'm unable to assist")
    # step 13 comes after a failed action (step 12, no screenshot) and a reflection prompt
    assert by_step[13].tool_result.startswith("You have just completed")
    assert len(by_step[13].history) == 13
    assert by_step[14].tool_result == f"Action executed: {by_step[13].action}"


def _copy_log_with_all_screenshots(src: Path, dst: Path) -> int:
    dst.mkdir(parents=True)
    shutil.copy(src / "interact_messages.json", dst / "interact_messages.json")
    msgs = json.loads((src / "interact_messages.json").read_text(encoding="utf-8"))
    k = sum(m["role"] == "assistant" for m in msgs)
    for i in range(1, k + 1):
        _png(dst / f"screenshot{i}.png")
    return k


@needs_data
def test_failure_feedback_tool_result(tmp_path):
    # In the real logs a failed action leaves no screenshot; give every turn one to see the
    # tool_result the next turn would get.
    k = _copy_log_with_all_screenshots(WV / "nocnoc" / "taskNocNoc--5", tmp_path / "t5")
    _copy_log_with_all_screenshots(WV / "nocnoc" / "taskNocNoc--3", tmp_path / "t3")
    trajs = {t.trajectory_id: t for t in import_webvoyager(tmp_path)}
    t5 = trajs["t5"]
    assert t5.horizon == k == len(t5.steps) and t5.skipped == ()
    for step in (5, 6):  # "FAIL A6 FAIL A7" in the log
        assert t5.steps[step].tool_result == FAIL_MSG
        assert t5.steps[step].element_text_omitted and t5.steps[step].element_text == ""
    t3 = trajs["t3"]
    assert t3.steps[6].tool_result == FORMAT_MSG
    # the turn that caused the format error has an "Action:" but no "Thought:"
    assert t3.steps[5].action == "GoBack" and t3.steps[5].thought.startswith("1. **Evaluation:**")


@needs_data
def test_round_trip_native(real, tmp_path):
    _, trajs, _ = real
    path = write_native(trajs, tmp_path / "wv.jsonl")
    assert read_native(path) == trajs
    back, skipped = load_native(path)
    assert back == trajs and skipped == []


@needs_data
def test_registry_webvoyager(real):
    _, trajs, _ = real
    got, skipped = import_webvoyager_report(WV / "examples", max_element_chars=10)
    assert len(got) == 15 and skipped == []
    assert max(len(s.element_text) for t in got for s in t.steps) == 10


@needs_data
def test_max_element_chars(real):
    full = real[0]["examples/taskAmazon--0"]
    cut = import_webvoyager(WV / "examples" / "taskAmazon--0", max_element_chars=20)[0]
    for a, b in zip(full.steps, cut.steps):
        assert b.element_text == a.element_text[:20]
    zero = import_webvoyager(WV / "examples" / "taskAmazon--0", max_element_chars=0)[0]
    assert all(s.element_text == "" and not s.element_text_omitted for s in zero.steps)


# ---------------------------------------------------------------- synthetic inputs


def _png(path: Path, size: tuple[int, int] = (48, 48)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, format="PNG")
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def _noisy_png_bytes() -> bytes:
    rng = random.Random(0)
    im = Image.frombytes("RGB", (64, 64), bytes(rng.randrange(256) for _ in range(64 * 64 * 3)))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def _messages(actions: list[str], task: str = "Find a cat.") -> list[dict]:
    msgs = [
        {"role": "system", "content": "Imagine you are a robot browsing the web."},
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": f"Now given a task: {task}  Please interact with https://x.org/ and "
                    f"get the answer. \nObservation: {PREAMBLE}[0]: \"Home\";\t[1]: <input> \"q\";",
                },
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,{b64_img}"}},
            ],
        },
    ]
    for i, a in enumerate(actions):
        if i:
            msgs.append({"role": "user", "content": OMITTED})
        msgs.append({"role": "assistant", "content": f"Thought: step {i}.\n\nAction: {a}"})
    return msgs


def _task(folder: Path, messages, shots: int | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    raw = messages if isinstance(messages, bytes) else json.dumps(messages).encode("utf-8")
    (folder / "interact_messages.json").write_bytes(raw)
    n = shots if shots is not None else sum(m["role"] == "assistant" for m in messages)
    for i in range(1, n + 1):
        _png(folder / f"screenshot{i}.png")
    return folder


def test_one_step_trajectory(tmp_path):
    _task(tmp_path / "solo", _messages(["ANSWER; a cat"]))
    (t,) = import_webvoyager(tmp_path)
    assert t.trajectory_id == "solo" and t.task == "Find a cat." and t.horizon == 1
    (s,) = t.steps
    assert (s.step, s.action, s.action_type, s.thought) == (0, "ANSWER; a cat", "answer", "step 0.")
    assert s.element_text == '[0]: "Home";\t[1]: <input> "q";' and not s.element_text_omitted
    assert s.tool_result == "No previous action." and s.history == ()
    # root itself a task folder: id is its name
    assert import_webvoyager(tmp_path / "solo")[0].trajectory_id == "solo"


@pytest.mark.parametrize(
    ("action", "kind"),
    [
        ("ANSWER; 42", "answer"),
        ("Type [2]; x", "type"),
        ("click [3]", "click"),
        ("Scroll [WINDOW]; down", "scroll"),
        ("Wait", "wait"),
        ("GoBack", "goback"),
        ("Google", "google"),
        ("Refresh the page.", "unknown"),
    ],
)
def test_action_types(tmp_path, action, kind):
    _task(tmp_path / "t", _messages([action]))
    (s,) = import_webvoyager(tmp_path)[0].steps
    assert (s.action, s.action_type) == (action, kind)


def test_action_split_on_last_and_missing(tmp_path):
    msgs = _messages(["x", "y"])
    msgs[2]["content"] = "Thought: use Action: carefully\nAction: no\n\nAction: Click [1]"
    msgs[4]["content"] = "Thought: I refuse."
    _task(tmp_path / "t", msgs)
    s0, s1 = import_webvoyager(tmp_path)[0].steps
    assert s0.action == "Click [1]" and s0.thought == "use Action: carefully\nAction: no"
    assert s1.action == "" and s1.action_type == "unknown" and s1.thought == "I refuse."
    assert s1.tool_result == "Action executed: Click [1]" and s1.history == ("Click [1]",)
    assert s1.element_text_omitted and s1.element_text == ""


def test_missing_screenshot_is_counted_skip(tmp_path):
    # After a failed action WebVoyager takes no screenshot: the turn's observation is replaced by
    # feedback. Such a missing file is expected and a counted skip in both modes.
    msgs = _messages(["Click [1]", "Click [2]", "ANSWER; ok"])
    msgs[3]["content"] = FAIL_MSG
    _task(tmp_path / "t", msgs, shots=3)
    (tmp_path / "t" / "screenshot2.png").unlink()
    _png(tmp_path / "t" / "screenshot2_no_box.png")  # ignored
    for mode in ("skip", "error"):
        (t,) = import_webvoyager(tmp_path, on_bad_step=mode)
        assert t.horizon == 3 and [s.step for s in t.steps] == [0, 2]
        shot2 = str(tmp_path / "t" / "screenshot2.png")
        assert t.skipped == (Skip(1, "missing screenshot", shot2),)
        assert t.steps[1].history == ("Click [1]", "Click [2]")
        assert t.steps[1].tool_result == "Action executed: Click [2]"


def test_unexplained_missing_screenshot_is_a_bad_step(tmp_path):
    # The log shows an observation for step 1, so its screenshot should exist.
    _task(tmp_path / "t", _messages(["Click [1]", "Click [2]", "ANSWER; ok"]), shots=3)
    (tmp_path / "t" / "screenshot2.png").unlink()
    shot2 = str(tmp_path / "t" / "screenshot2.png")
    (t,) = import_webvoyager(tmp_path, on_bad_step="skip")
    assert [s.step for s in t.steps] == [0, 2]
    assert t.skipped == (Skip(1, "missing screenshot (the log has an observation for this step)", shot2),)
    with pytest.raises(DataError, match=r"screenshot2\.png: step 1: missing screenshot"):
        import_webvoyager(tmp_path, on_bad_step="error")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "empty file"),
        ("truncated", "unreadable screenshot"),
        (b"this is not a png at all", "unreadable screenshot"),
    ],
)
def test_bad_screenshot(tmp_path, content, problem):
    _task(tmp_path / "t", _messages(["Click [1]", "ANSWER; ok"]))
    bad = tmp_path / "t" / "screenshot2.png"
    if content == "truncated":
        whole = _noisy_png_bytes()
        content = whole[: len(whole) // 2]
    bad.write_bytes(content)
    (t,) = import_webvoyager(tmp_path, on_bad_step="skip")
    assert [s.step for s in t.steps] == [0] and t.horizon == 2
    (k,) = t.skipped
    assert k.step == 1 and k.path == str(bad)
    assert k.reason.startswith("unreadable screenshot") and problem in k.reason
    with pytest.raises(DataError, match=r"screenshot2\.png.*step 1"):
        import_webvoyager(tmp_path, on_bad_step="error")


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b'[{"role": "system", "content": "x"},\n  {oops}]', r"not valid JSON \(line 2, column 4"),
        (b"[]", "empty"),
        (b'{"role": "user"}', "not a list"),
        (b"\xff\xfe\x00garbage", "not valid UTF-8"),
        (
            json.dumps(_messages(["Click [1]"])[:2]).encode(),
            "no assistant turn",
        ),
        (
            json.dumps(
                [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"}]
            ).encode(),
            "no task",
        ),
        (b'[{"role": "user"}]', "'role' and 'content'"),
    ],
    ids=["json", "empty", "not-list", "non-utf8", "no-assistant", "no-task", "no-content"],
)
def test_malformed_log(tmp_path, raw, match):
    _task(tmp_path / "good", _messages(["ANSWER; ok"]))
    _task(tmp_path / "bad", raw, shots=1)
    log = tmp_path / "bad" / "interact_messages.json"
    with pytest.raises(DataError, match=match) as e:
        import_webvoyager(tmp_path, on_bad_step="error")
    assert str(log) in str(e.value)
    trajs, skipped = import_webvoyager_report(tmp_path, on_bad_step="skip")
    assert [t.trajectory_id for t in trajs] == ["good"]
    assert len(skipped) == 1 and skipped[0]["path"] == str(log)
    assert re.search(match, skipped[0]["reason"])
    with pytest.warns(UserWarning, match=r"left out 1 folder"):
        assert len(import_webvoyager(tmp_path)) == 1


def test_screenshots_without_log_are_reported(tmp_path):
    _task(tmp_path / "good", _messages(["ANSWER; ok"]))
    orphan = tmp_path / "orphan"
    orphan.mkdir()
    _png(orphan / "screenshot1.png")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("x")
    for mode in ("skip", "error"):
        trajs, skipped = import_webvoyager_report(tmp_path, on_bad_step=mode)
        assert [t.trajectory_id for t in trajs] == ["good"]
        assert skipped == [
            {"path": str(orphan), "reason": "screenshots but no interact_messages.json"}
        ]
    with pytest.warns(UserWarning, match="orphan"):
        import_webvoyager(tmp_path)


def test_nested_discovery_and_sorting(tmp_path):
    for rel in ("b/task2", "a/deep/er/task1", "a/task10"):
        _task(tmp_path / rel, _messages(["ANSWER; ok"], task=f"Find {rel}."))
    ids = [t.trajectory_id for t in import_webvoyager(tmp_path)]
    assert ids == ["a/deep/er/task1", "a/task10", "b/task2"]


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="on_bad_step"):
        import_webvoyager(tmp_path, on_bad_step="ignore")
    with pytest.raises(ValueError, match="max_element_chars"):
        import_webvoyager(tmp_path, max_element_chars=-1)
    with pytest.raises(FileNotFoundError):
        import_webvoyager(tmp_path / "nope")
    assert issubclass(DataError, ValueError)


def test_each_format_is_the_importer_its_config_names():
    """A run finds its importer through conf/data/<kind>.yaml's ``_target_``: one file per format."""
    import yaml
    from hydra.utils import get_method

    import ipi.data

    confs = {p.stem: yaml.safe_load(p.read_text()) for p in (REPO / "conf" / "data").glob("*.yaml")}
    assert set(confs) == {"webvoyager", "native", "online_mind2web", "multimodal_mind2web", "browser_use"}
    for kind, conf in confs.items():
        assert conf["kind"] == kind
        target = get_method(conf["importer"]["_target_"])
        assert target.__module__.startswith("ipi.data") and getattr(ipi.data, target.__name__) is target
