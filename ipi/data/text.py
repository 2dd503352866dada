"""The rule every imported text meets: a tokenizer can take it.

A lone UTF-16 surrogate (U+D800–U+DFFF, valid as a JSON escape) is the only code point the Rust
``tokenizers`` encoders refuse. :func:`tokenizer_safe` joins a well-formed surrogate pair into
its character and replaces each lone surrogate by U+FFFD, counted. :func:`clean_trajectory`
applies it to every text of a trajectory as an importer builds it; ``data.on_bad_step`` decides
whether a replacement is counted (``"skip"``: ``Trajectory.meta["replaced_characters"]``) or an
error naming the file and step (``"error"``). Attack sources refuse such a text by name
(:func:`ipi.attacks.source.check_text`)."""

from __future__ import annotations

import re
from dataclasses import replace

from ipi.data.schema import DataError, Trajectory

__all__ = ["REPLACEMENT", "REPLACED", "clean_trajectory", "text_problem", "tokenizer_safe"]

#: What a lone surrogate becomes.
REPLACEMENT = "\ufffd"
#: Key of ``Trajectory.meta``: ``[{"step", "field", "count"}]`` per text that had replacements
#: (``step`` None for the task).
REPLACED = "replaced_characters"

_SURROGATE = re.compile("[\ud800-\udfff]")


def tokenizer_safe(text: str) -> tuple[str, int]:
    """``text`` as a tokenizer takes it, and how many characters were replaced.

    Args:
        text: Any string.

    Returns:
        ``(text, n)``: each well-formed surrogate pair joined into its character (not counted),
        each lone surrogate replaced by U+FFFD (``n`` of them); ``text`` itself when it has no
        surrogate.
    """
    if not _SURROGATE.search(text):
        return text, 0
    fixed = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return fixed, fixed.count(REPLACEMENT) - text.count(REPLACEMENT)


def text_problem(text: str) -> str | None:
    """What in ``text`` a tokenizer refuses, in words (first code point and position), or None."""
    n = tokenizer_safe(text)[1]
    if not n:
        return None
    m = _SURROGATE.search(text)
    return (f"{n} lone UTF-16 surrogate(s) (first U+{ord(m.group()):04X} at character {m.start()}), "
            "which no tokenizer takes")


def clean_trajectory(t: Trajectory, where: str, on_bad_step: str) -> Trajectory:
    """Apply :func:`tokenizer_safe` to every text of a trajectory an importer built.

    Args:
        t: The trajectory as read.
        where: The file (and, where one file holds many, the trajectory) for messages.
        on_bad_step: ``"skip"``: replace and count (``t.meta["replaced_characters"]``, added to
            what it holds); ``"error"``: raise.

    Returns:
        ``t`` itself when nothing needed replacing, else a copy with the texts replaced.

    Raises:
        DataError: Under ``on_bad_step="error"``, one line naming ``where``, the step (or the
            task) and the field.
    """
    found: list[dict] = []

    def fix(text: str, step: int | None, field: str) -> str:
        new, n = tokenizer_safe(text)
        if n:
            if on_bad_step == "error":
                at = "task" if step is None else f"step {step}: {field}"
                raise DataError(f"{where}: {at}: {text_problem(text)} (data.on_bad_step=skip replaces each "
                                "by U+FFFD and counts it)")
            found.append({"step": step, "field": field, "count": n})
        return new

    tid = t.trajectory_id
    if _SURROGATE.search(tid):
        # an id is not tokenised but is written to every table and file of the run (UTF-8): a folder
        # name that is not UTF-8 (read back with surrogate escapes) or a JSON id holding a lone
        # surrogate is written with each such character as its backslash escape, which keeps ids
        # distinct and stable (U+FFFD could make two ids one)
        if on_bad_step == "error":
            m = _SURROGATE.search(tid)
            raise DataError(f"{where}: trajectory id {ascii(tid)}: a character that is not text (first U+{ord(m.group()):04X} "
                            f"at character {m.start()}: a folder name that is not UTF-8, or a lone UTF-16 surrogate); "
                            "data.on_bad_step=skip writes each such character as its backslash escape and counts it")
        fixed = tid.encode("utf-8", "backslashreplace").decode("utf-8")
        found.append({"step": None, "field": "trajectory_id", "count": len(_SURROGATE.findall(tid))})
        tid = fixed
    task = fix(t.task, None, "task")
    steps = tuple(replace(s, element_text=fix(s.element_text, s.step, "element_text"),
                          tool_result=fix(s.tool_result, s.step, "tool_result"),
                          thought=fix(s.thought, s.step, "thought"), action=fix(s.action, s.step, "action"),
                          history=tuple(fix(h, s.step, f"history[{i}]") for i, h in enumerate(s.history)))
                  for s in t.steps)
    if not found:
        return t
    return replace(t, trajectory_id=tid, task=task, steps=steps,
                   meta={**t.meta, REPLACED: [*t.meta.get(REPLACED, ()), *found]})
