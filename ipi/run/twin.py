"""The random-weight twin of a backbone: the selectivity baseline of verdict check 6.

Token identity alone can separate attacks from nuisance-matched controls in a network with
random weights (control tasks and selectivity, Hewitt & Liang 2019). The twin is the run's
backbone architecture and config with its own seeded random initialisation
(:func:`ipi.backbone.random_init_from_config`), the same processor and rows, its own
activation-cache entry, and the same probe fitted on the same folds. See docs/backbones.md and
docs/estimands.md."""

from __future__ import annotations

import copy

from omegaconf import DictConfig, OmegaConf, open_dict

from ipi.run.schemas import BackboneConf, EvaluationConf

__all__ = ["backbone_weights", "twin_config", "twin_description", "twin_seeds", "twins_on"]


def backbone_weights(cfg: DictConfig) -> str:
    """What the run's backbone's own weights are: ``"constructed"`` (``backbone.constructed``: a
    planted-truth backbone), ``"pretrained"`` or ``"random"`` (results.json ``run.backbone_weights``)."""
    if bool(cfg.backbone.get("constructed", BackboneConf.constructed)):
        return "constructed"
    return "pretrained" if bool(cfg.backbone.pretrained) else "random"


def twins_on(cfg: DictConfig) -> bool:
    """Whether the run extracts random-weight twins: ``evaluation.random_twin`` true, false or
    ``auto`` (the default: on for a pretrained or constructed backbone; off for a backbone whose
    own weights are random, whose claim check 6 caps at "separates" whatever the twins say).

    Raises:
        ValueError: Any other value.
    """
    v = cfg.evaluation.get("random_twin", EvaluationConf.random_twin)
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    if text == "auto":
        return backbone_weights(cfg) != "random"
    raise ValueError(f"evaluation.random_twin={v!r}; allowed: true, false, auto")


def twin_seeds(cfg: DictConfig) -> list[int]:
    """``evaluation.random_twin_seeds`` as ints (empty when the twins are off: :func:`twins_on`).

    Raises:
        ValueError: The list is empty, repeats a seed, or holds a seed equal to the tiny
            backbone's own weight seed (``backbone.loader.seed``).
    """
    if not twins_on(cfg):
        return []
    seeds = [int(s) for s in cfg.evaluation.random_twin_seeds]
    if not seeds:
        raise ValueError("evaluation.random_twin_seeds is empty: give at least one seed, e.g. [1, 2, 3], "
                         "or set evaluation.random_twin=false")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"evaluation.random_twin_seeds={seeds} repeats a seed: each twin must be another draw")
    loader = cfg.backbone.get("loader")
    if isinstance(loader, DictConfig) and isinstance(loader.get("base"), DictConfig):  # a constructed backbone
        loader = loader.base
    own = loader.get("seed") if isinstance(loader, DictConfig) else None
    if own is not None and int(own) in seeds:
        raise ValueError(f"evaluation.random_twin_seeds={seeds} holds backbone.loader.seed={int(own)} of backbone="
                         f"{cfg.backbone.name}: that twin would be the backbone itself; choose other seeds")
    return seeds


def twin_config(cfg: DictConfig, seed: int) -> DictConfig:
    """A copy of the run config whose backbone is the random-weight twin of seed ``seed``.

    Only ``backbone.loader`` changes: it gains ``random_init_seed = seed``; for a constructed
    backbone (:mod:`ipi.backbone_planted`) the loader becomes ``base`` and ``backbone.name`` the
    architecture's name. The cache key hashes the loader node, so the twin has its own cache
    entry; everything else is the run's.

    Args:
        cfg: Composed ``train``/``extract`` config.
        seed: The twin's torch seed.

    Returns:
        The twin's config (a new object; ``cfg`` is untouched).

    Raises:
        ValueError: The loader node has no ``_target_`` (not a builder), or the tiny backbone's
            own weight seed equals the twin seed.
"""
    twin = copy.deepcopy(cfg)
    loader = twin.backbone.loader
    if isinstance(loader, DictConfig) and "plant" in loader and isinstance(loader.get("base"), DictConfig):
        # A constructed backbone (ipi.backbone_planted): its twin is the architecture without the
        # plant, named as that architecture, so every planted kind (and the plain architecture)
        # shares one twin cache entry per seed.
        with open_dict(twin.backbone):
            twin.backbone.loader = OmegaConf.create(OmegaConf.to_container(loader.base, resolve=True))
            twin.backbone.name = str(twin.backbone.loader.get("name", cfg.backbone.name))
            twin.backbone.constructed = False
        loader = twin.backbone.loader
    if not isinstance(loader, DictConfig) or "_target_" not in loader:
        raise ValueError(f"backbone={cfg.backbone.name}: backbone.loader has no _target_; "
                         "the random twin needs a builder node")
    seed = int(seed)
    if "seed" in loader and loader.seed is not None and int(loader.seed) == seed:
        raise ValueError(f"random twin seed {seed} (evaluation.random_twin_seeds) equals backbone.loader.seed of "
                         f"backbone={cfg.backbone.name}: the twin would be the backbone itself; choose another seed")
    with open_dict(loader):
        loader.random_init_seed = seed
    return twin


def twin_description(cfg: DictConfig) -> dict:
    """What results.json records about the twins (``run.random_twin``).

    Returns:
        ``{"backbone", "seeds", "init", "backbone_pretrained", "backbone_weights"}``.
    """
    return {
        "backbone": cfg.backbone.name,
        "seeds": twin_seeds(cfg),
        "init": "the architecture's own initialisation (from_config -> post_init -> _init_weights) "
                "under torch.manual_seed(seed), same config, processor and rows",
        "backbone_pretrained": bool(cfg.backbone.pretrained),
        "backbone_weights": backbone_weights(cfg),
    }
