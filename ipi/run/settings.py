"""Typed settings built from the composed config: what the layers below ``ipi.run`` receive.

Each builder reads one piece of ``cfg`` once and returns a frozen dataclass defined beside the
code that uses it, so that no function outside :mod:`ipi.run` takes ``cfg`` (the schemas in
:mod:`ipi.run.schemas` hold every default; these builders copy values, never add defaults).
"""

from __future__ import annotations

from omegaconf import DictConfig

from ipi.extraction.forward import ExtractSettings
from ipi.probe.fit import ProbeConfig
from ipi.run.validation import enum_value, to_container
from ipi.run.schemas import ExtractConf

__all__ = ["extract_settings", "probe_settings"]


def extract_settings(cfg: DictConfig) -> ExtractSettings:
    """The extraction settings of a ``train``/``extract`` config (``backbone``, ``extract``, ``quiet``).

    The backbone node is resolved to plain data here (interpolations such as
    ``${paths.shared_dir}`` against the whole config), exactly as the cache key hashes it.
    """
    ex = cfg.extract
    return ExtractSettings(
        backbone=to_container(cfg.backbone), cache_dir=str(ex.cache_dir), layers=tuple(to_container(ex.layers) or ()),
        force=bool(ex.force), num_workers=to_container(ex.num_workers), shard_rows=int(ex.shard_rows),
        accelerator=str(ex.accelerator), devices=to_container(ex.devices), strategy=str(ex.strategy),
        precision=str(ex.precision), quiet=bool(cfg.quiet),
        prefix_reuse=to_container(ex.get("prefix_reuse", ExtractConf.prefix_reuse)),
        twins_per_pass=to_container(ex.get("twins_per_pass", ExtractConf.twins_per_pass)),
        over_context=enum_value(ex.over_context))


def probe_settings(probe: DictConfig, seed: int) -> tuple[ProbeConfig, list[float] | None]:
    """``(ProbeConfig, l2_grid)`` of ``cfg.probe`` (PROTOCOL.md §4; docs/probe.md).

    ``probe.l2: auto`` selects ``C`` by inner CV per fold over ``l2_grid`` (``ProbeConfig.l2`` is
    then 1.0, the baselines' ``C``); otherwise ``l2_grid`` is None.
    """
    auto_l2 = probe.l2 == "auto"
    return (ProbeConfig(l2=1.0 if auto_l2 else float(probe.l2), max_iter=probe.max_iter, tol=probe.tol, seed=seed,
                        solver=enum_value(probe.solver)),
            list(probe.l2_grid) if auto_l2 else None)
