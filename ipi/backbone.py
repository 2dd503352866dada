"""Frozen backbones: building them from config and finding their decoder layers.

A backbone is a ``(model, processor)`` pair. ``model`` is used frozen (``eval()``,
``requires_grad_(False)``) and only up to its deepest chosen decoder layer; the LM head is never
computed. Layers are found by inspecting the module tree (the longest ``nn.ModuleList`` of
decoder blocks), not by a hard-coded attribute path, because transformers moves them between
versions (Qwen2.5-VL keeps them under ``model.language_model.layers``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class Backbone:
    """A frozen backbone and what replay needs to drive it.

    Attributes:
        name: Config name, e.g. ``tiny_qwen2_5_vl``.
        model: The frozen model (``...ForConditionalGeneration`` or ``...ForCausalLM``).
        processor: The HF processor (multimodal) or tokenizer (text-only).
        layers: The decoder blocks, in depth order.
        hidden_size: Width of the residual stream.
        multimodal: Whether the backbone reads the screenshot.
        image_token_id: Token id of an image placeholder token (``None`` if text-only).
        identity: JSON-able description of everything about the backbone that changes the
            numbers (model id/revision or config+seed, dtype, pixel limits); part of the cache key.
        image_size: ``{"shortest_edge": min_pixels, "longest_edge": max_pixels}`` for the
            image processor (total pixel counts), or ``None``.
    """

    name: str
    model: nn.Module
    processor: Any
    layers: nn.ModuleList
    hidden_size: int
    multimodal: bool
    image_token_id: int | None
    identity: dict
    image_size: dict | None = None

    @property
    def n_layers(self) -> int:
        """Number of decoder blocks."""
        return len(self.layers)

    @property
    def tokenizer(self):
        """The text tokenizer (the processor's, or the processor itself if text-only)."""
        return getattr(self.processor, "tokenizer", self.processor)


def find_decoder_layers(model: nn.Module) -> nn.ModuleList:
    """Return the decoder blocks of a causal LM by inspecting its modules.

    The decoder stack is the ``nn.ModuleList`` whose parent also owns the final norm and whose
    name ends in ``layers`` and that is not part of a vision tower; among candidates the longest
    wins.

    Args:
        model: Any transformers causal / vision-language model.

    Returns:
        The ``nn.ModuleList`` of decoder blocks.

    Raises:
        ValueError: No candidate list was found.
    """
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.ModuleList) or not name.endswith("layers"):
            continue
        if "visual" in name or "vision" in name:
            continue
        cand = (len(mod), name, mod)
        if best is None or cand[0] > best[0]:
            best = cand
    if best is None:
        raise ValueError(f"no decoder layer list found in {type(model).__name__}")
    return best[2]


def _freeze(model: nn.Module) -> nn.Module:
    model.eval()
    model.requires_grad_(False)
    return model


QUANTIZATIONS: tuple[str, ...] = ("none", "int8", "nf4")


def quantization_config(quantization: str, compute_dtype: str = "bfloat16"):
    """transformers' ``BitsAndBytesConfig`` for ``backbone.quantization``.

    ``int8`` is LLM.int8() (8-bit weights, outliers in fp16); ``nf4`` is 4-bit NormalFloat with
    double quantisation and ``compute_dtype`` matmuls (QLoRA's recipe). The vision tower's
    patch embedding (a Conv3d) is never quantised by bitsandbytes, which only replaces
    ``nn.Linear`` layers.

    Args:
        quantization: ``none`` | ``int8`` | ``nf4``.
        compute_dtype: dtype of the 4-bit matmuls.

    Returns:
        ``None`` for ``none``, else a ``BitsAndBytesConfig``.

    Raises:
        ValueError: Unknown quantization name.
    """
    quantization = getattr(quantization, "value", quantization)
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"backbone.quantization={quantization!r}; allowed: {', '.join(QUANTIZATIONS)}")
    if quantization == "none":
        return None
    from transformers import BitsAndBytesConfig

    if quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=getattr(torch, compute_dtype))


def _quantised_device_map(device_map):
    """Where a quantised model is loaded: this process's GPU under DDP, else ``device_map``."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "LOCAL_RANK" in os.environ:
        return {"": int(os.environ["LOCAL_RANK"])}
    return device_map if device_map is not None else "auto"


def build_tiny_qwen2_5_vl(
    processor_path: str,
    *,
    text: dict,
    vision: dict,
    seed: int = 0,
    image_size: dict | None = None,
    quantization: str = "none",
    name: str = "tiny_qwen2_5_vl",
) -> Backbone:
    """Build the real ``Qwen2_5_VLForConditionalGeneration`` class from a small config.

    Weights are random but seeded, so features are reproducible; the processor (tokenizer and
    image processor) is the real Qwen2.5-VL one, so token ids and image-token counts are real.

    Args:
        processor_path: Folder with the Qwen2.5-VL processor files.
        text: Keyword arguments of the text config (hidden_size, num_hidden_layers, ...).
        vision: Keyword arguments of the vision config (depth, hidden_size, ...).
        seed: Seed of the random weights.
        image_size: Pixel limits ``{"shortest_edge", "longest_edge"}`` (total pixels).
        quantization: Must be ``none``: bitsandbytes quantises checkpoints as they are loaded,
            and the tiny model is built, not loaded.
        name: Backbone name recorded in results.

    Returns:
        The frozen backbone.

    Raises:
        ValueError: ``quantization`` is not ``none``.
    """
    from transformers import AutoProcessor, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    quantization = getattr(quantization, "value", quantization)
    if quantization != "none":
        raise ValueError(f"backbone={name}: quantization={quantization} needs a pretrained checkpoint "
                         "(backbone=qwen2_5_vl_7b or qwen2_5_vl_3b); the tiny backbone is fp32 only")

    processor = AutoProcessor.from_pretrained(processor_path)
    tok = processor.tokenizer
    text = dict(text)
    text.setdefault("vocab_size", len(tok))
    ids = {
        "image_token_id": tok.convert_tokens_to_ids("<|image_pad|>"),
        "video_token_id": tok.convert_tokens_to_ids("<|video_pad|>"),
        "vision_start_token_id": tok.convert_tokens_to_ids("<|vision_start|>"),
        "vision_end_token_id": tok.convert_tokens_to_ids("<|vision_end|>"),
    }
    config = Qwen2_5_VLConfig(text_config=text, vision_config=dict(vision), **ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(config)
    _freeze(model)
    layers = find_decoder_layers(model)
    return Backbone(
        name=name,
        model=model,
        processor=processor,
        layers=layers,
        hidden_size=int(config.text_config.hidden_size),
        multimodal=True,
        image_token_id=ids["image_token_id"],
        identity={
            "kind": "tiny_qwen2_5_vl",
            "text": text,
            "vision": dict(vision),
            "seed": seed,
            "processor": os.path.abspath(processor_path),
            "image_size": image_size,
        },
        image_size=image_size,
    )


def build_pretrained_qwen2_5_vl(
    model_id: str,
    *,
    processor_path: str | None = None,
    revision: str | None = None,
    dtype: str = "bfloat16",
    image_size: dict | None = None,
    device_map: str | dict | None = "auto",
    trust_remote_code: bool = False,
    local_files_only: bool | None = None,
    quantization: str = "none",
    name: str = "qwen2_5_vl",
) -> Backbone:
    """Load a pretrained Qwen2.5-VL checkpoint (e.g. ``Qwen/Qwen2.5-VL-7B-Instruct``), frozen.

    This is the path GPU users run. Nothing is downloaded when ``HF_HUB_OFFLINE=1`` or
    ``local_files_only`` is true: the checkpoint must then be in the local HF cache or be a
    local folder.

    Args:
        model_id: Hub id or local folder of the checkpoint.
        processor_path: Processor folder (defaults to ``model_id``).
        revision: Hub revision (commit) to pin.
        dtype: ``bfloat16`` | ``float16`` | ``float32``.
        image_size: Pixel limits for the image processor.
        device_map: Passed to ``from_pretrained`` (``"auto"`` spreads over visible GPUs).
        trust_remote_code: Passed to ``from_pretrained``; off by default.
        local_files_only: Forbid downloads (default: ``HF_HUB_OFFLINE`` env var).
        quantization: ``none`` | ``int8`` | ``nf4`` (:func:`quantization_config`). A quantised
            model is loaded in place on the GPU(s) through ``device_map`` (``"auto"`` when
            ``device_map`` is null; this rank's GPU under DDP) and never moved with ``.to()``
            afterwards: the extractor leaves it out of Lightning's device placement. Needs
            ``pip install .[quant]`` (bitsandbytes, accelerate) and a CUDA GPU.
        name: Backbone name recorded in results.

    Returns:
        The frozen backbone.

    Raises:
        ValueError: Unknown quantization.
    """
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    if local_files_only is None:
        local_files_only = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false")
    kw = dict(revision=revision, trust_remote_code=trust_remote_code, local_files_only=local_files_only)
    processor = AutoProcessor.from_pretrained(processor_path or model_id, **kw)
    qconf = quantization_config(quantization, compute_dtype=dtype)
    if qconf is not None:
        kw["quantization_config"] = qconf
        device_map = _quantised_device_map(device_map)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        model_id, dtype=getattr(torch, dtype), device_map=device_map, **kw
    )
    _freeze(model)
    layers = find_decoder_layers(model)
    tok = processor.tokenizer
    return Backbone(
        name=name,
        model=model,
        processor=processor,
        layers=layers,
        hidden_size=int(model.config.text_config.hidden_size),
        multimodal=True,
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        identity={
            "kind": "pretrained_qwen2_5_vl",
            "model_id": model_id,
            "revision": revision,
            "dtype": dtype,
            "quantization": getattr(quantization, "value", quantization),
            "image_size": image_size,
        },
        image_size=image_size,
    )
