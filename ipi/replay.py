"""Teacher-forced replay: the agent prompt of one step, tokenised, with its token groups located.

The prompt of a step (PROTOCOL.md §1, §3) is, through the processor's chat template::

    system:    <system prompt>
    user:      Task: <task>
               Previous actions: <history, one per line | none>
               <screenshot>
               Result of the previous action: <tool result>
               Page elements: <element text>
    assistant: Thought: <gold thought>  Action: <gold action>      (teacher-forced)

Field spans are exact by construction (:func:`render_prompt`) and mapped to tokens through the
offsets of :func:`encode_prompt` (image tokens by their token id); nothing depends on
hard-coded offsets."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PromptParts:
    """The text pieces of one replayed step (after any injection).

    Attributes:
        system: System prompt.
        task: Task instruction.
        history: Previous action strings, oldest first.
        tool_result: Tool / environment result block.
        element_text: Page text / element list.
        gold: Teacher-forced agent turn (``Thought: ... Action: ...``).
        has_image: Whether the screenshot is part of the prompt.
    """

    system: str
    task: str
    history: tuple[str, ...]
    tool_result: str
    element_text: str
    gold: str
    has_image: bool = True


@dataclass
class TokenisedRow:
    """A tokenised replay row.

    Attributes:
        inputs: Model inputs (``input_ids`` [1, T], ``attention_mask`` [1, T], and for images
            ``pixel_values`` [patches, C*p*p], ``image_grid_thw`` [1, 3] and
            ``mm_token_type_ids`` [1, T] (1 on image tokens), without which Qwen2.5-VL would fall
            back to 1-D text positions for the image tokens).
        groups: Token indices of each token group, each a 1-D ``LongTensor`` (may be empty).
        prompt_len: Number of prompt tokens (all tokens before the first gold-action token).
        seq_len: Total tokens T.
    """

    inputs: dict[str, torch.Tensor]
    groups: dict[str, torch.Tensor]
    prompt_len: int
    seq_len: int


def _history_text(history: tuple[str, ...]) -> str:
    if not history:
        return "none"
    return "\n".join(f"{i + 1}. {a}" for i, a in enumerate(history))


#: Recorded (untrusted) fields of a prompt, in template order. Their text comes from logs, pages
#: and injections; it is tokenised as plain characters (see :func:`plain_encode`).
UNTRUSTED_FIELDS: tuple[str, ...] = ("task", "history", "tool_result", "element_text", "gold")


def _sentinel(i: int) -> str:
    # Private-use code points: no tokenizer's added tokens, and no chat template, touch them.
    return f"\ue000{i}\ue001"


def _messages(parts: PromptParts, fields: dict[str, str]) -> list[dict]:
    user: list[dict] = [
        {"type": "text", "text": f"Task: {fields['task']}\nPrevious actions:\n{fields['history']}\n"}
    ]
    if parts.has_image:
        user.append({"type": "image"})
    user.append(
        {
            "type": "text",
            "text": f"\nResult of the previous action:\n{fields['tool_result']}\nPage elements:\n"
                    f"{fields['element_text']}",
        }
    )
    return [
        {"role": "system", "content": [{"type": "text", "text": parts.system}]},
        {"role": "user", "content": user},
        {"role": "assistant", "content": [{"type": "text", "text": fields["gold"]}]},
    ]


def _field_values(parts: PromptParts) -> dict[str, str]:
    return {"task": parts.task, "history": _history_text(parts.history), "tool_result": parts.tool_result,
            "element_text": parts.element_text, "gold": parts.gold}


@dataclass(frozen=True)
class RenderedPrompt:
    """A chat-template rendering with the exact character span of every recorded field.

    Attributes:
        pieces: ``(text, trusted)`` in order; ``trusted`` pieces come from the chat template and
            the system prompt (their special tokens are the prompt's structure), the others are
            the recorded fields verbatim.
        spans: ``{field: (start, end)}`` character span of each field of
            :data:`UNTRUSTED_FIELDS` in ``text``.
    """

    pieces: tuple[tuple[str, bool], ...]
    spans: dict[str, tuple[int, int]]

    @property
    def text(self) -> str:
        """The rendered prompt."""
        return "".join(t for t, _ in self.pieces)


_TEMPLATES: dict[tuple, tuple] = {}


def _placeholder_template(processor, system: str, has_image: bool, marks: dict[str, str]) -> str:
    """The chat template rendered with a placeholder per field, once per (processor, system, image).

    The rendering depends only on the system prompt and whether the screenshot is shown (the
    cache keeps the processor alive, so its ``id`` cannot be reused).
"""
    key = (id(processor), system, has_image)
    hit = _TEMPLATES.get(key)
    if hit is not None and hit[0] is processor:
        return hit[1]
    parts = PromptParts(system=system, task="", history=(), tool_result="", element_text="", gold="",
                        has_image=has_image)
    text = processor.apply_chat_template(_messages(parts, marks), tokenize=False)
    if len(_TEMPLATES) >= 16:
        _TEMPLATES.clear()
    _TEMPLATES[key] = (processor, text)
    return text


def render_prompt(processor, parts: PromptParts) -> RenderedPrompt:
    """Render the chat template with the recorded fields placed verbatim at known spans.

    The template is rendered with a placeholder per field, each then replaced by the field's
    text, so a field's span is known exactly and every special token of the trusted pieces
    belongs to the template.

    Args:
        processor: A processor or tokenizer with a chat template.
        parts: The prompt pieces.

    Returns:
        The rendered prompt.

    Raises:
        ValueError: The chat template dropped or repeated a field.
"""
    fields = _field_values(parts)
    marks = {n: _sentinel(i) for i, n in enumerate(UNTRUSTED_FIELDS)}
    template = _placeholder_template(processor, parts.system, parts.has_image, marks)
    pieces: list[tuple[str, bool]] = []
    spans: dict[str, tuple[int, int]] = {}
    rest, pos = template, 0
    for n in UNTRUSTED_FIELDS:
        if template.count(marks[n]) != 1:
            raise ValueError(f"replay: the chat template does not show field {n!r} exactly once")
        head, rest = rest.split(marks[n], 1)
        pieces.append((head, True))
        pos += len(head)
        pieces.append((fields[n], False))
        spans[n] = (pos, pos + len(fields[n]))
        pos += len(fields[n])
    pieces.append((rest, True))
    return RenderedPrompt(tuple(pieces), spans)


def _backend(tok):
    return getattr(tok, "backend_tokenizer", None)


def plain_tokenizer(tok):
    """A copy of ``tok``'s fast tokenizer without its added (special or not) tokens.

    On text without added-token strings it gives exactly ``tok``'s ids, while ``"<|im_end|>"``
    comes out as plain characters. Built once per tokenizer and kept on it.

    Args:
        tok: A ``transformers`` fast tokenizer.

    Returns:
        A ``tokenizers.Tokenizer``, or None when ``tok`` is not a fast tokenizer.
"""
    plain = getattr(tok, "_ipi_plain_tokenizer", None)
    if plain is None and _backend(tok) is not None:
        import json

        from tokenizers import Tokenizer

        spec = json.loads(_backend(tok).to_str())
        spec["added_tokens"] = []
        spec["post_processor"] = None
        spec["truncation"] = None
        spec["padding"] = None
        plain = Tokenizer.from_str(json.dumps(spec))
        tok._ipi_plain_tokenizer = plain
    return plain


def plain_encode(tok, text: str, memo: dict | None = None) -> tuple[list[int], list[tuple[int, int]]]:
    """Tokenise untrusted ``text`` as plain characters: no special or added token can arise.

    Args:
        tok: A ``transformers`` tokenizer.
        text: Any text (a task, a thought, a page's element list, an injected string).
        memo: Optional ``{text: (ids, offsets)}`` owned by the caller for this one tokenizer;
            a hit returns the stored result, a miss is stored.

    Returns:
        ``(ids, offsets)``: token ids and their ``(start, end)`` character offsets in ``text``
        (lists the caller must not change when ``memo`` is given).
"""
    if not text:
        return [], []
    if memo is not None:
        hit = memo.get(text)
        if hit is None:
            hit = memo[text] = plain_encode(tok, text)
        return hit
    tok = getattr(tok, "tokenizer", tok)
    plain = plain_tokenizer(tok)
    if plain is not None:
        enc = plain.encode(text, add_special_tokens=False)
        return list(enc.ids), [tuple(o) for o in enc.offsets]
    # Slow tokenizer: its own switch (leaves non-special added tokens whole).
    enc = tok(text, add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def count_plain_tokens(tok, text: str) -> int:
    """Number of tokens of ``text`` tokenised as plain characters (:func:`plain_encode`)."""
    inner = getattr(tok, "tokenizer", tok)
    plain = plain_tokenizer(inner) if text else None
    if plain is not None:  # the count alone: no id/offset lists built
        return len(plain.encode(text, add_special_tokens=False))
    return len(plain_encode(tok, text)[0])


def _added_tokens(tok) -> dict[str, int]:
    table = getattr(tok, "_ipi_added_tokens", None)
    if table is None:
        table = {str(k): int(v) for k, v in tok.get_added_vocab().items()}
        tok._ipi_added_tokens = table
    return table


def _added_pattern(added: dict[str, int]) -> re.Pattern | None:
    """One regex matching any added token (longest first); compiled once per token table."""
    if not added:
        return None
    key = tuple(sorted(added, key=len, reverse=True))
    hit = _ADDED_PATTERNS.get(key)
    if hit is None:
        if len(_ADDED_PATTERNS) >= 8:
            _ADDED_PATTERNS.clear()
        hit = _ADDED_PATTERNS[key] = re.compile("|".join(re.escape(a) for a in key))
    return hit


_ADDED_PATTERNS: dict[tuple[str, ...], re.Pattern] = {}


def encode_prompt(tok, rendered: RenderedPrompt, *, image_pad: str | None = None, n_image_tokens: int = 0,
                  memo: dict | None = None) -> tuple[str, torch.Tensor, torch.Tensor, dict[str, tuple[int, int]]]:
    """Tokenise a rendered prompt: template special tokens as tokens, recorded fields as text.

    The prompt is cut at every added token of the trusted pieces; each stretch between two is
    tokenised by :func:`plain_encode`. Without added-token strings in the fields this equals
    ``tok(text)``; a field holding ``"<|im_end|>"`` stays text.

    Args:
        tok: A ``transformers`` tokenizer.
        rendered: From :func:`render_prompt`.
        image_pad: The image placeholder token; its one template occurrence becomes
            ``n_image_tokens`` copies.
        n_image_tokens: Image tokens of the screenshot (``grid.prod() // merge**2``).
        memo: Passed to :func:`plain_encode`.

    Returns:
        ``(text, input_ids [T], offsets [T, 2], spans)``: the expanded prompt, its ids and
        character offsets, and the field spans in the expanded text.
"""
    added = _added_tokens(tok)
    pattern = _added_pattern(added)
    # (text, is_special, copies): the image placeholder is one run of ``n_image_tokens`` copies, so
    # a screenshot's hundreds of image tokens cost one list extension, not one run each.
    runs: list[tuple[str, bool, int]] = []
    spans: dict[str, tuple[int, int]] = {}
    field_iter = iter(UNTRUSTED_FIELDS)
    pos = 0
    for text, trusted in rendered.pieces:
        if not trusted:
            name = next(field_iter)
            spans[name] = (pos, pos + len(text))
            runs.append((text, False, 1))
            pos += len(text)
            continue
        expand_at = text.find(image_pad) if image_pad else -1  # its first occurrence is the screenshot
        last = 0
        for m in (pattern.finditer(text) if pattern else ()):
            runs.append((text[last:m.start()], False, 1))
            copies = n_image_tokens if m.start() == expand_at and m.group() == image_pad else 1
            runs.append((m.group(), True, copies))
            if copies != 1:
                pos += len(image_pad) * (copies - 1)
            last = m.end()
        runs.append((text[last:], False, 1))
        pos += len(text)
    ids: list[int] = []
    offsets: list[tuple[int, int]] = []
    pos = 0
    buf, buf_at = [], 0

    def flush():
        chunk = "".join(buf)
        buf.clear()
        if not chunk:
            return
        i, o = plain_encode(tok, chunk, memo=memo)
        ids.extend(i)
        offsets.extend((a + buf_at, b + buf_at) for a, b in o)

    for text, special, copies in runs:
        if special:
            flush()
            n = len(text)
            ids.extend([added[text]] * copies)
            offsets.extend((pos + k * n, pos + (k + 1) * n) for k in range(copies))
            pos += n * copies
            buf_at = pos
        else:
            buf.append(text)
            pos += len(text)
    flush()
    full = "".join(t * c for t, _, c in runs)
    return full, torch.tensor(ids, dtype=torch.long), torch.tensor(offsets, dtype=torch.long).reshape(-1, 2), spans


def _tokens_in(offsets: torch.Tensor, span: tuple[int, int]) -> torch.Tensor:
    a, b = span
    if b <= a:
        return torch.zeros(0, dtype=torch.long)
    s, e = offsets[:, 0], offsets[:, 1]
    mask = (e > a) & (s < b) & (e > s)
    return torch.nonzero(mask, as_tuple=False).flatten()


def tokenise(processor, parts: PromptParts, image=None, *, image_size: dict | None = None,
             image_token_id: int | None = None, image_inputs: dict | None = None,
             memo: dict | None = None) -> TokenisedRow:
    """Render the chat template for one row, tokenise it and locate the token groups.

    Recorded text is untrusted and tokenised as plain characters (:func:`encode_prompt`;
    ``docs/replay.md``).

    Args:
        processor: A Qwen2.5-VL processor (or a text tokenizer with a chat template).
        parts: Prompt pieces; ``parts.has_image`` must agree with ``image``.
        image: PIL image of the (possibly altered) screenshot, or ``None`` for text-only.
        image_size: Pixel limits passed to the image processor as ``size``.
        image_token_id: Id of the image placeholder token (required with an image).
        image_inputs: The image processor's output for ``image`` (``pixel_values``,
            ``image_grid_thw``), shared by every variant showing the same screenshot.
        memo: Stretches already tokenised with this tokenizer (:func:`plain_encode`), shared
            by the variants of one step; None: no sharing.

    Returns:
        The tokenised row with token groups (PROTOCOL.md §3):
        ``last_prompt`` (the final prompt token before the gold action), ``image`` (image
        tokens), ``task``, ``observation`` (tool result + page text) and ``action`` (gold action).

    Raises:
        ValueError: The chat template lost a field, or the gold action is empty.
"""
    return _tokenise(processor, parts, image, image_size=image_size, image_token_id=image_token_id,
                     image_inputs=image_inputs, memo=memo)[0]


def _tokenise(processor, parts: PromptParts, image=None, *, image_size: dict | None = None,
              image_token_id: int | None = None, image_inputs: dict | None = None,
              memo: dict | None = None) -> tuple[TokenisedRow, torch.Tensor, dict[str, tuple[int, int]]]:
    """:func:`tokenise`, also returning the token offsets ``[T, 2]`` and the field spans."""
    rendered = render_prompt(processor, parts)
    tok = getattr(processor, "tokenizer", processor)
    has_image = image is not None or image_inputs is not None
    extra: dict[str, torch.Tensor] = {}
    if has_image:
        if image_inputs is None:
            out = processor.image_processor(images=[image], return_tensors="pt",
                                            **({"size": image_size} if image_size else {}))
            image_inputs = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
        merge = getattr(processor.image_processor, "merge_size", 2)
        grid = image_inputs["image_grid_thw"]
        n_image = int(grid.prod().item()) // (merge * merge)
        expanded, ids, offsets, spans = encode_prompt(tok, rendered, image_pad="<|image_pad|>",
                                                      n_image_tokens=n_image, memo=memo)
        if int((ids == image_token_id).sum()) != n_image:
            raise ValueError(f"replay: {int((ids == image_token_id).sum())} image tokens for {n_image} image features")
        extra = {"pixel_values": image_inputs["pixel_values"], "image_grid_thw": grid}
    else:
        expanded, ids, offsets, spans = encode_prompt(tok, rendered, memo=memo)
    if ids.numel() == 0 or int(offsets[-1, 1]) != len(expanded):
        raise ValueError("replay: tokenizer offsets do not cover the rendered prompt")
    enc: dict[str, torch.Tensor] = {"input_ids": ids[None], "attention_mask": torch.ones(1, ids.numel(), dtype=torch.long),
                                    **extra}
    if has_image:
        # Modality of each token (1 = image): Qwen2.5-VL needs it for its 3-D (M-RoPE) positions.
        enc["mm_token_type_ids"] = (enc["input_ids"] == image_token_id).to(torch.int32)
    action = _tokens_in(offsets, spans["gold"])
    if action.numel() == 0:
        raise ValueError("replay: empty gold action")
    prompt_len = int(action[0])
    obs = torch.cat([_tokens_in(offsets, spans["tool_result"]), _tokens_in(offsets, spans["element_text"])])
    groups = {
        "last_prompt": torch.tensor([prompt_len - 1]),
        "image": (torch.nonzero(ids == image_token_id).flatten() if has_image
                  else torch.zeros(0, dtype=torch.long)),
        "task": _tokens_in(offsets, spans["task"]),
        "observation": torch.unique(obs),
        "action": action,
    }
    return TokenisedRow(inputs=enc, groups=groups, prompt_len=prompt_len, seq_len=int(ids.numel())), offsets, spans


def generation_prompt(processor, parts: PromptParts, image=None, *, image_size: dict | None = None,
                      image_token_id: int | None = None, image_inputs: dict | None = None,
                      memo: dict | None = None) -> TokenisedRow:
    """The teacher-forced row cut before the gold action: the prompt the agent chose its action from.

    The row is tokenised exactly as :func:`tokenise` does (recorded fields as plain text, so a
    special-token string in a page, tool result or injection stays text), then cut at
    ``prompt_len``: every token before the first gold-action token, i.e. the prompt through
    ``<|im_start|>assistant\n``, which is the chat template's generation prompt. A free-run
    generation continues from here (:mod:`ipi.behaviour.generate`). Arguments as :func:`tokenise`;
    ``parts.gold`` must be the recorded turn (it is cut off, and only checked not to share a token
    with the prompt).

    Returns:
        A :class:`TokenisedRow` of ``prompt_len`` tokens: ``input_ids``, ``attention_mask`` (and
        ``mm_token_type_ids``) cut to ``[1, prompt_len]``, the image inputs unchanged; the token
        groups of the prompt (``action`` empty); ``seq_len == prompt_len``.

    Raises:
        ValueError: As :func:`tokenise`; or the last prompt token and the first gold token were
            merged by the tokenizer (the cut would drop prompt text).
    """
    row, offsets, spans = _tokenise(processor, parts, image, image_size=image_size, image_token_id=image_token_id,
                                    image_inputs=image_inputs, memo=memo)
    n = row.prompt_len
    if int(offsets[n, 0]) != spans["gold"][0]:
        raise ValueError("replay: the first gold-action token also holds prompt text; the prompt cannot be cut "
                         "before the action")
    inputs = {k: (v[:, :n] if k in ("input_ids", "attention_mask", "mm_token_type_ids") else v)
              for k, v in row.inputs.items()}
    groups = {g: idx[idx < n] for g, idx in row.groups.items()}
    return TokenisedRow(inputs=inputs, groups=groups, prompt_len=n, seq_len=n)
