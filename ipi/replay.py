"""Teacher-forced replay: the agent prompt of one step, tokenised, with its token groups located.

The prompt of a step (PROTOCOL.md §1, §3) is, through the processor's chat template::

    system:    <system prompt>
    user:      Task: <task>
               Previous actions: <history, one per line | none>
               <screenshot>
               Result of the previous action: <tool result>
               Page elements: <element text>
    assistant: Thought: <gold thought>  Action: <gold action>      (teacher-forced)

Token groups are located from the tokenised prompt: the character span of each segment in the
rendered template is found by sequential search, then mapped to tokens through the tokenizer's
offset mapping (image tokens by their token id). Nothing depends on hard-coded offsets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TOKEN_GROUPS: tuple[str, ...] = ("last_prompt", "image", "task", "observation", "action")

DEFAULT_SYSTEM_PROMPT = (
    "You are a web agent. Each turn you receive the task, your previous actions, a screenshot of "
    "the page with numerical labels on its elements, the result of your previous action and the "
    "page's elements. Reply with 'Thought: ...' then 'Action: ...', where the action is one of: "
    "Click [label]; Type [label]; [content]; Scroll [label or WINDOW]; [up or down]; Wait; "
    "GoBack; Google; ANSWER; [content]."
)


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


def build_messages(parts: PromptParts) -> tuple[list[dict], list[tuple[str, str]]]:
    """Build chat messages and the ordered list of segments to locate.

    Args:
        parts: The prompt pieces.

    Returns:
        ``(messages, segments)`` where segments are ``(name, text)`` in template order; names
        are ``task``, ``tool_result``, ``element_text``, ``gold``.
    """
    user: list[dict] = [
        {"type": "text", "text": f"Task: {parts.task}\nPrevious actions:\n{_history_text(parts.history)}\n"}
    ]
    if parts.has_image:
        user.append({"type": "image"})
    user.append(
        {
            "type": "text",
            "text": f"\nResult of the previous action:\n{parts.tool_result}\nPage elements:\n{parts.element_text}",
        }
    )
    messages = [
        {"role": "system", "content": [{"type": "text", "text": parts.system}]},
        {"role": "user", "content": user},
        {"role": "assistant", "content": [{"type": "text", "text": parts.gold}]},
    ]
    segments = [
        ("task", parts.task),
        ("tool_result", parts.tool_result),
        ("element_text", parts.element_text),
        ("gold", parts.gold),
    ]
    return messages, segments


def _locate(text: str, segments: list[tuple[str, str]], start: int) -> dict[str, tuple[int, int]]:
    spans: dict[str, tuple[int, int]] = {}
    cursor = start
    for name, seg in segments:
        if not seg:
            spans[name] = (cursor, cursor)
            continue
        i = text.find(seg, cursor)
        if i < 0:
            raise ValueError(f"replay: segment {name!r} not found in the rendered chat template")
        spans[name] = (i, i + len(seg))
        cursor = i + len(seg)
    return spans


def _tokens_in(offsets: torch.Tensor, span: tuple[int, int]) -> torch.Tensor:
    a, b = span
    if b <= a:
        return torch.zeros(0, dtype=torch.long)
    s, e = offsets[:, 0], offsets[:, 1]
    mask = (e > a) & (s < b) & (e > s)
    return torch.nonzero(mask, as_tuple=False).flatten()


def tokenise(processor, parts: PromptParts, image=None, *, image_size: dict | None = None,
             image_token_id: int | None = None, image_inputs: dict | None = None) -> TokenisedRow:
    """Render the chat template for one row, tokenise it and locate the token groups.

    Args:
        processor: A Qwen2.5-VL processor (or a text tokenizer with a chat template).
        parts: Prompt pieces; ``parts.has_image`` must agree with ``image``.
        image: PIL image of the (possibly altered) screenshot, or ``None`` for text-only.
        image_size: Pixel limits passed to the image processor as ``size``.
        image_token_id: Id of the image placeholder token (required with an image).
        image_inputs: The image processor's output for ``image`` (``pixel_values``,
            ``image_grid_thw``), computed once and shared by every variant showing the same
            screenshot; the image is then not processed again and only the text is tokenised
            (same ids and offsets as the processor's own call, checked in tests).

    Returns:
        The tokenised row with token groups (PROTOCOL.md §3):
        ``last_prompt`` (the final prompt token before the gold action), ``image`` (image
        tokens), ``task``, ``observation`` (tool result + page text) and ``action`` (gold action).

    Raises:
        ValueError: A segment cannot be located, or the gold action is empty.
    """
    messages, segments = build_messages(parts)
    text = processor.apply_chat_template(messages, tokenize=False)
    has_image = image is not None or image_inputs is not None
    if has_image:
        pad = "<|image_pad|>"
        merge = getattr(processor.image_processor, "merge_size", 2)
        if image_inputs is None:
            enc = processor(
                text=[text], images=[image], return_tensors="pt", return_offsets_mapping=True,
                images_kwargs={"size": image_size} if image_size else {},
            )
            grid = enc["image_grid_thw"]
            expanded = text.replace(pad, pad * (int(grid.prod().item()) // (merge * merge)), 1)
        else:
            grid = image_inputs["image_grid_thw"]
            expanded = text.replace(pad, pad * (int(grid.prod().item()) // (merge * merge)), 1)
            tok = getattr(processor, "tokenizer", processor)
            enc = dict(tok([expanded], return_tensors="pt", return_offsets_mapping=True))
            enc["pixel_values"] = image_inputs["pixel_values"]
            enc["image_grid_thw"] = grid
        # Modality of each token (1 = image): Qwen2.5-VL needs it for its 3-D (M-RoPE) positions.
        enc["mm_token_type_ids"] = (enc["input_ids"] == image_token_id).to(torch.int32)
    else:
        tok = getattr(processor, "tokenizer", processor)
        enc = tok([text], return_tensors="pt", return_offsets_mapping=True, add_special_tokens=False)
        expanded = text
    offsets = enc.pop("offset_mapping")[0]
    ids = enc["input_ids"][0]
    if int(offsets[-1, 1]) != len(expanded):
        raise ValueError("replay: tokenizer offsets do not cover the rendered prompt")
    # Segments live in the user and assistant turns: search after the system prompt.
    start = expanded.find(parts.system) + len(parts.system) if parts.system else 0
    spans = _locate(expanded, segments, start)
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
    return TokenisedRow(inputs=dict(enc), groups=groups, prompt_len=prompt_len, seq_len=int(ids.numel()))
