"""The detector stage of ``train.py``: build the configured detector, its inputs, and cross-fit it.

Every detector goes through :func:`ipi.detectors.crossfit.cross_fit`; what only some detectors
have are capabilities of the detector object, never a name check here (docs/detectors.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.utils import instantiate
from omegaconf import DictConfig

from ipi.detectors.attention import extract_attention, focus_ratios
from ipi.detectors.crossfit import CrossFit, cross_fit
from ipi.detectors.external import join_scores
from ipi.detectors.linear import LogisticDetector
from ipi.evaluation.scoretable import read_score_table
from ipi.probe.folds import TransferSource
from ipi.protocol import resolve_layers
from ipi.run.validation import to_container
from ipi.run.settings import extract_settings, probe_settings

log = logging.getLogger(__name__)

__all__ = ["FixedScores", "attention_layers", "attention_matrix", "build_detector", "detector_record",
           "fit_detector", "permutation_m"]

#: ``C`` of the C1 and collapse-only baselines of a detector without ``baseline_l2``.
BASELINE_L2 = 1.0


def build_detector(cfg: DictConfig):
    """The configured detector (``cfg.detector``; ``logistic`` when the node is absent).

    A detector configured by ``probe.*`` (it has ``with_probe``: the logistic probe) gets the
    probe's settings (:func:`ipi.run.settings.probe_settings`) and ``seed``."""
    node = cfg.get("detector")
    if node is None:
        det = LogisticDetector()
    else:
        kwargs = {k: v for k, v in to_container(node).items() if k != "_target_"}
        det = instantiate({"_target_": node._target_}, **kwargs)
    if hasattr(det, "with_probe"):
        det = det.with_probe(*probe_settings(cfg.probe, cfg.seed))
    return det


def permutation_m(cfg: DictConfig, det) -> int:
    """Refits M of verdict check 4 for ``det``: ``detector.permutation_m`` or ``evaluation.permutation.m``;
    0 for a detector that is not refitted here (``external``)."""
    if not getattr(det, "trainable", True):
        return 0
    m = getattr(det, "permutation_m", None)
    return int(cfg.evaluation.permutation.m if m is None else m)


def detector_record(cfg: DictConfig, det, fits=None) -> dict:
    """``run.detector`` of results.json: the detector's name, settings, and what it chose."""
    rec = {**det.settings(), "permutation_m": permutation_m(cfg, det),
           "permutation_refits": (det.null_refits_method if hasattr(det, "null_refits")
                                  else "direct refits of the detector" if getattr(det, "trainable", True)
                                  else "not run (external scores are not refitted)")}
    if fits is not None and hasattr(fits.fitted[0], "chosen_heads"):
        rec["chosen_heads"] = [f.chosen_heads() for f in fits.fitted]  # per fold
    return rec


def attention_layers(cfg: DictConfig, det, run_layers: list[int]) -> list[int]:
    """Decoder blocks the attention detector reads (``detector.layers`` or ``run_layers``, the run's)."""
    spec = det.layers
    if spec is None:
        return list(run_layers)
    spec = list(spec)
    return resolve_layers(spec, cfg.backbone.n_layers)


def attention_matrix(cfg: DictConfig, det, rows, run_layers: list[int]) -> tuple[np.ndarray, dict, object]:
    """Focus ratios ``[N, L * heads]`` of ``rows`` (extracted or read from the cache), the
    extraction info, and ``det`` with its layer indices and head count set; ``run_layers`` are
    the run's decoder blocks (:func:`attention_layers`)."""
    layers = attention_layers(cfg, det, run_layers)
    feats, info = extract_attention(extract_settings(cfg), rows, layers)
    li = [feats.layers.index(i) for i in layers]
    mass = feats.features[:, li].double().numpy()
    x = focus_ratios(mass, [r.variant.surface for r in rows])
    return x, info, replace(det, layer_indices=layers, n_heads=int(mass.shape[-1]))


def attention_transfer_source(cfg: DictConfig, det, surfaces: list[str], rows_of: Callable[[str], list],
                              run_layers: list[int]):
    """Clean/attack rows of the transfer surfaces in attention-focus features (PROTOCOL.md §6).

    Args:
        cfg: The run config.
        det: The attention detector.
        surfaces: The transfer source surfaces.
        rows_of: ``surface -> replay rows`` (:func:`ipi.run.stages.make_rows` of the run).
        run_layers: The run's decoder blocks.

    Returns:
        ``(TransferSource, {surface: attention extraction info})``.
    """
    metas, xs, infos = [], [], {}
    for s in surfaces:
        s_rows = rows_of(s)
        s_x, infos[s], _ = attention_matrix(cfg, det, s_rows, run_layers)
        metas.append(pd.DataFrame([r.metadata() for r in s_rows]))
        xs.append(s_x)
    return TransferSource.from_rows(pd.concat(metas, ignore_index=True), np.concatenate(xs)), infos


@dataclass
class FixedScores:
    """The external detector inside cross-fitting: ``x[:, 0]`` already holds each row's score."""

    name: str = "external"
    input: str = "table"
    trainable: bool = False

    def fit(self, x, y, groups):
        return self

    def score(self, x):
        return np.asarray(x, dtype=np.float64)[:, 0]


def external_matrix(det, meta: pd.DataFrame, folds) -> np.ndarray:
    """``[N, 1]``: the table's score on every test row of ``folds``, NaN on training-only rows."""

    test_ids = {t for _, te in folds for t in te}
    is_te = meta["trajectory_id"].astype(str).isin(test_ids).to_numpy()
    out = np.full((len(meta), 1), np.nan)
    out[is_te, 0] = join_scores(read_score_table(det.scores), meta.loc[is_te], str(det.scores))
    return out


def fit_detector(cfg: DictConfig, det, meta: pd.DataFrame, x: np.ndarray, folds, *, metadata=None, collapse=None,
                 transfer: TransferSource | None = None, baselines: bool = True, logger=None,
                 default_root_dir: str | Path | None = None) -> CrossFit:
    """Cross-fit ``det`` (:func:`ipi.detectors.crossfit.cross_fit`) as ``cfg.evaluation`` asks.

    ``baselines=False`` (the random twins, a transfer table's refits) runs the detector alone: no
    permuted refit and no permutation test. A detector that is not refitted (``external``) has no
    permuted, transfer or permutation refits: its table's scores enter as ``x[:, 0]``
    (:class:`FixedScores`). The baselines' ``C`` is the detector's ``baseline_l2`` when it has
    one (the logistic probe: ``probe.l2``), else :data:`BASELINE_L2`.
    """
    trainable = getattr(det, "trainable", True)
    if not trainable:
        x, det = external_matrix(det, meta, folds), FixedScores()
    refit = baselines and trainable
    return cross_fit(
        det, meta, x, folds, metadata=metadata, collapse=collapse,
        permuted=bool(cfg.evaluation.permuted) and refit, permute_seed=cfg.seed,
        transfer=transfer if trainable else None, l2=getattr(det, "baseline_l2", BASELINE_L2),
        permutation_m=permutation_m(cfg, det) if refit else 0,
        permutation_seed=cfg.evaluation.permutation.seed, logger=logger,
        default_root_dir=None if default_root_dir is None else str(default_root_dir))
