"""The score-table schema: columns, variants, validation and step weights (PROTOCOL.md §5, §9).

A *score table* is a :class:`pandas.DataFrame` with one row per forward pass on the test split,
columns ``trajectory_id, step, variant, score[, weight]`` (docs/estimands.md, "Score tables");
the default row weight counts every step once per variant (:func:`step_weights`)."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

__all__ = ["ATTACK", "CLEAN", "COPY_CHANCE", "COPY_TOLERANCE", "CONTROL_PREFIX", "REQUIRED_COLUMNS",
           "check_copied_trajectories", "check_id_collisions", "is_control",
           "normalise_id", "step_weights", "validate_table"]

CLEAN = "clean"
ATTACK = "attack"
CONTROL_PREFIX = "c_"
REQUIRED_COLUMNS = ("trajectory_id", "step", "variant", "score")


def is_control(variant: str) -> bool:
    """Whether ``variant`` names a nuisance-matched control (``"c_<name>"``, PROTOCOL.md §2)."""
    return isinstance(variant, str) and variant.startswith(CONTROL_PREFIX) and len(variant) > 2


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def normalise_id(trajectory_id) -> str:
    """A trajectory id as compared for collisions: Unicode NFKC, case-folded, surrounding whitespace stripped."""
    return unicodedata.normalize("NFKC", str(trajectory_id)).strip().casefold()


def check_id_collisions(ids: Iterable, source: str = "score table") -> None:
    """Raise when two distinct trajectory ids are equal after :func:`normalise_id`.

    The same trajectory exported twice under ids differing in case, surrounding whitespace or
    Unicode form would count as two clusters of the bootstrap and of the verdict's gate
    (PROTOCOL.md §5, §7.0): an input error, never a silent merge.

    Raises:
        ValueError: ``"<source>: trajectory ids 'A' and 'a' are the same after normalisation
            ..."`` naming the first pair (in sorted order).
    """
    seen: dict[str, str] = {}
    for t in sorted({str(x) for x in ids}):
        k = normalise_id(t)
        if k in seen:
            raise ValueError(f"{source}: trajectory ids {seen[k]!r} and {t!r} are the same after normalisation "
                             "(case, surrounding whitespace, Unicode NFKC): one trajectory exported twice would "
                             "count as two clusters; fix the ids")
        seen[k] = t


#: Two trajectories whose rows agree to within this share of their scores' spread are one
#: trajectory under two ids (:func:`check_copied_trajectories`).
COPY_TOLERANCE = 0.01
#: The chance of agreement by coincidence under which identical tied rows are refused as a copy.
COPY_CHANCE = 1e-3


#: A trajectory that shares at least this share of its distinct scores (same variant, equal on the
#: table's grid, and at least :data:`PARTIAL_COPY_MIN_VALUES` of them) with one other trajectory is a
#: partial copy of it (:func:`check_copied_trajectories`, continuous scores only).
PARTIAL_COPY_SHARE = 0.5
PARTIAL_COPY_MIN_VALUES = 3
#: A value found in more trajectories than this is a tie of the detector, not a copy.
PARTIAL_COPY_MAX_OWNERS = 4
#: Significant digits of the finest grid scores are compared on (float32 storage keeps about 7).
COMPARE_SIGNIFICANT_DIGITS = 6
#: Scores whose trajectories repeat values within themselves more than this (the median share of a
#: trajectory's rows holding a value it already has) are discrete: equality is then no evidence.
DISCRETE_REPEAT_SHARE = 0.5


def _decimals(s: np.ndarray, finest: int) -> int:
    """The fewest decimals (at most ``finest``) that write every value of ``s`` exactly."""
    for d in range(finest):
        if np.array_equal(np.round(s, d), s):
            return d
    return finest


def comparison_grids(table: pd.DataFrame) -> dict[str, int]:
    """Each trajectory's decimals: the grid on which its scores are compared for copies.

    The finest grid keeps :data:`COMPARE_SIGNIFICANT_DIGITS` significant digits of the table's
    largest score (so a float32 round trip does not hide a copy); a trajectory written with fewer
    decimals (a CSV exported with ``%.4f``) has that coarser grid. Two trajectories are compared
    on the coarser of their two grids: a rounded copy's values are its source's values rounded
    to it, and one coarse trajectory leaves the other pairs' comparisons as fine as they were.

    Args:
        table: A score table with ``trajectory_id`` and ``score``.

    Returns:
        ``{trajectory id: decimals}`` (negative for scores in the thousands).
    """
    s = table["score"].to_numpy(dtype=np.float64)
    scale = float(np.max(np.abs(s))) if len(s) else 0.0
    finest = COMPARE_SIGNIFICANT_DIGITS - 1 - (int(np.floor(np.log10(scale))) if scale > 0 else 0)
    per = table.groupby(table["trajectory_id"].map(str))["score"].agg(
        lambda v: _decimals(v.to_numpy(dtype=np.float64), finest))
    return {str(k): int(d) for k, d in per.items()}


def _shared_values(v: pd.DataFrame, pairs_of: set[str] | None) -> dict[tuple[str, str], tuple[int, set, set]]:
    """Per pair of trajectories (at least one in ``pairs_of``, or any when None): how many distinct
    ``(variant, score)`` values they share, and the steps holding them on each side."""
    shared: dict[tuple[str, str], tuple[int, set, set]] = {}
    owners = v.groupby(["variant", "score"])["trajectory_id"].transform("nunique").to_numpy()
    keep = (owners >= 2) & (owners <= PARTIAL_COPY_MAX_OWNERS)
    for _, g in v[keep].groupby(["variant", "score"]):
        ids = sorted(set(g["trajectory_id"]))
        steps = {t: set(g.loc[g.trajectory_id == t, "step"]) for t in ids}
        for i, a in enumerate(ids):
            for b in ids[i + 1:]:
                if pairs_of is not None and a not in pairs_of and b not in pairs_of:
                    continue
                c, sa, sb = shared.get((a, b), (0, set(), set()))
                shared[(a, b)] = (c + 1, sa | steps[a], sb | steps[b])
    return shared


def _partial_copies(table: pd.DataFrame, source: str) -> None:
    """Refuse a trajectory whose continuous scores largely reappear in one other trajectory.

    Catches a copy with steps dropped or renumbered, rounded or stored as float32, comparing
    each pair on the coarser of their grids (:func:`comparison_grids`). Sharing at least
    :data:`PARTIAL_COPY_MIN_VALUES` distinct values, on at least two steps of each, and
    :data:`PARTIAL_COPY_SHARE` of the smaller trajectory's distinct values is a copy. A value in
    more than :data:`PARTIAL_COPY_MAX_OWNERS` trajectories counts for none; on a grid where the
    trajectories repeat values within themselves (over :data:`DISCRETE_REPEAT_SHARE` of their
    rows: a discrete detector) copies are left to the same-rows test.

    Raises:
        ValueError: One line naming the file, both ids and how many values they share.
"""
    v = table[["trajectory_id", "step", "variant", "score"]]
    v = v.assign(trajectory_id=v["trajectory_id"].map(str))
    grids = comparison_grids(v)
    raw = v["score"].to_numpy(dtype=np.float64)
    for decimals in sorted(set(grids.values()), reverse=True):
        # every trajectory at least this fine, on this grid; pairs with one trajectory exactly at it
        members = v["trajectory_id"].map(grids).to_numpy() >= decimals
        g = v[members].assign(score=np.round(raw[members], decimals))
        rows = g.groupby("trajectory_id").size()
        n_distinct = g.drop_duplicates(["trajectory_id", "variant", "score"]).groupby("trajectory_id").size()
        if float(np.median(1.0 - n_distinct / rows)) > DISCRETE_REPEAT_SHARE:
            continue
        at = {t for t, d in grids.items() if d == decimals}
        for (a, b), (c, sa, sb) in sorted(_shared_values(g, at).items()):
            small = int(min(n_distinct[a], n_distinct[b]))
            # one shared step is the same page scored by a page-only detector, not a copy
            if c >= PARTIAL_COPY_MIN_VALUES and c >= PARTIAL_COPY_SHARE * small and min(len(sa), len(sb)) >= 2:
                raise ValueError(f"{source}: trajectories {a!r} and {b!r} share {c} of {small} distinct scores "
                                 f"(equal to {decimals} decimals; continuous scores never coincide): one is a copy "
                                 "of the other with rows dropped or steps renumbered, and would count as a second "
                                 "cluster; keep one of them")


def _trajectory_blocks(table: pd.DataFrame) -> dict[str, tuple[tuple, np.ndarray]]:
    """``{trajectory id: (signature, scores)}``: the sorted ``(step, variant, occurrence)`` keys of its
    rows and their scores in that order."""
    t = table[["trajectory_id", "step", "variant", "score"]].copy()
    t["trajectory_id"] = t["trajectory_id"].map(str)
    t["_k"] = t.groupby(["trajectory_id", "step", "variant"], sort=False).cumcount()
    t = t.sort_values(["trajectory_id", "step", "variant", "_k"], kind="mergesort")
    out = {}
    for tid, g in t.groupby("trajectory_id", sort=True):
        sig = tuple(zip(g["step"].tolist(), g["variant"].tolist(), g["_k"].tolist()))
        out[tid] = (sig, g["score"].to_numpy(dtype=np.float64))
    return out


def check_copied_trajectories(table: pd.DataFrame, source: str = "score table") -> list[str]:
    """Refuse the same trajectory under two ids (PROTOCOL.md §7.0: clusters must be distinct).

    A duplicated trajectory enters the cluster bootstrap and the gate twice, so intervals come
    out too narrow. Two trajectories are one under two ids when they have the same rows (steps
    and variants, as many of each) and their scores agree row by row to within
    :data:`COPY_TOLERANCE` of the spread of the pair's scores.

    With continuous scores (at least three distinct values in the pair) agreement is always
    evidence. With tied scores two trajectories of the same shape can agree by chance (the
    product over rows of each row's value frequency among its variant's rows, times the pairs of
    that shape): a copy is refused below :data:`COPY_CHANCE` and returned as a warning otherwise.
    A copy with rows dropped or steps renumbered is caught by :func:`_partial_copies`.

    Args:
        table: A validated score table (:func:`validate_table`).
        source: Name used at the start of messages (the file path).

    Returns:
        One warning per tied pair that agrees but may be a coincidence (empty when none).

    Raises:
        ValueError: One line naming the file, both trajectory ids and the evidence.
"""
    blocks = _trajectory_blocks(table)
    by_sig: dict[tuple, list[str]] = {}
    for tid, (sig, _) in blocks.items():
        by_sig.setdefault(sig, []).append(tid)
    freq = {v: g.value_counts(normalize=True) for v, g in table.groupby("variant")["score"]}
    warnings = []
    for sig, ids in by_sig.items():
        if len(ids) < 2:
            continue
        n_pairs = len(ids) * (len(ids) - 1) // 2
        for i, a in enumerate(ids):
            for b in ids[i + 1:]:
                sa, sb = blocks[a][1], blocks[b][1]
                both = np.concatenate([sa, sb])
                spread = float(np.std(both))
                diff = float(np.max(np.abs(sa - sb)))
                if diff > COPY_TOLERANCE * spread or (spread == 0.0 and diff > 0.0):
                    continue
                distinct = len(np.unique(both))
                what = (f"{source}: trajectories {a!r} and {b!r} have the same {len(sa)} rows (steps and "
                        f"variants) and scores that agree to within {diff:.3g} (spread {spread:.3g})")
                if distinct >= 3:
                    raise ValueError(f"{what}: the same trajectory under two ids would count as two clusters of "
                                     "the bootstrap and the cluster gate; keep one of them")
                chance = n_pairs * float(np.prod([freq[v].get(x, 0.0) for (_, v, _), x in zip(sig, sa)]))
                if chance < COPY_CHANCE:
                    raise ValueError(f"{what}, {distinct} distinct value(s), agreement by chance about "
                                     f"{chance:.2g}: the same trajectory under two ids would count as two clusters; "
                                     "keep one of them")
                warnings.append(f"{what}, with tied scores ({distinct} distinct value(s)): agreement by chance "
                                f"about {chance:.2g}, so they are kept as two trajectories; if they are one, keep one")
    _partial_copies(table, source)
    return warnings


def validate_table(
    table: pd.DataFrame,
    source: str = "score table",
    *,
    row_name: Callable[[int], str] | None = None,
) -> pd.DataFrame:
    """Check a score table and return a normalised copy (PROTOCOL.md §5, §9).

    Checks the columns ``trajectory_id, step, variant, score`` (and ``weight`` when present),
    their types, that scores are finite, that every variant is ``clean``, ``attack`` or
    ``c_<name>``, and that there is at least one attack and one clean row. Extra columns are
    kept untouched.

    Args:
        table: The score table.
        source: Name used at the start of error messages (e.g. the file path).
        row_name: Maps a 0-based row position to the text naming it in messages
            (default ``"row <i>"``).

    Returns:
        A copy with ``trajectory_id`` and ``variant`` as Python ``str`` objects, ``step`` as
        ``int64``, ``score`` (and ``weight``) as ``float64``, and a fresh ``RangeIndex``.

    Raises:
        ValueError: One-line message ``"<source>: column '<col>' <row>: <problem>"`` naming the
            first offending column/row; or two trajectory ids equal after normalisation
            (:func:`check_id_collisions`).
    """
    name = row_name or (lambda i: f"row {i}")
    if not isinstance(table, pd.DataFrame):
        raise ValueError(f"{source}: expected a pandas DataFrame, got {type(table).__name__}")
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(
            f"{source}: missing column(s) {', '.join(repr(c) for c in missing)} "
            f"(need {', '.join(REQUIRED_COLUMNS)}[, weight]; found {list(map(str, table.columns))})"
        )
    if table.columns.duplicated().any():
        dup = table.columns[table.columns.duplicated()][0]
        raise ValueError(f"{source}: duplicated column {dup!r}")
    if len(table) == 0:
        raise ValueError(f"{source}: the table has no rows")
    out = table.reset_index(drop=True).copy()
    out["trajectory_id"] = _trajectory_ids(out["trajectory_id"], source, name)
    out["step"] = _steps(out["step"], source, name)
    out["variant"] = _variants(out["variant"], source, name)
    for col, allow_negative in (("score", True), ("weight", False)):
        if col in out.columns:
            out[col] = _finite_numbers(out[col], col, allow_negative, source, name)
    variants = set(out["variant"])
    for needed in (ATTACK, CLEAN):
        if needed not in variants:
            raise ValueError(
                f"{source}: column 'variant': no {needed!r} rows (found {sorted(variants)})"
            )
    return out


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _trajectory_ids(tid: pd.Series, source: str, name: Callable[[int], str]) -> pd.Series:
    """trajectory_id: present, non-empty, compared as strings, no two equal after normalisation."""
    bad = tid.isna().to_numpy()
    if bad.any():
        raise ValueError(f"{source}: column 'trajectory_id' {name(_first_bad(bad))}: missing value")
    tid = tid.map(str)
    bad = (tid.str.len() == 0).to_numpy()
    if bad.any():
        raise ValueError(f"{source}: column 'trajectory_id' {name(_first_bad(bad))}: empty string")
    check_id_collisions(tid, source)
    return tid.astype(object)


def _steps(step: pd.Series, source: str, name: Callable[[int], str]) -> np.ndarray:
    """step: integer-valued and non-negative, as int64."""
    if not (pd.api.types.is_integer_dtype(step) or pd.api.types.is_float_dtype(step)):
        num = pd.to_numeric(step, errors="coerce")
        bad = num.isna().to_numpy()
        if bad.any():
            i = _first_bad(bad)
            raise ValueError(
                f"{source}: column 'step' {name(i)}: not an integer ({_short(step.iloc[i])})"
            )
        step = num
    vals = step.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(vals) | (vals != np.round(vals)) | (vals < 0)
    if bad.any():
        i = _first_bad(bad)
        raise ValueError(
            f"{source}: column 'step' {name(i)}: expected a non-negative integer, "
            f"got {_short(step.iloc[i])}"
        )
    return vals.astype(np.int64)


def _variants(var: pd.Series, source: str, name: Callable[[int], str]) -> pd.Series:
    """variant: clean | attack | c_<name>."""
    ok = np.array(
        [isinstance(v, str) and (v in (CLEAN, ATTACK) or is_control(v)) for v in var], dtype=bool
    )
    if not ok.all():
        i = _first_bad(~ok)
        raise ValueError(
            f"{source}: column 'variant' {name(i)}: unknown variant {_short(var.iloc[i])} "
            f"(expected 'clean', 'attack' or 'c_<name>')"
        )
    return var.astype(object)


def _finite_numbers(s: pd.Series, col: str, allow_negative: bool, source: str,
                    name: Callable[[int], str]) -> np.ndarray:
    """score / weight: numeric (not boolean) and finite (weight also non-negative), as float64."""
    if pd.api.types.is_bool_dtype(s):
        raise ValueError(f"{source}: column {col!r}: booleans, expected numbers")
    if not pd.api.types.is_numeric_dtype(s):
        num = pd.to_numeric(s, errors="coerce")
        bad = (num.isna() & s.notna()).to_numpy()
        if bad.any():
            i = _first_bad(bad)
            raise ValueError(
                f"{source}: column {col!r} {name(i)}: not a number ({_short(s.iloc[i])})"
            )
        s = num
    vals = s.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = np.isnan(vals)
    if bad.any():
        raise ValueError(f"{source}: column {col!r} {name(_first_bad(bad))}: NaN {col}")
    bad = ~np.isfinite(vals)
    if bad.any():
        i = _first_bad(bad)
        raise ValueError(f"{source}: column {col!r} {name(i)}: infinite {col} ({vals[i]})")
    if not allow_negative:
        bad = vals < 0
        if bad.any():
            i = _first_bad(bad)
            raise ValueError(f"{source}: column {col!r} {name(i)}: negative {col} ({vals[i]})")
    return vals


def step_weights(table: pd.DataFrame) -> np.ndarray:
    """Row weights of PROTOCOL.md §5.

    Default: ``w = 1 / (number of rows with the same (trajectory_id, step, variant))`` so that
    every step counts once per variant. A ``weight`` column, when present, overrides this.

    Args:
        table: A score table (see :func:`validate_table`).

    Returns:
        ``float64`` array ``[n_rows]`` aligned with the table's rows.
    """
    if "weight" in table.columns:
        return table["weight"].to_numpy(dtype=np.float64)
    keys = [table["trajectory_id"].map(str), table["step"], table["variant"]]
    counts = table.groupby(keys, sort=False)["score"].transform("size").to_numpy()
    return 1.0 / counts.astype(np.float64)
