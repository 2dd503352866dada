"""Free-run generation: the backbone's own next action from the replay prompt, cached by content.

The prompt is the teacher-forced prompt up to the action (:func:`ipi.replay.generation_prompt`),
and the backbone continues it:

* **greedy**, at most ``max_new_tokens`` new tokens, stopping at the chat template's end-of-turn
  token (:func:`end_of_turn_ids`) or the end-of-sequence token;
* **batched** with left padding, positions from the attention mask; padding changes float
  rounding only, so ``batch_size`` is left out of the cache key;
* **cached by content** (:class:`GenerationCache`, :func:`generation_key`): the backbone's
  identity, the prompt's token ids, the image inputs' bytes, the settings and the intervention.

The backbone must keep its LM head and every decoder block (:func:`check_can_generate`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from ipi.io import atomic_path, atomic_write_text
from ipi.progress import progress_bar, track
from ipi.replay import PromptParts, generation_prompt, render_prompt

log = logging.getLogger(__name__)

__all__ = [
    "GENERATION_VERSION",
    "Generation",
    "GenerationCache",
    "GenerationRequest",
    "GenerationSettings",
    "Intervention",
    "check_can_generate",
    "end_of_turn_ids",
    "generate",
    "generation_key",
    "request_of_row",
    "requests_of_rows",
]

#: Bumped whenever prompt building, decoding or the cache entry change what a key stands for.
GENERATION_VERSION = 1


@dataclass(frozen=True)
class GenerationSettings:
    """How the next action is generated.

    Attributes:
        max_new_tokens: Bound on new tokens per row (>= 1); a generation cut by the bound is
            marked (:attr:`Generation.stopped` False) and labelled from what it holds.
        batch_size: Requests per ``generate`` call (>= 1; not part of the cache key).
"""

    max_new_tokens: int = 96
    batch_size: int = 4

    def __post_init__(self):
        for name in ("max_new_tokens", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"generation: {name} must be an integer >= 1, got {v!r}")

    def key(self) -> dict:
        """The settings that change a generation (the cache key's part)."""
        return {"max_new_tokens": int(self.max_new_tokens), "decoding": "greedy"}


@dataclass(frozen=True, eq=False)
class GenerationRequest:
    """One prompt to continue.

    Attributes:
        row_id: The replay row (``"<trajectory_id>|<step>|<surface>|<variant>|<k>"``).
        input_ids: Prompt token ids ``[T]`` (int64).
        mm_token_type_ids: ``[T]`` modality per token (1 = image) for a multimodal backbone, or None.
        pixel_values: The screenshot's patches ``[P, D]`` (float32), or None (text-only).
        image_grid_thw: ``[1, 3]`` grid of the screenshot, or None.
    """

    row_id: str
    input_ids: torch.Tensor
    mm_token_type_ids: torch.Tensor | None = None
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None

    def __post_init__(self):
        if self.input_ids.ndim != 1 or self.input_ids.numel() == 0:
            raise ValueError(f"row {self.row_id}: input_ids must be a non-empty 1-D tensor")
        if (self.pixel_values is None) != (self.image_grid_thw is None):
            raise ValueError(f"row {self.row_id}: pixel_values and image_grid_thw go together")
        if self.pixel_values is not None and (self.mm_token_type_ids is None
                                              or self.mm_token_type_ids.shape != self.input_ids.shape):
            raise ValueError(f"row {self.row_id}: an image needs mm_token_type_ids of the prompt's shape")

    def digest(self) -> str:
        """SHA-256 of the prompt's content: token ids, modality ids, image bytes and grid."""
        h = hashlib.sha256()
        for name, t in (("ids", self.input_ids), ("mm", self.mm_token_type_ids), ("pixels", self.pixel_values),
                        ("grid", self.image_grid_thw)):
            h.update(name.encode())
            if t is None:
                h.update(b"\x00")
                continue
            a = t.detach().cpu().contiguous()
            h.update(f"{a.dtype}{tuple(a.shape)}".encode())
            h.update(a.numpy().tobytes())
        return h.hexdigest()


@dataclass(frozen=True)
class Generation:
    """A generated turn.

    Attributes:
        row_id: The replay row.
        text: The new tokens decoded, up to (without) the end-of-turn token.
        n_tokens: New tokens generated (the end-of-turn token included when reached).
        stopped: The turn ended (end-of-turn or end-of-sequence token) before ``max_new_tokens``.
        key: The cache key (:func:`generation_key`).
        cached: Served from the cache, not generated in this call.
    """

    row_id: str
    text: str
    n_tokens: int
    stopped: bool
    key: str
    cached: bool = False


class Intervention(Protocol):
    """What :func:`generate` needs of an intervention (:class:`ipi.behaviour.ablation.ProjectOut`)."""

    def identity(self) -> dict:
        """JSON-able description of everything that changes the generations (part of the key)."""
        ...

    def applied(self, backbone) -> contextlib.AbstractContextManager:
        """A context in which the backbone's forward passes carry the intervention."""
        ...


def _json_default(o: Any):
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def generation_key(identity: Mapping, request: GenerationRequest, settings: GenerationSettings,
                   intervention: Mapping | None = None) -> str:
    """Content key of one generation (module docstring).

    Args:
        identity: The backbone's identity (:attr:`ipi.backbone.Backbone.identity`).
        request: The prompt.
        settings: The generation settings.
        intervention: The intervention's identity, or None.

    Returns:
        A 64-hex-digit SHA-256.
    """
    payload = json.dumps({"version": GENERATION_VERSION, "backbone": identity, "prompt": request.digest(),
                          "settings": settings.key(), "intervention": intervention},
                         sort_keys=True, default=_json_default)
    return hashlib.sha256(payload.encode()).hexdigest()


class GenerationCache:
    """Generations by content key, in one JSON-Lines file written atomically.

    Each line is ``{"key", "row_id", "text", "n_tokens", "stopped"}`` as ASCII JSON, read back
    split at ``"\\n"`` only. :meth:`put` (after every batch) re-reads the file, adds the new
    entries and rewrites it atomically (:func:`ipi.io.atomic_write_text`); two concurrent writers
    can lose one's new entries, never corrupt the file.

    A line that is not an entry is moved, as it was, to ``<file>.corrupt-<n>``, the file is
    rewritten without it and a warning names both files.

    Args:
        path: The ``.jsonl`` file (created on the first :meth:`put`).
"""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._entries: dict[str, dict] = self._read()

    @staticmethod
    def _entry(raw: bytes) -> dict | None:
        """The entry a line holds, or None when it holds none."""
        try:
            e = json.loads(raw.decode("utf-8"))
        except ValueError:  # not UTF-8 (UnicodeDecodeError) or not JSON
            return None
        ok = (isinstance(e, dict) and isinstance(e.get("key"), str) and isinstance(e.get("text"), str)
              and isinstance(e.get("n_tokens"), int) and isinstance(e.get("stopped"), bool))
        return e if ok else None

    def _read(self) -> dict[str, dict]:
        if not self.path.exists():
            return {}
        out: dict[str, dict] = {}
        bad: list[tuple[int, bytes]] = []
        for i, raw in enumerate(self.path.read_bytes().split(b"\n"), 1):
            if not raw.strip():
                continue
            e = self._entry(raw.removesuffix(b"\r"))
            if e is None:
                bad.append((i, raw))
            else:
                out[e["key"]] = e
        if bad:
            self._set_aside(bad, out)
        return out

    def _set_aside(self, bad: list[tuple[int, bytes]], good: Mapping[str, dict]) -> Path:
        """Move unreadable lines to ``<file>.corrupt-<n>``, rewrite the file without them, warn."""
        n = 1
        while (aside := self.path.with_name(f"{self.path.name}.corrupt-{n}")).exists():
            n += 1
        with atomic_path(aside) as tmp:
            tmp.write_bytes(b"".join(raw + b"\n" for _, raw in bad))
        self._write(good)
        lines = ", ".join(str(i) for i, _ in bad[:10]) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        log.warning("%s: %d line(s) are not generation cache entries (line %s); set aside in %s, the rest "
                    "kept; those generations are made again", self.path, len(bad), lines, aside)
        return aside

    def _write(self, entries: Mapping[str, dict]) -> None:
        atomic_write_text(self.path, "".join(json.dumps(e, ensure_ascii=True, sort_keys=True) + "\n"
                                             for e in entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> dict | None:
        """The entry stored under ``key``, or None."""
        return self._entries.get(key)

    def put(self, entries: Sequence[dict]) -> None:
        """Store ``entries`` (dicts as in the class docstring) and rewrite the file atomically."""
        if not entries:
            return
        merged = self._read()
        merged.update(self._entries)
        for e in entries:
            merged[e["key"]] = {k: e[k] for k in ("key", "row_id", "text", "n_tokens", "stopped")}
        self._entries = merged
        self._write(merged)


# ----------------------------------------------------------------------------------- prompts
def request_of_row(backbone, row, system_prompt: str, *, memo: dict | None = None,
                   screenshot=None) -> GenerationRequest:
    """The generation request of one replay row: its teacher-forced prompt without the gold action.

    Args:
        backbone: The :class:`~ipi.backbone.Backbone` (its processor, image settings, modality).
        row: A replay row (:class:`ipi.extraction.rows.ReplayRow`: ``parts()``, ``variant.image()``).
        system_prompt: The agent's system prompt (``backbone.system_prompt`` of the run).
        memo: Text stretches already tokenised for this step (:func:`ipi.replay.plain_encode`).
        screenshot: The step's screenshot already decoded (shared by a step's variants), or None.

    Returns:
        The request.

    Raises:
        ValueError: The row cannot be tokenised (names the row and screenshot).
    """
    parts: PromptParts = row.parts(system_prompt, backbone.multimodal)
    image = row.variant.image(row.step, screenshot) if backbone.multimodal else None
    try:
        tok = generation_prompt(backbone.processor, parts, image, image_size=backbone.image_size,
                                image_token_id=backbone.image_token_id, memo=memo)
    except ValueError as e:
        raise ValueError(f"row {row.row_id} (screenshot {row.step.screenshot}): {e}") from e
    x = tok.inputs
    return GenerationRequest(row_id=row.row_id, input_ids=x["input_ids"][0],
                             mm_token_type_ids=x["mm_token_type_ids"][0] if "mm_token_type_ids" in x else None,
                             pixel_values=x.get("pixel_values"), image_grid_thw=x.get("image_grid_thw"))


def step_inputs(backbone, rows: Sequence):
    """Per row: ``(row, memo, screenshot)``, the step's shared tokenisation memo and its decoded
    screenshot (None on a text-only backbone): each step's screenshot decoded once, its text
    tokenised once for all its variants."""
    from ipi.data.images import load_rgb

    memo, shots, last = {}, {}, None
    for r in rows:
        key = (r.trajectory_id, r.step.step)
        if key != last:
            memo, shots, last = {}, {}, key
        shot = None
        if backbone.multimodal:
            if r.step.screenshot not in shots:
                shots[r.step.screenshot] = load_rgb(r.step.screenshot, r.step.step)
            shot = shots[r.step.screenshot]
        yield r, memo, shot


def requests_of_rows(backbone, rows: Sequence, system_prompt: str) -> list[GenerationRequest]:
    """:func:`request_of_row` for every row (each step's screenshot decoded once, text shared per step).

    A progress bar (rows, elapsed, ETA; :func:`ipi.progress.track`) shows the tokenising.
    """
    return [request_of_row(backbone, r, system_prompt, memo=memo, screenshot=shot)
            for r, memo, shot in step_inputs(backbone, track(rows, "free run: tokenising prompts (rows)"))]


def check_can_generate(backbone) -> None:
    """Refuse a backbone that cannot write tokens.

    Raises:
        ValueError: No LM head (built without ``with_lm_head=True``), or decoder blocks dropped
            (built with ``max_layer``).
    """
    model = backbone.model
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or not hasattr(model, "generate"):
        raise ValueError(f"backbone={backbone.name}: {type(model).__name__} has no LM head; build it with "
                         "with_lm_head=True to generate")
    if backbone.depth is not None and len(backbone.layers) != int(backbone.depth):
        raise ValueError(f"backbone={backbone.name}: only {len(backbone.layers)} of {backbone.depth} decoder blocks "
                         "were built (max_layer); generation needs all of them")


def end_of_turn_ids(backbone) -> list[int]:
    """Token ids that end the agent's turn: the chat template's turn-closing token and the EOS token.

    The turn-closing token is the first added token the chat template puts right after an
    assistant message, found by rendering the template.

    Returns:
        Distinct ids, the turn-closing one first.
"""
    from ipi.replay import _added_pattern, _added_tokens

    tok = backbone.tokenizer
    parts = PromptParts(system="s", task="t", history=(), tool_result="r", element_text="e", gold="g",
                        has_image=False)
    rendered = render_prompt(backbone.processor, parts)
    added = _added_tokens(tok)
    after_gold = rendered.pieces[-1][0]  # the trusted piece after the last field (the gold turn)
    ids: list[int] = []
    pattern = _added_pattern(added)
    m = pattern.search(after_gold) if pattern else None
    if m is not None:
        ids.append(added[m.group()])
    if tok.eos_token_id is not None:
        ids.append(int(tok.eos_token_id))
    if not ids:
        raise ValueError(f"backbone={backbone.name}: no end-of-turn or end-of-sequence token")
    return list(dict.fromkeys(ids))


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _batch(requests: Sequence[GenerationRequest], pad_id: int, device) -> dict[str, torch.Tensor]:
    n = max(r.input_ids.numel() for r in requests)
    ids = torch.full((len(requests), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(requests), n), dtype=torch.long)
    multimodal = requests[0].pixel_values is not None
    mm = torch.zeros((len(requests), n), dtype=torch.int32) if multimodal else None
    for b, r in enumerate(requests):
        t = r.input_ids.numel()
        ids[b, n - t:] = r.input_ids
        mask[b, n - t:] = 1
        if mm is not None:
            mm[b, n - t:] = r.mm_token_type_ids
    out = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
    if multimodal:
        if any(r.pixel_values is None for r in requests):
            raise ValueError("generation: a batch mixes rows with and without a screenshot")
        out["mm_token_type_ids"] = mm.to(device)
        out["pixel_values"] = torch.cat([r.pixel_values for r in requests]).to(device)
        out["image_grid_thw"] = torch.cat([r.image_grid_thw for r in requests]).to(device)
    return out


def _decode(tok, new_ids: list[int], stop_ids: set[int]) -> tuple[str, int, bool]:
    cut = next((i for i, t in enumerate(new_ids) if t in stop_ids), None)
    kept = new_ids if cut is None else new_ids[:cut]
    return tok.decode(kept, skip_special_tokens=False), (len(new_ids) if cut is None else cut + 1), cut is not None


def generate(backbone, requests: Sequence[GenerationRequest], settings: GenerationSettings = GenerationSettings(),
             *, cache: GenerationCache | None = None, intervention: Intervention | None = None,
             description: str = "free run: generating (rows)") -> list[Generation]:
    """Generate the next turn of every request (module docstring), reusing cached generations.

    Args:
        backbone: A :class:`~ipi.backbone.Backbone` with its LM head and all decoder blocks.
        requests: The prompts (:func:`requests_of_rows`); row ids must be distinct.
        settings: ``max_new_tokens`` and ``batch_size``.
        cache: Where generations are kept by content key; None: generate everything, keep nothing.
        intervention: Forward hooks active while generating (an ablation), part of the key.
        description: What the progress bar says it is doing.

    Returns:
        One :class:`Generation` per request, in order.

    Raises:
        ValueError: The backbone cannot generate (:func:`check_can_generate`), or duplicate row ids.
"""
    check_can_generate(backbone)
    ids = [r.row_id for r in requests]
    if len(set(ids)) != len(ids):
        raise ValueError("generation: duplicate row ids among the requests")
    inter_id = intervention.identity() if intervention is not None else None
    keys = [generation_key(backbone.identity, r, settings, inter_id) for r in requests]
    out: list[Generation | None] = [None] * len(requests)
    todo = []
    for i, (r, k) in enumerate(zip(requests, keys)):
        hit = cache.get(k) if cache is not None else None
        if hit is not None:
            out[i] = Generation(r.row_id, hit["text"], int(hit["n_tokens"]), bool(hit["stopped"]), k, cached=True)
        else:
            todo.append(i)
    if todo:
        tok = backbone.tokenizer
        stop = end_of_turn_ids(backbone)
        pad = tok.pad_token_id if tok.pad_token_id is not None else stop[0]
        from transformers import GenerationConfig

        config = GenerationConfig(max_new_tokens=int(settings.max_new_tokens), do_sample=False, num_beams=1,
                                  eos_token_id=stop, pad_token_id=int(pad))
        order = sorted(todo, key=lambda i: -requests[i].input_ids.numel())  # stable: ties keep row order
        device = _device(backbone.model)
        ctx = intervention.applied(backbone) if intervention is not None else contextlib.nullcontext()
        with ctx, torch.inference_mode(), progress_bar(description, len(order)) as bar:
            for s in range(0, len(order), settings.batch_size):
                chunk = order[s:s + settings.batch_size]
                batch = _batch([requests[i] for i in chunk], int(pad), device)
                width = batch["input_ids"].shape[1]
                gen = backbone.model.generate(**batch, generation_config=config)
                new_entries = []
                for b, i in enumerate(chunk):
                    text, n_tok, stopped = _decode(tok, gen[b, width:].tolist(), set(stop))
                    out[i] = Generation(requests[i].row_id, text, n_tok, stopped, keys[i])
                    new_entries.append({"key": keys[i], "row_id": requests[i].row_id, "text": text,
                                        "n_tokens": n_tok, "stopped": stopped})
                if cache is not None:  # after every batch: an interrupted run keeps what it generated
                    cache.put(new_entries)
                bar.advance(len(chunk))
    return list(out)  # type: ignore[arg-type]

