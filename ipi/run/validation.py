"""Cross-field rules of a composed config, checked before any work (one line, no torch imported).

The schemas (:mod:`ipi.run.schemas`) type each config group; the rules here read several groups
at once (the surface's class and name, controls that do not apply to the surface, a text-only
backbone with image inputs, layer specs, the attack source, the behaviour stage, DDP in a
sweep). :class:`ipi.run.hydra_callbacks.ConfigCheck` runs :func:`validate` on every job's
composed config before any job starts."""

from __future__ import annotations

from enum import Enum
from typing import Any

from hydra.utils import get_method
from omegaconf import DictConfig, ListConfig, OmegaConf

from ipi.extraction.prefix_reuse import resolve_prefix_reuse
from ipi.protocol import check_layer_spec, check_surface
from ipi.run.schemas import BackboneConf, EvaluationConf, ExtractConf, SplitConf, TrainConf
from ipi.run.twin import twin_seeds, twins_on
from ipi.surfaces.registry import register, surface_class, surface_names
from ipi.surfaces.surface import Surface


def enum_value(x) -> str:
    """The plain string of a config value that may be an enum member (``SplitKind.kfold`` -> ``"kfold"``)."""
    return x.value if isinstance(x, Enum) else str(x)


def run_surface(cfg: DictConfig) -> Surface:
    """The run's surface object: the class ``surface._target_`` names, registered and checked.

    A surface whose config file lies outside ``conf/surface`` (a Hydra searchpath entry) joins
    the registry here (:func:`ipi.surfaces.registry.register`), so the rest of the run finds it
    by name.

    Raises:
        ValueError: No ``_target_``, a class that cannot be imported or is no ``Surface``,
            ``surface.name`` that is not the class's name, or a declaration outside the
            protocol's vocabulary; one line naming the allowed surfaces.
    """
    node = cfg.surface
    name = enum_value(node.name)
    target = None if OmegaConf.is_missing(node, "_target_") else node.get("_target_")
    allowed = f"choose surface=<name>, one of: {', '.join(surface_names())}"
    if not target:
        raise ValueError(f"surface={name}: no _target_ naming the surface's class (docs/surfaces.md); {allowed}")
    try:
        cls = surface_class(target, "surface")
    except ValueError as e:
        raise ValueError(f"{e}; {allowed}") from None
    candidate = cls()
    candidate.check()
    check_surface(candidate)  # the protocol's vocabulary, before the class joins the registry
    surface = register(cls, "surface")
    if surface.name != name:
        raise ValueError(f"surface.name={name} is not the name of surface._target_={target} "
                         f"({surface.name}); {allowed}")
    return surface


def resolved_controls(cfg: DictConfig) -> list[str]:
    """The controls a run builds: the configured list, or all that apply to the surface.

    Raises:
        ValueError: A configured control does not apply to the surface (one line naming both),
            or the surface itself is wrong (:func:`run_surface`).
    """
    surface = run_surface(cfg)
    allowed = surface.controls
    if cfg.control.names is None:
        return list(allowed)
    names = [enum_value(c) for c in cfg.control.names]
    for c in names:
        if c not in allowed:
            raise ValueError(
                f"control={c} does not apply to surface={surface.name}; allowed: {', '.join(allowed)}"
            )
    return names


def check_known_keys(cfg: DictConfig, schema: type | None = None) -> None:
    """Refuse keys the schema does not have, including ones appended with Hydra's ``+key=value``.

    Hydra rejects ``evaluation.n_bootstrap=10`` (not in the schema) but suggests
    ``+evaluation.n_bootstrap=10``, which it accepts; the run would then ignore the setting
    silently. Open nodes (``backbone.loader``, the detector settings) still take new keys.

    Raises:
        ValueError: One line naming the unknown key and the keys its node allows.
    """
    import dataclasses

    from omegaconf.errors import ConfigKeyError

    schema = schema or TrainConf
    try:
        given = OmegaConf.to_container(cfg, resolve=False)
        given.pop("hydra", None)  # Hydra's own node, present in callbacks
        OmegaConf.merge(OmegaConf.structured(schema), given)
    except ConfigKeyError as e:
        node = e.object_type
        allowed = ", ".join(f.name for f in dataclasses.fields(node)) if dataclasses.is_dataclass(node) else "?"
        raise ValueError(f"{e.full_key}: unknown setting (a '+' override adds keys the run never reads); "
                         f"{getattr(node, '__name__', 'this node')} allows: {allowed}") from None


def validate(cfg: DictConfig) -> None:
    """Cross-field checks that a schema cannot express; each error is one line.

    Raises:
        ValueError: Inapplicable control, layer fraction outside (0, 1], ``image`` token group on
            a text-only backbone, or a non-positive bootstrap count.
    """
    check_known_keys(cfg)
    resolved_controls(cfg)
    resolve_prefix_reuse(cfg.extract.get("prefix_reuse", ExtractConf.prefix_reuse))
    check_layer_spec(cfg.layers.spec, cfg.backbone.n_layers, where="layers.spec", backbone=cfg.backbone.name)
    groups = [enum_value(g) for g in cfg.token_group.names]
    if not groups:
        raise ValueError("token_group.names: empty; choose e.g. token_group=five")
    if not cfg.backbone.multimodal and "image" in groups:
        raise ValueError(
            f"token_group: 'image' is unavailable with the text-only backbone={cfg.backbone.name}; "
            "choose one of last_prompt, task, observation, action"
        )
    surface = run_surface(cfg)
    if not cfg.backbone.multimodal and surface.needs_image:
        raise ValueError(f"surface={surface.name} needs a multimodal backbone; backbone={cfg.backbone.name} is text-only")
    l2 = cfg.probe.l2
    if not (l2 == "auto" or (isinstance(l2, (int, float)) and not isinstance(l2, bool) and l2 > 0)):
        raise ValueError(f"probe.l2: {l2!r} is neither a positive number (scikit-learn's C) nor 'auto'")
    if l2 == "auto" and (not cfg.probe.l2_grid or min(cfg.probe.l2_grid) <= 0):
        raise ValueError("probe.l2_grid: give positive C values for probe.l2=auto")
    if cfg.split.repeats < 1:
        raise ValueError(f"split.repeats must be >= 1, got {cfg.split.repeats}")
    if cfg.evaluation.n_boot < 1:
        raise ValueError("evaluation.n_boot must be >= 1")
    if cfg.evaluation.min_clusters < 1:
        raise ValueError(f"evaluation.min_clusters must be >= 1, got {cfg.evaluation.min_clusters}")
    if cfg.evaluation.permutation.m < 0:
        raise ValueError(f"evaluation.permutation.m must be >= 0 (0 = not run), got {cfg.evaluation.permutation.m}")
    if not 0.0 < cfg.evaluation.permutation.alpha < 1.0:
        raise ValueError(f"evaluation.permutation.alpha must be in (0, 1), got {cfg.evaluation.permutation.alpha}")
    multi = uses_ddp(cfg)
    if multi and cfg.evaluation.transfer:
        raise ValueError(
            "extract.devices>1 (DDP) extracts one surface per launch: run `python extract.py surface=<s> "
            "evaluation.transfer=false extract.devices=N` for each surface, then train on one device; "
            "or set evaluation.transfer=false"
        )
    if cfg.evaluation.get("random_twin_seed") is not None:
        old = to_container(cfg.evaluation.random_twin_seed)
        seeds = ",".join(str(x) for x in (old if isinstance(old, list) else [old]))
        raise ValueError(
            f"evaluation.random_twin_seed={old} was replaced by "
            "evaluation.random_twin_seeds, a list (one twin per seed; check 6 needs the backbone to beat every "
            f"one): use evaluation.random_twin_seeds=[{seeds}] or more seeds, e.g. "
            "[1,2,3] (docs/estimands.md)"
        )
    if twins_on(cfg):  # true | false | auto, checked
        twin_seeds(cfg)  # non-empty, distinct, not the backbone's own seed
    if multi and twins_on(cfg):
        seeds = list(cfg.evaluation.random_twin_seeds)
        raise ValueError(
            "extract.devices>1 (DDP) extracts one cache entry per launch: run `python extract.py surface=<s> "
            "evaluation.transfer=false evaluation.random_twin=false extract.devices=N`, then each twin's entry "
            f"(seeds {seeds}) with `+backbone.loader.random_init_seed=<seed>` added, then train on one device; "
            "or set evaluation.random_twin=false"
        )
    if not 0.0 < cfg.evaluation.get("min_boot_fraction", EvaluationConf.min_boot_fraction) <= 1.0:
        raise ValueError(f"evaluation.min_boot_fraction must be in (0, 1], got {cfg.evaluation.min_boot_fraction}")
    if not 0.0 <= cfg.evaluation.operating_fpr < 1.0:
        raise ValueError(f"evaluation.operating_fpr must be in [0, 1), got {cfg.evaluation.operating_fpr}")
    if not 0.0 < cfg.evaluation.level < 1.0:
        raise ValueError(f"evaluation.level must be in (0, 1), got {cfg.evaluation.level}")
    target = cfg.data.importer.get("_target_") if isinstance(cfg.data.get("importer"), DictConfig) else None
    try:
        get_method(target)
    except Exception:  # noqa: BLE001 - hydra raises ImportError/ValueError/TypeError by case
        raise ValueError(f"data.importer._target_={target!r} (data={cfg.data.kind}): no such importer function; "
                         "see conf/data/*.yaml and docs/data.md") from None
    if cfg.data.max_trajectories is not None and cfg.data.max_trajectories < 1:
        raise ValueError(f"data.max_trajectories must be >= 1 or null, got {cfg.data.max_trajectories}")
    kind = enum_value(cfg.split.kind)
    if kind == "holdout":
        if cfg.split.get("k") is not None:
            raise ValueError(f"split.k={cfg.split.k} does not apply to split=holdout (it sets the folds of "
                             "split=kfold); use split=kfold split.k=N, or split.test_fraction for the holdout")
        if cfg.split.get("test_fraction") is None or not 0.0 < cfg.split.test_fraction < 1.0:
            raise ValueError(f"split.test_fraction must be in (0, 1) for split=holdout, got {cfg.split.get('test_fraction')}")
    else:
        if cfg.split.get("test_fraction") is not None:
            raise ValueError(f"split.test_fraction={cfg.split.test_fraction} does not apply to split=kfold (every "
                             "trajectory is tested once); use split.k=N folds, or split=holdout")
        if cfg.split.get("k") is None or cfg.split.k < 2:
            raise ValueError(f"split.k must be >= 2 for split=kfold, got {cfg.split.get('k')}")
    if "attack" in cfg:
        _validate_attack(cfg)
    if cfg.get("behaviour") is not None and cfg.behaviour.enabled:
        _validate_behaviour(cfg)
    if cfg.split.get("min_per_side", SplitConf.min_per_side) < 1:
        raise ValueError(f"split.min_per_side must be >= 1, got {cfg.split.min_per_side}")
    loader = cfg.backbone.get("loader")
    quant = enum_value(cfg.backbone.get("quantization", BackboneConf.quantization))
    if quant != "none" and isinstance(loader, (DictConfig, dict)) and "quantization" not in loader:
        raise ValueError(f"backbone.quantization={quant} does not apply to backbone={cfg.backbone.name} "
                         "(its loader takes no quantization); remove the override")
    if not cfg.backbone.multimodal and cfg.backbone.get("image_size") is not None:
        raise ValueError(f"backbone.image_size does not apply to the text-only backbone={cfg.backbone.name}; "
                         "remove the override")


def _validate_attack(cfg: DictConfig) -> None:
    """The attack source and ``split.wording`` (one line each; reads the source's data, no torch)."""
    from ipi.attacks.pool import pool_from_config
    from ipi.attacks.source import AttackSourceError

    try:
        pool = pool_from_config(cfg.attack)
    except AttackSourceError as e:
        raise ValueError(str(e)) from None
    if enum_value(cfg.split.get("wording", SplitConf.wording)) == "source":
        n = len(pool.sources)
        if not cfg.evaluation.heldout_wording:
            raise ValueError("split.wording=source holds out wording: it needs evaluation.heldout_wording=true")
        if n < 2:
            raise ValueError(f"split.wording=source needs >= 2 attack sources; attack={pool.name} has "
                             f"{n} ({', '.join(pool.sources)}); use attack=mix")
        if enum_value(cfg.split.kind) != "kfold" or cfg.split.get("k") != n:
            raise ValueError(f"split.wording=source: one fold per attack source of attack={pool.name} "
                             f"({', '.join(sorted(pool.sources))}); use split=kfold split.k={n}")


#: Loaders that always build a causal LM (an LM head) and take no ``with_lm_head``.
CAUSAL_LM_LOADERS = ("ipi.backbone_text.build_gguf_causal_lm",)


def behaviour_variants(cfg: DictConfig) -> list[str]:
    """The variants the behaviour stage generates and labels: ``behaviour.variants``, or every
    variant of the run (``attack``, ``clean``, its controls) when null.

    Raises:
        ValueError: A variant the run does not build, or no ``attack`` (one line).
    """
    built = ["attack", "clean", *resolved_controls(cfg)]
    given = cfg.behaviour.get("variants")
    if given is None:
        return built
    names = [str(v) for v in given]
    bad = [v for v in names if v not in built]
    if bad:
        raise ValueError(f"behaviour.variants: {bad} not among the run's variants ({', '.join(built)})")
    if "attack" not in names:
        raise ValueError("behaviour.variants must hold attack (E4 and the ablation read the attack rows)")
    return list(dict.fromkeys(names))


def _validate_behaviour(cfg: DictConfig) -> None:
    """``behaviour.*`` of a run with ``behaviour.enabled`` (one line each; no torch).

    Raises:
        ValueError: Bounds below 1, bad variants, a backbone loader that cannot build an LM head,
            an ablation with a detector other than the linear probe or on a layer the probe does
            not read.
    """
    import inspect

    b = cfg.behaviour
    for name in ("max_new_tokens", "batch_size"):
        if int(b[name]) < 1:
            raise ValueError(f"behaviour.{name} must be >= 1, got {b[name]}")
    behaviour_variants(cfg)
    loader = cfg.backbone.get("loader")
    target = loader.get("_target_") if isinstance(loader, (DictConfig, dict)) else None
    try:
        params = inspect.signature(get_method(target)).parameters
    except Exception:  # noqa: BLE001 - hydra raises ImportError/ValueError/TypeError by case
        params = {}
    if target not in CAUSAL_LM_LOADERS and "with_lm_head" not in params:
        raise ValueError(f"behaviour.enabled: backbone={cfg.backbone.name} (loader {target}) cannot build its LM head, "
                         "so it cannot generate; use a backbone that generates or behaviour.enabled=false")
    if b.ablation.enabled:
        det = cfg.get("detector")
        det_name = enum_value(det.get("name", "logistic")) if isinstance(det, (DictConfig, dict)) else "logistic"
        if det_name != "logistic":
            raise ValueError(f"behaviour.ablation needs the linear probe's direction (detector=logistic), not "
                             f"detector={det_name}; set behaviour.ablation.enabled=false")
        if b.ablation.layers is not None:
            from ipi.protocol import resolve_layers

            check_layer_spec(list(b.ablation.layers), cfg.backbone.n_layers, where="behaviour.ablation.layers",
                             backbone=cfg.backbone.name)
            probe_layers = resolve_layers(list(cfg.layers.spec), cfg.backbone.n_layers)
            at = resolve_layers(list(b.ablation.layers), cfg.backbone.n_layers)
            outside = [k for k in at if k not in probe_layers]
            if not at or outside:
                raise ValueError(f"behaviour.ablation.layers: blocks {outside or at} are not among the probe's "
                                 f"layers {probe_layers} (layers={cfg.layers.name}); null takes all of them")


def uses_ddp(cfg: DictConfig) -> bool:
    """Whether ``extract.devices`` asks for more than one device (DDP extraction)."""
    devices = cfg.extract.devices
    if isinstance(devices, str):
        devices = devices.strip()
        if devices.lstrip("-").isdigit():
            devices = int(devices)
        elif devices == "auto":
            return False
        else:
            devices = [d for d in devices.split(",") if d.strip()]
    return (isinstance(devices, int) and (devices > 1 or devices == -1)) or \
        (isinstance(devices, (list, ListConfig)) and len(devices) > 1)


#: The one-line reason a sweep refuses DDP (checked at composition: ipi.run.hydra_callbacks).
DDP_IN_SWEEP = (
    "extract.devices>1 (DDP) inside a -m sweep: Lightning's DDP launcher re-runs the whole command "
    "in every extra process, so each would run the whole sweep again; instead extract each surface "
    "with DDP first (`python extract.py surface=<s> evaluation.transfer=false extract.devices=N`), "
    "then run the sweep on one device (docs/sweeps.md)"
)


def validate_sweep_job(cfg: DictConfig) -> None:
    """Rules for a job of a ``-m`` sweep, on top of :func:`validate`.

    Raises:
        ValueError: ``extract.devices`` > 1 (:data:`DDP_IN_SWEEP`).
    """
    if uses_ddp(cfg):
        raise ValueError(DDP_IN_SWEEP)


def to_container(node) -> Any:
    """Resolve an OmegaConf node to plain Python (enums as their values)."""
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    return node
