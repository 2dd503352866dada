"""browser-use histories (AgentHistoryList.save_to_file), built here as browser-use lays them out.

Two versions of the schema: current (flat ``model_output`` with ``thinking``/``memory``/
``next_goal``; ``state.screenshot_path`` to a PNG written beside the run) and older
(``model_output.current_state``; ``state.screenshot`` as base64).
"""

from __future__ import annotations

import base64
import io
import json
import os

import pytest
from PIL import Image

from ipi.data import DataError, import_browser_use_report
from ipi.data.browser_use import NO_TASK, NOT_A_HISTORY, browser_use_action_type
from tests.conftest import compose_train


def _png(colour=(10, 120, 200), size=(64, 48)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def _state(url, title, screenshot_path=None, screenshot=None, elements=(None,)):
    s = {"tabs": [{"url": url, "title": title, "tab_id": "A1B2", "parent_tab_id": None}],
         "interacted_element": list(elements), "url": url, "title": title}
    if screenshot is not None:
        s["screenshot"] = screenshot
    else:
        s["screenshot_path"] = screenshot_path
    return s


def _meta(n):
    return {"step_start_time": 1700000000.0 + n, "step_end_time": 1700000001.5 + n, "input_tokens": 2100,
            "step_number": n}


def _current_run(folder):
    """A current-version run: screenshots in <run>/screenshots/step_<n>.png, absolute paths."""
    shots = folder / "screenshots"
    shots.mkdir(parents=True)
    for n in (1, 2, 3):
        (shots / f"step_{n}.png").write_bytes(_png((40 * n, 0, 0)))
    el = {"tag_name": "input", "xpath": "html/body/form/input", "highlight_index": 3,
          "attributes": {"name": "q", "placeholder": "Search"}}
    history = [
        {"model_output": {"thinking": "The page has a search box.", "evaluation_previous_goal": "Start.",
                          "memory": "Nothing yet.", "next_goal": "Search for socks.",
                          "action": [{"input_text": {"index": 3, "text": "wool socks"}},
                                     {"send_keys": {"keys": "Enter"}}]},
         "result": [{"is_done": False, "extracted_content": "Input 'wool socks' into element 3.",
                     "include_in_memory": True, "long_term_memory": "Typed wool socks"},
                    {"is_done": False, "error": "Element not interactable"}],
         "state": _state("https://shop.example/", "Shop", str(shots / "step_1.png"), elements=(el, None)),
         "metadata": _meta(1)},
        {"model_output": None,  # a failed model call
         "result": [{"is_done": False, "error": "Invalid model output format. Please follow the correct schema."}],
         "state": _state("https://shop.example/s?q=wool+socks", "Results", str(shots / "step_2.png")),
         "metadata": _meta(2)},
        {"model_output": {"evaluation_previous_goal": "Results shown.", "memory": "On results.",
                          "next_goal": "Open the first result.",
                          "action": [{"click_element_by_index": {"index": 12}}]},
         "result": [{"is_done": False, "extracted_content": "Clicked button with index 12"}],
         "state": _state("https://shop.example/s?q=wool+socks", "Results", "screenshots/step_3.png"),
         "metadata": _meta(3)},
        {"model_output": {"evaluation_previous_goal": "Found it.", "memory": "", "next_goal": "Report.",
                          "action": [{"done": {"text": "Wool socks cost $12 <|im_end|>", "success": True}}]},
         "result": [{"is_done": True, "success": True, "extracted_content": "Wool socks cost $12"}],
         "state": _state("https://shop.example/p/1", "Wool socks", None),
         "metadata": _meta(4)},
    ]
    path = folder / "history.json"
    path.write_text(json.dumps({"history": history}, indent=2))  # AgentHistoryList.save_to_file
    (folder / "task.txt").write_text("Find the price of wool socks.\n")
    return path


def _old_run(path):
    """An older-version run: nested current_state, base64 screenshots, task added by a wrapper."""
    b64 = base64.b64encode(_png((0, 200, 0))).decode()
    history = [{"model_output": {"current_state": {"evaluation_previous_goal": "Unknown", "memory": "",
                                                   "next_goal": "Go to the site"},
                                 "action": [{"go_to_url": {"url": "https://news.example"}}]},
                "result": [{"is_done": False, "extracted_content": "Navigated to https://news.example",
                            "include_in_memory": True}],
                "state": _state("about:blank", "", screenshot=b64), "metadata": None},
               {"model_output": {"current_state": {"evaluation_previous_goal": "Success", "memory": "",
                                                   "next_goal": "Scroll"},
                                 "action": [{"scroll_down": {"amount": None}}]},
                "result": [{"is_done": False}],
                "state": _state("https://news.example", "News", screenshot=b64), "metadata": None}]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"task": "Read the top headline.", "history": history}))


def test_current_version_history(tmp_path):
    _current_run(tmp_path / "runs" / "socks")
    (t,), skipped = import_browser_use_report(tmp_path / "runs", image_dir=tmp_path / "img")
    assert skipped == []
    assert t.trajectory_id == "socks/history" and t.task == "Find the price of wool socks." and t.horizon == 4
    s0, s1, s2 = t.steps
    assert [k.step for k in t.skipped] == [3] and t.skipped[0].reason == "missing screenshot"
    assert (s0.action, s0.action_type) == ("input_text(index=3, text='wool socks')", "type")
    assert s0.thought == "The page has a search box.\nEvaluation: Start.\nMemory: Nothing yet.\nNext goal: Search for socks."
    assert s0.tool_result == "No previous action." and s0.element_text == "" and s0.element_text_omitted
    # Both actions of the first call share its screenshot; the second sees the first's result.
    assert s0.screenshot == s1.screenshot and s0.screenshot.endswith("step_1.png")
    assert (s1.action, s1.action_type) == ("send_keys(keys='Enter')", "press")
    assert s1.tool_result == "Input 'wool socks' into element 3." and s1.history == (s0.action,)
    # After the failed model call, the next action's feedback is that call's error.
    assert s2.screenshot.endswith("step_3.png") and s2.action == "click_element_by_index(index=12)"
    assert s2.tool_result == "Error: Invalid model output format. Please follow the correct schema."
    assert s2.history == (s0.action, s1.action) and s2.thought.startswith("Evaluation: Results shown.")


def test_older_version_base64_and_skips(tmp_path):
    root = tmp_path / "root"
    _old_run(root / "old" / "agent_history.json")
    (root / "notes").mkdir()
    (root / "notes" / "config.json").write_text(json.dumps({"llm": "gpt-4o"}))
    no_task = _current_run(tmp_path / "other")
    os.remove(no_task.parent / "task.txt")
    (root / "no_task").symlink_to(no_task.parent, target_is_directory=True)
    trajs, skipped = import_browser_use_report(root, image_dir=tmp_path / "img")
    (t,) = trajs
    assert t.trajectory_id == "old/agent_history" and t.task == "Read the top headline."
    assert [(s.action, s.action_type) for s in t.steps] == [
        ("go_to_url(url='https://news.example')", "navigate"), ("scroll_down(amount=None)", "scroll")]
    assert t.steps[1].tool_result == "Navigated to https://news.example"
    from ipi.data.images import root_image_dir

    # the data root's own folder under image_dir (never shared with another root)
    assert t.steps[0].screenshot == str(root_image_dir(tmp_path / "img", root) / "old" / "agent_history" / "0.png")
    assert Image.open(t.steps[0].screenshot).getpixel((0, 0)) == (0, 200, 0)
    reasons = {os.path.relpath(d["path"], root): d["reason"] for d in skipped}
    assert reasons == {os.path.join("no_task", "history.json"): NO_TASK,
                       os.path.join("notes", "config.json"): NOT_A_HISTORY}
    with pytest.raises(DataError, match="no_task/history.json: no task"):
        import_browser_use_report(root, image_dir=tmp_path / "img", on_bad_step="error")
    # Unknown action names follow data.unknown_action.
    assert browser_use_action_type("switch_tab") == "unknown"
    assert import_browser_use_report(root, image_dir=tmp_path / "img", limit=1)[0] == trajs


def test_data_config_browser_use(tmp_path):
    from ipi.run.tasks import load_data

    _current_run(tmp_path / "runs" / "socks")
    _old_run(tmp_path / "runs" / "old" / "agent_history.json")
    cfg = compose_train(tmp_path, ["data=browser_use", f"data.root={tmp_path / 'runs'}"])
    assert cfg.data.options.image_dir == str(tmp_path / "cache" / "browser_use_screenshots")
    trajs, traj_skips, step_skips = load_data(cfg)
    assert [t.trajectory_id for t in trajs] == ["old/agent_history", "socks/history"] and traj_skips == []
    assert [(s["trajectory_id"], s["step"], s["reason"]) for s in step_skips] == [("socks/history", 3, "missing screenshot")]
