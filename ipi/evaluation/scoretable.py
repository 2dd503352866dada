"""Score tables on disk: read, validate, evaluate (PROTOCOL.md §5, §7, §9).

A score table file is CSV (``.csv``) or Parquet (``.parquet``/``.pq``) with the columns
``trajectory_id, step, variant, score`` and optionally ``weight`` (:mod:`ipi.metrics.table`), or a
folder of part files (:func:`read_score_folder`). :func:`evaluate_score_table` turns one into the
JSON-ready report through :func:`ipi.evaluation.assess.assess`."""

from __future__ import annotations

import bisect
import difflib
import logging
import urllib.parse
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pandas as pd

from ipi.evaluation.assess import ScoreTables, assess
from ipi.evaluation.results import DEFAULTS, KFOLD, Settings
from ipi.metrics.table import CONTROL_PREFIX, check_copied_trajectories, validate_table
from ipi.protocol import CONTROLS

log = logging.getLogger(__name__)

__all__ = ["CSV_SUFFIXES", "FOLD", "PARQUET_SUFFIXES", "TWIN_SEED_COLUMN", "check_score_rows", "design_of_table",
           "evaluate_score_table", "read_score_folder", "read_score_table", "split_twin_table", "twin_score_table"]

#: Column of ``scores_twin.csv`` naming each row's random-twin seed (one file, every seed).
TWIN_SEED_COLUMN = "twin_seed"

CSV_SUFFIXES = (".csv",)
PARQUET_SUFFIXES = (".parquet", ".pq")
_NA_STRINGS = ["", "nan", "NaN", "NAN", "NA", "N/A", "n/a", "null", "NULL", "None", "-nan"]


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _read_part(p: Path, suffix: str) -> pd.DataFrame:
    """One CSV or Parquet file, read as a score table (CSV ids and variants as literal strings)."""
    if suffix in CSV_SUFFIXES:
        return pd.read_csv(p, dtype={"trajectory_id": str, "variant": str}, keep_default_na=False,
                           na_values={c: _NA_STRINGS for c in ("step", "score", "weight")})
    return pd.read_parquet(p)


def read_score_table(path) -> pd.DataFrame:
    """Read and validate a score table from CSV or Parquet (chosen by suffix), or a folder of parts.

    Validation (PROTOCOL.md §5, §9): :func:`ipi.metrics.table.validate_table`, then
    :func:`check_score_rows`; extra columns kept. In CSV files ``trajectory_id`` and
    ``variant`` are read as literal strings (an id ``"NA"`` stays ``"NA"``).

    Args:
        path: ``.csv``, ``.parquet`` or ``.pq`` file, or a folder of such parts
            (:func:`read_score_folder`; its name's suffix does not matter).

    Returns:
        The normalised table.

    Raises:
        ValueError: One-line message naming the file and the offending column/row (rows are
            0-based data rows; for CSV the file line is given too). Also for a missing file,
            an unknown suffix or an unparsable file.
"""
    p = Path(path)
    if p.is_dir():
        return read_score_folder(p)
    suffix = p.suffix.lower()
    if suffix not in CSV_SUFFIXES + PARQUET_SUFFIXES:
        raise ValueError(
            f"{p}: unsupported score-table format {p.suffix!r} "
            f"(use {', '.join(CSV_SUFFIXES + PARQUET_SUFFIXES)})"
        )
    if not p.is_file():
        raise ValueError(f"{p}: no such file")
    try:
        table = _read_part(p, suffix)
    except Exception as err:  # noqa: BLE001 - any reader failure becomes one ValueError
        raise ValueError(f"{p}: cannot read score table: {_one_line(err)}") from err
    return check_score_rows(table, str(p), (lambda i: f"row {i} (line {i + 2})") if suffix in CSV_SUFFIXES else None)


#: Value Hive, Spark and pyarrow write for a missing partition value.
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def _part_files(folder: Path) -> list[Path]:
    """Data files under ``folder``, sorted; names starting ``_`` or ``.`` (``_SUCCESS``, ``.crc``,
    ``_metadata``) are bookkeeping, as pyarrow and Spark treat them, and are left out."""
    return sorted(f for f in folder.rglob("*")
                  if f.is_file() and not any(x.startswith(("_", ".")) for x in f.relative_to(folder).parts))


def _partition_values(folder: Path, f: Path) -> dict[str, str | None]:
    """``{key: value}`` of the hive ``key=value`` folders between ``folder`` and ``f`` (URI-decoded)."""
    out = {}
    for part in f.relative_to(folder).parts[:-1]:
        if "=" not in part:
            raise ValueError(f"{folder}: sub-folder {part!r} (of {f}) is not a hive partition 'column=value'")
        key, value = (urllib.parse.unquote(x) for x in part.split("=", 1))
        out[key] = None if value == HIVE_NULL else value
    return out


def read_score_folder(folder) -> pd.DataFrame:
    """Read and validate a score table written as a folder of parts.

    The folder holds part files of one format (``.csv`` or ``.parquet``/``.pq``), directly or in
    hive ``column=value`` sub-folders; names starting ``_`` or ``.`` are skipped. A partition
    value becomes a column: ``step`` as an integer, ``score``/``weight`` as numbers, any other
    column as text exactly as written (an id ``007`` stays ``007``). Parts are concatenated in
    sorted path order.

    Args:
        folder: The folder.

    Returns:
        The normalised table, as :func:`read_score_table` returns it.

    Raises:
        ValueError: One line naming the folder, and the part file where one is at fault: no part
            file, parts of two formats or of another format, a sub-folder that is not
            ``column=value``, an unreadable part, or an invalid row (named by part and row).
"""
    folder = Path(folder)
    files = _part_files(folder)
    kinds = {f.suffix.lower() for f in files}
    known = CSV_SUFFIXES + PARQUET_SUFFIXES
    if not files:
        raise ValueError(f"{folder}: a folder with no part file (.csv, .parquet or .pq); give a score-table "
                         "file or a folder of parts")
    if not kinds <= set(known) or (kinds & set(CSV_SUFFIXES) and kinds & set(PARQUET_SUFFIXES)):
        odd = next((f for f in files if f.suffix.lower() not in known), files[0])
        raise ValueError(f"{folder}: a score-table folder holds part files of one format (.csv, or "
                         f".parquet/.pq), found {', '.join(sorted(kinds))} (e.g. {odd})")
    parts, starts = [], []
    n = 0
    for f in files:
        values = _partition_values(folder, f)
        try:
            part = _read_part(f, f.suffix.lower())
            for key, value in values.items():
                if key in part.columns:
                    raise ValueError(f"column {key!r} is both a partition folder and a column of the file")
                part[key] = (pd.to_numeric(pd.Series([value] * len(part), dtype=object))
                             if key in ("step", "score", "weight") else pd.Series([value] * len(part), dtype=object))
        except Exception as err:  # noqa: BLE001 - any reader failure becomes one ValueError
            raise ValueError(f"{f}: cannot read score-table part: {_one_line(err)}") from err
        parts.append(part)
        starts.append(n)
        n += len(part)
    table = pd.concat(parts, ignore_index=True)
    csv = kinds <= set(CSV_SUFFIXES)

    def row_name(i: int) -> str:
        k = bisect.bisect_right(starts, i) - 1
        j = i - starts[k]
        return f"row {i} ({files[k].relative_to(folder)} row {j}" + (f", line {j + 2})" if csv else ")")

    return check_score_rows(table, str(folder), row_name)


def check_score_rows(table: pd.DataFrame, source: str, row_name=None) -> pd.DataFrame:
    """:func:`validate_table`, then refuse what it lets through but is almost surely a mistake.

    * a control the project does not know (``c_scrambld``);
    * a variant whose rows all have weight 0 (its estimands are 0/0);
    * the same trajectory under two ids (:func:`ipi.metrics.table.check_copied_trajectories`):
      it would count as two clusters (PROTOCOL.md §7.0).

    Rows identical to an earlier row are valid and kept (several attack rows at a step may tie;
    the step weights of §5 count the step once either way) but logged as a warning naming the
    first pair.

    Args:
        table: A score table.
        source: Name used at the start of messages (the file path).
        row_name: Maps a 0-based row position to its name in messages (default ``"row <i>"``).

    Returns:
        The validated table.

    Raises:
        ValueError: One line naming the file, the row(s) and the problem.
"""
    table = validate_table(table, source, row_name=row_name)
    name = row_name or (lambda i: f"row {i}")
    known = list(CONTROLS)
    variant = table["variant"].to_numpy()
    for i, v in enumerate(variant):
        if v.startswith(CONTROL_PREFIX) and v not in known:
            near = difflib.get_close_matches(v, known, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ValueError(f"{source}: column 'variant' {name(i)}: unknown control {v!r} "
                             f"({hint}known: {', '.join(known)})")
    dup = table.duplicated(keep="first").to_numpy()
    if dup.any():
        i = int(dup.nonzero()[0][0])
        same = (table == table.iloc[i]).all(axis=1).to_numpy()
        j = int(same.nonzero()[0][0])
        log.warning("%s: %d row(s) repeat an earlier row exactly, e.g. %s = %s (trajectory_id=%r, step=%s, "
                    "variant=%r); kept: identical rows are valid (several rows of a variant at one step, "
                    "tied scores; PROTOCOL.md §2, §5), but a table pasted twice looks the same",
                    source, int(dup.sum()), name(i), name(j), table["trajectory_id"].iloc[i],
                    table["step"].iloc[i], variant[i])
    if TWIN_SEED_COLUMN not in table.columns:  # a twins' long table is checked seed by seed
        for warning in check_copied_trajectories(table, source):
            log.warning("%s", warning)
    if "weight" in table.columns:
        totals = table.groupby("variant", sort=True)["weight"].sum()
        zero = [str(v) for v, w in totals.items() if not w > 0]
        if zero:
            raise ValueError(f"{source}: column 'weight': every {zero[0]!r} row has weight 0, so its "
                             "estimands are undefined; give those rows positive weights or drop them")
    return table


def _counts(table: pd.DataFrame) -> dict:
    by_variant = table["variant"].value_counts()
    return {
        "trajectories": int(table["trajectory_id"].nunique()),
        "steps": int(len(table[["trajectory_id", "step"]].drop_duplicates())),
        "rows": int(len(table)),
        "rows_by_variant": {str(k): int(by_variant[k]) for k in sorted(by_variant.index)},
    }


def twin_score_table(tables: Mapping[int | str, pd.DataFrame]) -> pd.DataFrame:
    """The random-weight twins' score tables as one long table (``scores_twin.csv``).

    Args:
        tables: ``{twin seed: score table}``.

    Returns:
        Rows of every seed in seed order, columns ``trajectory_id, step, variant, twin_seed,
        score``.
    """
    parts = []
    for seed, tbl in tables.items():
        t = tbl[["trajectory_id", "step", "variant", "score"]].copy()
        t.insert(3, TWIN_SEED_COLUMN, int(seed))
        parts.append(t)
    return pd.concat(parts, ignore_index=True)


def split_twin_table(table: pd.DataFrame, source: str = "random-twin score table") -> dict[str, pd.DataFrame]:
    """``{str(seed): score table}`` from a :func:`twin_score_table`.

    A table without the ``twin_seed`` column is one twin of unknown seed, keyed ``"twin"``.

    Raises:
        ValueError: A seed's rows fail :func:`ipi.metrics.table.validate_table`.
    """
    if TWIN_SEED_COLUMN not in table.columns:
        return {"twin": check_score_rows(table, source)}
    out = {}
    for seed, part in table.groupby(TWIN_SEED_COLUMN, sort=False):
        name = f"{source} (twin_seed {seed})"
        out[str(seed)] = check_score_rows(part.drop(columns=[TWIN_SEED_COLUMN]).reset_index(drop=True), name)
    return out


#: The score table's column naming the fold that scored each row (``train.py`` writes it under
#: K-fold cross-fitting).
FOLD = "fold"


def design_of_table(table: pd.DataFrame, settings: Settings, source: str) -> Settings:
    """The split design the table itself shows: out-of-fold scores of several folds are K-fold.

    A ``fold`` column holding more than one fold makes the table K-fold whatever
    ``settings.split`` says, so check 1 is not stated at a level it does not hold
    (PROTOCOL.md §7.1).

    Args:
        table: The validated score table.
        settings: The settings given (``split`` from the command line or config).
        source: The table's name, for the warning.

    Returns:
        ``settings``, with ``split="kfold"`` when the table shows several folds.
"""
    if FOLD not in table.columns or settings.split == KFOLD:
        return settings
    folds = table[FOLD].dropna().unique()
    if len(folds) <= 1:
        return settings
    log.warning("%s: column %r holds %d folds: out-of-fold K-fold scores, judged as split=%s (check 1 then "
                "needs the exact permutation test, which a score table cannot run)", source, FOLD, len(folds),
                KFOLD)
    return replace(settings, split=KFOLD)


def evaluate_score_table(
    path,
    *,
    baselines: Mapping[str, object] | None = None,
    twin=None,
    settings: Settings = DEFAULTS,
    **overrides,
) -> dict:
    """Estimands, counts, verdict and reportability of a score-table file (PROTOCOL.md §5, §7).

    Args:
        path: The probe's score table (``.csv``/``.parquet``, or a folder of parts).
        baselines: Optional named baseline tables (paths or DataFrames) scored on the same
            test trajectories, e.g. ``{"c1": ..., "collapse_only": ..., "permuted": ...}``;
            they share the bootstrap draws with the main table.
        twin: The random-weight twins' score table (path or DataFrame; ``train.py`` writes
            ``scores_twin.csv`` with a ``twin_seed`` column, one block of rows per seed; a table
            without it is one twin) on the same rows, or None (verdict check 6 NOT RUN).
        settings: Bootstrap, verdict thresholds, reportability gate and ``pretrained``
            (:class:`~ipi.evaluation.results.Settings`).
        **overrides: Fields of ``settings`` to replace (``n_boot=200``, ``interval="bca"``,
            ``pretrained=False`` ...).

    Returns:
        :func:`ipi.evaluation.assess.assess`'s results as a dict: the numbers, ``"source"`` (the
        path; ``"source_twin"`` for a twin file), ``"counts"`` (``{"trajectories", "steps",
        "rows", "rows_by_variant"}`` of the main table), ``"verdict"`` (checks whose inputs are
        absent are ``"NOT RUN"``) and ``"reportability"``.

    Raises:
        ValueError: On an unreadable or invalid table (see :func:`read_score_table`).
        TypeError: An override that is not a field of :class:`~ipi.evaluation.results.Settings`.
    """
    settings = replace(settings, **overrides)
    main = read_score_table(path)
    settings = design_of_table(main, settings, str(path))
    loaded = {}
    for name, item in (baselines or {}).items():
        loaded[name] = (check_score_rows(item, f"baseline {name!r}") if isinstance(item, pd.DataFrame)
                        else read_score_table(item))
    twins = None
    if twin is not None:
        twins = split_twin_table(twin if isinstance(twin, pd.DataFrame) else read_score_table(twin),
                                 "random-twin score table" if isinstance(twin, pd.DataFrame) else str(twin))
    results = assess(ScoreTables(main, loaded, twins), settings, source=str(path),
                     source_twin=None if twin is None or isinstance(twin, pd.DataFrame) else str(twin),
                     counts=_counts(main))
    return results.to_dict()
