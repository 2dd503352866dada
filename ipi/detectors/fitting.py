"""Cross-fitting any detector with the probe's baselines and permutation test (PROTOCOL.md §4–§7).

:func:`cross_fit_detector` is :func:`ipi.probe.crossfit.cross_fit` for a detector other than the
logistic probe: the same folds, the same training rows (clean/attack rows of the fold's training
trajectories), the same C1 and collapse-only baselines (which do not depend on the detector), the
permuted-label baseline and the transfer baseline as refits of **this** detector, and the exact
permutation test of verdict check 4 as M refits of this detector under the same
within-(trajectory, step) label permutations (one ``numpy.random.default_rng(permutation_seed)``
drawn replicate after replicate, as the probe's). The logistic probe's refits go through the dual
Newton solver (:mod:`ipi.probe.dual`); any other detector is refitted directly, so check 4 costs
``M × folds`` detector fits (docs/detectors.md gives the measured times).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from lightning import LightningModule
from torch import Tensor

from ipi.metrics.permutation import permute_within
from ipi.probe.crossfit import LABELLED, CrossFit, TransferSource, _table, check_folds
from ipi.probe.fit import fit_sklearn_reference
from ipi.probe.split import LeakageError, assert_rows_disjoint

__all__ = ["DetectorScores", "cross_fit_detector"]


def cross_fit_detector(
    detector,
    meta: pd.DataFrame,
    x: np.ndarray,
    folds: list[tuple[set[str], set[str]]],
    *,
    metadata: np.ndarray | None = None,
    collapse: np.ndarray | None = None,
    permuted: bool = False,
    permute_seed: int = 0,
    transfer: TransferSource | None = None,
    l2: float = 1.0,
    permutation_m: int = 0,
    permutation_seed: int = 0,
) -> CrossFit:
    """Fit ``detector`` and the baselines in every fold; score each fold's test rows.

    Args:
        detector: A :class:`ipi.detectors.detector.Detector` (unfitted; each fit returns a copy).
        meta: Row table ``[N]`` with ``trajectory_id, step, variant``.
        x: The detector's features ``[N, d]`` (hidden states or attention-focus ratios).
        folds: From :func:`ipi.probe.crossfit.make_folds` (checked again here).
        metadata: ``[N, 4]`` metadata scalars for C1 (PROTOCOL.md §5), or None.
        collapse: ``[N, L]`` collapse statistics for the collapse-only baseline, or None.
        permuted: Refit the detector on permuted training labels (``default_rng(permute_seed)``,
            one generator drawn fold after fold, as the probe's; PROTOCOL.md §6).
        permute_seed: Seed of that permutation.
        transfer: Other surfaces' clean/attack rows in the detector's own features, or None.
        l2: ``C`` of the scikit-learn baselines (C1, collapse-only).
        permutation_m: Refits M of the exact permutation test (0: not run).
        permutation_seed: Seed of its within-(trajectory, step) permutations.

    Returns:
        A :class:`ipi.probe.crossfit.CrossFit` whose ``probes`` are the fitted detectors, with
        ``test_scores`` ``[n_test]`` (the detector's out-of-fold scores of ``test_index``) set.

    Raises:
        LeakageError: A trajectory on both sides of a fold or a training row in the test set.
    """
    kind = "kfold" if len(folds) > 1 else "holdout"
    tid = meta["trajectory_id"].astype(str).to_numpy()
    check_folds(folds, tid, kind)
    variant = meta["variant"].to_numpy()
    labelled = np.isin(variant, LABELLED)
    n = len(meta)
    x = np.asarray(x)
    fold_of_row = np.full(n, -1, dtype=np.int64)
    names = [k for k, on in (("c1", metadata is not None), ("collapse_only", collapse is not None),
                             ("permuted", permuted), ("transfer", transfer is not None)) if on]
    base_scores = {k: np.full(n, np.nan) for k in names}
    main = np.full(n, np.nan)
    rng = np.random.default_rng(permute_seed)
    fitted, per_fold = [], []
    for k, (train_ids, test_ids) in enumerate(folds):
        is_tr = np.isin(tid, list(train_ids))
        is_te = np.isin(tid, list(test_ids))
        fit = is_tr & labelled
        assert_rows_disjoint(tid[fit], tid[is_te])
        fold_of_row[is_te] = k
        y = (variant[fit] == "attack").astype(np.int64)
        det = detector.fit(x[fit], y, tid[fit])
        fitted.append(det)
        main[is_te] = det.score(x[is_te])
        if metadata is not None:
            m = fit_sklearn_reference(metadata[fit], y, l2=l2)
            base_scores["c1"][is_te] = m.decision_function(metadata[is_te])
        if collapse is not None:
            m = fit_sklearn_reference(collapse[fit], y, l2=l2)
            base_scores["collapse_only"][is_te] = m.decision_function(collapse[is_te])
        if permuted:
            base_scores["permuted"][is_te] = detector.fit(x[fit], rng.permutation(y), tid[fit]).score(x[is_te])
        info = {"fold": k, "trajectories_train": len(train_ids), "trajectories_test": len(test_ids),
                "rows_train_labelled": int(fit.sum()), "rows_test": int(is_te.sum())}
        for key, val in (getattr(det, "fit_info_", None) or {}).items():
            info[f"detector_{key}"] = val
        if transfer is not None:
            src = np.isin(transfer.trajectory_id, list(train_ids))
            assert_rows_disjoint(transfer.trajectory_id[src], tid[is_te])
            tdet = detector.fit(transfer.x[src], transfer.y[src], transfer.trajectory_id[src])
            sel = is_te & labelled
            base_scores["transfer"][sel] = tdet.score(x[sel])
            info["rows_transfer_train"] = int(src.sum())
        per_fold.append(info)
    test_index = np.flatnonzero(fold_of_row >= 0)
    if kind == "kfold" and len(test_index) != n:
        raise LeakageError(f"kfold: {n - len(test_index)} rows were scored by no fold")
    null_scores, permutation = None, None
    if int(permutation_m) > 0:
        null_scores, permutation = _refit_null(detector, meta, x, folds, labelled, test_index, main,
                                               int(permutation_m), int(permutation_seed))
    baselines = {}
    for name, s in base_scores.items():
        idx = test_index[labelled[test_index]] if name == "transfer" else test_index
        if not np.isfinite(s[idx]).all():
            raise RuntimeError(f"cross_fit_detector: baseline {name!r} left rows unscored")
        baselines[name] = _table(meta, idx, s[idx])
    if not np.isfinite(main[test_index]).all():
        raise RuntimeError(f"detector={detector.name}: non-finite scores on {int((~np.isfinite(main[test_index])).sum())} test rows")
    out = CrossFit(folds=folds, fold_of_row=fold_of_row, probes=fitted, test_index=test_index,
                   baselines=baselines, per_fold=per_fold, null_scores=null_scores, permutation=permutation)
    out.test_scores = main[test_index]
    return out


def _refit_null(detector, meta, x, folds, labelled, test_index, main, m: int, seed: int):
    """M within-(trajectory, step) permuted-label refits of ``detector`` in every fold; ``[M, n_test]``.

    The permutations are drawn exactly as :func:`ipi.probe.crossfit._permutation_refits` draws
    them (same groups, same generator), so for one seed the probe and every detector face the
    same permuted labels.
    """
    t0 = time.perf_counter()
    tid = meta["trajectory_id"].astype(str).to_numpy()
    variant = meta["variant"].to_numpy()
    lab_idx = np.flatnonzero(labelled)
    y_lab = (variant[lab_idx] == "attack").astype(np.int64)
    groups, _ = pd.factorize(pd.Series(tid[lab_idx]) + "\x00" + meta["step"].to_numpy()[lab_idx].astype(str))
    pos_in_test = np.full(len(meta), -1, dtype=np.int64)
    pos_in_test[test_index] = np.arange(len(test_index))
    plan = []
    for train_ids, test_ids in folds:
        fit = lab_idx[np.isin(tid[lab_idx], list(train_ids))]
        te = lab_idx[np.isin(tid[lab_idx], list(test_ids))]
        assert_rows_disjoint(tid[fit], tid[te])
        plan.append((np.searchsorted(lab_idx, fit), fit, te))
    null = np.full((m, len(test_index)), np.nan)
    refit = np.full(len(test_index), np.nan)
    for _, _, te in plan:
        refit[pos_in_test[te]] = main[te]  # the refit procedure on the true labels is the detector's own fit
    rng = np.random.default_rng(seed)
    for j in range(m):
        y_perm = permute_within(groups, y_lab, rng)
        for sel, fit, te in plan:
            null[j, pos_in_test[te]] = detector.fit(x[fit], y_perm[sel], tid[fit]).score(x[te])
    info = {"refit_scores": refit, "seed": seed,
            "unit": "attack/clean labels permuted within each training (trajectory, step)",
            "design": f"detector={detector.name}: {m} direct refits × {len(folds)} fold(s)",
            "seconds": round(time.perf_counter() - t0, 3)}
    return null, info


class DetectorScores(LightningModule):
    """Hands precomputed out-of-fold detector scores to ``Trainer.predict`` (so the estimands
    and report callbacks run unchanged). Batches are ``(index [n] int64,)`` into ``scores``."""

    def __init__(self, scores: Sequence[float]):
        super().__init__()
        self.register_buffer("scores", torch.as_tensor(np.asarray(scores, dtype=np.float64)))

    def predict_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        (idx,) = batch
        return self.scores[idx]
