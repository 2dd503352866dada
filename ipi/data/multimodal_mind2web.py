"""Importer for Multimodal-Mind2Web (Hugging Face dataset ``osunlp/Multimodal-Mind2Web``).

Reads a local copy only (Parquet files or a ``save_to_disk`` folder; one row per action), streaming
the columns it reads; the mapping onto the native schema is in ``docs/data.md``
("Multimodal-Mind2Web")."""

from __future__ import annotations

import io
import json
import os
import re
from collections import defaultdict
from html.parser import HTMLParser
from pathlib import Path

from PIL import Image

from ipi.data.discover import bad_step, check_options, data_root, no_usable_step
from ipi.data.images import DEFAULT_LIMITS, ImageLimits, root_image_dir, screenshot_problem, write_image_bytes
from ipi.data.online_mind2web import NO_PREVIOUS_ACTION, mind2web_action_type
from ipi.data.schema import DataError, Skip, Step, Trajectory
from ipi.data.text import clean_trajectory
from ipi.progress import track

__all__ = ["COLUMNS", "SOURCE", "html_to_element_text", "import_multimodal_mind2web_report"]

SOURCE = "multimodal_mind2web"
COLUMNS = ("annotation_id", "confirmed_task", "action_uid", "action_reprs", "target_action_index",
           "target_action_reprs", "operation", "screenshot", "cleaned_html")

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
_FORM = {"input", "select", "textarea", "button", "option", "img"}
_LABEL_ATTRS = ("aria_label", "aria-label", "placeholder", "value", "name", "title", "alt", "type")
_WS = re.compile(r"\s+")


class _Elements(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, dict, list[str], int]] = []
        self.entries: list[str | None] = []

    def _open(self, tag, attrs):
        self.entries.append(None)
        return (tag, {k: v for k, v in attrs if v}, [], len(self.entries) - 1)

    def _close(self, item):
        tag, attrs, parts, slot = item
        text = _WS.sub(" ", " ".join(parts)).strip()
        if not text and tag in _FORM:
            text = next((attrs[a] for a in _LABEL_ATTRS if attrs.get(a)), "")
            text = _WS.sub(" ", text).strip()
        if text:
            self.entries[slot] = f'<{tag}> "{text}"'

    def handle_starttag(self, tag, attrs):
        item = self._open(tag, attrs)
        if tag in _VOID:
            self._close(item)
        else:
            self.stack.append(item)

    def handle_startendtag(self, tag, attrs):
        self._close(self._open(tag, attrs))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                while len(self.stack) > i:
                    self._close(self.stack.pop())
                return

    def handle_data(self, data):
        if self.stack and data.strip():
            self.stack[-1][2].append(data)

    def result(self) -> list[str]:
        while self.stack:
            self._close(self.stack.pop())
        return [e for e in self.entries if e is not None]


def html_to_element_text(html: str, max_chars: int | None = None) -> str:
    """The elements of a (cleaned) HTML page as a numbered list, WebVoyager-style.

    Args:
        html: HTML text.
        max_chars: Truncate the result to this many characters (None: keep it whole).

    Returns:
        ``'[0]: <tag> "text";\\t[1]: ...'`` in document order; only elements with their own
        text, or form elements with a label attribute, are listed.
    """
    p = _Elements()
    p.feed(html or "")
    p.close()
    text = ";\t".join(f"[{i}]: {e}" for i, e in enumerate(p.result()))
    return text[:max_chars] if max_chars is not None else text


def _parquet_files(root: Path, split: str | None) -> list[Path]:
    if root.is_file():
        return [root]
    files = sorted(root.rglob("*.parquet"))
    if split is not None:
        files = [f for f in files if f.name.startswith(f"{split}-") or f.parent.name == split
                 or f.stem == split]
    return files


def _open_rows(root: Path, split: str | None, columns: list[str]):
    """An iterable of row dicts with ``columns`` (screenshots as ``{"bytes", "path"}``)."""
    import datasets

    if root.is_dir() and ((root / "state.json").is_file() or (root / "dataset_dict.json").is_file()):
        ds = datasets.load_from_disk(str(root))
        if isinstance(ds, datasets.DatasetDict):
            if split is None or split not in ds:
                raise DataError(f"{root}: saved DatasetDict has splits {sorted(ds)}; set data.options.split")
            ds = ds[split]
        missing = [c for c in columns if c not in ds.column_names]
        if missing:
            raise DataError(f"{root}: dataset lacks column(s) {', '.join(missing)}")
        ds = ds.select_columns(columns)
        if "screenshot" in columns:
            ds = ds.cast_column("screenshot", datasets.Image(decode=False))
        return ds
    files = _parquet_files(root, split)
    if not files:
        what = f" for split {split!r}" if split else ""
        raise FileNotFoundError(f"{root}: no Parquet files{what}")
    import pyarrow.parquet as pq

    for f in files:
        names = set(pq.read_schema(f).names)
        missing = [c for c in columns if c not in names]
        if missing:
            raise DataError(f"{f}: missing column(s) {', '.join(missing)} (not Multimodal-Mind2Web rows?)")
    ds = datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train",
                               streaming=True, columns=columns)
    if "screenshot" in columns:
        ds = ds.cast_column("screenshot", datasets.Image(decode=False))
    return ds


def _image_bytes(value) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, dict):
        if value.get("bytes"):
            return value["bytes"]
        if value.get("path") and Path(value["path"]).is_file():
            return Path(value["path"]).read_bytes()
        return None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return None


def _write_image(data: bytes, folder: Path, stem: str) -> Path:
    ext = ".jpg" if data[:3] == b"\xff\xd8\xff" else ".png" if data[:8] == b"\x89PNG\r\n\x1a\n" else ".img"
    return write_image_bytes(folder / f"{stem}{ext}", data)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _op(operation, action: str) -> str:
    if isinstance(operation, str):
        try:
            operation = json.loads(operation)
        except json.JSONDecodeError:
            operation = None
    if isinstance(operation, dict) and isinstance(operation.get("op"), str):
        return operation["op"].lower()
    return mind2web_action_type(action)


def import_multimodal_mind2web_report(
    root: str | os.PathLike,
    *,
    split: str | None = None,
    image_dir: str | os.PathLike | None = None,
    limit: int | None = None,
    on_bad_step: str = "skip",
    max_element_chars: int | None = None,
    image_limits: ImageLimits | None = DEFAULT_LIMITS,
) -> tuple[list[Trajectory], list[dict]]:
    """Import Multimodal-Mind2Web rows from a local copy into native-schema trajectories.

    Args:
        root: Folder searched recursively for ``*.parquet``, one Parquet file, or a
            ``save_to_disk`` folder.
        split: Keep only Parquet files named ``<split>-*.parquet`` (or the split of a saved
            ``DatasetDict``); None reads every file.
        image_dir: Where screenshots are written (default ``$IPI_CACHE_DIR`` or
            ``outputs/cache``, then ``multimodal_mind2web/``).
        limit: Import only the first ``limit`` annotation ids in sorted order.
        image_limits: The backbone's image limits: a screenshot its processor would refuse is a
            counted skip (:func:`ipi.data.images.screenshot_problem`).
        on_bad_step: ``"skip"`` records unreadable screenshots as skips; ``"error"`` raises
            :class:`DataError` naming the task and step.
        max_element_chars: Truncate ``element_text`` to this many characters.

    Returns:
        ``(trajectories sorted by annotation_id, left_out)``: a task none of whose steps is
        usable is left out as ``{"path": "<root> (annotation_id=<id>)", "reason": "no usable
        step: ..."}``.

    Raises:
        FileNotFoundError: ``root`` missing or no Parquet files.
        DataError: Missing columns, a non-integer ``target_action_index``, two rows for one step,
            rows of one task disagreeing on ``action_reprs``, or (under ``"error"``) an
            unreadable screenshot.
    """
    check_options(on_bad_step)
    root = data_root(root, "Multimodal-Mind2Web")
    base = root_image_dir(Path(image_dir) if image_dir is not None else (
        Path(os.environ.get("IPI_CACHE_DIR", "outputs/cache")) / "multimodal_mind2web"), root)
    keep = None
    if limit is not None:
        ids = sorted({str(r["annotation_id"]) for r in _open_rows(root, split, ["annotation_id"])})
        keep = set(ids[:limit])
    columns = list(COLUMNS)
    rows_by_task: dict[str, dict[int, dict]] = defaultdict(dict)
    meta: dict[str, tuple[str, tuple[str, ...]]] = {}
    for r in track(_open_rows(root, split, columns), "import multimodal_mind2web"):
        aid = str(r["annotation_id"])
        if keep is not None and aid not in keep:
            continue
        try:
            k = int(str(r["target_action_index"]).strip())
        except ValueError:
            raise DataError(f"{root}: task {aid} action {r.get('action_uid')}: target_action_index "
                            f"{r['target_action_index']!r} is not an integer") from None
        reprs = tuple(str(a) for a in (r["action_reprs"] or ()))
        if aid in meta and meta[aid][1] != reprs:
            raise DataError(f"{root}: task {aid}: rows disagree on action_reprs")
        meta[aid] = (str(r["confirmed_task"]), reprs)
        if k in rows_by_task[aid]:
            raise DataError(f"{root}: task {aid}: two rows for step {k}")
        html = r.get("cleaned_html") or ""
        rows_by_task[aid][k] = {
            "action_uid": str(r.get("action_uid") or f"step{k}"),
            "action": str(r.get("target_action_reprs") or (reprs[k] if k < len(reprs) else "")),
            "op": r.get("operation"),
            "image": _image_bytes(r.get("screenshot")),
            "element_text": html_to_element_text(html, max_element_chars),
        }
    trajectories, left_out = [], []
    for aid in sorted(rows_by_task):
        task, reprs = meta[aid]
        horizon = max(len(reprs), max(rows_by_task[aid]) + 1)
        folder = base / _safe(aid)
        where = f"{root} (annotation_id={aid})"
        steps, skipped = [], []
        for k in range(horizon):
            row = rows_by_task[aid].get(k)
            if row is None:
                skipped.append(Skip(k, "no row for this action in the loaded split", where))
                continue
            if row["image"] is None:
                skipped.append(Skip(k, "missing screenshot", where))
                continue
            try:
                with Image.open(io.BytesIO(row["image"])) as im:
                    im.verify()
            except Exception as e:
                if on_bad_step == "error":
                    raise DataError(f"{where}: step {k}: unreadable screenshot ({type(e).__name__})") from e
                skipped.append(Skip(k, f"unreadable screenshot: {type(e).__name__}", where))
                continue
            path = _write_image(row["image"], folder, _safe(row["action_uid"]))
            if (problem := screenshot_problem(path, limits=image_limits)) is not None:
                bad_step(skipped, on_bad_step, k, f"unreadable screenshot: {problem}", path, where)
                continue
            history = tuple(reprs[:k])
            prev = reprs[k - 1] if 0 < k <= len(reprs) else None
            steps.append(Step(
                step=k, screenshot=str(path), element_text=row["element_text"],
                element_text_omitted=not row["element_text"],
                tool_result=NO_PREVIOUS_ACTION if prev is None else f"Action executed: {prev}",
                thought="", action=row["action"].strip(), action_type=_op(row["op"], row["action"]),
                history=history,
            ))
        t = Trajectory(aid, task.strip(), SOURCE, horizon, tuple(steps), tuple(skipped))
        if steps:
            trajectories.append(clean_trajectory(t, where, on_bad_step))
        else:
            left_out.append(no_usable_step(where, t))
    return trajectories, left_out
