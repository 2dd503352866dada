"""Weighted AUC and its vectorised cluster-bootstrap form (PROTOCOL.md §5).

The weighted AUC of positives ``P`` over negatives ``N`` is (PROTOCOL.md §5)::

    AUC(P, N) = Σ_{i∈P} Σ_{j∈N} w_i w_j · H(f_i − f_j) / (Σ_P w_i · Σ_N w_j),
    H(x) = 1 if x > 0, ½ if x = 0, 0 if x < 0,

which equals ``sklearn.metrics.roc_auc_score(y, f, sample_weight=w)``. Algorithm: sort the
negatives once and take the prefix sums ``C`` of their weights; a positive with ``lo``/``hi``
negatives scoring ``< f`` / ``<= f`` contributes ``w_i · (C[lo] + C[hi]) / 2`` (ties count ½).
O(n log n), and O(B·n) for ``B`` bootstrap replicates."""

from __future__ import annotations

import numpy as np

__all__ = ["weighted_auc", "bootstrap_weighted_auc", "grouped_weighted_auc"]

# Bound on the number of float64 cells one bootstrap chunk may allocate per temporary array
# (4e6 cells = 32 MB); replicates are processed in chunks of rows of the [B, n] problem.
_CHUNK_CELLS = 4_000_000


def _as_1d_float(x, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    return arr


def _check_scores(f: np.ndarray, name: str) -> None:
    if not np.all(np.isfinite(f)):
        raise ValueError(f"{name} contains NaN or infinite scores")


def _check_weights(w: np.ndarray, n: int, name: str) -> None:
    if w.shape != (n,):
        raise ValueError(f"{name} has shape {w.shape}, expected ({n},)")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"{name} must be finite and non-negative")


def _labels_and_weights(labels, weights, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Validated boolean labels ``[n]`` and non-negative weights ``[n]`` (ones when None)."""
    y = np.asarray(labels)
    if y.shape != (n,):
        raise ValueError(f"labels has shape {y.shape}, expected ({n},)")
    w = np.ones(n) if weights is None else _as_1d_float(weights, "weights")
    _check_weights(w, n, "weights")
    return y.astype(bool), w


def weighted_auc(scores_pos, scores_neg, w_pos=None, w_neg=None) -> float:
    """Weighted AUC of positives over negatives, ties counted ½ (PROTOCOL.md §5).

    Computes ``Σ_{i∈P} Σ_{j∈N} w_i w_j H(f_i − f_j) / (Σ_P w_i · Σ_N w_j)`` in
    O(n log n) by sorting the negatives once (see the module docstring). Equals
    ``sklearn.metrics.roc_auc_score`` with ``sample_weight``.

    Args:
        scores_pos: Scores of the positive rows, shape ``[n_pos]``.
        scores_neg: Scores of the negative rows, shape ``[n_neg]``.
        w_pos: Non-negative weights of the positives, shape ``[n_pos]``; ``None`` means all 1.
        w_neg: Non-negative weights of the negatives, shape ``[n_neg]``; ``None`` means all 1.

    Returns:
        The AUC in ``[0, 1]`` as a Python float, or ``nan`` when either side is empty or has
        zero total weight (the AUC is undefined there).

    Raises:
        ValueError: On non-finite scores, negative/non-finite weights or mismatched shapes.
    """
    fp = _as_1d_float(scores_pos, "scores_pos")
    fn = _as_1d_float(scores_neg, "scores_neg")
    _check_scores(fp, "scores_pos")
    _check_scores(fn, "scores_neg")
    wp = np.ones_like(fp) if w_pos is None else _as_1d_float(w_pos, "w_pos")
    wn = np.ones_like(fn) if w_neg is None else _as_1d_float(w_neg, "w_neg")
    _check_weights(wp, fp.size, "w_pos")
    _check_weights(wn, fn.size, "w_neg")
    if fp.size == 0 or fn.size == 0:
        return float("nan")
    sum_p = float(wp.sum())
    sum_n = float(wn.sum())
    if sum_p <= 0.0 or sum_n <= 0.0:
        return float("nan")
    order = np.argsort(fn, kind="stable")
    fn_sorted = fn[order]
    cum = np.concatenate(([0.0], np.cumsum(wn[order])))
    lo = np.searchsorted(fn_sorted, fp, side="left")
    hi = np.searchsorted(fn_sorted, fp, side="right")
    numerator = float(np.dot(wp, cum[lo] + cum[hi])) * 0.5
    return numerator / (sum_p * sum_n)


def bootstrap_weighted_auc(
    scores,
    labels,
    weights,
    multiplicity,
    *,
    clusters=None,
) -> np.ndarray:
    """Weighted AUC for every bootstrap replicate at once (PROTOCOL.md §5, cluster bootstrap).

    In replicate ``b`` row ``i`` carries weight ``multiplicity[b, i] · weights[i]`` (a row of a
    trajectory drawn twice counts twice); scores stay fixed. The negatives are sorted once and
    the tie-aware prefix-sum formula of the module docstring is evaluated for all replicates with
    numpy (no Python loop over replicates; replicates are processed in memory-bounded chunks).

    Args:
        scores: Row scores, shape ``[n]``.
        labels: Row labels, shape ``[n]``; truthy = positive (attack), falsy = negative.
        weights: Non-negative row weights, shape ``[n]`` (``None`` means all 1).
        multiplicity: Non-negative draw counts. Shape ``[B, n]`` (one column per row: the
            draw count of the row's trajectory), or ``[B, n_clusters]`` when ``clusters``
            is given.
        clusters: Optional integer cluster index per row, shape ``[n]``, into the columns of
            ``multiplicity``; saves materialising the ``[B, n]`` row multiplicities.

    Returns:
        ``float64`` array of shape ``[B]``: the replicate AUCs, ``nan`` for replicates with no
        positive or no negative weight (these are to be dropped and counted by the caller).

    Raises:
        ValueError: On shape mismatches, non-finite scores or negative/non-finite weights or
            multiplicities.
    """
    f = _as_1d_float(scores, "scores")
    n = f.size
    _check_scores(f, "scores")
    y, w = _labels_and_weights(labels, weights, n)
    m = np.asarray(multiplicity, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"multiplicity must be [B, n], got shape {m.shape}")
    if clusters is None:
        if m.shape[1] != n:
            raise ValueError(f"multiplicity has {m.shape[1]} columns, expected {n} (one per row)")
        col = np.arange(n)
    else:
        col = np.asarray(clusters)
        if col.shape != (n,) or not np.issubdtype(col.dtype, np.integer):
            raise ValueError("clusters must be an integer array with one entry per row")
        if n and (col.min() < 0 or col.max() >= m.shape[1]):
            raise ValueError("clusters index outside the columns of multiplicity")
    if not np.all(np.isfinite(m)) or np.any(m < 0):
        raise ValueError("multiplicity must be finite and non-negative")
    n_boot = m.shape[0]
    out = np.full(n_boot, np.nan)
    pos = np.flatnonzero(y)
    neg = np.flatnonzero(~y)
    if pos.size == 0 or neg.size == 0 or n_boot == 0:
        return out

    order = neg[np.argsort(f[neg], kind="stable")]
    f_neg_sorted = f[order]
    lo = np.searchsorted(f_neg_sorted, f[pos], side="left")
    hi = np.searchsorted(f_neg_sorted, f[pos], side="right")
    col_neg, w_neg = col[order], w[order]
    col_pos, w_pos = col[pos], w[pos]

    chunk = max(1, _CHUNK_CELLS // max(n, 1))
    for start in range(0, n_boot, chunk):
        mb = m[start : start + chunk]
        wn = mb[:, col_neg] * w_neg  # [b, n_neg], sorted by score
        wp = mb[:, col_pos] * w_pos  # [b, n_pos]
        cum = np.zeros((mb.shape[0], wn.shape[1] + 1))
        np.cumsum(wn, axis=1, out=cum[:, 1:])
        numer = 0.5 * np.einsum("bi,bi->b", wp, cum[:, lo] + cum[:, hi])
        sum_p = wp.sum(axis=1)
        sum_n = cum[:, -1]
        ok = (sum_p > 0) & (sum_n > 0)
        res = np.full(mb.shape[0], np.nan)
        res[ok] = numer[ok] / (sum_p[ok] * sum_n[ok])
        out[start : start + chunk] = res
    return out


def grouped_weighted_auc(groups, scores, labels, weights=None) -> np.ndarray:
    """Within-group weighted AUC for every group at once (used for E2, PROTOCOL.md §5).

    For each group ``g`` computes ``AUC(P_g, N_g)`` with the §5 formula, where ``P_g``/``N_g``
    are the positive/negative rows of the group; vectorised over groups (one lexicographic sort
    of the negatives by ``(group, score)``).

    Args:
        groups: Integer group index per row, shape ``[n]``, values in ``[0, n_groups)``.
        scores: Row scores, shape ``[n]``.
        labels: Row labels, shape ``[n]``; truthy = positive.
        weights: Non-negative row weights, shape ``[n]``; ``None`` means all 1.

    Returns:
        ``float64`` array of shape ``[n_groups]`` (``n_groups = max(groups) + 1``): the AUC per
        group, ``nan`` for groups without positive or without negative weight.

    Raises:
        ValueError: On shape mismatches, negative group indices, non-finite scores or
            negative/non-finite weights.
    """
    f = _as_1d_float(scores, "scores")
    n = f.size
    _check_scores(f, "scores")
    g = np.asarray(groups)
    if g.shape != (n,) or (n and not np.issubdtype(g.dtype, np.integer)):
        raise ValueError("groups must be an integer array with one entry per row")
    if n and g.min() < 0:
        raise ValueError("groups must be non-negative")
    y, w = _labels_and_weights(labels, weights, n)
    n_groups = int(g.max()) + 1 if n else 0
    if n == 0:
        return np.full(0, np.nan)

    g = g.astype(np.int64)
    # Exact integer composite key (group, dense score rank): no float tricks, ties preserved.
    _, rank = np.unique(f, return_inverse=True)
    rank = rank.reshape(-1).astype(np.int64)
    stride = int(rank.max()) + 2
    key = g * stride + rank
    pos = np.flatnonzero(y)
    neg = np.flatnonzero(~y)
    sum_p = np.bincount(g[pos], weights=w[pos], minlength=n_groups)
    sum_n = np.bincount(g[neg], weights=w[neg], minlength=n_groups)
    numer = np.zeros(n_groups)
    if pos.size and neg.size:
        order = neg[np.argsort(key[neg], kind="stable")]
        key_neg = key[order]
        lo = np.searchsorted(key_neg, key[pos], side="left")
        hi = np.searchsorted(key_neg, key[pos], side="right")
        start = np.searchsorted(key_neg, g[pos] * stride, side="left")
        cum = np.concatenate(([0.0], np.cumsum(w[order])))
        # Negative weight strictly below within the group + half the tied weight.
        below = cum[lo] - cum[start]
        tied = cum[hi] - cum[lo]
        numer = np.bincount(g[pos], weights=w[pos] * (below + 0.5 * tied), minlength=n_groups)
    out = np.full(n_groups, np.nan)
    ok = (sum_p > 0) & (sum_n > 0)
    out[ok] = numer[ok] / (sum_p[ok] * sum_n[ok])
    return out
