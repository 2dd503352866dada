"""Frozen backbones: building them from config and finding their decoder layers.

A backbone is a ``(model, processor)`` pair, used frozen and only up to its deepest chosen
decoder layer; the LM head is never computed. Layers are found by inspecting the module tree
(:func:`find_decoder_layers`), not by a hard-coded attribute path."""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch import nn

from ipi.io import local_content_digest


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
        depth: Decoder blocks of the architecture; differs from ``len(layers)`` when blocks
            above the deepest one read were not built (``max_layer`` of the builders).
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
    depth: int | None = None

    @property
    def n_layers(self) -> int:
        """Number of decoder blocks of the architecture (also those left unbuilt by ``max_layer``)."""
        return int(self.depth) if self.depth is not None else len(self.layers)

    @property
    def tokenizer(self):
        """The text tokenizer (the processor's, or the processor itself if text-only)."""
        return getattr(self.processor, "tokenizer", self.processor)

    @property
    def pad_token_id(self) -> int:
        """The id rows are padded with in a batch: the tokenizer's pad token, else its end-of-sequence token."""
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


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


def keep_decoder_layers(model: nn.Module, n_keep: int | None) -> nn.ModuleList:
    """Drop the decoder blocks above the first ``n_keep`` (in place); return the kept blocks.

    The kept blocks are the same module objects, so their weights and features are unchanged.

    Args:
        model: A model with a decoder stack (:func:`find_decoder_layers`).
        n_keep: Blocks to keep (``max_layer + 1``), or None to keep all.

    Returns:
        The (possibly shortened) ``nn.ModuleList`` of decoder blocks.

    Raises:
        ValueError: ``n_keep`` is not in ``1 .. depth``.
"""
    layers = find_decoder_layers(model)
    if n_keep is None or int(n_keep) == len(layers):
        return layers
    if not 1 <= int(n_keep) <= len(layers):
        raise ValueError(f"max_layer={int(n_keep) - 1} is outside the model's {len(layers)} decoder blocks")
    name = next(n for n, m in model.named_modules() if m is layers)
    parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    kept = nn.ModuleList(list(layers)[: int(n_keep)])
    setattr(parent, name.rpartition(".")[2], kept)
    return kept


@lru_cache(maxsize=16)
def _pretrained(auto_class: str, path: str, items: tuple, content: str | None = None):
    import transformers

    return getattr(transformers, auto_class).from_pretrained(path, **dict(items))


def load_pretrained(auto_class: str, path: str | os.PathLike, **kwargs):
    """``transformers.<auto_class>.from_pretrained(path, **kwargs)``, loaded once per process.

    A local folder is remembered by its content (:func:`ipi.io.local_content_digest`), so
    changed files are loaded again. What is loaded (processors, tokenizers) is only read, never changed.
"""
    local = os.path.isdir(str(path))
    return _pretrained(auto_class, os.path.abspath(path) if local else str(path), tuple(sorted(kwargs.items())),
                       local_content_digest(path) if local else None)


def load_processor(path: str | os.PathLike, **kwargs):
    """``AutoProcessor.from_pretrained(path, **kwargs)``, loaded once per process (:func:`load_pretrained`)."""
    return load_pretrained("AutoProcessor", path, **kwargs)


def build_kwargs(loader, *, max_layer: int | None = None, with_lm_head: bool = False) -> dict:
    """Keyword arguments for ``instantiate(loader, **kwargs)`` that the loader's builder accepts.

    ``max_layer`` and ``with_lm_head`` change what is built, never the weights of what runs, and
    are not part of the loader node (so not of the cache key).

    Args:
        loader: The ``backbone.loader`` config node (``_target_`` = a builder).
        max_layer: Deepest decoder block the caller reads; blocks above it are not kept.
        with_lm_head: Build the ``...ForConditionalGeneration`` class with its LM head; else
            the base model.

    Returns:
        The keyword arguments.
"""
    from hydra.utils import get_method

    params = inspect.signature(get_method(loader["_target_"])).parameters
    kw = {}
    if max_layer is not None and "max_layer" in params:
        kw["max_layer"] = int(max_layer)
    if "with_lm_head" in params:
        kw["with_lm_head"] = bool(with_lm_head)
    return kw


def build_backbone(loader, *, max_layer: int | None = None, with_lm_head: bool = False) -> Backbone:
    """``instantiate(loader, **build_kwargs(loader, ...))`` (:func:`build_kwargs`).

    Returns:
        The backbone.
    """
    from hydra.utils import instantiate

    return instantiate(loader, **build_kwargs(loader, max_layer=max_layer, with_lm_head=with_lm_head))


def random_init_from_config(model_cls, config, seed: int, dtype: torch.dtype | None = None) -> nn.Module:
    """The architecture of ``config`` with its own seeded random initialisation (a "random twin").

    ``model_cls._from_config(config)`` runs transformers' ``_init_weights`` for every module,
    under ``torch.random.fork_rng`` seeded with ``seed`` and on the CPU, so the weights depend
    only on ``seed``, the config and the transformers/torch versions.

    Args:
        model_cls: A transformers model class, e.g. ``LlamaForCausalLM``.
        config: Its ``PretrainedConfig``.
        seed: Seed of the random weights.
        dtype: Parameter dtype (e.g. ``torch.bfloat16``), or None for the default float32.

    Returns:
        The model (not yet frozen).
"""
    kwargs = {"dtype": dtype} if dtype is not None else {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return model_cls._from_config(config, **kwargs)


def weight_seed(name: str, seed: int, random_init_seed: int | None) -> tuple[int, int | None]:
    """``(seed the weights are drawn with, seed of the backbone it is a twin of or None)``: a random
    twin (``random_init_seed``) draws its own weights.

    Raises:
        ValueError: ``random_init_seed == seed`` (the twin would be the backbone itself).
    """
    if random_init_seed is None:
        return seed, None
    if int(random_init_seed) == int(seed):
        raise ValueError(f"backbone={name}: the random twin's seed ({random_init_seed}) equals the backbone's "
                         "weight seed; choose other evaluation.random_twin_seeds")
    return int(random_init_seed), int(seed)


def _freeze(model: nn.Module) -> nn.Module:
    model.eval()
    model.requires_grad_(False)
    return model


QUANTIZATIONS: tuple[str, ...] = ("none", "int8", "nf4")


def quantization_config(quantization: str, compute_dtype: str = "bfloat16"):
    """transformers' ``BitsAndBytesConfig`` for ``backbone.quantization``.

    ``int8`` is LLM.int8(); ``nf4`` is 4-bit NormalFloat with double quantisation and
    ``compute_dtype`` matmuls. Only ``nn.Linear`` layers are quantised.

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


def qwen2_5_vl_config(tok, text: dict, vision: dict):
    """A ``Qwen2_5_VLConfig`` of the given text and vision configs, its special-token ids read from ``tok``."""
    from transformers import Qwen2_5_VLConfig

    ids = {f"{k}_token_id": tok.convert_tokens_to_ids(f"<|{v}|>") for k, v in (
        ("image", "image_pad"), ("video", "video_pad"), ("vision_start", "vision_start"), ("vision_end", "vision_end"))}
    return Qwen2_5_VLConfig(text_config=dict(text), vision_config=dict(vision), **ids)


def _tiny_qwen2_5_vl_config(processor_path: str, *, text: dict, vision: dict, **_):
    """The ``Qwen2_5_VLConfig`` :func:`build_tiny_qwen2_5_vl` builds its model from (no weights)."""
    tok = load_processor(processor_path).tokenizer
    return qwen2_5_vl_config(tok, {"vocab_size": len(tok), **dict(text)}, vision)


def build_tiny_qwen2_5_vl(
    processor_path: str,
    *,
    text: dict,
    vision: dict,
    seed: int = 0,
    image_size: dict | None = None,
    quantization: str = "none",
    name: str = "tiny_qwen2_5_vl",
    random_init_seed: int | None = None,
    max_layer: int | None = None,
    with_lm_head: bool = False,
) -> Backbone:
    """Build the real Qwen2.5-VL architecture from a small config, with seeded random weights.

    The processor is the real Qwen2.5-VL one, so token ids and image-token counts are real.

    Args:
        processor_path: Folder with the Qwen2.5-VL processor files.
        text: Keyword arguments of the text config (hidden_size, num_hidden_layers, ...).
        vision: Keyword arguments of the vision config (depth, hidden_size, ...).
        seed: Seed of the random weights.
        image_size: Pixel limits ``{"shortest_edge", "longest_edge"}`` (total pixels).
        quantization: Must be ``none`` (the tiny model is built, not loaded).
        name: Backbone name recorded in results.
        random_init_seed: Build the random-weight twin (docs/backbones.md) with this seed in
            place of ``seed``; it must differ from ``seed``.
        max_layer: Keep only decoder blocks ``0..max_layer`` (:func:`keep_decoder_layers`);
            all blocks are initialised first, so every kept weight is the same as with all
            blocks. None: keep all.
        with_lm_head: Build ``Qwen2_5_VLForConditionalGeneration``; default False builds
            ``Qwen2_5_VLModel``, whose weights under the same seed are bit-identical (the head
            is initialised last).

    Returns:
        The frozen backbone.

    Raises:
        ValueError: ``quantization`` is not ``none``, or ``random_init_seed == seed``.
"""
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLModel

    seed, twin_of = weight_seed(name, seed, random_init_seed)
    quantization = getattr(quantization, "value", quantization)
    if quantization != "none":
        raise ValueError(f"backbone={name}: quantization={quantization} needs a pretrained checkpoint "
                         "(backbone=qwen2_5_vl_7b or qwen2_5_vl_3b); the tiny backbone is fp32 only")

    processor = load_processor(processor_path)
    config = _tiny_qwen2_5_vl_config(processor_path, text=text, vision=vision)
    text = {**dict(text), "vocab_size": config.text_config.vocab_size}
    model_cls = Qwen2_5_VLForConditionalGeneration if with_lm_head else Qwen2_5_VLModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    _freeze(model)
    layers = keep_decoder_layers(model, None if max_layer is None else int(max_layer) + 1)
    return Backbone(
        name=name,
        model=model,
        processor=processor,
        layers=layers,
        hidden_size=int(config.text_config.hidden_size),
        multimodal=True,
        image_token_id=int(config.image_token_id),
        identity={
            "kind": "tiny_qwen2_5_vl",
            "text": text,
            "vision": dict(vision),
            "seed": seed,
            "processor": os.path.abspath(processor_path),
            "image_size": image_size,
            **({"random_twin_of_seed": twin_of} if twin_of is not None else {}),
        },
        image_size=image_size,
        depth=int(config.text_config.num_hidden_layers),
    )


def resolve_attn_implementation(attn_implementation: str | None, dtype: str = "bfloat16") -> str | None:
    """``backbone.loader.attn_implementation``: ``auto`` -> FlashAttention-2 where it can run.

    FlashAttention-2 needs the ``flash_attn`` package, a CUDA GPU and a 16-bit dtype; otherwise
    ``auto`` gives ``sdpa`` (PyTorch's fused attention). Other values pass through unchanged.
    """
    if attn_implementation != "auto":
        return attn_implementation
    import importlib.util

    if (importlib.util.find_spec("flash_attn") is not None and torch.cuda.is_available()
            and dtype in ("bfloat16", "float16")):
        return "flash_attention_2"
    return "sdpa"


def _pretrained_config_kwargs(revision=None, trust_remote_code=False, local_files_only=None) -> dict:
    if local_files_only is None:
        local_files_only = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false")
    return dict(revision=revision, trust_remote_code=trust_remote_code, local_files_only=local_files_only)


def _pretrained_qwen2_5_vl_config(model_id: str, *, revision: str | None = None, trust_remote_code: bool = False,
                                  local_files_only: bool | None = None, **_):
    """The checkpoint's config (``config.json`` only, no weights) of :func:`build_pretrained_qwen2_5_vl`."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_id, **_pretrained_config_kwargs(revision, trust_remote_code,
                                                                            local_files_only))


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
    attn_implementation: str | None = "auto",
    random_init_seed: int | None = None,
    max_layer: int | None = None,
    with_lm_head: bool = False,
) -> Backbone:
    """Load a pretrained Qwen2.5-VL checkpoint (e.g. ``Qwen/Qwen2.5-VL-7B-Instruct``), frozen.

    Nothing is downloaded when ``HF_HUB_OFFLINE=1`` or ``local_files_only`` is true.

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
            model is loaded in place through ``device_map`` (``"auto"`` when null; this rank's
            GPU under DDP) and never moved with ``.to()``. Needs ``pip install .[quant]`` and a
            CUDA GPU.
        name: Backbone name recorded in results.
        attn_implementation: ``auto`` (:func:`resolve_attn_implementation`) or any value
            transformers accepts; None: transformers' default. The twin uses the same one.
        random_init_seed: Build the random-weight twin instead (docs/backbones.md;
            :func:`random_init_from_config` on the checkpoint's ``config.json``, in ``dtype``).
            Quantisation does not apply to the twin.
        max_layer: Keep only decoder blocks ``0..max_layer`` (a checkpoint is loaded with a
            shortened config; a twin is initialised whole, then shortened). None: keep all.
        with_lm_head: Load ``Qwen2_5_VLForConditionalGeneration`` with the LM head; default
            False loads ``Qwen2_5_VLModel``.

    Returns:
        The frozen backbone.

    Raises:
        ValueError: Unknown quantization.
"""
    from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLModel

    kw = _pretrained_config_kwargs(revision, trust_remote_code, local_files_only)
    processor = load_processor(processor_path or model_id, **kw)
    attn = resolve_attn_implementation(attn_implementation, dtype)
    if attn is not None:
        kw["attn_implementation"] = attn
    model_cls = Qwen2_5_VLForConditionalGeneration if with_lm_head else Qwen2_5_VLModel
    depth = None
    if random_init_seed is not None:
        config = AutoConfig.from_pretrained(model_id, **kw)
        depth = int(config.text_config.num_hidden_layers)
        model = random_init_from_config(model_cls, config, int(random_init_seed), dtype=getattr(torch, dtype))
        quantization = "none"
        layers = keep_decoder_layers(model, None if max_layer is None else int(max_layer) + 1)
    else:
        qconf = quantization_config(quantization, compute_dtype=dtype)
        if qconf is not None:
            kw["quantization_config"] = qconf
            device_map = _quantised_device_map(device_map)
        if max_layer is not None:  # load only blocks 0..max_layer
            config = AutoConfig.from_pretrained(model_id, **{k: v for k, v in kw.items() if k != "quantization_config"})
            depth = int(config.text_config.num_hidden_layers)
            if int(max_layer) + 1 > depth:
                raise ValueError(f"max_layer={int(max_layer)} is outside the model's {depth} decoder blocks")
            _shorten_text_config(config.text_config, int(max_layer) + 1)
            kw["config"] = config
        model = _quiet_from_pretrained(model_cls, model_id, dtype=getattr(torch, dtype), device_map=device_map, **kw)
        layers = find_decoder_layers(model)
    _freeze(model)
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
            **({"random_init_seed": int(random_init_seed)} if random_init_seed is not None else {}),
        },
        image_size=image_size,
        depth=depth,
    )


build_tiny_qwen2_5_vl.model_config = _tiny_qwen2_5_vl_config
build_pretrained_qwen2_5_vl.model_config = _pretrained_qwen2_5_vl_config


def model_config(loader):
    """The transformers config a ``backbone.loader`` node builds its model from, without any weights.

    The builder names its config reader as ``<builder>.model_config``; a wrapping builder
    (:func:`ipi.backbone_planted.build_planted`) reads its ``base`` node's.

    Args:
        loader: The ``backbone.loader`` node, resolved.

    Returns:
        A ``transformers.PretrainedConfig``.

    Raises:
        ValueError: The builder has no config reader.
"""
    from hydra.utils import get_method
    from omegaconf import DictConfig, OmegaConf

    node = OmegaConf.to_container(loader, resolve=True) if isinstance(loader, DictConfig) else dict(loader)
    target = node.get("_target_")
    reader = getattr(get_method(target), "model_config", None) if target else None
    if reader is None:
        raise ValueError(f"backbone.loader._target_={target}: the builder names no model_config reader, so the "
                         "backbone's context length cannot be read before building it")
    return reader(**{k: v for k, v in node.items() if not k.startswith("_")})


def context_positions(config) -> int:
    """Token positions a model was built for: ``max_position_embeddings`` of its (text) config.

    Args:
        config: A transformers config; a vision-language one's ``text_config`` is read.

    Returns:
        The number of positions (RoPE models run past it without an error, on positions never trained).
    """
    text = getattr(config, "text_config", None) or config
    return int(text.max_position_embeddings)


def _shorten_text_config(text_config, n_keep: int) -> None:
    """Set a decoder config to its first ``n_keep`` blocks (``num_hidden_layers``, ``layer_types``)."""
    text_config.num_hidden_layers = n_keep
    if getattr(text_config, "layer_types", None):
        text_config.layer_types = list(text_config.layer_types)[:n_keep]


def _quiet_from_pretrained(model_cls, model_id, **kwargs):
    """``model_cls.from_pretrained`` without transformers' report of the checkpoint weights left
    unread on purpose (the LM head, the blocks above ``max_layer``)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return model_cls.from_pretrained(model_id, **kwargs)
    finally:
        hf_logging.set_verbosity(level)
