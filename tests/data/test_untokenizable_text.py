"""Text no tokenizer takes (a lone UTF-16 surrogate) is replaced and counted at import, or refused
naming the file and step (ipi.data.text, applied by every importer)."""

from __future__ import annotations

import json
import shutil

import pytest

from ipi.data import DataError, import_browser_use_report, import_online_mind2web_report, load_native, write_native
from ipi.data.webvoyager import import_webvoyager_report
from ipi.replay import PromptParts, tokenise
from tests.conftest import WEBVOYAGER, compose_train

TASK = "examples/taskAmazon--0"
LONE = "\ud83d"  # the high half of an emoji, as a JavaScript logger that cut it leaves it
REPLACEMENT = "\ufffd"


def _insert_escape(raw: str, text: str, at: int) -> str:
    """``raw`` (a JSON file's text, holding ``text`` once) with the escape ``\\ud83d`` written after
    ``text[:at]``."""
    whole = json.dumps(text)[1:-1]
    assert raw.count(whole) == 1
    i = raw.index(whole) + len(json.dumps(text[:at])[1:-1])
    return raw[:i] + "\\ud83d" + raw[i:]


@pytest.fixture
def broken(tmp_path):
    """A real WebVoyager task folder whose log holds three ``\\ud83d`` escapes (task, element text
    of step 0, thought of step 1); returns ``(root, log, the texts as imported from the original)``."""
    root = tmp_path / "root"
    shutil.copytree(WEBVOYAGER / TASK, root / TASK)
    (orig,), _ = import_webvoyager_report(root)
    log = root / TASK / "interact_messages.json"
    raw = log.read_text(encoding="utf-8")
    raw = _insert_escape(raw, orig.task, 20)
    raw = _insert_escape(raw, orig.steps[0].element_text, 30)
    raw = _insert_escape(raw, orig.steps[1].thought, 15)
    log.write_text(raw, encoding="utf-8")
    json.loads(log.read_bytes().decode("utf-8"))  # valid UTF-8, valid JSON
    return root, log, orig


@pytest.mark.needs_shared
def test_lone_surrogate_in_a_webvoyager_log_is_replaced_and_counted(broken, processor):
    root, log, orig = broken
    (t,), skipped = import_webvoyager_report(root)
    assert skipped == [] and len(t.steps) == len(orig.steps)
    assert t.task == orig.task[:20] + REPLACEMENT + orig.task[20:]
    assert t.steps[0].element_text == orig.steps[0].element_text[:30] + REPLACEMENT + orig.steps[0].element_text[30:]
    assert t.steps[1].thought == orig.steps[1].thought[:15] + REPLACEMENT + orig.steps[1].thought[15:]
    assert t.meta["replaced_characters"] == [{"step": None, "field": "task", "count": 1},
                                             {"step": 0, "field": "element_text", "count": 1},
                                             {"step": 1, "field": "thought", "count": 1}]
    # every text the importer produced renders with the real tokenizer (a lone surrogate made it raise)
    for s in t.steps:
        row = tokenise(processor, PromptParts(system="You browse.", task=t.task, history=s.history,
                                              tool_result=s.tool_result, element_text=s.element_text,
                                              gold=s.gold_text, has_image=False))
        observation = processor.tokenizer.decode(row.inputs["input_ids"][0, row.groups["observation"]])
        assert (REPLACEMENT in observation) == (s.step == 0)


@pytest.mark.needs_shared
def test_lone_surrogate_under_on_bad_step_error_is_one_line_naming_file_and_step(broken):
    root, log, _ = broken
    with pytest.raises(DataError) as e:
        import_webvoyager_report(root, on_bad_step="error")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{log}: task: 1 lone UTF-16 surrogate(s) (first U+D83D at character 20)")
    # without the task's, the first is step 0's element text
    raw = log.read_text(encoding="utf-8")
    log.write_text(raw.replace("\\ud83d", "", 1), encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{json.dumps(str(log))[1:-1]}: step 0: element_text: 1 lone UTF-16 "
                                        r"surrogate\(s\) \(first U\+D83D at character 30\)"):
        import_webvoyager_report(root, on_bad_step="error")


@pytest.mark.needs_shared
def test_the_run_records_each_replacement(broken, tmp_path):
    from ipi.reporting.layout import report_sections
    from ipi.run.stages import load_data, replaced_characters

    root, _, _ = broken
    trajs, _, _ = load_data(compose_train(tmp_path, [f"data.root={root}"]))
    rec = replaced_characters(trajs)
    assert rec == [{"trajectory_id": TASK, "step": None, "field": "task", "count": 1},
                   {"trajectory_id": TASK, "step": 0, "field": "element_text", "count": 1},
                   {"trajectory_id": TASK, "step": 1, "field": "thought", "count": 1}]
    sections = report_sections({"counts": {"trajectories": 1, "steps": 3, "skipped_steps": [],
                                           "skipped_trajectories": [], "replaced_characters": rec}})
    counts = next(s for s in sections if s.id == "counts")
    assert "3 character(s) no tokenizer takes replaced by U+FFFD" in counts.summary


@pytest.mark.needs_shared
def test_native_jsonl_texts_meet_the_same_rule(broken, tmp_path):
    root, _, _ = broken
    (t,), _ = import_webvoyager_report(root)
    path = tmp_path / "d.jsonl"
    write_native([t], path)
    # a hand-made native file with a lone surrogate in a tool result and a history entry
    line = json.loads(path.read_text(encoding="utf-8"))
    line["meta"] = {}
    line["steps"][2]["tool_result"] = "ok " + LONE
    line["steps"][2]["history"][0] = LONE + "Click [1]"
    path.write_text(json.dumps(line, ensure_ascii=True) + "\n", encoding="ascii")
    (n,), _ = load_native(path)
    assert n.steps[2].tool_result == "ok " + REPLACEMENT and n.steps[2].history[0] == REPLACEMENT + "Click [1]"
    assert n.meta["replaced_characters"] == [{"step": 2, "field": "tool_result", "count": 1},
                                             {"step": 2, "field": "history[0]", "count": 1}]
    with pytest.raises(DataError, match=r"d\.jsonl: trajectory examples/taskAmazon--0: step 2: tool_result: 1 lone"):
        load_native(path, on_bad_step="error")


def test_the_rule_itself():
    from ipi.data.text import text_problem, tokenizer_safe

    # what the Rust tokenizers refuse is exactly the surrogates; every other code point passes
    for ok in ("plain", "\x00nul", "\x1besc", "\ufffe\uffff", "\U0010ffff", "\u200b\ufeff", "😀"):
        assert tokenizer_safe(ok) == (ok, 0) and text_problem(ok) is None
    assert tokenizer_safe("a\ud83db") == ("a\ufffdb", 1)
    assert tokenizer_safe("\udc00x\ud83d") == ("\ufffdx\ufffd", 2)
    assert tokenizer_safe("\ud83d\ude00") == ("😀", 0)  # a well-formed pair is the character it encodes
    assert tokenizer_safe("\ufffd\ud83d") == ("\ufffd\ufffd", 1)  # a U+FFFD already there is not counted
    assert text_problem("ab\udc00") == ("1 lone UTF-16 surrogate(s) (first U+DC00 at character 2), "
                                         "which no tokenizer takes")


def test_attack_texts_meet_the_rule():
    from dataclasses import replace

    from ipi.attacks.pool import AttackPool, project_pool
    from ipi.attacks.source import AttackSourceError

    pool = project_pool()
    bad = replace(pool.templates[0], text=pool.templates[0].text + LONE)
    with pytest.raises(AttackSourceError, match=rf"attack=project: {bad.id} \(.*\): 1 lone UTF-16 surrogate"):
        AttackPool(pool.name, (bad, *pool.templates[1:]), pool.goals, pool.benign, pool.benign_from)


def test_online_mind2web_texts_meet_the_same_rule(tmp_path):
    from ipi.data import import_browser_use_report, import_online_mind2web_report
    from tests.data.test_online_mind2web import A, _v1

    bad_action = "<button> Go" + LONE + " -> CLICK"
    folder = _v1(tmp_path, "t0", [A[0], bad_action, A[2]], thoughts=["type", "sub" + LONE + "mit", "open"],
                 frames=[0, 1, 2])
    (t,), _ = import_online_mind2web_report(tmp_path)
    fixed = bad_action.replace(LONE, REPLACEMENT)
    assert (t.steps[1].thought, t.steps[1].action) == ("sub" + REPLACEMENT + "mit", fixed)
    assert t.steps[2].tool_result == f"Action executed: {fixed}" and t.steps[2].history == (A[0], fixed)
    assert t.meta["replaced_characters"] == [{"step": 1, "field": "thought", "count": 1},
                                             {"step": 1, "field": "action", "count": 1},
                                             {"step": 2, "field": "tool_result", "count": 1},
                                             {"step": 2, "field": "history[1]", "count": 1}]
    with pytest.raises(DataError, match=rf"^{json.dumps(str(folder / 'result.json'))[1:-1]}: step 1: thought: "
                                        r"1 lone UTF-16 surrogate"):
        import_online_mind2web_report(tmp_path, on_bad_step="error")


def test_browser_use_texts_meet_the_same_rule(tmp_path):
    from ipi.data import import_browser_use_report, import_online_mind2web_report
    from tests.data.test_browser_use import _current_run

    path = _current_run(tmp_path / "runs" / "socks")
    data = json.loads(path.read_text())
    data["history"][0]["model_output"]["thinking"] = "The page" + LONE + " has a search box."
    data["history"][0]["result"][0]["extracted_content"] = LONE + "Input 'wool socks' into element 3."
    path.write_text(json.dumps(data))
    (t,), _ = import_browser_use_report(tmp_path / "runs", image_dir=tmp_path / "img")
    assert t.steps[0].thought.startswith("The page" + REPLACEMENT + " has a search box.")
    assert REPLACEMENT + "Input 'wool socks'" in t.steps[1].tool_result
    # the model output of history[0] made steps 0 and 1 (two actions): both carry its thought
    assert t.steps[1].thought == t.steps[0].thought
    assert t.meta["replaced_characters"] == [{"step": 0, "field": "thought", "count": 1},
                                             {"step": 1, "field": "tool_result", "count": 1},
                                             {"step": 1, "field": "thought", "count": 1}]
    with pytest.raises(DataError, match=rf"^{json.dumps(str(path))[1:-1]}: step 0: thought: 1 lone"):
        import_browser_use_report(tmp_path / "runs", image_dir=tmp_path / "img2", on_bad_step="error")


@pytest.mark.needs_shared
def test_the_rule_is_what_the_tokenizer_refuses(processor):
    from ipi.data.text import tokenizer_safe

    tok = processor.tokenizer
    for ok in ("\x00nul", "\x1besc", "\x7fdel", "\ufffe\uffff", "\U0010ffff", "\u200b\ufeff", "\ue000", "😀"):
        assert tokenizer_safe(ok) == (ok, 0)
        tok(ok)  # encodes
    for bad in ("a\ud83db", "\udc00", "x\ud83d", "\ud83d\ude00"):
        with pytest.raises(TypeError):
            tok(bad)
        assert tok(tokenizer_safe(bad)[0])["input_ids"]


@pytest.mark.needs_shared
def test_a_task_folder_name_that_is_not_utf8_gives_an_id_every_file_can_hold(tmp_path):
    """A folder name with a byte that is not UTF-8 (an archive made on another system) is read
    back with a surrogate escape in the trajectory id; the id is written to every table and file
    of the run, so it is escaped (\\udcff) and counted, or refused under on_bad_step=error."""
    import os

    from ipi.evaluation.scoretable import read_score_table
    from ipi.extraction.activation_cache import stable_hash
    from ipi.io import atomic_write_text

    root = tmp_path / "root"
    shutil.copytree(WEBVOYAGER / TASK, root / "examples" / "taskAmazon--0")
    os.rename(os.fsencode(root / "examples" / "taskAmazon--0"), os.fsencode(root / "examples") + b"/task\xffAmazon")
    (t,), skipped = import_webvoyager_report(root)
    assert skipped == [] and t.trajectory_id == "examples/task\\udcffAmazon" and t.trajectory_id.isascii()
    assert t.meta["replaced_characters"] == [{"step": None, "field": "trajectory_id", "count": 1}]
    # the native file, a score table and a cache key hold it (each raised UnicodeEncodeError before)
    write_native([t], tmp_path / "t.jsonl")
    assert load_native(tmp_path / "t.jsonl")[0][0].trajectory_id == t.trajectory_id
    scores = tmp_path / "scores.csv"
    atomic_write_text(scores, "trajectory_id,step,variant,score\n" + "".join(
        f"{t.trajectory_id},0,{v},{x}\n" for v, x in (("clean", 0.1), ("attack", 0.9))))
    assert read_score_table(scores).trajectory_id.tolist() == [t.trajectory_id] * 2
    assert len(stable_hash({"path": t.steps[0].screenshot})) == 64  # the screenshot path keeps its escape
    with pytest.raises(DataError, match=r"task\\udcffAmazon.*not text.*not UTF-8") as e:
        import_webvoyager_report(root, on_bad_step="error")
    assert "interact_messages.json" in str(e.value) and "\n" not in str(e.value)
