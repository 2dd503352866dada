"""The linear probe as a LightningModule (PROTOCOL.md §4).

``LinearProbe`` minimises exactly the objective of scikit-learn's
``make_pipeline(StandardScaler(), LogisticRegression(C=l2, class_weight="balanced"))``: ``J`` of
:mod:`ipi.probe.dual` on features standardised with the TRAIN rows' mean/std, scaled to ``J / n``,
full batch, in float64 — by an exact Newton solve (``solver="newton"``,
:func:`ipi.probe.dual.fit_standardised`) in Lightning's manual optimisation, or by
``torch.optim.LBFGS`` with a strong-Wolfe line search (``solver="lbfgs"``). ``J`` is strictly
convex: both reach the same minimiser."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from lightning import LightningModule
from torch import Tensor, nn
from torchmetrics.classification import BinaryAUROC

from ipi.probe.dual import fit_standardised, standardisation

__all__ = ["LinearProbe", "auroc_inputs", "SOLVERS"]

_DTYPE = torch.float64

#: Ways to minimise the probe's objective (the same unique minimiser).
SOLVERS = ("newton", "lbfgs")


def auroc_inputs(logits: Tensor) -> Tensor:
    """Map logits to ``(0, 1)`` for ``BinaryAUROC`` without creating ties.

    ``BinaryAUROC``'s sigmoid rounds large logits to exactly 1.0, creating ties;
    ``0.5 + atan(logit) / pi`` is strictly increasing and stays distinguishable in float64.

    Args:
        logits: Scores of any shape.

    Returns:
        Tensor of the same shape with values in ``(0, 1)``, float64.
"""
    return 0.5 + torch.atan(logits.to(_DTYPE)) / math.pi


class _BinaryAUROC64(BinaryAUROC):
    """``BinaryAUROC`` whose ROC curve is computed in float64.

    torchmetrics builds the cumulative TP/FP counts in the *default* dtype (float32), so the
    AUROC would only be accurate to ~1e-7. ``compute`` here runs with float64 as the default
    dtype (restored afterwards), so the value equals ``sklearn.metrics.roc_auc_score``.
    """

    def compute(self) -> Tensor:  # noqa: D102
        previous = torch.get_default_dtype()
        torch.set_default_dtype(_DTYPE)
        try:
            return super().compute()
        finally:
            torch.set_default_dtype(previous)


def _split_batch(batch) -> tuple[Tensor, Tensor | None]:
    if isinstance(batch, Tensor):
        return batch, None
    if isinstance(batch, (tuple, list)):
        return batch[0], (batch[1] if len(batch) > 1 else None)
    raise TypeError(f"unsupported batch type {type(batch).__name__}; expected (x, y) or x")


class LinearProbe(LightningModule):
    """L2-regularised, class-balanced logistic regression on standardised features.

    Standardisation statistics and class weights are buffers set from the training rows by
    :meth:`set_train_statistics`; if unset when training starts, :meth:`on_train_start` computes
    them from the (single, full-batch) training dataloader. Never fit them on test rows. The
    weights start at zero, so the fit is deterministic.

    Args:
        n_features: Width ``d`` of the feature vectors.
        l2: scikit-learn's ``C``: inverse L2 regularisation strength (> 0).
        max_iter: LBFGS iterations per optimiser step (one step per epoch, full batch);
            with ``solver="newton"`` a bound on Newton iterations (``min(max_iter, 100)``).
        tol: Stop when the max-abs gradient of ``J / n`` is ``<= tol`` (LBFGS
            ``tolerance_grad``); Newton stops at ``min(tol, 1e-10)`` in its solved coordinates.
        history_size: LBFGS memory (``2 * history_size * d`` float64 values).
        solver: ``"newton"`` (default): one exact full-batch Newton solve per epoch
            (:func:`ipi.probe.dual.fit_standardised`); ``"lbfgs"``: ``torch.optim.LBFGS``
            through Lightning's automatic optimisation.

    Shapes:
        ``forward(x)``: ``x`` ``[n, d]`` (any float dtype) -> logits ``[n]`` float64.

    Logged metrics:
        ``train/loss`` (``J / n`` after the step), ``train/auroc`` and ``val/auroc`` (only with
        a validation dataloader), torchmetrics ``BinaryAUROC``.
"""

    def __init__(
        self,
        n_features: int,
        l2: float = 1.0,
        max_iter: int = 500,
        tol: float = 1e-8,
        history_size: int = 10,
        solver: str = "newton",
    ) -> None:
        super().__init__()
        solver = getattr(solver, "value", solver)
        if solver not in SOLVERS:
            raise ValueError(f"solver must be one of {', '.join(SOLVERS)}, got {solver!r}")
        if int(n_features) < 1:
            raise ValueError(f"n_features must be >= 1, got {n_features}")
        if not (float(l2) > 0.0 and math.isfinite(float(l2))):
            raise ValueError(f"l2 (sklearn's C) must be a finite positive number, got {l2}")
        if int(max_iter) < 1:
            raise ValueError(f"max_iter must be >= 1, got {max_iter}")
        self.save_hyperparameters()
        self.hparams.solver = solver  # a plain string even when given an enum member
        # newton: training_step solves the full-batch problem itself (no torch optimizer)
        self.automatic_optimization = solver == "lbfgs"
        self.n_iter = 0  # iterations of the last solve (LBFGS: read from its state by fit_probe)
        d = int(n_features)
        self.linear = nn.Linear(d, 1, dtype=_DTYPE)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.register_buffer("mean", torch.zeros(d, dtype=_DTYPE))
        self.register_buffer("std", torch.ones(d, dtype=_DTYPE))
        self.register_buffer("class_weight", torch.ones(2, dtype=_DTYPE))
        self.register_buffer("n_train", torch.zeros((), dtype=_DTYPE))
        self.train_auroc = _BinaryAUROC64()
        self.val_auroc = _BinaryAUROC64()

    # ------------------------------------------------------------------ statistics
    @property
    def is_prepared(self) -> bool:
        """True once standardisation statistics and class weights have been set."""
        return bool(self.n_train.item() > 0)

    @torch.no_grad()
    def set_train_statistics(self, x: np.ndarray | Tensor, y: np.ndarray | Tensor) -> None:
        """Set mean/std (``ddof=0``, zero std -> 1) and balanced class weights from TRAIN rows.

        Computed in float64 in row chunks, so no extra ``[n, d]`` float64 copy is made.

        Args:
            x: Training features ``[n, d]``.
            y: Training labels ``[n]`` in ``{0, 1}``; both classes must be present.

        Raises:
            ValueError: On a shape mismatch or if a class is missing.
        """
        x_np = x.detach().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)
        y_np = y.detach().cpu().numpy() if isinstance(y, Tensor) else np.asarray(y)
        y_np = y_np.reshape(-1)
        if x_np.ndim != 2 or x_np.shape[1] != self.hparams.n_features:
            raise ValueError(
                f"x must have shape [n, {self.hparams.n_features}], got {tuple(x_np.shape)}"
            )
        n = x_np.shape[0]
        if y_np.shape[0] != n:
            raise ValueError(f"x has {n} rows but y has {y_np.shape[0]}")
        n_pos = int((y_np == 1).sum())
        n_neg = int((y_np == 0).sum())
        if n_pos == 0 or n_neg == 0 or n_pos + n_neg != n:
            raise ValueError(
                f"labels must be in {{0, 1}} with both classes present; got {n_neg} zeros, "
                f"{n_pos} ones, {n - n_pos - n_neg} other values"
            )
        # StandardScaler's rule: a feature indistinguishable from a constant gets scale 1.
        mean, std = standardisation(x_np)
        self.mean.copy_(torch.from_numpy(mean))
        self.std.copy_(torch.from_numpy(std))
        self.class_weight.copy_(
            torch.tensor([n / (2.0 * n_neg), n / (2.0 * n_pos)], dtype=_DTYPE)
        )
        self.n_train.fill_(float(n))

    # ------------------------------------------------------------------ model
    def effective_weights(self) -> tuple[Tensor, Tensor]:
        """Weights in raw feature space: ``logit = x @ w_raw + b_raw``.

        Standardisation is folded into the linear layer (``w_raw = w / std``,
        ``b_raw = b - mean . w_raw``), so no standardised copy of ``x`` is materialised.

        Returns:
            ``(w_raw [d], b_raw [])``, float64.
        """
        w = self.linear.weight.reshape(-1) / self.std
        b = self.linear.bias.reshape(()) - torch.dot(self.mean, w)
        return w, b

    @property
    def coef_(self) -> np.ndarray:
        """Coefficients on standardised features, ``[d]`` (comparable to sklearn's ``coef_[0]``)."""
        return self.linear.weight.detach().reshape(-1).cpu().numpy().copy()

    @property
    def intercept_(self) -> float:
        """Intercept on standardised features (comparable to sklearn's ``intercept_[0]``)."""
        return float(self.linear.bias.detach().reshape(()).item())

    def forward(self, x: Tensor) -> Tensor:
        """Logits of the rows of ``x``.

        Args:
            x: Features ``[n, d]``; cast to float64.

        Returns:
            Logits ``[n]``, float64.
        """
        w, b = self.effective_weights()
        return x.to(_DTYPE) @ w + b

    def objective(self, logits: Tensor, y: Tensor) -> Tensor:
        """``J / n``: balanced weighted BCE summed over rows plus ``0.5 ||w||^2 / C``, over n.

        ``n`` is the number of training rows (``n_train``); with the full batch this is exactly
        scikit-learn's scaled objective.

        Args:
            logits: ``[m]`` float64.
            y: ``[m]`` labels in ``{0, 1}``.

        Returns:
            Scalar loss.
        """
        y = y.to(_DTYPE).reshape(-1)
        weights = self.class_weight[y.long()]
        data = F.binary_cross_entropy_with_logits(logits, y, weight=weights, reduction="sum")
        penalty = 0.5 * self.linear.weight.pow(2).sum() / self.hparams.l2
        return (data + penalty) / self.n_train

    # ------------------------------------------------------------------ lightning hooks
    def configure_optimizers(self):
        """Full-batch LBFGS with strong-Wolfe line search (one ``step`` per epoch); none for Newton."""
        if self.hparams.solver == "newton":
            return None
        return torch.optim.LBFGS(
            self.linear.parameters(),
            lr=1.0,
            max_iter=int(self.hparams.max_iter),
            max_eval=int(self.hparams.max_iter) * 5 // 4,
            tolerance_grad=float(self.hparams.tol),
            tolerance_change=1e-15,
            history_size=int(self.hparams.history_size),
            line_search_fn="strong_wolfe",
        )

    def on_train_start(self) -> None:
        """Compute train statistics from the training dataloader if they were not set."""
        if self.is_prepared:
            return
        loader = self.trainer.train_dataloader
        xs, ys = [], []
        for batch in loader:
            x, y = _split_batch(batch)
            if y is None:
                raise ValueError("the training dataloader must yield (x, y) batches")
            xs.append(x)
            ys.append(y)
        self.set_train_statistics(torch.cat(xs), torch.cat(ys))

    def training_step(self, batch, batch_idx: int) -> Tensor | None:
        """LBFGS: return ``J / n`` on the (full) batch (called through Lightning's closure).
        Newton: solve the full-batch problem exactly and set the weights.

        Nothing is logged here: LBFGS evaluates the closure many times per step, so metrics
        are logged once, after the step, in :meth:`on_train_batch_end`.
        """
        x, y = _split_batch(batch)
        if self.automatic_optimization:
            return self.objective(self(x), y)
        if y is None:
            raise ValueError("the training dataloader must yield (x, y) batches")
        with torch.no_grad():
            fit = fit_standardised(
                x.detach().cpu().numpy(), y.detach().cpu().numpy(), self.mean.cpu().numpy(),
                self.std.cpu().numpy(), C=float(self.hparams.l2),
                tol=min(float(self.hparams.tol), 1e-10), max_iter=min(int(self.hparams.max_iter), 100))
            w = torch.from_numpy(fit.coef).to(self.linear.weight)
            self.linear.weight.copy_(w.reshape(1, -1))
            self.linear.bias.fill_(fit.intercept)
        self.n_iter = fit.n_iter
        return None

    @torch.no_grad()
    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        """Log ``train/loss`` and ``train/auroc`` at the parameters after the LBFGS step."""
        x, y = _split_batch(batch)
        logits = self(x)
        loss = self.objective(logits, y)
        self.train_auroc.update(auroc_inputs(logits), y.long().reshape(-1))
        bs = int(x.shape[0])
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=bs)
        self.log("train/auroc", self.train_auroc, on_step=False, on_epoch=True, batch_size=bs)

    def validation_step(self, batch, batch_idx: int) -> None:
        """Accumulate validation logits into ``val_auroc`` and log ``val/auroc`` per epoch."""
        x, y = _split_batch(batch)
        if y is None:
            raise ValueError("the validation dataloader must yield (x, y) batches")
        logits = self(x)
        self.val_auroc.update(auroc_inputs(logits), y.long().reshape(-1))
        self.log(
            "val/auroc", self.val_auroc, on_step=False, on_epoch=True, batch_size=int(x.shape[0])
        )

    def predict_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        """Logits ``[m]`` (float64) of the batch's features; labels, if present, are ignored."""
        x, _ = _split_batch(batch)
        return self(x)
