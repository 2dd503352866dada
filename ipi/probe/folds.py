"""The split folds of a cross-fit and what every fold's fits share (PROTOCOL.md §4–§6).

* :func:`make_folds` / :func:`check_folds`: the two split designs of PROTOCOL.md §4 — ``holdout``
  (one fold, the fixed trajectory holdout) and ``kfold`` (grouped K-fold cross-fitting, every
  trajectory scored once, out of fold) — and their leakage checks.
* :class:`TransferSource`: the other surfaces' clean/attack rows, the transfer baseline's training
  pool (§6).
* :func:`select_l2`: the probe's ``C`` by grouped inner CV on a fold's training rows
  (``probe.l2=auto``).
* :class:`FoldedProbe`: the K fold probes as one module for ``Trainer.predict``.

The fold loop itself — the detector and its baselines fitted on every fold's training rows — is
:func:`ipi.detectors.crossfit.cross_fit`, one function for every detector (docs/detectors.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from lightning import LightningModule
from torch import Tensor, nn

from ipi.probe.fit import fit_sklearn_reference
from ipi.probe.module import LinearProbe
from ipi.probe.split import LeakageError, assert_trajectory_disjoint, grouped_kfold, holdout_split

__all__ = [
    "LABELLED",
    "FoldedProbe",
    "TransferSource",
    "check_folds",
    "make_folds",
    "score_table",
    "select_l2",
]


def select_l2(x: np.ndarray, y: np.ndarray, groups: np.ndarray, grid: Sequence[float], *,
              seed: int, n_splits: int = 5) -> tuple[float, dict[str, float]]:
    """Pick the probe's ``C`` by grouped inner cross-validation on training rows only.

    ``GroupKFold`` over the training trajectories (``min(n_splits, #trajectories)`` folds,
    shuffled by ``seed``); for every ``C`` :func:`~ipi.probe.fit.fit_sklearn_reference` (the
    probe's objective) is fitted on the inner training trajectories and scored on the held-out
    ones by attack-vs-clean AUC; the best mean wins, ties to the smallest ``C``.

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
    trajectory_ids: Sequence[str], kind: str, *, seed: int, test_fraction: float | None = None,
    k: int | None = None,
) -> list[tuple[set[str], set[str]]]:
    """The folds of a split design over trajectory ids (PROTOCOL.md §4).

    Args:
        trajectory_ids: Trajectory ids (repeats allowed).
        kind: ``"holdout"`` (:func:`~ipi.probe.split.holdout_split`, one fold) or ``"kfold"``
            (:func:`~ipi.probe.split.grouped_kfold`, ``k`` folds).
        seed: Seed of the split permutation (``split.seed``).
        test_fraction: Holdout test fraction (``split.test_fraction``; holdout only).
        k: Number of folds (``split.k``; kfold only).

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


def score_table(meta: pd.DataFrame, idx: np.ndarray, scores: np.ndarray) -> pd.DataFrame:
    """The score table (``trajectory_id, step, variant, score``) of rows ``idx`` of ``meta``."""
    t = meta.iloc[idx][["trajectory_id", "step", "variant"]].reset_index(drop=True)
    t["score"] = np.asarray(scores, dtype=np.float64)
    return t
