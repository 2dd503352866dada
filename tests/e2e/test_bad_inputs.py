"""The bad-input corpus: every kind of broken input, what each produces, and a full run over them.

The corpus is built by the tests under ``tmp_path`` (nothing is copied into the repository):
synthetic WebVoyager task folders, each broken in one way, beside three real task folders copied
from ``../shared`` at test time. ``docs/reliability.md`` lists the cases and what each produces.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image, ImageFile

from ipi.data import DataError, Skip, load_native, read_native, write_native
from ipi.data.images import MAX_SCREENSHOT_PIXELS, load_rgb, screenshot_problem
from ipi.data.webvoyager import import_webvoyager, import_webvoyager_report
from tests.conftest import WEBVOYAGER, compose_train

PREAMBLE = (
    "please analyze the attached screenshot and give the Thought and Action. I've provided the "
    "tag name of each element and the text it contains (if text exists). Note that <textarea> or "
    "<input> may be textbox, but not exactly. Please focus more on the screenshot and then refer "
    "to the textual information.\n"
)
OMITTED = "Observation: A screenshot and some texts. (Omitted in context.)"
FAIL_MSG = (
    "The action you have chosen cannot be exected. Please double-check if you have selected the "
    "wrong Numerical Label or Action or Action format. Then provide the revised Thought and Action."
)
REAL = ("examples/taskAmazon--0", "examples/taskBBC News--9", "examples/taskWolfram Alpha--6")


# ------------------------------------------------------------------------------- builders


def png_bytes(seed: int, size: tuple[int, int] = (64, 48)) -> bytes:
    """A small noisy RGB PNG (distinct per seed)."""
    rng = random.Random(seed)
    w, h = size
    im = Image.frombytes("RGB", size, bytes(rng.randrange(256) for _ in range(w * h * 3)))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_by_hand(width: int, height: int, idat: bytes) -> bytes:
    """A PNG built chunk by chunk with valid CRCs: the header claims ``width`` x ``height``."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat)
            + _chunk(b"IEND", b""))


def enormous_png() -> bytes:
    """A 20000 x 20000 PNG header with a few bytes of pixel data (a decompression bomb)."""
    return png_by_hand(20000, 20000, zlib.compress(b"\0" * 64))


def corrupt_png(seed: int) -> bytes:
    """A real PNG with one byte of its pixel data flipped (the chunk CRC no longer matches)."""
    raw = bytearray(png_bytes(seed))
    at = raw.index(b"IDAT") + 4 + 40
    raw[at] ^= 0xFF
    return bytes(raw)


def forged_png() -> bytes:
    """Structurally valid (CRCs right, IEND present) but its compressed stream is garbage."""
    return png_by_hand(64, 64, b"this is not a zlib stream")


def damaged_after_idat_png(seed: int) -> bytes:
    """A real PNG with a chunk after the image data that every checksum accepts but no decoder
    reads: a ``zTXt`` (compressed text) naming compression method 5 (PNG defines only 0)."""
    raw = png_bytes(seed)
    at = raw.rindex(b"IEND") - 4  # the IEND chunk's length field
    return raw[:at] + _chunk(b"zTXt", b"Comment\x00\x05" + zlib.compress(b"hello")) + raw[at:]


def messages(actions: list[str], task: str, feedback_before: set[int] = frozenset()) -> list[dict]:
    """A WebVoyager chat: system, the task with the first observation, then one turn per action.

    Turn ``k`` in ``feedback_before`` is preceded by failed-action feedback instead of an
    observation (WebVoyager saves no screenshot for such a turn).
    """
    msgs = [
        {"role": "system", "content": "Imagine you are a robot browsing the web."},
        {"role": "user", "content": [
            {"type": "text", "text": f"Now given a task: {task}  Please interact with "
             f"https://x.org/ and get the answer. \nObservation: {PREAMBLE}[0]: \"Home\";\t"
             "[1]: <input> \"q\";"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,{b64_img}"}},
        ]},
    ]
    for i, a in enumerate(actions):
        if i:
            msgs.append({"role": "user", "content": FAIL_MSG if i in feedback_before else OMITTED})
        msgs.append({"role": "assistant", "content": f"Thought: step {i} of {task}\n\nAction: {a}"})
    return msgs


def task_folder(folder: Path, log: list[dict] | bytes | None, shots: dict[int, bytes | None],
                seed: int) -> Path:
    """Write a task folder: the log (None: no log) and ``screenshot{k}.png`` per entry of
    ``shots`` (value None: a good distinct PNG; bytes: exactly those bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    if log is not None:
        raw = log if isinstance(log, bytes) else json.dumps(log).encode("utf-8")
        (folder / "interact_messages.json").write_bytes(raw)
    for k, content in shots.items():
        (folder / f"screenshot{k}.png").write_bytes(png_bytes(seed * 100 + k) if content is None else content)
    return folder


def two_turns(name: str, seed: int, shot2: bytes | None | str) -> tuple[list[dict], dict]:
    """A two-turn trajectory whose second screenshot is ``shot2`` ("absent": no file)."""
    log = messages(["Click [1]", "ANSWER; done"], task=f"Find {name}.")
    shots = {1: None} if shot2 == "absent" else {1: None, 2: shot2}
    return log, shots


def build_corpus(root: Path, with_real: bool = True) -> dict[str, Path]:
    """Write the bad-input corpus under ``root``; returns case name -> task folder.

    Step-level cases (trajectory kept, one step skipped) are two-turn trajectories whose
    second step is bad. The three real trajectories are copied from ``../shared`` at test time.
    """
    cases: dict[str, Path] = {}
    step_cases = {
        "missing_screenshot": "absent",
        "truncated_png": png_bytes(7)[: len(png_bytes(7)) // 2],
        "corrupt_png": corrupt_png(8),
        "zero_byte_png": b"",
        "enormous_png": enormous_png(),
        "forged_png": forged_png(),
        "damaged_after_idat_png": damaged_after_idat_png(9),
    }
    for seed, (name, shot2) in enumerate(step_cases.items(), 1):
        log, shots = two_turns(name, seed, shot2)
        cases[name] = task_folder(root / "bad" / name, log, shots, seed)
    # A screenshot missing after a failed action: expected by WebVoyager's design.
    log = messages(["Click [9]", "Click [1]", "ANSWER; done"], task="Find after failure.",
                   feedback_before={1})
    cases["no_screenshot_after_failed_action"] = task_folder(
        root / "bad" / "no_screenshot_after_failed_action", log, {1: None, 3: None}, 20)
    # Whole-trajectory cases.
    shots = {1: None}
    cases["malformed_json"] = task_folder(root / "bad" / "malformed_json",
                                          b'[{"role": "system", "content": "x"},\n {oops}]', shots, 21)
    cases["empty_log"] = task_folder(root / "bad" / "empty_log", b"", shots, 22)
    cases["empty_list_log"] = task_folder(root / "bad" / "empty_list_log", b"[]", shots, 23)
    cases["no_assistant_turn"] = task_folder(
        root / "bad" / "no_assistant_turn", messages(["x"], task="Find nothing.")[:2], shots, 24)
    latin1 = json.dumps(messages(["ANSWER; caf\u00e9"], task="Find a caf\u00e9."),
                        ensure_ascii=False).encode("latin-1")
    cases["non_utf8_log"] = task_folder(root / "bad" / "non_utf8_log", latin1, shots, 25)
    cases["screenshots_no_log"] = task_folder(root / "bad" / "screenshots_no_log", None,
                                              {1: None, 2: None}, 26)
    cases["all_steps_bad"] = task_folder(
        root / "bad" / "all_steps_bad", messages(["ANSWER; x"], task="Find all bad."), {1: b""}, 27)
    # Usable oddities.
    cases["unknown_action"] = task_folder(
        root / "odd" / "unknown_action",
        messages(["Click [1]", "Refresh the page.", "ANSWER; ok"], task="Find a refresh."),
        {1: None, 2: None, 3: None}, 28)
    cases["one_step"] = task_folder(root / "odd" / "one_step",
                                    messages(["ANSWER; a cat"], task="Find a cat."), {1: None}, 29)
    shutil.copytree(cases["one_step"], root / "odd" / "one_step_copy")
    cases["copy_of_one_step"] = root / "odd" / "one_step_copy"
    if with_real:
        for rel in REAL:
            cases[f"real:{rel}"] = Path(shutil.copytree(WEBVOYAGER / rel, root / "real" / rel))
    return cases


#: What each case produces under on_bad_step=skip: ("step", step, reason start) for a counted
#: step skip inside a kept trajectory, ("trajectory", reason start) for a folder left out,
#: ("kept", n_steps) for a usable trajectory.
EXPECTED_SKIP = {
    "missing_screenshot": ("step", 1, "missing screenshot (the log has an observation"),
    "truncated_png": ("step", 1, "unreadable screenshot: "),
    "corrupt_png": ("step", 1, "unreadable screenshot: "),
    "zero_byte_png": ("step", 1, "unreadable screenshot: empty file (0 bytes)"),
    "enormous_png": ("step", 1, "unreadable screenshot: image too large"),
    "forged_png": ("step", 1, "unreadable screenshot: cannot decode (OSError"),
    "damaged_after_idat_png": ("step", 1, "unreadable screenshot: cannot decode (SyntaxError: Unknown compression"),
    "no_screenshot_after_failed_action": ("step", 1, "missing screenshot"),
    "malformed_json": ("trajectory", "not valid JSON (line 2, column 3"),
    "empty_log": ("trajectory", "empty file (0 bytes)"),
    "empty_list_log": ("trajectory", "empty list of chat messages"),
    "no_assistant_turn": ("trajectory", "no assistant turn"),
    "non_utf8_log": ("trajectory", "not valid UTF-8"),
    "screenshots_no_log": ("trajectory", "screenshots but no interact_messages.json"),
    "all_steps_bad": ("trajectory", "no usable step: all 1 step(s) skipped (unreadable screenshot: empty"),
    "copy_of_one_step": ("trajectory", "duplicate of odd/one_step"),
    "unknown_action": ("kept", 3),
    "one_step": ("kept", 1),
}


def _report_path(case: str, folder: Path) -> str:
    """The path a trajectory-level skip names: the log, or the folder where there is no usable log."""
    kind_path = {"screenshots_no_log": folder, "all_steps_bad": folder}
    return str(kind_path.get(case, folder / "interact_messages.json"))


# ------------------------------------------------------------------- the importer, both modes


@pytest.fixture
def corpus(tmp_path):
    return build_corpus(tmp_path / "corpus", with_real=False)


def test_every_case_in_skip_mode(tmp_path, corpus):
    root = tmp_path / "corpus"
    trajs, left_out = import_webvoyager_report(root, on_bad_step="skip")
    by_id = {t.trajectory_id: t for t in trajs}
    left = {d["path"]: d["reason"] for d in left_out}
    for case, expected in EXPECTED_SKIP.items():
        folder = corpus[case]
        tid = folder.relative_to(root).as_posix()
        if expected[0] == "step":
            _, step, reason = expected
            t = by_id[tid]
            (k,) = t.skipped
            assert k.step == step and k.reason.startswith(reason), (case, k)
            assert k.path == str(folder / f"screenshot{step + 1}.png")
            assert [s.step for s in t.steps] == [s for s in range(t.horizon) if s != step]
        elif expected[0] == "trajectory":
            assert tid not in by_id, case
            assert left[_report_path(case, folder)].startswith(expected[1]), (case, left)
        else:
            assert len(by_id[tid].steps) == expected[1] and by_id[tid].skipped == ()
    n_traj_cases = sum(e[0] == "trajectory" for e in EXPECTED_SKIP.values())
    assert len(left_out) == n_traj_cases
    assert len(trajs) == len(EXPECTED_SKIP) - n_traj_cases
    # The unknown action is kept by default, flagged as such.
    unknown = by_id["odd/unknown_action"].steps[1]
    assert (unknown.action, unknown.action_type) == ("Refresh the page.", "unknown")


BAD_STEP_ERRORS = {
    "missing_screenshot": r"screenshot2\.png: step 1: missing screenshot \(the log has an observation",
    "truncated_png": r"screenshot2\.png: step 1: unreadable screenshot: ",
    "corrupt_png": r"screenshot2\.png: step 1: unreadable screenshot: .*(CRC|checksum|broken)",
    "zero_byte_png": r"screenshot2\.png: step 1: unreadable screenshot: empty file \(0 bytes\)",
    "enormous_png": r"screenshot2\.png: step 1: unreadable screenshot: image too large",
    "forged_png": r"screenshot2\.png: step 1: unreadable screenshot: cannot decode \(OSError",
    "damaged_after_idat_png": r"screenshot2\.png: step 1: unreadable screenshot: cannot decode \(SyntaxError",
    "malformed_json": r"interact_messages\.json: not valid JSON \(line 2, column 3",
    "empty_log": r"interact_messages\.json: empty file \(0 bytes\)",
    "empty_list_log": r"interact_messages\.json: empty list of chat messages",
    "no_assistant_turn": r"interact_messages\.json: no assistant turn",
    "non_utf8_log": r"interact_messages\.json: not valid UTF-8 \(byte \d+: invalid",
}


@pytest.mark.parametrize("case", sorted(BAD_STEP_ERRORS))
def test_error_mode_names_file_and_step(tmp_path, case):
    corpus = build_corpus(tmp_path / "c", with_real=False)
    # Alone beside one good trajectory, so the error can only come from this case.
    root = tmp_path / "only"
    shutil.copytree(corpus[case], root / case)
    shutil.copytree(corpus["one_step"], root / "good")
    with pytest.raises(DataError, match=BAD_STEP_ERRORS[case]) as e:
        import_webvoyager(root, on_bad_step="error")
    msg = str(e.value)
    assert "\n" not in msg and str(root / case) in msg


@pytest.mark.parametrize("case", ["no_screenshot_after_failed_action", "screenshots_no_log",
                                  "unknown_action", "one_step"])
def test_error_mode_accepts_expected_oddities(tmp_path, corpus, case):
    root = tmp_path / "only"
    shutil.copytree(corpus[case], root / case)
    trajs, left_out = import_webvoyager_report(root, on_bad_step="error")
    if case == "screenshots_no_log":
        assert trajs == [] and left_out == [{"path": str(root / case),
                                             "reason": "screenshots but no interact_messages.json"}]
    else:
        assert len(trajs) == 1 and left_out == []


def test_copy_of_a_task_folder_is_refused_in_error_mode(tmp_path, corpus):
    root = tmp_path / "only"
    shutil.copytree(corpus["one_step"], root / "a")
    shutil.copytree(corpus["one_step"], root / "b")
    with pytest.raises(DataError, match=r"b/interact_messages\.json: duplicate of a"):
        import_webvoyager(root, on_bad_step="error")
    # Same log but different screenshots is not a copy: both are kept.
    (root / "b" / "screenshot1.png").write_bytes(png_bytes(999))
    assert [t.trajectory_id for t in import_webvoyager(root, on_bad_step="error")] == ["a", "b"]


@pytest.mark.parametrize("policy", ["keep", "skip", "error"])
def test_unknown_action_policy(tmp_path, corpus, policy):
    root = tmp_path / "only"
    shutil.copytree(corpus["unknown_action"], root / "t")
    log = root / "t" / "interact_messages.json"
    if policy == "error":
        with pytest.raises(DataError, match=r"interact_messages\.json: step 1: unknown action "
                                            r"'Refresh the page\.'; known: click, type"):
            import_webvoyager(root, unknown_action=policy)
        return
    (t,) = import_webvoyager(root, unknown_action=policy)
    assert t.horizon == 3
    if policy == "keep":
        assert [s.action_type for s in t.steps] == ["click", "unknown", "answer"] and t.skipped == ()
    else:
        assert [s.step for s in t.steps] == [0, 2]
        assert t.skipped == (Skip(1, "unknown action 'Refresh the page.'", str(log)),)
        # The skipped action still belongs to the history of later steps.
        assert t.steps[1].history == ("Click [1]", "Refresh the page.")
    with pytest.raises(ValueError, match="unknown_action must be one of keep, skip, error"):
        import_webvoyager(root, unknown_action="drop")


def test_enormous_header_is_refused_without_decoding(tmp_path, monkeypatch):
    def no_decode(self, *a, **k):
        raise AssertionError("pixels decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decode)
    big = tmp_path / "big.png"
    big.write_bytes(enormous_png())  # 4e8 pixels: Pillow's own guard refuses it at open
    assert screenshot_problem(big).startswith("image too large")
    # Between 1x and 2x Pillow's limit Pillow only warns; the importer's own check refuses it.
    mid = tmp_path / "mid.png"
    mid.write_bytes(png_by_hand(10000, 10000, zlib.compress(b"\0" * 64)))
    assert screenshot_problem(mid) == (
        f"image too large (10000x10000 = 100000000 pixels > {MAX_SCREENSHOT_PIXELS})")
    # Under a raised limit the header passes and only then is the file decoded (here: refused).
    assert screenshot_problem(mid, max_pixels=10**9) == "cannot decode (AssertionError: pixels decoded)"


def test_tiny_screenshot_is_a_bad_step(tmp_path):
    tiny = tmp_path / "tiny.png"
    tiny.write_bytes(png_bytes(1, size=(8, 40)))
    assert screenshot_problem(tiny) == "image too small (8x40; at least 32x32)"


@pytest.mark.parametrize("make", [forged_png, lambda: damaged_after_idat_png(41)], ids=["forged", "after_idat"])
def test_undecodable_screenshot_passing_every_checksum_is_refused_at_import(tmp_path, make):
    """Every chunk's CRC is right (Pillow's verify passes), yet decoding fails: the import check
    decodes what the replay decodes, so the step is refused at import, and a step built around
    the file anyway (native JSONL) names the file and step when decoded."""
    from ipi.data.schema import Step
    from ipi.surfaces.variants import make_variants

    p = tmp_path / "s.png"
    p.write_bytes(make())
    with Image.open(p) as im:
        im.verify()  # the header-and-checksum check alone lets it through
    assert screenshot_problem(p).startswith("cannot decode (")
    with pytest.raises(DataError, match=r"s\.png: step 3: cannot decode screenshot"):
        load_rgb(p, 3)
    step = Step(step=3, screenshot=str(p), element_text="", element_text_omitted=True, tool_result="",
                thought="", action="ANSWER; x", action_type="answer", history=())
    clean = make_variants("t", step, "i_vis", [])[0]
    with pytest.raises(DataError, match=r"s\.png: step 3: cannot decode screenshot"):
        clean.image(step)


def test_import_check_passes_exactly_the_files_the_replay_decodes(tmp_path):
    """Attack the check: seeded damage to the bytes after the image data (chunk types, lengths,
    payloads with their CRCs recomputed, truncation). A file the check passes always decodes;
    a file that does not decode never passes."""
    rng = random.Random(5)
    base = damaged_after_idat_png(3).replace(b"zTXt", b"tEXt")  # a text chunk after IDAT
    start = base.rindex(b"tEXt") - 4
    n_pass = n_refused = 0
    for i in range(60):
        raw = bytearray(base)
        kind = i % 3
        if kind == 0:  # rewrite the chunk after IDAT with valid CRC: random type and payload
            ctype = rng.choice([b"zTXt", b"iTXt", b"iCCP", b"tEXt", b"eXIf", b"IDAT", b"sRGB", b"pHYs"])
            payload = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 24)))
            raw = raw[:start] + bytearray(_chunk(ctype, payload)) + raw[raw.rindex(b"IEND") - 4:]
        elif kind == 1:  # flip a byte anywhere after the image data
            at = rng.randrange(start, len(raw))
            raw[at] ^= 1 << rng.randrange(8)
        else:  # cut the file somewhere after the image data
            raw = raw[: rng.randrange(start, len(raw))]
        p = tmp_path / f"d{i}.png"
        p.write_bytes(bytes(raw))
        problem = screenshot_problem(p, limits=None)
        try:
            load_rgb(p)
            decodes = True
        except DataError:
            decodes = False
        assert problem is not None or decodes, (i, problem)
        n_pass += problem is None
        n_refused += problem is not None
    assert n_pass and n_refused  # both kinds were built


# ----------------------------------------------------------------------------- native JSONL


def test_native_jsonl_bad_inputs(tmp_path, corpus):
    root = tmp_path / "only"
    shutil.copytree(corpus["unknown_action"], root / "t")
    shutil.copytree(corpus["one_step"], root / "u")
    trajs = import_webvoyager(root)
    path = write_native(trajs, tmp_path / "d.jsonl")
    # The unknown-action policy applies to native data too.
    got, _ = load_native(path, unknown_action="skip")
    assert got[0].skipped == (Skip(1, "unknown action 'Refresh the page.'", str(path)),)
    with pytest.raises(DataError, match=r"d\.jsonl: trajectory t step 1: unknown action"):
        load_native(path, unknown_action="error")
    # A screenshot that went missing / bad after the JSONL was written: a bad step.
    Path(trajs[0].steps[1].screenshot).unlink()
    Path(trajs[1].steps[0].screenshot).write_bytes(b"")
    got, left_out = load_native(path, on_bad_step="skip")
    assert [t.trajectory_id for t in got] == ["t"]
    assert got[0].skipped == (Skip(1, "missing screenshot", trajs[0].steps[1].screenshot),)
    assert left_out == [{"path": str(path), "reason": "trajectory u: no usable step"}]
    with pytest.raises(DataError, match=r"screenshot2\.png: step 1: missing screenshot"):
        load_native(path, on_bad_step="error")
    # Non-UTF-8 text, broken JSON and a repeated id: DataError naming file and line.
    lines = path.read_bytes().splitlines()
    for bad, match in [(b"{\"trajectory_id\": \"caf\xe9\"}", r"d2\.jsonl:2: not valid UTF-8"),
                       (b"{oops", r"d2\.jsonl:2: not a native-schema trajectory"),
                       (lines[0], r"d2\.jsonl:2: trajectory_id 't' already used on line 1")]:
        p2 = tmp_path / "d2.jsonl"
        p2.write_bytes(lines[0] + b"\n" + bad + b"\n")
        with pytest.raises(DataError, match=match):
            read_native(p2)


# ------------------------------------------------------------------- the whole run over them

@pytest.mark.needs_shared
def test_train_over_corpus_counts_every_skip(tmp_path):
    """The composed train pipeline over 3 real trajectories + the corpus: counted skips, listed."""
    from ipi.run.tasks import load_data, train

    cases = build_corpus(tmp_path / "corpus")
    root = tmp_path / "corpus"
    ov = [f"data.root={root}", "data.max_element_chars=200", "control=scrambled",
          "split.test_fraction=0.5", "evaluation.n_boot=20", "evaluation.permuted=false",
          "logger=none"]
    results, _ = train(compose_train(tmp_path, ov))
    on_disk = json.loads((tmp_path / "run" / "results.json").read_text())
    assert on_disk == json.loads(json.dumps(results))
    counts = on_disk["counts"]

    expected_step_skips = sorted(
        (cases[c].relative_to(root).as_posix(), e[1], e[2]) for c, e in EXPECTED_SKIP.items()
        if e[0] == "step")
    got_step_skips = sorted((s["trajectory_id"], s["step"], s["reason"]) for s in counts["skipped_steps"])
    assert [(t, s) for t, s, _ in got_step_skips] == [(t, s) for t, s, _ in expected_step_skips]
    for (_, _, got), (_, _, want) in zip(got_step_skips, expected_step_skips):
        assert got.startswith(want)
    expected_traj = {_report_path(c, cases[c]): e[1] for c, e in EXPECTED_SKIP.items()
                     if e[0] == "trajectory"}
    got_traj = {d["path"]: d["reason"] for d in counts["skipped_trajectories"]}
    assert got_traj.keys() == expected_traj.keys()
    for path, want in expected_traj.items():
        assert got_traj[path].startswith(want)

    # Independent count of what was used: 3 real (3 steps each) + kept synthetic trajectories.
    kept_synthetic = {c: e for c, e in EXPECTED_SKIP.items() if e[0] != "trajectory"}
    n_steps = 9 + sum(e[1] if e[0] == "kept" else (2 if c == "no_screenshot_after_failed_action" else 1)
                      for c, e in kept_synthetic.items())
    assert counts["trajectories"] == 3 + len(kept_synthetic)
    assert counts["steps"] == n_steps
    assert counts["rows"] == 3 * n_steps  # clean, attack, c_scrambled per step
    assert set(on_disk["e3"]) == {"c_scrambled"}

    # The report lists every skip with its reason.
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"- skipped_steps: {len(expected_step_skips)}" in report
    assert f"- skipped_trajectories: {len(expected_traj)}" in report
    for reason in ("image too large", "empty file (0 bytes)", "not valid UTF-8", "no assistant turn",
                   "screenshots but no interact_messages.json", "duplicate of odd/one_step",
                   "missing screenshot (the log has an observation"):
        assert reason in report, reason

    # The same corpus under on_bad_step=error stops before any work, naming the file and step.
    with pytest.raises(DataError, match=r"corpus/bad/\w+/(screenshot\d\.png: step \d|interact_messages\.json): "):
        train(compose_train(tmp_path / "strict", [*ov, "data.on_bad_step=error"]))
    # unknown_action=skip through the config: the step becomes a counted skip.
    _, _, step_skips = load_data(compose_train(tmp_path / "u", [*ov, "data.unknown_action=skip"]))
    assert {"trajectory_id": "odd/unknown_action", "step": 1, "reason": "unknown action 'Refresh the page.'",
            "path": str(cases["unknown_action"] / "interact_messages.json")} in step_skips
