"""The detector stage of ``train.py``: build the configured detector, its inputs, and cross-fit it.

``detector=logistic`` keeps the probe's own path (:func:`ipi.probe.crossfit.cross_fit` and the
dual-solver permutation test), so its numbers are those of the probe before detectors existed;
every other detector goes through :func:`ipi.detectors.fitting.cross_fit_detector`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from hydra.utils import instantiate
from omegaconf import DictConfig

from ipi.detectors.attention import extract_attention, focus_ratios
from ipi.detectors.fitting import cross_fit_detector
from ipi.detectors.external import join_scores
from ipi.detectors.linear import LogisticDetector
from ipi.evaluation.scoretable import read_score_table
from ipi.probe.crossfit import TransferSource
from ipi.protocol import resolve_layers
from ipi.run.config import to_container
from ipi.run.settings import extract_settings

log = logging.getLogger(__name__)

__all__ = ["FixedScores", "attention_layers", "attention_matrix", "build_detector", "detector_record",
           "fit_detector", "permutation_m"]


def build_detector(cfg: DictConfig):
    """The configured detector (``cfg.detector``; ``logistic`` when the node is absent)."""
    node = cfg.get("detector")
    if node is None:
        det = LogisticDetector()
    else:
        kwargs = {k: v for k, v in to_container(node).items() if k != "_target_"}
        det = instantiate({"_target_": node._target_}, **kwargs)
    if det.name == "logistic":
        l2 = cfg.probe.l2
        det = replace(det, l2=l2, max_iter=cfg.probe.max_iter, tol=cfg.probe.tol, seed=cfg.seed)
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
           "permutation_refits": ("dual Newton solver (exact, cheap)" if det.name == "logistic"
                                  else "direct refits of the detector" if getattr(det, "trainable", True)
                                  else "not run (external scores are not refitted)")}
    if det.name == "attention_focus" and fits is not None:
        rec["chosen_heads"] = [f.chosen_heads() for f in fits.probes]  # per fold
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


def fit_detector(cfg: DictConfig, det, meta: pd.DataFrame, x: np.ndarray, folds, *, metadata, collapse,
                 transfer: TransferSource | None, l2: float):
    """Cross-fit a non-logistic detector with the baselines (see :func:`cross_fit_detector`)."""
    trainable = getattr(det, "trainable", True)
    if not trainable:
        x, det = external_matrix(det, meta, folds), FixedScores()
    return cross_fit_detector(
        det, meta, x, folds, metadata=metadata, collapse=collapse,
        permuted=cfg.evaluation.permuted and trainable, permute_seed=cfg.seed,
        transfer=transfer if trainable else None, l2=l2,
        permutation_m=permutation_m(cfg, det) if trainable else 0,
        permutation_seed=cfg.evaluation.permutation.seed)
