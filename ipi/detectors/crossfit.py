"""One cross-fit for every detector: its fits and baselines per split fold, scored out of fold
(PROTOCOL.md §4–§7).

:func:`cross_fit` serves both split designs of PROTOCOL.md §4 (:func:`ipi.probe.folds.make_folds`):
``holdout`` (one fold; the test trajectories scored once) and ``kfold`` (grouped K-fold: every
trajectory gets out-of-fold scores from a model that never saw it; ``docs/probe.md``). In every
fold the same training rows fit the detector and every baseline; leakage is asserted per fold on
trajectory ids and on the rows fed to each fit.

The :class:`~ipi.detectors.detector.Detector` protocol (``fit``, ``score``) is the only seam;
optional capabilities are methods of the detector object (docs/detectors.md, "One cross-fit,
capabilities instead of special cases"):

* ``tune(x, y, groups, fold) -> (detector, info)``: per-fold hyper-parameter selection on the
  fold's training rows; the tuned detector makes every fit of that fold.
* ``fit_logged(x, y, groups, *, logger, default_root_dir)``: the main fit of a fold with a
  Lightning logger (holdout only) and root directory.
* ``null_refits(x_fit, y, y_perm, x_test) -> (refit [n_te], null [M, n_te], design)``: all M
  permuted-label refits of a fold at once (:mod:`ipi.probe.dual`); without it, check 4's null
  is ``M × folds`` direct refits."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from lightning import LightningModule
from torch import Tensor

from ipi.metrics.permutation import permute_within
from ipi.probe.fit import fit_sklearn_reference
from ipi.probe.folds import LABELLED, TransferSource, check_folds, score_table
from ipi.probe.split import LeakageError, assert_rows_disjoint

__all__ = ["CrossFit", "DetectorScores", "cross_fit"]


@dataclass
class CrossFit:
    """Fitted per-fold detectors, their out-of-fold scores and the baseline score tables.

    Attributes:
        folds: ``[(train_ids, test_ids)]`` as used.
        fold_of_row: ``[N]`` fold whose test set holds each row (``-1``: never scored, i.e. a
            holdout training row).
        fitted: The fitted detector of each fold (for the logistic probe, ``fitted[k].probe_`` is
            fold ``k``'s :class:`~ipi.probe.module.LinearProbe`).
        test_index: ``[n_test]`` row indices scored out of fold, ascending (the row order of
            every score table).
        test_scores: ``[n_test]`` float64 scores of the ``test_index`` rows, each by its fold's
            fitted detector.
        baselines: Out-of-fold score tables (``trajectory_id, step, variant, score``) by name:
            ``c1``, ``collapse_only``, ``permuted``, ``transfer`` (those that ran).
        per_fold: One dict per fold: train/test trajectory and row counts, what ``tune`` chose
            (e.g. ``l2``, ``l2_inner_cv_auc``) and the detector's ``fit_info_`` (``detector_*``).
        null_scores: ``[M, n_test]`` scores of the ``test_index`` rows by the M permuted-label
            refits of the exact permutation test (PROTOCOL.md §7.4; ``nan`` on control rows,
            which E1 does not use), or None when it did not run.
        permutation: Facts of the permutation refits (``refit_scores`` ``[n_test]``: the same
            refit procedure on the true labels; ``seed``, ``unit``, ``design``, ``seconds``),
            the ``permutation=`` argument of :func:`ipi.metrics.compare_tables` together with
            ``null_scores``; None when it did not run.
    """

    folds: list
    fold_of_row: np.ndarray
    fitted: list
    test_index: np.ndarray
    test_scores: np.ndarray
    baselines: dict[str, pd.DataFrame] = field(default_factory=dict)
    per_fold: list[dict] = field(default_factory=list)
    null_scores: np.ndarray | None = None
    permutation: dict | None = None

    def permutation_input(self) -> dict | None:
        """``permutation=`` of :func:`ipi.metrics.compare_tables` (None when not run)."""
        if self.null_scores is None:
            return None
        return {**self.permutation, "null_scores": self.null_scores}

    def score_table(self, meta: pd.DataFrame) -> pd.DataFrame:
        """The detector's out-of-fold score table (``trajectory_id, step, variant, score``)."""
        return score_table(meta, self.test_index, self.test_scores)


def cross_fit(
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
    logger=None,
    default_root_dir=None,
) -> CrossFit:
    """Fit ``detector`` and its baselines in every fold; score each fold's test rows (§4–§7).

    Per fold ``k`` with training trajectories ``A`` and test trajectories ``B``:

    * training rows = clean/attack rows of ``A`` (label 1 = attack); controls are never trained
      on; ``detector.tune`` (when it has it) picks the fold's hyper-parameters on them only;
    * the detector (``fit_logged`` when it has it, else ``fit``) scores every row of ``B``;
    * ``c1``: :func:`~ipi.probe.fit.fit_sklearn_reference` on ``metadata`` (PROTOCOL.md §5);
    * ``collapse_only``: the same on ``collapse`` (§6);
    * ``permuted``: the detector refitted on the training labels permuted by
      ``numpy.random.default_rng(permute_seed)`` (one generator, fold after fold) (§6);
    * ``transfer``: the detector fitted on ``transfer``'s clean/attack rows of ``A`` and scored
      on the clean/attack rows of ``B`` (§6);
    * exact permutation test (``permutation_m = M > 0``, PROTOCOL.md §7.4): replicate ``j``
      permutes the attack/clean labels of all labelled rows within (trajectory, step)
      (:func:`ipi.metrics.permutation.permute_within`), and every fold refits on its training
      rows' permuted labels and scores its test clean/attack rows, so under K folds the whole
      cross-fitting procedure is rerun on the relabelled data. ``null_refits`` makes a fold's
      M refits at once; otherwise the detector is refitted M times per fold.

    Args:
        detector: A :class:`~ipi.detectors.detector.Detector` (unfitted; each fit returns a copy).
        meta: Row table ``[N]`` with ``trajectory_id, step, variant``.
        x: The detector's features ``[N, d]``.
        folds: From :func:`ipi.probe.folds.make_folds` (checked again here).
        metadata: ``[N, 4]`` metadata scalars for C1, or None to skip C1.
        collapse: ``[N, L]`` collapse statistics, or None to skip collapse-only.
        permuted: Run the permuted-label refit.
        permute_seed: Seed of that label permutation.
        transfer: Rows of the other surfaces in the detector's features, or None to skip transfer.
        l2: ``C`` of the scikit-learn baselines (C1, collapse-only).
        permutation_m: Refits ``M`` of the exact permutation test (0: not run).
        permutation_seed: Seed of its label permutations.
        logger: Lightning logger of the main fit (holdout only), for a detector with ``fit_logged``.
        default_root_dir: Trainer root of the main fit, for a detector with ``fit_logged``.

    Returns:
        A :class:`CrossFit`.

    Raises:
        LeakageError: A trajectory on both sides of a fold, in two test folds, or a training
            row of any fit whose trajectory is in the fold's test set.
        RuntimeError: A baseline left rows unscored, or non-finite detector scores.
"""
    kind = "kfold" if len(folds) > 1 else "holdout"
    tid = meta["trajectory_id"].astype(str).to_numpy()
    check_folds(folds, tid, kind)
    variant = meta["variant"].to_numpy()
    labelled = np.isin(variant, LABELLED)
    n, x = len(meta), np.asarray(x)
    fold_of_row = np.full(n, -1, dtype=np.int64)
    names = [k for k, on in (("c1", metadata is not None), ("collapse_only", collapse is not None),
                             ("permuted", permuted), ("transfer", transfer is not None)) if on]
    base_scores = {k: np.full(n, np.nan) for k in names}
    main, rng = np.full(n, np.nan), np.random.default_rng(permute_seed)
    tuned, fitted, per_fold = [], [], []
    for k, (train_ids, test_ids) in enumerate(folds):
        is_tr = np.isin(tid, list(train_ids))
        is_te = np.isin(tid, list(test_ids))
        fit = is_tr & labelled
        assert_rows_disjoint(tid[fit], tid[is_te])
        fold_of_row[is_te] = k
        y = (variant[fit] == "attack").astype(np.int64)
        det, chosen, model = _fit_fold(detector, x[fit], y, tid[fit], k, logger=logger if kind == "holdout" else None,
                                       default_root_dir=default_root_dir)
        tuned.append(det)
        fitted.append(model)
        main[is_te] = model.score(x[is_te])
        info = {"fold": k, "trajectories_train": len(train_ids), "trajectories_test": len(test_ids),
                "rows_train_labelled": int(fit.sum()), "rows_test": int(is_te.sum()), **chosen}
        for key, val in (getattr(model, "fit_info_", None) or {}).items():
            info[f"detector_{key}"] = val
        info.update(_score_baselines(base_scores, det, x, y, tid, fit, is_te & labelled, is_te, l2=l2,
                                     metadata=metadata, collapse=collapse, rng=rng if permuted else None,
                                     transfer=transfer, train_ids=train_ids))
        per_fold.append(info)
    test_index = np.flatnonzero(fold_of_row >= 0)
    if kind == "kfold" and len(test_index) != n:
        raise LeakageError(f"kfold: {n - len(test_index)} rows were scored by no fold")
    null_scores, permutation = None, None
    if int(permutation_m) > 0:
        null_scores, permutation = _null_refits(tuned, meta, x, folds, labelled, test_index, main,
                                                int(permutation_m), int(permutation_seed))
    baselines = _baseline_tables(meta, base_scores, test_index, labelled)
    if not np.isfinite(main[test_index]).all():
        raise RuntimeError(f"detector={detector.name}: non-finite scores on "
                           f"{int((~np.isfinite(main[test_index])).sum())} test rows")
    return CrossFit(folds=folds, fold_of_row=fold_of_row, fitted=fitted, test_index=test_index,
                    test_scores=main[test_index], baselines=baselines, per_fold=per_fold,
                    null_scores=null_scores, permutation=permutation)


def _fit_fold(detector, x: np.ndarray, y: np.ndarray, groups: np.ndarray, fold: int, *, logger,
              default_root_dir):
    """``(tuned detector, its chosen settings, fitted model)`` of one fold's training rows:
    ``tune`` when the detector has it, then ``fit_logged`` (with ``logger``) when it has it, else ``fit``."""
    det, chosen = detector.tune(x, y, groups, fold) if hasattr(detector, "tune") else (detector, {})
    if hasattr(det, "fit_logged"):
        return det, chosen, det.fit_logged(x, y, groups, logger=logger, default_root_dir=default_root_dir)
    return det, chosen, det.fit(x, y, groups)


def _score_baselines(scores: dict[str, np.ndarray], det, x: np.ndarray, y: np.ndarray, tid: np.ndarray,
                     fit: np.ndarray, test_labelled: np.ndarray, is_te: np.ndarray, *, l2: float,
                     metadata: np.ndarray | None, collapse: np.ndarray | None, rng: np.random.Generator | None,
                     transfer: TransferSource | None, train_ids: set[str]) -> dict:
    """One fold's baselines, written into ``scores`` at its test rows: C1 on ``metadata`` and
    collapse-only on ``collapse`` (scikit-learn reference, ``C = l2``), the detector refitted on
    labels permuted by ``rng``, and the detector fitted on ``transfer``'s rows of the training
    trajectories (scored on the labelled test rows). Returns the fold's extra record."""
    for name, feats in (("c1", metadata), ("collapse_only", collapse)):
        if feats is not None:
            scores[name][is_te] = fit_sklearn_reference(feats[fit], y, l2=l2).decision_function(feats[is_te])
    if rng is not None:
        scores["permuted"][is_te] = det.fit(x[fit], rng.permutation(y), tid[fit]).score(x[is_te])
    if transfer is None:
        return {}
    src = np.isin(transfer.trajectory_id, list(train_ids))
    assert_rows_disjoint(transfer.trajectory_id[src], tid[is_te])
    scores["transfer"][test_labelled] = det.fit(transfer.x[src], transfer.y[src],
                                                transfer.trajectory_id[src]).score(x[test_labelled])
    return {"rows_transfer_train": int(src.sum())}


def _baseline_tables(meta: pd.DataFrame, scores: dict[str, np.ndarray], test_index: np.ndarray,
                     labelled: np.ndarray) -> dict[str, pd.DataFrame]:
    """Each baseline's score table on the test rows (``transfer``: the labelled ones only).

    Raises:
        RuntimeError: A baseline left one of those rows unscored.
    """
    tables = {}
    for name, s in scores.items():
        idx = test_index[labelled[test_index]] if name == "transfer" else test_index
        if not np.isfinite(s[idx]).all():
            raise RuntimeError(f"cross_fit: baseline {name!r} left rows unscored")
        tables[name] = score_table(meta, idx, s[idx])
    return tables


def _null_refits(tuned: Sequence, meta: pd.DataFrame, x: np.ndarray, folds, labelled: np.ndarray,
                 test_index: np.ndarray, main: np.ndarray, m: int, seed: int) -> tuple[np.ndarray, dict]:
    """The M within-(trajectory, step) permuted-label refits of every fold (see :func:`cross_fit`).

    Args:
        tuned: The (tuned) unfitted detector of each fold.
        meta, x, folds: As :func:`cross_fit`.
        labelled: ``[N]`` clean/attack rows.
        test_index: ``[n_test]`` the out-of-fold rows.
        main: ``[N]`` the detector's scores (``nan`` off the test rows).
        m: Refits M.
        seed: Seed of the permutations.

    Returns:
        ``(null [M, n_test], facts)``: ``refit_scores`` ``[n_test]`` (the refit procedure on the
        true labels: ``null_refits``'s, else the detector's own fit), ``seed``, ``unit``,
        ``design``, ``seconds``.
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
    rng = np.random.default_rng(seed)
    y_perm = np.stack([permute_within(groups, y_lab, rng) for _ in range(m)])  # [M, n_labelled]
    null = np.full((m, len(test_index)), np.nan)
    refit = np.full(len(test_index), np.nan)
    batched = all(hasattr(d, "null_refits") for d in tuned)
    designs = []
    if batched:  # all M refits of a fold at once
        for k, (det, (sel, fit, te)) in enumerate(zip(tuned, plan)):
            refit[pos_in_test[te]], null[:, pos_in_test[te]], design = det.null_refits(
                x[fit], y_lab[sel], y_perm[:, sel], x[te])
            designs.append(f"fold {k}: {design}")
        design = ", ".join(designs)
    else:  # direct refits, replicate after replicate; on the true labels the detector's own fit
        for _, _, te in plan:
            refit[pos_in_test[te]] = main[te]
        for j in range(m):
            for det, (sel, fit, te) in zip(tuned, plan):
                null[j, pos_in_test[te]] = det.fit(x[fit], y_perm[j, sel], tid[fit]).score(x[te])
        design = f"detector={tuned[0].name}: {m} direct refits × {len(folds)} fold(s)"
    info = {"refit_scores": refit, "seed": seed,
            "unit": "attack/clean labels permuted within each training (trajectory, step)",
            "design": design, "seconds": round(time.perf_counter() - t0, 3)}
    if len(folds) > 1:
        # K-fold: each row is trained on by the other folds' refits, so replicate j is the whole
        # procedure rerun on the relabelled data and its out-of-fold E1 is read on the same labels
        # (an exact test: the data are exchangeable under within-step relabelling).
        lab_test = labelled[test_index]
        attack = np.zeros((m, len(test_index)), dtype=bool)
        attack[:, lab_test] = y_perm[:, np.searchsorted(lab_idx, test_index[lab_test])].astype(bool)
        info["null_attack"] = attack
        info["unit"] = ("attack/clean labels permuted within each (trajectory, step); every fold refitted and "
                        "the out-of-fold E1 read on the permuted labels")
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
