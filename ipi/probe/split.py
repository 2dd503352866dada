"""Trajectory-level train/test splits and leakage assertions (PROTOCOL.md §4).

Splits are always made over *trajectories*, never over rows: every row of a trajectory lands on
the same side, so the probe cannot memorise a trajectory. Both splitters de-duplicate and
**sort** the ids, then apply ``numpy.random.default_rng(seed)``'s permutation, so the result
depends only on the *set* of ids and the seed."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

__all__ = [
    "LeakageError",
    "holdout_split",
    "grouped_kfold",
    "assert_trajectory_disjoint",
    "assert_rows_disjoint",
]

_MAX_LISTED = 5


class LeakageError(AssertionError):
    """A trajectory appears on both sides of a train/test split (PROTOCOL.md §4)."""


def _unique_sorted(trajectory_ids: Iterable[str]) -> list[str]:
    if isinstance(trajectory_ids, str):
        raise TypeError("trajectory_ids must be a sequence of ids, not a single string")
    return sorted({str(t) for t in trajectory_ids})


def holdout_split(
    trajectory_ids: Sequence[str], test_fraction: float, seed: int
) -> tuple[set[str], set[str]]:
    """Split unique trajectory ids into a train set and a test set.

    The unique ids are sorted, permuted with ``numpy.random.default_rng(seed)``, and the first
    ``round(test_fraction * n)`` of the permutation (clamped to ``[1, n - 1]``) form the test
    set, so both sides always hold at least one trajectory. PROTOCOL.md §4.

    Args:
        trajectory_ids: Trajectory ids; may be a per-row column with repeats (duplicates are
            collapsed before splitting).
        test_fraction: Fraction of trajectories in the test set, in the open interval (0, 1).
        seed: Seed of the permutation. Same ids and seed give the same split.

    Returns:
        ``(train_ids, test_ids)``: two disjoint sets whose union is the set of unique ids.

    Raises:
        ValueError: If there are fewer than 2 unique trajectories or ``test_fraction`` is not
            in (0, 1).
    """
    ids = _unique_sorted(trajectory_ids)
    n = len(ids)
    if n < 2:
        raise ValueError(
            f"holdout_split needs at least 2 unique trajectories (one per side), got {n}"
        )
    if not 0.0 < float(test_fraction) < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    n_test = int(min(max(round(float(test_fraction) * n), 1), n - 1))
    order = np.random.default_rng(seed).permutation(n)
    test = {ids[i] for i in order[:n_test]}
    train = {ids[i] for i in order[n_test:]}
    assert_trajectory_disjoint(train, test)
    return train, test


def grouped_kfold(
    trajectory_ids: Sequence[str], k: int, seed: int
) -> list[tuple[set[str], set[str]]]:
    """Grouped K-fold over trajectories for cross-fitting (out-of-fold scores for all).

    The unique ids are sorted, permuted with ``numpy.random.default_rng(seed)`` and cut into
    ``k`` contiguous folds of near-equal size (``numpy.array_split``: sizes differ by at most
    one). Fold ``i`` is the test set of split ``i``; its train set is every other trajectory.
    Each trajectory is in exactly one test fold. PROTOCOL.md §4.

    Args:
        trajectory_ids: Trajectory ids; may contain repeats (collapsed before splitting).
        k: Number of folds, ``2 <= k <= number of unique trajectories``.
        seed: Seed of the permutation.

    Returns:
        A list of ``k`` pairs ``(train_ids, test_ids)``; the test sets partition the unique ids.

    Raises:
        ValueError: If ``k < 2`` or ``k`` exceeds the number of unique trajectories.
    """
    ids = _unique_sorted(trajectory_ids)
    n = len(ids)
    if int(k) != k or k < 2:
        raise ValueError(f"grouped_kfold needs an integer k >= 2, got {k}")
    if k > n:
        raise ValueError(
            f"grouped_kfold with k={k} needs at least {k} unique trajectories, got {n}"
        )
    order = np.random.default_rng(seed).permutation(n)
    all_ids = set(ids)
    folds: list[tuple[set[str], set[str]]] = []
    for chunk in np.array_split(order, int(k)):
        test = {ids[i] for i in chunk}
        train = all_ids - test
        assert_trajectory_disjoint(train, test)
        folds.append((train, test))
    return folds


def assert_trajectory_disjoint(train_ids: Iterable[str], test_ids: Iterable[str]) -> None:
    """Assert that no trajectory id is on both sides of a split.

    Args:
        train_ids: Trajectory ids of the training side (set, list or per-row column).
        test_ids: Trajectory ids of the test side.

    Raises:
        LeakageError: (an ``AssertionError``) if the sides overlap; the message gives the
            number of shared trajectories and lists up to 5 of them (sorted).
    """
    overlap = sorted({str(t) for t in train_ids} & {str(t) for t in test_ids})
    if overlap:
        shown = ", ".join(repr(t) for t in overlap[:_MAX_LISTED])
        more = f" (and {len(overlap) - _MAX_LISTED} more)" if len(overlap) > _MAX_LISTED else ""
        raise LeakageError(
            f"{len(overlap)} trajectory id(s) appear in both train and test: {shown}{more}"
        )


def assert_rows_disjoint(train_traj_col: Iterable[str], test_traj_col: Iterable[str]) -> None:
    """Row-level form of :func:`assert_trajectory_disjoint`.

    Use it on the ``trajectory_id`` columns of the actual train and test row tables (after any
    filtering), so the check covers the rows that were really fed to the probe.

    Args:
        train_traj_col: ``trajectory_id`` of every training row, shape ``[n_train_rows]``.
        test_traj_col: ``trajectory_id`` of every test row, shape ``[n_test_rows]``.

    Raises:
        LeakageError: If any trajectory has rows on both sides.
    """
    assert_trajectory_disjoint(
        np.asarray(train_traj_col).ravel(), np.asarray(test_traj_col).ravel()
    )
