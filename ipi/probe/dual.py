"""Cheap exact refits of the probe for the permutation test (PROTOCOL.md §4, §7.4).

The probe (:mod:`ipi.probe.module`) minimises, on training rows standardised with their own
mean/std (``z = (x − mean) / std``)::

    J(w, b) = Σ_i c_{y_i} · BCE(z_i·w + b, y_i) + ½‖w‖² / C,     c_k = n / (2 n_k)

(scikit-learn's ``LogisticRegression(C, class_weight="balanced")``, intercept not penalised).
By the representer theorem the minimiser lies in the row space of ``Z`` (``w = Zᵀα``), so only
the Gram matrix ``K = Z Zᵀ`` (``[n, n]``) and the test-vs-train Gram ``Z_test Zᵀ`` matter. With
``K = U S Uᵀ`` (positive eigenvalues only, rank ``r ≤ n − 1``) the change of variables
``w = Zᵀ U S^{-1/2} β`` gives ``Z w = Φ β`` with ``Φ = U S^{1/2}`` (``[n, r]``) and
``‖w‖ = ‖β‖``: the same L2 logistic regression on ``r`` reduced features, exactly. When
``d ≤ n`` the reduced design is ``Z`` itself.

:class:`ReducedDesign` builds ``Φ`` and ``Φ_test`` once (the only pass over the ``d``
features, in column chunks: at paper width 107,520 features × 1,000 rows this is one Gram
product), and :func:`fit_reduced` solves each refit by Newton's method on ``r + 1``
coefficients — the label permutations of the test change neither ``Z`` nor the class counts,
so every refit reuses the same design. The scores equal scikit-learn's refits (the test suite
checks AUCs within 1e-4 and scores within 1e-6 on small data).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["ReducedDesign", "fit_reduced", "standardisation"]


def standardisation(x: np.ndarray, chunk_rows: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Mean and scale of training rows exactly as the probe sets them (PROTOCOL.md §4).

    ``ddof=0``; a feature indistinguishable from a constant gets scale 1 (scikit-learn's
    ``StandardScaler`` rule); :meth:`ipi.probe.module.LinearProbe.set_train_statistics` calls it.

    Args:
        x: Training features ``[n, d]`` (any float dtype).
        chunk_rows: Rows converted to float64 at a time.

    Returns:
        ``(mean [d], std [d])`` float64.
    """
    n = x.shape[0]
    total = np.zeros(x.shape[1], dtype=np.float64)
    for s in range(0, n, chunk_rows):
        total += x[s : s + chunk_rows].sum(axis=0, dtype=np.float64)
    mean = total / n
    sq = np.zeros_like(mean)
    for s in range(0, n, chunk_rows):
        dev = x[s : s + chunk_rows].astype(np.float64) - mean
        sq += np.einsum("ij,ij->j", dev, dev)
    var = sq / n
    eps = np.finfo(np.float64).eps
    constant = var <= n * eps * var + (n * mean * eps) ** 2
    std = np.sqrt(var)
    std[constant] = 1.0
    return mean, std


@dataclass(frozen=True)
class ReducedDesign:
    """Training and test rows of one fold in the probe's reduced coordinates.

    Attributes:
        phi: ``[n, r]`` reduced training design (``Φ Φᵀ = Z Zᵀ``).
        phi_test: ``[m, r]`` reduced test rows (``Φ_test Φᵀ = Z_test Zᵀ``).
        n_features: ``d`` of the raw features.
        dual: Whether the Gram (dual) route was taken (``d > n``) or ``Φ = Z``.
    """

    phi: np.ndarray
    phi_test: np.ndarray
    n_features: int
    dual: bool

    @classmethod
    def build(cls, x_train: np.ndarray, x_test: np.ndarray, *, chunk_cols: int = 8192,
              rel_eig_tol: float = 1e-12) -> ReducedDesign:
        """Standardise on ``x_train`` and reduce to at most ``n`` coordinates.

        Args:
            x_train: Training rows ``[n, d]`` (float16/32/64).
            x_test: Rows to score ``[m, d]``.
            chunk_cols: Feature columns standardised (float64) at a time; bounds memory to
                ``(n + m) · chunk_cols`` float64 values besides the ``[n, n]`` Gram matrix.
            rel_eig_tol: Eigenvalues of ``K`` below ``rel_eig_tol · max`` are treated as 0
                (the centred Gram matrix has rank ≤ n − 1).

        Returns:
            The design.

        Raises:
            ValueError: If the widths differ or there are no training rows.
        """
        x_train = np.asarray(x_train)
        x_test = np.asarray(x_test)
        if x_train.ndim != 2 or x_test.ndim != 2 or x_train.shape[1] != x_test.shape[1]:
            raise ValueError(f"ReducedDesign: shapes {x_train.shape} and {x_test.shape} do not match")
        n, d = x_train.shape
        if n == 0:
            raise ValueError("ReducedDesign: no training rows")
        mean, std = standardisation(x_train)
        if d <= n:
            z = (x_train.astype(np.float64) - mean) / std
            zt = (x_test.astype(np.float64) - mean) / std
            return cls(z, zt, d, False)
        k = torch.zeros((n, n), dtype=torch.float64)
        kt = torch.zeros((x_test.shape[0], n), dtype=torch.float64)
        for s in range(0, d, chunk_cols):
            sl = slice(s, s + chunk_cols)
            z = torch.from_numpy((x_train[:, sl].astype(np.float64) - mean[sl]) / std[sl])
            zt = torch.from_numpy((x_test[:, sl].astype(np.float64) - mean[sl]) / std[sl])
            k += z @ z.T
            kt += zt @ z.T
        k = 0.5 * (k + k.T)
        s_eig, u = torch.linalg.eigh(k)
        keep = s_eig > rel_eig_tol * max(float(s_eig[-1]), 0.0)
        s_eig, u = s_eig[keep], u[:, keep]
        root = torch.sqrt(s_eig)
        return cls((u * root).numpy(), ((kt @ u) / root).numpy(), d, True)

    @property
    def rank(self) -> int:
        """``r``, the number of reduced coordinates."""
        return int(self.phi.shape[1])


def _loss_grad(theta: torch.Tensor, phi: torch.Tensor, y: torch.Tensor, cw: torch.Tensor, lam: float):
    f = phi @ theta[:-1] + theta[-1]
    # c · BCE(f, y) = c · (log(1 + e^f) − y f), computed stably
    beta = theta[:-1]
    loss = float(torch.sum(cw * (torch.nn.functional.softplus(f) - y * f)) + 0.5 * lam * (beta @ beta))
    p = torch.sigmoid(f)
    r = cw * (p - y)
    g = torch.empty_like(theta)
    g[:-1] = phi.T @ r + lam * beta
    g[-1] = r.sum()
    return loss, g, p


def fit_reduced(phi: np.ndarray, y: np.ndarray, *, C: float = 1.0, tol: float = 1e-10,
                max_iter: int = 100, theta0: np.ndarray | None = None) -> np.ndarray:
    """Balanced L2 logistic regression on reduced coordinates by damped Newton (PROTOCOL.md §4).

    Minimises ``J/n`` with ``J = Σ c_{y_i} BCE(φ_i·β + b, y_i) + ½‖β‖²/C``,
    ``c_k = n / (2 n_k)``: the probe's objective (see the module docstring). Float64 torch
    linear algebra (its LAPACK is markedly faster than numpy's wheels' for the ``[r+1, r+1]``
    Hessian and Cholesky solve of every iteration); Armijo backtracking.

    Args:
        phi: Reduced design ``[n, r]``.
        y: Labels ``[n]`` in ``{0, 1}``, both present.
        C: Inverse regularisation strength (scikit-learn's ``C``, the probe's ``l2``).
        tol: Stop when the max-abs gradient of ``J/n`` is below ``tol``.
        max_iter: Newton iterations at most.
        theta0: Warm start ``[r + 1]`` (``β`` then ``b``); zeros by default.

    Returns:
        ``theta`` ``[r + 1]`` float64 numpy: ``β`` followed by the intercept ``b``.

    Raises:
        ValueError: A single class in ``y``.
        RuntimeError: No convergence within ``max_iter``.
    """
    y_np = np.asarray(y, dtype=np.float64).reshape(-1)
    n, r = phi.shape
    n_pos = float(y_np.sum())
    if n_pos == 0 or n_pos == n:
        raise ValueError("fit_reduced: y has a single class")
    phi_t = torch.as_tensor(np.asarray(phi, dtype=np.float64))
    y_t = torch.from_numpy(y_np)
    cw = torch.from_numpy(np.where(y_np == 1, n / (2.0 * n_pos), n / (2.0 * (n - n_pos))) / n)  # J/n
    lam = 1.0 / (C * n)
    theta = torch.zeros(r + 1, dtype=torch.float64) if theta0 is None else torch.tensor(theta0, dtype=torch.float64)
    design = torch.cat([phi_t, torch.ones(n, 1, dtype=torch.float64)], dim=1)
    reg = torch.full((r + 1,), lam, dtype=torch.float64)
    reg[-1] = 0.0
    loss, g, p = _loss_grad(theta, phi_t, y_t, cw, lam)
    for _ in range(max_iter):
        if float(g.abs().max()) <= tol:
            return theta.numpy()
        # Hessian of J/n: [Φ 1]ᵀ diag(c p (1 − p)) [Φ 1] + diag(λ, …, λ, 0).
        a = design * torch.sqrt(cw * p * (1.0 - p))[:, None]
        h = a.T @ a
        h.diagonal().add_(reg)
        chol, info = torch.linalg.cholesky_ex(h)
        if int(info) == 0:
            step = torch.cholesky_solve(g[:, None], chol)[:, 0]
        else:
            step = torch.linalg.lstsq(h, g[:, None]).solution[:, 0]
        t, dec = 1.0, float(g @ step)
        while True:  # Armijo backtracking
            cand = theta - t * step
            c_loss, c_g, c_p = _loss_grad(cand, phi_t, y_t, cw, lam)
            if c_loss <= loss - 1e-4 * t * dec or t < 1e-10:
                break
            t *= 0.5
        if t < 1e-10 and c_loss > loss:
            break
        theta, loss, g, p = cand, c_loss, c_g, c_p
    gmax = float(g.abs().max())
    if gmax <= max(tol, 1e-8):
        return theta.numpy()
    if gmax <= 1e-6:  # far below what moves an AUC; say so rather than stop a run
        warnings.warn(f"fit_reduced: stopped at max-abs gradient {gmax:.3g} (tol {tol})", RuntimeWarning,
                      stacklevel=2)
        return theta.numpy()
    raise RuntimeError(
        f"fit_reduced: Newton did not converge in {max_iter} iterations "
        f"(max-abs gradient {float(g.abs().max()):.3g} > tol {tol})"
    )
