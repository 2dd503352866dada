"""Fitting and scoring the Lightning probe, and the scikit-learn reference (PROTOCOL.md §4).

``fit_probe`` trains :class:`~ipi.probe.module.LinearProbe` with a quiet, deterministic,
CPU ``lightning.Trainer`` on one full batch; ``score`` returns float64 logits.
``fit_sklearn_reference`` is the scikit-learn pipeline the probe must agree with (AUC within
0.01); the project also uses it for the metadata baseline C1 (PROTOCOL.md §5).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass
from os import PathLike

import lightning
import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from torch.utils.data import DataLoader, TensorDataset

from ipi.probe.module import LinearProbe

__all__ = ["ProbeConfig", "fit_probe", "score", "fit_sklearn_reference", "validate_xy"]

_QUIET_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning")
_QUIET_WARNINGS = (
    r".*does not have many workers.*",
    r".*GPU available but not used.*",
    r".*TPU available but not used.*",
    r".*smaller than the logging interval.*",
    r".*LBFGS.*",
    r".*sync_dist=True.*",
    r".*validation_step.*but have no.*val_dataloader.*",
    r".*LeafSpec.*",
    r".*configure_optimizers` returned `None`.*",
    r".*training_step.*returned `None`.*",
)


@dataclass
class ProbeConfig:
    """Hyper-parameters of the probe (PROTOCOL.md §4): ``probe.*``, passed in (defaults: the ``ProbeConf`` schema).

    Attributes:
        l2: scikit-learn's ``C``, the inverse L2 regularisation strength (> 0).
        max_iter: LBFGS iterations per epoch (one full-batch optimiser step per epoch).
        tol: LBFGS gradient tolerance on the ``1/n``-scaled objective (max-abs gradient).
        max_epochs: Number of full-batch LBFGS steps (Newton: solves; one is exact).
        seed: Seed passed to ``lightning.seed_everything`` (the fit starts from zero weights).
        solver: ``"newton"`` (exact full-batch Newton) or ``"lbfgs"``
            (:class:`~ipi.probe.module.LinearProbe`).
"""

    l2: float
    max_iter: int
    tol: float
    solver: str
    max_epochs: int = 1
    seed: int = 0


def validate_xy(x: np.ndarray, y: np.ndarray | None = None, *, name: str = "x") -> None:
    """Check shapes, finiteness and labels of probe inputs.

    Args:
        x: Features ``[n, d]``.
        y: Optional labels ``[n]`` in ``{0, 1}``; both classes must be present.
        name: Name used in error messages.

    Raises:
        ValueError: If ``x`` is not 2-D or empty, has NaN/inf values (the message gives the
            number of affected rows), ``y`` does not match ``x`` in length, has values other
            than 0/1, or has a single class.
    """
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty 2-D array [n_rows, n_features], "
                         f"got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
        raise ValueError(f"{name} must be a real numeric array, got dtype {x.dtype}")
    if np.issubdtype(x.dtype, np.floating):
        bad = np.zeros(x.shape[0], dtype=bool)
        for s in range(0, x.shape[0], 1024):
            bad[s : s + 1024] = ~np.isfinite(x[s : s + 1024]).all(axis=1)
        n_bad = int(bad.sum())
        if n_bad:
            first = np.flatnonzero(bad)[:5].tolist()
            raise ValueError(
                f"{name} has NaN/inf values in {n_bad} of {x.shape[0]} rows "
                f"(first row indices: {first}); drop or repair them before fitting/scoring"
            )
    if y is None:
        return
    y = np.asarray(y).reshape(-1)
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"{name} has {x.shape[0]} rows but y has {y.shape[0]} labels")
    values = np.unique(y)
    if not np.isin(values, [0, 1]).all():
        raise ValueError(f"y must contain only 0 and 1, got values {values[:10].tolist()}")
    if values.size < 2:
        raise ValueError(
            f"y has a single class ({int(values[0])}) in all {y.shape[0]} rows; the probe "
            "needs both clean (0) and attack (1) training rows"
        )


def _full_batch_loader(x: np.ndarray, y: np.ndarray) -> DataLoader:
    """A one-batch loader yielding ``(x [n, d] float64, y [n] float64)`` with no copy per epoch.

    ``TensorDataset`` indexed with ``slice(None)`` returns the whole tensors (views), so the
    batch is the full training set (batch size = n) without collating ``n`` single rows.
    """
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))
    yt = torch.from_numpy(np.asarray(y, dtype=np.float64).reshape(-1))
    return DataLoader(TensorDataset(xt, yt), batch_size=None, sampler=[slice(None)],
                      num_workers=0)


@contextlib.contextmanager
def _quiet():
    loggers = [logging.getLogger(n) for n in _QUIET_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            for pattern in _QUIET_WARNINGS:
                warnings.filterwarnings("ignore", message=pattern)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def fit_probe(
    x_train: np.ndarray,
    y_train: np.ndarray,
    probe_config: ProbeConfig,
    *,
    logger=None,
    x_val: np.ndarray | None = None,
    y_val: np.ndarray | None = None,
    default_root_dir: str | PathLike | None = None,
) -> LinearProbe:
    """Train the linear probe on clean-vs-attack training rows (PROTOCOL.md §4).

    Standardisation statistics and balanced class weights come from ``x_train``/``y_train``
    only. Training is one full batch per epoch, in float64 — an exact Newton solve
    (``probe_config.solver="newton"``) or LBFGS with strong Wolfe (``"lbfgs"``) — through
    ``lightning.Trainer(accelerator="cpu", devices=1, deterministic=True)``; banners,
    progress bars, checkpoints and the model summary are off.

    Args:
        x_train: Training features ``[n, d]`` (float16/32/64). Converted to one float64 copy.
        y_train: Training labels ``[n]`` in ``{0, 1}`` (1 = attack, 0 = clean).
        probe_config: Hyper-parameters (``probe.*``).
        logger: A Lightning logger (e.g. ``CSVLogger``) or None for no logging.
        x_val: Optional validation features ``[m, d]``; logs ``val/auroc`` each epoch.
        y_val: Validation labels ``[m]`` (required with ``x_val``).
        default_root_dir: Trainer root directory (logs of loggers without their own path).

    Returns:
        The fitted :class:`LinearProbe` in eval mode, on CPU. The metrics of the fit are kept
        in ``probe.fit_metrics`` (a dict of floats: ``trainer.callback_metrics``, the max-abs
        gradient of ``J / n`` at the solution ``train/grad_max``, and ``newton/n_iter`` or
        ``lbfgs/n_iter``, the iterations taken). A ``RuntimeWarning`` is issued if LBFGS used
        all its iterations without reaching ``tol``.

    Raises:
        ValueError: If ``y_train`` has a single class or values other than 0/1, a feature
            array has NaN/inf (the message gives the number of rows), shapes disagree, or
            only one of ``x_val``/``y_val`` is given.
    """
    validate_xy(x_train, y_train, name="x_train")
    x_train = np.asarray(x_train)
    if (x_val is None) != (y_val is None):
        raise ValueError("pass both x_val and y_val, or neither")
    if x_val is not None:
        x_val = np.asarray(x_val)
        if x_val.ndim != 2 or x_val.shape[1] != x_train.shape[1]:
            raise ValueError(
                f"x_val must have shape [m, {x_train.shape[1]}], got {x_val.shape}"
            )
        validate_xy(x_val, None, name="x_val")
        y_val_arr = np.asarray(y_val).reshape(-1)
        if y_val_arr.shape[0] != x_val.shape[0] or not np.isin(y_val_arr, [0, 1]).all():
            raise ValueError("y_val must be [m] labels in {0, 1} matching x_val")

    with _quiet():
        lightning.seed_everything(probe_config.seed, workers=True, verbose=False)
        probe = LinearProbe(
            n_features=int(x_train.shape[1]), l2=probe_config.l2, max_iter=probe_config.max_iter, tol=probe_config.tol,
            solver=probe_config.solver,
        )
        probe.set_train_statistics(x_train, y_train)
        train_loader = _full_batch_loader(x_train, y_train)
        val_loader = _full_batch_loader(x_val, y_val) if x_val is not None else None
        trainer = lightning.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=int(probe_config.max_epochs),
            logger=logger if logger is not None else False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            deterministic=True,
            num_sanity_val_steps=0,
            log_every_n_steps=1,
            default_root_dir=default_root_dir,
        )
        trainer.fit(probe, train_dataloaders=train_loader, val_dataloaders=val_loader)
    probe.fit_metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    grad_max = _objective_grad_max(probe, train_loader)
    probe.fit_metrics["train/grad_max"] = grad_max
    if probe.hparams.solver == "newton":  # fit_standardised raises if it did not converge
        probe.fit_metrics["newton/n_iter"] = float(probe.n_iter)
        return probe.eval()
    optimizer = trainer.optimizers[0]
    state = optimizer.state[optimizer.param_groups[0]["params"][0]]
    n_iter = int(state.get("n_iter", 0))
    probe.fit_metrics["lbfgs/n_iter"] = float(n_iter)
    if n_iter >= int(probe_config.max_iter) * int(probe_config.max_epochs) and grad_max > probe_config.tol:
        warnings.warn(
            f"LBFGS stopped after {n_iter} iterations without reaching tol={probe_config.tol} "
            f"(last max-abs gradient {grad_max:.3g}); raise ProbeConfig.max_iter or max_epochs",
            RuntimeWarning,
            stacklevel=2,
        )
    return probe.eval()


def _objective_grad_max(probe: LinearProbe, loader: DataLoader) -> float:
    """Max-abs gradient of ``J / n`` at the fitted parameters (the LBFGS stopping quantity)."""
    x, y = next(iter(loader))
    params = list(probe.linear.parameters())
    with torch.enable_grad():
        loss = probe.objective(probe(x), y)
        grads = torch.autograd.grad(loss, params)
    return float(max(g.abs().max() for g in grads))


@torch.no_grad()
def score(probe: LinearProbe, x: np.ndarray, chunk_rows: int = 4096) -> np.ndarray:
    """Logits of the probe on rows ``x`` (any variant, controls included).

    Args:
        probe: A fitted probe.
        x: Features ``[n, d]`` (float16/32/64).
        chunk_rows: Rows converted to float64 at a time (bounds memory for wide features).

    Returns:
        Logits ``[n]``, float64 (higher = more attack-like).

    Raises:
        ValueError: If ``x`` is not ``[n, d]`` with the probe's ``d`` or has NaN/inf rows.
    """
    validate_xy(x, None, name="x")
    x = np.asarray(x)
    d = int(probe.hparams.n_features)
    if x.shape[1] != d:
        raise ValueError(f"x has {x.shape[1]} features but the probe was fit on {d}")
    w, b = probe.effective_weights()
    w = w.detach().cpu().to(torch.float64)
    b = b.detach().cpu().to(torch.float64)
    out = np.empty(x.shape[0], dtype=np.float64)
    for s in range(0, x.shape[0], chunk_rows):
        xc = torch.from_numpy(np.asarray(x[s : s + chunk_rows], dtype=np.float64))
        out[s : s + chunk_rows] = (xc @ w + b).numpy()
    return out


def fit_sklearn_reference(x_train: np.ndarray, y_train: np.ndarray, l2: float | None = None) -> Pipeline:
    """The scikit-learn model the probe must agree with; also the C1 metadata baseline.

    ``Pipeline([("scaler", StandardScaler()), ("logreg", LogisticRegression(C=l2,
    class_weight="balanced", max_iter=5000, tol=1e-10))])`` (lbfgs, L2 penalty, intercept
    not penalised), fitted on the training rows. PROTOCOL.md §4 and §5 (C1).

    Args:
        x_train: Training features ``[n, d]`` (for C1: the 4 metadata scalars).
        y_train: Labels ``[n]`` in ``{0, 1}``.
        l2: ``C`` (inverse regularisation strength); None: scikit-learn's own default ``C``.

    Returns:
        The fitted pipeline; use ``decision_function`` for logits.

    Raises:
        ValueError: As :func:`validate_xy` (single class, NaN/inf rows, shape mismatch).
    """
    validate_xy(x_train, y_train, name="x_train")
    pipe = Pipeline(
        [
            ("scaler", StandardScaler()),
            (
                "logreg",
                LogisticRegression(
                    **({} if l2 is None else {"C": float(l2)}), class_weight="balanced", max_iter=5000, tol=1e-10
                ),
            ),
        ]
    )
    return pipe.fit(np.asarray(x_train, dtype=np.float64), np.asarray(y_train).reshape(-1))
