"""Fitting the probe and its baselines per split fold and scoring out of fold (PROTOCOL.md §4–§6).

One function, :func:`cross_fit`, serves both split designs of PROTOCOL.md §4:

* ``holdout``: one fold (the fixed trajectory holdout); the test trajectories are scored once.
* ``kfold``: grouped K-fold cross-fitting; fold ``k``'s models are fitted on the other folds'
  trajectories and score fold ``k``'s trajectories, so **every** trajectory gets out-of-fold
  scores, each from a model that never saw it. The pooled out-of-fold scores come from K
  different probes (see ``docs/probe.md``).

In every fold the same training rows (clean vs attack rows of the fold's training trajectories)
fit the probe and every baseline — C1 on the metadata scalars (§5), the collapse-only probe and
the permuted-label probe (§6) — and the cross-surface transfer probe is fitted on the *other
surfaces'* clean/attack rows of the same training trajectories (§6). Leakage is asserted per fold
on trajectory ids and on the rows actually fed to each fit.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import torch
from lightning import LightningModule
from torch import Tensor, nn

from ipi.metrics.permutation import permute_within
from ipi.probe.dual import ReducedDesign, fit_reduced, fit_reduced_batch
from ipi.probe.fit import ProbeConfig, fit_probe, fit_sklearn_reference, score
from ipi.probe.module import LinearProbe
from ipi.probe.split import (
    LeakageError,
    assert_rows_disjoint,
    assert_trajectory_disjoint,
    grouped_kfold,
    holdout_split,
)

__all__ = [
    "LABELLED",
    "CrossFit",
    "FoldedProbe",
    "TransferSource",
    "check_folds",
    "cross_fit",
    "make_folds",
    "select_l2",
]


#: Candidate ``C`` values of ``probe.l2=auto`` (``probe.l2_grid`` overrides).
DEFAULT_L2_GRID = (0.001, 0.01, 0.1, 1.0, 10.0)


def select_l2(x: np.ndarray, y: np.ndarray, groups: np.ndarray, grid: Sequence[float], *,
              n_splits: int = 5, seed: int = 0) -> tuple[float, dict[str, float]]:
    """Pick the probe's ``C`` by grouped inner cross-validation on training rows only.

    ``GroupKFold`` over the training trajectories (``min(n_splits, #trajectories)`` folds,
    trajectories shuffled by ``seed``); for every ``C`` the scikit-learn reference model
    (:func:`~ipi.probe.fit.fit_sklearn_reference`: standardised, L2 logistic, balanced — the
    objective the Lightning probe minimises) is fitted on the inner training trajectories and
    scored on the held-out ones; the criterion is the mean inner AUC (attack vs clean). Ties go
    to the smallest ``C`` (strongest regularisation). No test trajectory is ever seen.

    Args:
        x: Training features ``[n, d]``.
        y: Labels ``[n]`` (1 = attack).
        groups: Trajectory id per row ``[n]``.
        grid: Candidate ``C`` values (> 0).
        n_splits: Inner folds.
        seed: Seed of the trajectory shuffle.

    Returns:
        ``(best C, {str(C): mean inner AUC})``.

    Raises:
        ValueError: Empty grid, a non-positive ``C``, or fewer than 2 training trajectories.
    """
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import GroupKFold

    grid = [float(c) for c in grid]
    if not grid or min(grid) <= 0:
        raise ValueError(f"probe.l2_grid must hold positive values, got {grid}")
    uniq = np.unique(groups)
    if len(uniq) < 2:
        raise ValueError("probe.l2=auto needs at least 2 training trajectories for the inner CV")
    # shuffle trajectories (GroupKFold is deterministic in group order)
    relabel = {g: i for i, g in enumerate(np.random.default_rng(seed).permutation(uniq))}
    g = np.array([relabel[v] for v in groups])
    splits = list(GroupKFold(n_splits=min(n_splits, len(uniq))).split(x, y, g))
    scores: dict[str, float] = {}
    for c in grid:
        aucs = []
        for tr, va in splits:
            if len(np.unique(y[tr])) < 2 or len(np.unique(y[va])) < 2:
                continue
            m = fit_sklearn_reference(x[tr], y[tr], l2=c)
            aucs.append(roc_auc_score(y[va], m.decision_function(x[va])))
        scores[str(c)] = float(np.mean(aucs)) if aucs else float("nan")
    best = max(grid, key=lambda c: (np.nan_to_num(scores[str(c)], nan=-1.0), -c))
    return best, scores

LABELLED = ("clean", "attack")
SPLIT_KINDS = ("holdout", "kfold")


def make_folds(
    trajectory_ids: Sequence[str], kind: str, *, test_fraction: float = 0.3, k: int = 5,
    seed: int = 0,
) -> list[tuple[set[str], set[str]]]:
    """The folds of a split design over trajectory ids (PROTOCOL.md §4).

    Args:
        trajectory_ids: Trajectory ids (repeats allowed).
        kind: ``"holdout"`` (:func:`~ipi.probe.split.holdout_split`, one fold) or ``"kfold"``
            (:func:`~ipi.probe.split.grouped_kfold`, ``k`` folds).
        test_fraction: Holdout test fraction.
        k: Number of folds for ``kfold``.
        seed: Seed of the split permutation.

    Returns:
        ``[(train_ids, test_ids), ...]``, checked by :func:`check_folds`.

    Raises:
        ValueError: Unknown ``kind`` or invalid split parameters.
    """
    kind = getattr(kind, "value", kind)
    if kind == "holdout":
        folds = [holdout_split(trajectory_ids, test_fraction, seed)]
    elif kind == "kfold":
        folds = grouped_kfold(trajectory_ids, k, seed)
    else:
        raise ValueError(f"split kind {kind!r} unknown; expected one of {', '.join(SPLIT_KINDS)}")
    check_folds(folds, trajectory_ids, kind)
    return folds


def check_folds(folds, trajectory_ids: Sequence[str], kind: str) -> None:
    """Assert a split design is leak-free (PROTOCOL.md §4).

    Every fold's train and test ids are disjoint and together are all ids; for ``kfold`` the
    test sets are pairwise disjoint and cover every id (each trajectory is scored exactly once).

    Raises:
        LeakageError: A trajectory on both sides of a fold, or (kfold) in two test folds.
        ValueError: A fold that does not cover all ids, or (kfold) a trajectory in no test fold.
    """
    ids = {str(t) for t in trajectory_ids}
    seen: dict[str, int] = {}
    for i, (train, test) in enumerate(folds):
        train, test = {str(t) for t in train}, {str(t) for t in test}
        assert_trajectory_disjoint(train, test)
        if train | test != ids:
            extra = sorted((train | test) ^ ids)[:5]
            raise ValueError(f"fold {i}: train ∪ test differs from the trajectories (e.g. {extra})")
        if not train or not test:
            raise ValueError(f"fold {i}: empty train or test side")
        for t in test:
            if t in seen:
                raise LeakageError(f"trajectory {t!r} is in the test sets of folds {seen[t]} and {i}")
            seen[t] = i
    if getattr(kind, "value", kind) == "kfold" and set(seen) != ids:
        missing = sorted(ids - set(seen))[:5]
        raise ValueError(f"kfold: trajectories in no test fold (e.g. {missing})")


@dataclass
class TransferSource:
    """Clean/attack rows of the *other* surfaces, the training pool of the transfer probe (§6).

    Attributes:
        trajectory_id: ``[M]`` trajectory of each row.
        y: ``[M]`` labels (1 = attack, 0 = clean).
        x: ``[M, d]`` features (same layers and token groups as the probe's).
        surface: ``[M]`` surface of each row (for the record and the tests).
    """

    trajectory_id: np.ndarray
    y: np.ndarray
    x: np.ndarray
    surface: np.ndarray

    @classmethod
    def from_rows(cls, meta: pd.DataFrame, x: np.ndarray) -> TransferSource:
        """From a row table (``trajectory_id, variant, surface``) and its features; keeps
        clean/attack rows only."""
        keep = meta["variant"].isin(LABELLED).to_numpy()
        return cls(
            trajectory_id=meta["trajectory_id"].astype(str).to_numpy()[keep],
            y=(meta["variant"].to_numpy()[keep] == "attack").astype(np.int64),
            x=np.asarray(x)[keep],
            surface=meta["surface"].astype(str).to_numpy()[keep],
        )


@dataclass
class CrossFit:
    """Fitted per-fold models and the out-of-fold baseline score tables.

    Attributes:
        folds: ``[(train_ids, test_ids)]`` as used.
        fold_of_row: ``[N]`` fold whose test set holds each row (``-1``: never scored, i.e. a
            holdout training row).
        probes: The probe of each fold.
        test_index: ``[n_test]`` row indices scored out of fold, ascending (the row order of
            every score table).
        baselines: Out-of-fold score tables (``trajectory_id, step, variant, score``) by name:
            ``c1``, ``collapse_only``, ``permuted``, ``transfer`` (those that ran).
        per_fold: One dict per fold: train/test trajectory and row counts.
        null_scores: ``[M, n_test]`` scores of the ``test_index`` rows by the M permuted-label
            refits of the exact permutation test (PROTOCOL.md §7.4; ``nan`` on control rows,
            which E1 does not use), or None when it did not run.
        permutation: Facts of the permutation refits (``refit_scores`` ``[n_test]``: the same
            refit procedure on the true labels; ``seed``, ``unit``, ``design``, ``seconds``),
            the ``permutation=`` argument of :func:`ipi.metrics.evaluate_tables` together with
            ``null_scores``; None when it did not run.
    """

    folds: list
    fold_of_row: np.ndarray
    probes: list[LinearProbe]
    test_index: np.ndarray
    baselines: dict[str, pd.DataFrame] = field(default_factory=dict)
    per_fold: list[dict] = field(default_factory=list)
    null_scores: np.ndarray | None = None
    permutation: dict | None = None

    def permutation_input(self) -> dict | None:
        """``permutation=`` of :func:`ipi.metrics.evaluate_tables` (None when not run)."""
        if self.null_scores is None:
            return None
        return {**self.permutation, "null_scores": self.null_scores}

    def probe_scores(self, x: np.ndarray) -> np.ndarray:
        """Out-of-fold probe scores ``[n_test]`` of the rows ``test_index`` (each by its fold's probe)."""
        out = np.full(len(self.test_index), np.nan)
        fold = self.fold_of_row[self.test_index]
        for k, probe in enumerate(self.probes):
            sel = fold == k
            if sel.any():
                out[sel] = score(probe, np.asarray(x)[self.test_index[sel]])
        return out


class FoldedProbe(LightningModule):
    """The K fold probes as one module for ``Trainer.predict``: row ``i`` is scored by probe
    ``fold[i]``.

    Batches are ``(x [n, d], fold [n] int64)``; ``predict_step`` returns float64 logits ``[n]``.
    With one probe (holdout) this is exactly that probe.
    """

    def __init__(self, probes: Sequence[LinearProbe]):
        super().__init__()
        self.probes = nn.ModuleList(probes)

    def forward(self, x: Tensor, fold: Tensor) -> Tensor:
        out = torch.empty(x.shape[0], dtype=torch.float64, device=x.device)
        for k, probe in enumerate(self.probes):
            sel = fold == k
            if bool(sel.any()):
                out[sel] = probe(x[sel])
        if bool(((fold < 0) | (fold >= len(self.probes))).any()):
            raise ValueError("FoldedProbe: a row's fold index has no probe")
        return out

    def predict_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        x, fold = batch
        return self(x, fold)


def _table(meta: pd.DataFrame, idx: np.ndarray, scores: np.ndarray) -> pd.DataFrame:
    t = meta.iloc[idx][["trajectory_id", "step", "variant"]].reset_index(drop=True)
    t["score"] = np.asarray(scores, dtype=np.float64)
    return t


def cross_fit(
    meta: pd.DataFrame,
    x: np.ndarray,
    folds: list[tuple[set[str], set[str]]],
    *,
    probe_cfg: ProbeConfig | None = None,
    metadata: np.ndarray | None = None,
    collapse: np.ndarray | None = None,
    permuted: bool = False,
    permute_seed: int = 0,
    transfer: TransferSource | None = None,
    l2: float = 1.0,
    logger=None,
    default_root_dir=None,
    fit_fn=fit_probe,
    permutation_m: int = 0,
    permutation_seed: int = 0,
    l2_grid: Sequence[float] | None = None,
) -> CrossFit:
    """Fit the probe and its baselines in every fold; score each fold's test rows (§4–§6).

    Per fold ``k`` with training trajectories ``A`` and test trajectories ``B``:

    * training rows = clean/attack rows of ``A`` (label 1 = attack); controls are never trained
      on;
    * the probe (:func:`~ipi.probe.fit.fit_probe`) scores every row of ``B`` (controls too);
    * ``c1``: :func:`~ipi.probe.fit.fit_sklearn_reference` on ``metadata`` (PROTOCOL.md §5);
    * ``collapse_only``: the same on ``collapse`` (§6);
    * ``permuted``: the probe refitted on the training labels permuted by
      ``numpy.random.default_rng(permute_seed)`` (one generator drawn fold after fold; true test
      labels are used for evaluation) (§6);
    * ``transfer``: the probe fitted on ``transfer``'s clean/attack rows of ``A`` (other
      surfaces) and scored on the clean/attack rows of ``B`` (§6);
    * exact permutation test (``permutation_m = M > 0``, PROTOCOL.md §7.4): replicate ``j``
      draws one within-(trajectory, step) permutation of the attack/clean labels of **all**
      labelled rows (:func:`ipi.metrics.permutation.permute_within`, one
      ``numpy.random.default_rng(permutation_seed)`` drawn replicate after replicate), and
      every fold refits the probe on its training rows' permuted labels and scores its test
      clean/attack rows (true labels kept). With K folds a replicate's statistic is thus the
      out-of-fold E1 of K refits — the whole cross-fitting procedure rerun on permuted labels,
      exactly as the observed E1 was obtained. The refits are exact and cheap: per fold the
      standardised training rows are reduced once to at most ``n`` coordinates
      (:class:`ipi.probe.dual.ReducedDesign`) and the M refits are Newton solves there, all M
      of a fold at once (:func:`ipi.probe.dual.fit_reduced_batch`, ``C`` of the fold; the
      refit on the true labels is :func:`ipi.probe.dual.fit_reduced`).

    Args:
        meta: Row table ``[N]`` with ``trajectory_id, step, variant``.
        x: Probe features ``[N, d]``.
        folds: From :func:`make_folds` (checked again here).
        probe_cfg: Probe hyper-parameters.
        metadata: ``[N, 4]`` metadata scalars for C1, or None to skip C1.
        collapse: ``[N, L]`` collapse statistics, or None to skip collapse-only.
        permuted: Run the permuted-label probe.
        permute_seed: Seed of the label permutation.
        transfer: Rows of the other surfaces, or None to skip transfer.
        l2: ``C`` of the scikit-learn baselines.
        logger: Lightning logger of the probe fit (holdout only; K-fold fits are not logged).
        default_root_dir: Trainer root of the probe fit.
        fit_fn: The probe fitter (``fit_probe``); injectable for tests.
        permutation_m: Refits ``M`` of the exact permutation test (0: not run).
        permutation_seed: Seed of its label permutations.
        l2_grid: ``probe.l2=auto``: candidate ``C`` values; each fold's probe (and its permuted
            and transfer refits) uses the one :func:`select_l2` picks by grouped inner CV on
            that fold's training trajectories only. None: ``probe_cfg.l2`` everywhere.

    Returns:
        A :class:`CrossFit`.

    Raises:
        LeakageError: A trajectory on both sides of a fold, in two test folds, or a training
            row of any fit whose trajectory is in the fold's test set.
    """
    kind = "kfold" if len(folds) > 1 else "holdout"
    tid = meta["trajectory_id"].astype(str).to_numpy()
    check_folds(folds, tid, kind)
    variant = meta["variant"].to_numpy()
    labelled = np.isin(variant, LABELLED)
    n = len(meta)
    fold_of_row = np.full(n, -1, dtype=np.int64)
    names = []
    if metadata is not None:
        names.append("c1")
    if collapse is not None:
        names.append("collapse_only")
    if permuted:
        names.append("permuted")
    if transfer is not None:
        names.append("transfer")
    base_scores = {k: np.full(n, np.nan) for k in names}
    rng = np.random.default_rng(permute_seed)
    probes, per_fold = [], []
    for k, (train_ids, test_ids) in enumerate(folds):
        is_tr = np.isin(tid, list(train_ids))
        is_te = np.isin(tid, list(test_ids))
        fit = is_tr & labelled
        assert_rows_disjoint(tid[fit], tid[is_te])
        fold_of_row[is_te] = k
        y = (variant[fit] == "attack").astype(np.int64)
        cv = None
        if l2_grid is not None:
            best, cv = select_l2(x[fit], y, tid[fit], l2_grid, seed=k)
            probe_cfg = replace(probe_cfg or ProbeConfig(), l2=best)
        probe = fit_fn(x[fit], y, probe_cfg, logger=logger if kind == "holdout" else None,
                       default_root_dir=default_root_dir)
        probes.append(probe)
        if metadata is not None:
            m = fit_sklearn_reference(metadata[fit], y, l2=l2)
            base_scores["c1"][is_te] = m.decision_function(metadata[is_te])
        if collapse is not None:
            m = fit_sklearn_reference(collapse[fit], y, l2=l2)
            base_scores["collapse_only"][is_te] = m.decision_function(collapse[is_te])
        if permuted:
            perm = fit_fn(x[fit], rng.permutation(y), probe_cfg)
            base_scores["permuted"][is_te] = score(perm, x[is_te])
        info = {"fold": k, "trajectories_train": len(train_ids), "trajectories_test": len(test_ids),
                "rows_train_labelled": int(fit.sum()), "rows_test": int(is_te.sum())}
        if cv is not None:
            info["l2"] = probe_cfg.l2
            info["l2_inner_cv_auc"] = cv
        if transfer is not None:
            src = np.isin(transfer.trajectory_id, list(train_ids))
            assert_rows_disjoint(transfer.trajectory_id[src], tid[is_te])
            tp = fit_fn(transfer.x[src], transfer.y[src], probe_cfg)
            sel = is_te & labelled
            base_scores["transfer"][sel] = score(tp, x[sel])
            info["rows_transfer_train"] = int(src.sum())
        per_fold.append(info)
    test_index = np.flatnonzero(fold_of_row >= 0)
    if kind == "kfold" and len(test_index) != n:
        raise LeakageError(f"kfold: {n - len(test_index)} rows were scored by no fold")
    null_scores, permutation = None, None
    if int(permutation_m) > 0:
        # each fold's own C (probe.l2=auto picks one per fold)
        c = [p.get("l2", (probe_cfg or ProbeConfig()).l2) for p in per_fold]
        null_scores, permutation = _permutation_refits(
            meta, x, folds, labelled, test_index, int(permutation_m), int(permutation_seed), c)
    baselines = {}
    for name, s in base_scores.items():
        idx = test_index[labelled[test_index]] if name == "transfer" else test_index
        if not np.isfinite(s[idx]).all():
            raise RuntimeError(f"cross_fit: baseline {name!r} left rows unscored")
        baselines[name] = _table(meta, idx, s[idx])
    return CrossFit(folds=folds, fold_of_row=fold_of_row, probes=probes, test_index=test_index,
                    baselines=baselines, per_fold=per_fold, null_scores=null_scores,
                    permutation=permutation)


def _permutation_refits(meta: pd.DataFrame, x: np.ndarray, folds, labelled: np.ndarray,
                        test_index: np.ndarray, m: int, seed: int, c) -> tuple[np.ndarray, dict]:
    """The M permuted-label refits of every fold (see :func:`cross_fit`); scores ``[M, n_test]``."""
    t0 = time.perf_counter()
    tid = meta["trajectory_id"].astype(str).to_numpy()
    variant = meta["variant"].to_numpy()
    lab_idx = np.flatnonzero(labelled)
    y_lab = (variant[lab_idx] == "attack").astype(np.int64)
    groups, _ = pd.factorize(pd.Series(tid[lab_idx]) + "\x00" + meta["step"].to_numpy()[lab_idx].astype(str))
    pos_in_test = np.full(len(meta), -1, dtype=np.int64)
    pos_in_test[test_index] = np.arange(len(test_index))
    designs = []
    c_of = list(c) if isinstance(c, (list, tuple)) else [c] * len(folds)
    for train_ids, test_ids in folds:
        fit = lab_idx[np.isin(tid[lab_idx], list(train_ids))]
        te = lab_idx[np.isin(tid[lab_idx], list(test_ids))]
        assert_rows_disjoint(tid[fit], tid[te])
        design = ReducedDesign.build(x[fit], x[te])
        designs.append((np.searchsorted(lab_idx, fit), pos_in_test[te], design, c_of[len(designs)]))
    refit = np.full(len(test_index), np.nan)
    null = np.full((m, len(test_index)), np.nan)
    for sel, cols, design, c in designs:
        theta = fit_reduced(design.phi, y_lab[sel], C=c)
        refit[cols] = design.phi_test @ theta[:-1] + theta[-1]
    rng = np.random.default_rng(seed)
    y_perm = np.stack([permute_within(groups, y_lab, rng) for _ in range(m)])  # [M, n_labelled]
    for sel, cols, design, c in designs:  # all M refits of a fold share its design: one batched solve
        theta = fit_reduced_batch(design.phi, y_perm[:, sel], C=c)
        null[:, cols] = theta[:, :-1] @ design.phi_test.T + theta[:, -1:]
    info = {
        "refit_scores": refit,
        "seed": seed,
        "unit": "attack/clean labels permuted within each training (trajectory, step)",
        "design": ", ".join(f"fold {k}: {'dual' if d.dual else 'primal'} rank {d.rank} "
                            f"({d.phi.shape[0]} training rows, {d.n_features} features)"
                            for k, (_, _, d, _) in enumerate(designs)),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    return null, info
