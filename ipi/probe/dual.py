"""Cheap exact refits of the probe for the permutation test (PROTOCOL.md §4, §7.4).

The probe (:mod:`ipi.probe.module`) minimises, on training rows standardised with their own
mean/std (``z = (x − mean) / std``)::

    J(w, b) = Σ_i c_{y_i} · BCE(z_i·w + b, y_i) + ½‖w‖² / C,     c_k = n / (2 n_k)

(scikit-learn's ``LogisticRegression(C, class_weight="balanced")``, intercept not penalised).
By the representer theorem ``w = Zᵀα``, so only the Gram matrix ``K = Z Zᵀ`` and the
test-vs-train Gram ``Z_test Zᵀ`` matter. With ``K = U S Uᵀ`` (positive eigenvalues only, rank
``r ≤ n − 1``), ``w = Zᵀ U S^{-1/2} β`` gives ``Z w = Φ β`` with ``Φ = U S^{1/2}`` and
``‖w‖ = ‖β‖``: the same L2 logistic regression on ``r`` reduced features, exactly. When
``d ≤ n`` the reduced design is ``Z`` itself.

:class:`ReducedDesign` builds ``Φ`` and ``Φ_test`` once (the only pass over the ``d`` features),
and :func:`fit_reduced` solves each refit by Newton's method on ``r + 1`` coefficients; label
permutations change neither ``Z`` nor the class counts, so every refit reuses the design."""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["ExactFit", "ReducedDesign", "fit_reduced", "fit_reduced_batch", "fit_standardised", "standardisation"]


def standardisation(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and scale of training rows exactly as the probe sets them (PROTOCOL.md §4).

    ``ddof=0``; a feature indistinguishable from a constant gets scale 1 (scikit-learn's
    ``StandardScaler`` rule); :meth:`ipi.probe.module.LinearProbe.set_train_statistics` calls it.

    Args:
        x: Training features ``[n, d]`` (any float dtype), converted to float64 1024 rows at a time.

    Returns:
        ``(mean [d], std [d])`` float64.
    """
    n, chunk_rows = x.shape[0], 1024
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


#: Feature columns standardised (float64) at a time: bounds memory to ``(n + m) · CHUNK_COLS``
#: float64 values besides the ``[n, n]`` Gram matrix.
CHUNK_COLS = 8192
#: Eigenvalues of ``K`` below ``REL_EIG_TOL · max`` are treated as 0 (the centred ``K`` has rank ≤ n − 1).
REL_EIG_TOL = 1e-12


def _gram_roots(x, mean, std, x_test=None):
    """``(U [n, r], S^{1/2} [r], Z_test Zᵀ [m, n] or None)`` of the Gram matrix ``K = Z Zᵀ`` of the standardised
    ``x`` [n, d], built :data:`CHUNK_COLS` columns at a time; eigenvalues below :data:`REL_EIG_TOL` · max dropped."""
    n = x.shape[0]
    k = torch.zeros((n, n), dtype=torch.float64)
    kt = None if x_test is None else torch.zeros((x_test.shape[0], n), dtype=torch.float64)
    for s in range(0, x.shape[1], CHUNK_COLS):
        sl = slice(s, s + CHUNK_COLS)
        z = torch.from_numpy((x[:, sl].astype(np.float64) - mean[sl]) / std[sl])
        k += z @ z.T
        if kt is not None:
            kt += torch.from_numpy((x_test[:, sl].astype(np.float64) - mean[sl]) / std[sl]) @ z.T
    k = 0.5 * (k + k.T)
    s_eig, u = torch.linalg.eigh(k)
    keep = s_eig > REL_EIG_TOL * max(float(s_eig[-1]), 0.0)
    return u[:, keep], torch.sqrt(s_eig[keep]), kt


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
    def build(cls, x_train: np.ndarray, x_test: np.ndarray) -> ReducedDesign:
        """Standardise on ``x_train`` and reduce to at most ``n`` coordinates.

        Args:
            x_train: Training rows ``[n, d]`` (float16/32/64).
            x_test: Rows to score ``[m, d]``.

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
        u, root, kt = _gram_roots(x_train, mean, std, x_test)
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
                max_iter: int = 100, iterations: dict | None = None) -> np.ndarray:
    """Balanced L2 logistic regression on reduced coordinates by damped Newton (PROTOCOL.md §4).

    Minimises ``J/n`` of the module docstring in float64 torch linear algebra, with Armijo
    backtracking.

    Args:
        phi: Reduced design ``[n, r]``.
        y: Labels ``[n]`` in ``{0, 1}``, both present.
        C: Inverse regularisation strength (scikit-learn's ``C``, the probe's ``l2``).
        tol: Stop when the max-abs gradient of ``J/n`` is below ``tol``.
        max_iter: Newton iterations at most.
        iterations: If given, ``iterations["n"]`` is set to the Newton iterations taken.

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
    theta = torch.zeros(r + 1, dtype=torch.float64)
    design = torch.cat([phi_t, torch.ones(n, 1, dtype=torch.float64)], dim=1)
    reg = torch.full((r + 1,), lam, dtype=torch.float64)
    reg[-1] = 0.0
    loss, g, p = _loss_grad(theta, phi_t, y_t, cw, lam)
    counter = iterations if iterations is not None else {}
    counter["n"] = 0
    for it in range(max_iter):
        counter["n"] = it
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
        # Along the step the logits and the penalty are affine/quadratic in t: each trial of
        # the Armijo search is O(n), not a pass over Φ.
        f_cur = phi_t @ theta[:-1] + theta[-1]
        f_dir = phi_t @ step[:-1] + step[-1]
        bb, bs, ss = float(theta[:-1] @ theta[:-1]), float(theta[:-1] @ step[:-1]), float(step[:-1] @ step[:-1])
        while True:  # Armijo backtracking
            f = f_cur - t * f_dir
            c_loss = float(torch.sum(cw * (torch.nn.functional.softplus(f) - y_t * f))
                           + 0.5 * lam * (bb - 2.0 * t * bs + t * t * ss))
            if c_loss <= loss - 1e-4 * t * dec or t < 1e-10:
                break
            t *= 0.5
        if t < 1e-10 and c_loss > loss:
            break
        theta = theta - t * step
        loss, g, p = _loss_grad(theta, phi_t, y_t, cw, lam)
        counter["n"] = it + 1
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


@dataclass(frozen=True)
class ExactFit:
    """The probe's minimiser on standardised features, from :func:`fit_standardised`.

    Attributes:
        coef: ``[d]`` weights on standardised features (scikit-learn's ``coef_[0]``).
        intercept: The unpenalised intercept ``b``.
        n_iter: Newton iterations taken.
        dual: Whether the Gram (dual) route was taken (``d > n``).
        rank: Reduced coordinates ``r`` of the solve.
    """

    coef: np.ndarray
    intercept: float
    n_iter: int
    dual: bool
    rank: int


def fit_standardised(x: np.ndarray, y: np.ndarray, mean: np.ndarray, std: np.ndarray, *, C: float = 1.0,
                     tol: float = 1e-10, max_iter: int = 100) -> ExactFit:
    """The probe's exact minimiser by Newton's method, primal or dual (PROTOCOL.md §4).

    Minimises ``J/n`` of the module docstring on ``z = (x − mean) / std``: Newton on the
    ``d + 1`` primal coefficients when ``d ≤ n``; otherwise on the reduced coordinates of
    :class:`ReducedDesign`, the weights mapped back by ``w = Zᵀ U S^{-1/2} β`` (the same unique
    minimiser). Memory: ``n ·`` :data:`CHUNK_COLS` float64 values besides ``[n, n]`` (dual) or one
    float64 ``[n, d]`` copy (primal).

    Args:
        x: Training rows ``[n, d]`` (float16/32/64).
        y: Labels ``[n]`` in ``{0, 1}``, both present.
        mean: ``[d]`` standardisation mean (:func:`standardisation`).
        std: ``[d]`` standardisation scale.
        C: Inverse regularisation strength (scikit-learn's ``C``).
        tol: Max-abs gradient of ``J/n`` in the solved coordinates at which Newton stops.
        max_iter: Newton iterations at most.

    Returns:
        An :class:`ExactFit`.

    Raises:
        ValueError: A single class in ``y`` or mismatched shapes.
        RuntimeError: Newton did not converge (see :func:`fit_reduced`).
"""
    x = np.asarray(x)
    n, d = x.shape
    if mean.shape != (d,) or std.shape != (d,):
        raise ValueError(f"fit_standardised: mean/std must be [{d}], got {mean.shape}, {std.shape}")
    counter = {"n": 0}
    if d <= n:
        z = (x.astype(np.float64) - mean) / std
        theta = fit_reduced(z, y, C=C, tol=tol, max_iter=max_iter, iterations=counter)
        return ExactFit(theta[:-1].copy(), float(theta[-1]), counter["n"], False, d)
    u, root, _ = _gram_roots(x, mean, std)
    theta = fit_reduced((u * root).numpy(), y, C=C, tol=tol, max_iter=max_iter,
                        iterations=counter)
    alpha = (u @ (torch.from_numpy(theta[:-1]) / root)).numpy()  # w = Zᵀ α
    coef = np.empty(d, dtype=np.float64)
    for s in range(0, d, CHUNK_COLS):
        sl = slice(s, s + CHUNK_COLS)
        coef[sl] = (alpha @ x[:, sl].astype(np.float64) - alpha.sum() * mean[sl]) / std[sl]
    return ExactFit(coef, float(theta[-1]), counter["n"], True, int(root.numel()))



def _batch_loss_grad(theta: torch.Tensor, phi: torch.Tensor, y: torch.Tensor, cw: torch.Tensor, lam: float):
    """``J/n``, its gradient and ``p`` of each row of ``theta`` ``[b, r+1]`` (``y``, ``cw`` ``[b, n]``)."""
    beta = theta[:, :-1]
    f = beta @ phi.T + theta[:, -1:]
    loss = torch.sum(cw * (torch.nn.functional.softplus(f) - y * f), dim=1) + 0.5 * lam * torch.sum(beta * beta, dim=1)
    p = torch.sigmoid(f)
    res = cw * (p - y)
    g = torch.empty_like(theta)
    g[:, :-1] = res @ phi + lam * beta
    g[:, -1] = res.sum(dim=1)
    return loss, g, p


def _upper_cholesky_solve(u: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """``A⁻¹ rhs`` for ``A = Uᵀ U`` (``u`` ``[b, k, k]`` upper, ``rhs`` ``[b, k, q]``): two triangular
    solves (on a CPU markedly faster than ``torch.cholesky_solve``'s batched path; same system)."""
    y = torch.linalg.solve_triangular(u.mT, rhs, upper=False)
    return torch.linalg.solve_triangular(u, y, upper=True)


def _batch_newton_step(phi: torch.Tensor, gram: torch.Tensor | None, w: torch.Tensor, g: torch.Tensor,
                       lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Newton steps ``H_j⁻¹ g_j`` of a block of problems sharing ``phi`` ``[n, r]``.

    ``H_j = [Φ 1]ᵀ diag(w_j) [Φ 1] + diag(λ, …, λ, 0)``. With ``gram = Φ Φᵀ`` the ``r × r`` block
    is inverted by the Woodbury identity through ``λI + W^{1/2} K W^{1/2}`` (``[n, n]``) and the
    intercept by its Schur complement; without it the ``[r+1, r+1]`` Hessians are factored
    directly. Both solve the same system exactly (Cholesky).

    Returns:
        ``(step [b, r+1], ok [b] bool)``; ``ok`` is False where a factorisation failed or the
        step is not finite (the caller re-solves those problems one by one).
"""
    b, n = w.shape
    # Problems with the same weights have the same matrix: factor it once (the first step from
    # zero of balanced label permutations: every weight is c · 1/4 with c equal across classes).
    wf = w[:1] if b > 1 and bool((w == w[:1]).all()) else w  # [1 or b, n]
    if gram is None:
        design = torch.cat([phi, torch.ones(n, 1, dtype=phi.dtype)], dim=1)  # [n, r+1]
        h = (design.T[None] * wf[:, None, :]) @ design  # [b or 1, r+1, r+1]
        diag = h.diagonal(dim1=1, dim2=2)
        diag[:, :-1] += lam
        chol, info = torch.linalg.cholesky_ex(h, upper=True)
        step = _upper_cholesky_solve(chol, g[:, :, None])[:, :, 0]
        ok = (info == 0).expand(b)
    else:
        sw = torch.sqrt(w)
        swf = sw[:1] if wf.shape[0] == 1 else sw
        m = torch.mul(gram, swf[:, :, None])  # [b or 1, n, n] = W^{1/2} K W^{1/2}, one buffer
        m.mul_(swf[:, None, :])
        m.diagonal(dim1=1, dim2=2).add_(lam)
        chol, info = torch.linalg.cholesky_ex(m, upper=True)
        info = info.expand(b)
        c = w @ phi  # [b, r]: Φᵀ w, the β–intercept block of H
        rhs = torch.stack([g[:, :-1], c], dim=2)  # [b, r, 2]
        t = sw[:, :, None] * (phi @ rhs)  # [b, n, 2]
        t = sw[:, :, None] * _upper_cholesky_solve(chol, t)
        sol = (rhs - phi.T @ t) / lam  # A⁻¹ [g_β, c],  A = Φᵀ W Φ + λ I
        u, v = sol[:, :, 0], sol[:, :, 1]
        schur = w.sum(dim=1) - torch.sum(c * v, dim=1)
        sb = (g[:, -1] - torch.sum(c * u, dim=1)) / schur
        step = torch.cat([u - v * sb[:, None], sb[:, None]], dim=1)
        ok = (info == 0) & (schur > 0)
    ok = ok & torch.isfinite(step).all(dim=1)
    return step, ok


def fit_reduced_batch(phi: np.ndarray, y: np.ndarray, *, C: float = 1.0, tol: float = 1e-10,
                      max_iter: int = 100, block_bytes: int = 64 * 2**20) -> np.ndarray:
    """:func:`fit_reduced` of many label vectors on one design at once (PROTOCOL.md §4, §7.4).

    The same damped Newton method (start, Armijo rule, stopping rule) on all M problems
    together, in blocks whose work arrays fit ``block_bytes``: one matrix product computes every
    problem's logits and each Newton system is solved exactly by a batched Cholesky
    factorisation (:func:`_batch_newton_step`); problems of a block with equal weights share one
    factorisation, and with several torch threads the blocks run one per thread. The minimiser
    is unique, so the result equals the sequential fits up to the solver tolerance. A problem
    whose factorisation fails, whose line search stalls or that does not converge is re-solved
    alone by :func:`fit_reduced`, which warns or raises as for a single fit.

    Args:
        phi: Reduced design ``[n, r]``.
        y: Labels ``[M, n]`` in ``{0, 1}``; each row has both classes.
        C: Inverse regularisation strength.
        tol: Max-abs gradient of ``J/n`` at which a problem stops.
        max_iter: Newton iterations at most per problem.
        block_bytes: Memory bound of a block's float64 work arrays.

    Returns:
        ``theta`` ``[M, r + 1]`` float64: ``β`` then the intercept, one row per label vector.

    Raises:
        ValueError: ``y`` is not ``[M, n]`` or a row has a single class.
        RuntimeError: As :func:`fit_reduced` for a problem that does not converge.
"""
    y_np = np.asarray(y, dtype=np.float64)
    phi_np = np.asarray(phi, dtype=np.float64)
    n, r = phi_np.shape
    if y_np.ndim != 2 or y_np.shape[1] != n:
        raise ValueError(f"fit_reduced_batch: y must be [M, {n}], got {y_np.shape}")
    n_pos = y_np.sum(axis=1)
    if np.any((n_pos == 0) | (n_pos == n)):
        raise ValueError("fit_reduced_batch: a label vector has a single class")
    out = np.empty((y_np.shape[0], r + 1), dtype=np.float64)
    if y_np.shape[0] == 0:
        return out
    phi_t = torch.from_numpy(np.ascontiguousarray(phi_np))
    lam = 1.0 / (C * n)
    # cost of one problem's Newton solve: direct Hessian vs Woodbury through [n, n]
    woodbury = n * n * n / 3.0 + 4.0 * n * r < n * (r + 1) ** 2 + (r + 1) ** 3 / 3.0
    gram = phi_t @ phi_t.T if woodbury else None
    per = 8 * (3 * n * n if woodbury else 2 * (n + r + 1) * (r + 1)) + 8 * 8 * n
    block = max(1, int(block_bytes // per))
    starts = range(0, y_np.shape[0], block)

    def solve(s: int) -> np.ndarray:
        return _fit_block(phi_np, phi_t, gram, y_np[s : s + block], n_pos[s : s + block], C, lam, tol, max_iter)

    workers = min(torch.get_num_threads(), len(starts))
    if workers <= 1:
        for s in starts:
            out[s : s + block] = solve(s)
        return out
    # Blocks are independent: one block per thread, each block's ops single-threaded (the numbers of a sequential solve).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for s, theta in zip(starts, pool.map(solve, starts)):
                out[s : s + block] = theta
    finally:
        torch.set_num_threads(threads)
    return out


def _fit_block(phi_np, phi_t, gram, y_np, n_pos, C, lam, tol, max_iter) -> np.ndarray:
    n, r = phi_np.shape
    y_t = torch.from_numpy(y_np)
    pos_w = torch.from_numpy(n / (2.0 * n_pos) / n)[:, None]
    neg_w = torch.from_numpy(n / (2.0 * (n - n_pos)) / n)[:, None]
    cw = torch.where(y_t == 1, pos_w, neg_w)
    b = y_np.shape[0]
    theta = torch.zeros((b, r + 1), dtype=torch.float64)
    active = torch.arange(b)
    done = torch.zeros(b, dtype=torch.bool)
    failed = torch.zeros(b, dtype=torch.bool)
    loss, g, p = _batch_loss_grad(theta, phi_t, y_t, cw, lam)
    for _ in range(max_iter):
        conv = g[active].abs().amax(dim=1) <= tol
        done[active[conv]] = True
        active = active[~conv]
        if active.numel() == 0:
            break
        th, ga, pa, ya, ca, la = theta[active], g[active], p[active], y_t[active], cw[active], loss[active]
        step, ok = _batch_newton_step(phi_t, gram, ca * pa * (1.0 - pa), ga, lam)
        failed[active[~ok]] = True
        keep = ok
        th, ga, ya, ca, la, step, idx = th[keep], ga[keep], ya[keep], ca[keep], la[keep], step[keep], active[keep]
        active = idx
        if idx.numel() == 0:
            break
        dec = torch.sum(ga * step, dim=1)
        f_cur = th[:, :-1] @ phi_t.T + th[:, -1:]
        f_dir = step[:, :-1] @ phi_t.T + step[:, -1:]
        bb = torch.sum(th[:, :-1] ** 2, dim=1)
        bs = torch.sum(th[:, :-1] * step[:, :-1], dim=1)
        ss = torch.sum(step[:, :-1] ** 2, dim=1)
        t = torch.ones(idx.numel(), dtype=torch.float64)
        c_loss = torch.empty_like(t)
        pending = torch.ones(idx.numel(), dtype=torch.bool)
        while bool(pending.any()):  # Armijo backtracking, every problem its own t
            q = pending.nonzero()[:, 0]
            tq = t[q]
            f = f_cur[q] - tq[:, None] * f_dir[q]
            c_loss[q] = (torch.sum(ca[q] * (torch.nn.functional.softplus(f) - ya[q] * f), dim=1)
                         + 0.5 * lam * (bb[q] - 2.0 * tq * bs[q] + tq * tq * ss[q]))
            accept = (c_loss[q] <= la[q] - 1e-4 * tq * dec[q]) | (tq < 1e-10)
            pending[q[accept]] = False
            t[q[~accept]] *= 0.5
        stalled = (t < 1e-10) & (c_loss > la)
        failed[idx[stalled]] = True
        go = ~stalled
        idx, t, step = idx[go], t[go], step[go]
        theta[idx] = theta[idx] - t[:, None] * step
        loss[idx], g[idx], p[idx] = _batch_loss_grad(theta[idx], phi_t, y_t[idx], cw[idx], lam)
        active = idx
    else:
        conv = g[active].abs().amax(dim=1) <= tol
        done[active[conv]] = True
    out = theta.numpy()
    for j in np.flatnonzero(~done.numpy()):  # stalled, failed or not converged: the single-fit path
        out[j] = fit_reduced(phi_np, y_np[j], C=C, tol=tol, max_iter=max_iter)
    return out
