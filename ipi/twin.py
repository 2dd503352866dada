"""The random-weight twin of a backbone: the selectivity baseline of verdict check 6.

A probe result says something about a model only relative to the same probe on an untrained
twin (control tasks and selectivity, Hewitt & Liang 2019; random-initialisation baselines):
token identity alone (gibberish sub-words vs English words, the attack bank's vocabulary vs the
benign bank's) can separate attacks from nuisance-matched controls in a network with random
weights, which cannot read malicious intent. The twin is the same architecture and config as
the run's backbone, with the architecture's own seeded random initialisation
(:func:`ipi.backbone.random_init_from_config`), the same processor/tokenizer and the same rows;
its features get their own activation-cache entry (the loader node, which the cache key
hashes, carries ``random_init_seed``), and the same probe is fitted on the same folds.
See docs/backbones.md and docs/estimands.md.
"""

from __future__ import annotations

import copy

from omegaconf import DictConfig, open_dict

__all__ = ["twin_config", "twin_description"]


def twin_config(cfg: DictConfig) -> DictConfig:
    """A copy of the run config whose backbone is the random-weight twin.

    Only ``backbone.loader`` changes: it gains ``random_init_seed = evaluation.random_twin_seed``,
    which every backbone builder (:func:`ipi.backbone.build_tiny_qwen2_5_vl`,
    :func:`ipi.backbone.build_pretrained_qwen2_5_vl`,
    :func:`ipi.backbone_text.build_gguf_causal_lm`) takes as "build this architecture from its
    config with seeded random weights". Because the cache key hashes the loader node, the twin's
    features have their own cache entry; everything else (rows, layers, token groups, processor,
    system prompt, batch size, cache dtype) is the run's.

    Args:
        cfg: Composed ``train``/``extract`` config.

    Returns:
        The twin's config (a new object; ``cfg`` is untouched).

    Raises:
        ValueError: The loader node has no ``_target_`` (not a builder), or the tiny backbone's
            own weight seed equals the twin seed.
    """
    twin = copy.deepcopy(cfg)
    loader = twin.backbone.loader
    if not isinstance(loader, DictConfig) or "_target_" not in loader:
        raise ValueError(f"backbone={cfg.backbone.name}: backbone.loader has no _target_; "
                         "the random twin needs a builder node")
    seed = int(cfg.evaluation.random_twin_seed)
    if "seed" in loader and loader.seed is not None and int(loader.seed) == seed:
        raise ValueError(f"evaluation.random_twin_seed={seed} equals backbone.loader.seed of backbone="
                         f"{cfg.backbone.name}: the twin would be the backbone itself; choose another seed")
    with open_dict(loader):
        loader.random_init_seed = seed
    return twin


def twin_description(cfg: DictConfig) -> dict:
    """What results.json records about the twin (``random_twin.twin``).

    Returns:
        ``{"backbone", "seed", "init", "backbone_pretrained"}``.
    """
    return {
        "backbone": cfg.backbone.name,
        "seed": int(cfg.evaluation.random_twin_seed),
        "init": "the architecture's own initialisation (from_config -> post_init -> _init_weights) "
                "under torch.manual_seed(seed), same config, processor and rows",
        "backbone_pretrained": bool(cfg.backbone.pretrained),
    }
