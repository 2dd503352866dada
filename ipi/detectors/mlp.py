"""One-hidden-layer MLP on pooled hidden states, early-stopped on a grouped inner split."""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field, replace

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import log_loss
from sklearn.model_selection import GroupShuffleSplit
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

from ipi.detectors.detector import check_fit_inputs

__all__ = ["MLPDetector"]


@dataclass
class MLPDetector:
    """scikit-learn ``MLPClassifier`` (one ReLU hidden layer, Adam, L2 ``alpha``), seeded.

    Fit: standardise with the training rows' statistics; hold out ``val_fraction`` of the
    training **trajectories** (``GroupShuffleSplit``, seeded: never a row split, so the
    validation rows share no trajectory with the rows fitted on); train epoch by epoch
    (``partial_fit``) on the rest and keep the weights of the epoch with the lowest validation
    log-loss; stop after ``patience`` epochs without improvement or at ``max_epochs``. The kept
    model is the one fitted on the inner training trajectories (no refit on all of them). Score:
    the output logit (pre-sigmoid, float64, so no ties from a saturated probability).

    The settings are ``detector.*`` (conf/detector/mlp.yaml), passed in.

    Args:
        hidden: Hidden units.
        alpha: L2 penalty (scikit-learn's ``alpha``).
        learning_rate: Adam step size.
        batch_size: Minibatch rows.
        max_epochs: Upper bound on epochs.
        patience: Epochs without a better validation loss before stopping.
        val_fraction: Fraction of training trajectories held out for early stopping.
        seed: Seeds the split, the initialisation and the minibatch order.
    """

    hidden: int
    alpha: float
    learning_rate: float
    batch_size: int
    max_epochs: int
    patience: int
    val_fraction: float
    seed: int
    name: str = "mlp"
    permutation_m: int | None = None  # check 4's refits M; None: evaluation.permutation.m
    input: str = "hidden"
    trainable: bool = True
    scaler_: StandardScaler | None = field(default=None, repr=False)
    model_: MLPClassifier | None = field(default=None, repr=False)
    fit_info_: dict = field(default_factory=dict, repr=False)

    def fit(self, x, y, groups) -> MLPDetector:
        x, y = check_fit_inputs(x, y, groups, self.name)
        groups = np.asarray(groups)
        if len(np.unique(groups)) < 2:
            raise ValueError(f"detector=mlp: early stopping needs >= 2 training trajectories, got {len(np.unique(groups))}")
        tr, va = next(GroupShuffleSplit(n_splits=1, test_size=self.val_fraction, random_state=self.seed)
                      .split(x, y, groups))
        if len(np.unique(y[tr])) < 2 or len(np.unique(y[va])) < 2:
            raise ValueError("detector=mlp: the grouped inner split left one class on a side; "
                             "use more trajectories or change detector.val_fraction")
        scaler = StandardScaler().fit(x)
        z = scaler.transform(x)
        clf = MLPClassifier(hidden_layer_sizes=(self.hidden,), alpha=self.alpha,
                            learning_rate_init=self.learning_rate, batch_size=min(self.batch_size, len(tr)),
                            random_state=self.seed, shuffle=True)
        best, best_loss, stale, epochs = None, np.inf, 0, 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            for epochs in range(1, self.max_epochs + 1):
                clf.partial_fit(z[tr], y[tr], classes=np.array([0, 1]))
                loss = log_loss(y[va], clf.predict_proba(z[va])[:, 1], labels=[0, 1])
                if loss < best_loss - 1e-12:
                    best, best_loss, stale = copy.deepcopy(clf), loss, 0
                else:
                    stale += 1
                    if stale >= self.patience:
                        break
        info = {"epochs": epochs, "best_val_log_loss": float(best_loss),
                "rows_inner_train": int(len(tr)), "rows_inner_val": int(len(va))}
        return replace(self, scaler_=scaler, model_=best, fit_info_=info)

    def score(self, x) -> np.ndarray:
        if self.model_ is None:
            raise RuntimeError("MLPDetector.score before fit")
        z = self.scaler_.transform(np.asarray(x, dtype=np.float64))
        (w1, w2), (b1, b2) = self.model_.coefs_, self.model_.intercepts_
        h = np.maximum(z @ w1 + b1, 0.0)
        return (h @ w2 + b2).reshape(-1).astype(np.float64)

    def settings(self) -> dict:
        return {"name": self.name, "hidden": self.hidden, "alpha": self.alpha, "learning_rate": self.learning_rate,
                "batch_size": self.batch_size, "max_epochs": self.max_epochs, "patience": self.patience,
                "val_fraction": self.val_fraction, "seed": self.seed,
                "early_stopping": "lowest validation log-loss on held-out training trajectories (GroupShuffleSplit)"}
