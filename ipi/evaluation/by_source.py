"""Estimands by attack source and by goal family, and the source × source transfer table.

A run whose attack pool is a published source or a mix (:mod:`ipi.attacks.pool`) reports, beside
the pooled estimands:

* **by source** and **by goal family**: E1, E2 and E3[c] (PROTOCOL.md §5) on the test rows of the
  steps whose attack (``k = 0``) came from that source (goal family); clean and control rows go
  with their step's attack. A step's source is its template's family; under
  ``split.wording=source`` its trajectory's held-out source, so "by source" is per held-out source.
* the **transfer table** (``split.wording=source`` only): cell ``[a][b]`` is E1 of the detector
  trained on source ``a``'s trajectories scoring source ``b``'s; the diagonal is ``a`` cross-fitted
  in two seeded halves (:func:`transfer_table`).

Slices with fewer than ``min_clusters`` test trajectories are reported with ``"n_trajectories"``
and ``"estimands": null``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from ipi.evaluation.results import Settings
from ipi.metrics.estimands import estimands
from ipi.metrics.keys import (ADAPTED_ROWS, ATTACK_ROWS, BANNER_OVERFLOW_ROWS, BENIGN, BENIGN_FROM, BY_GOAL_FAMILY,
                              BY_SOURCE, CONTROL_TOKEN_MISMATCHES, COUNTS, E1, ESTIMANDS_KEY, GOALS, HELDOUT_SOURCE,
                              N_ROWS, N_TRAJECTORIES, NAME, POOL, SOURCES, TEMPLATES, TRANSFER)

__all__ = ["estimands_by", "step_attribute", "transfer_table"]

_KEY = ["trajectory_id", "step"]


def step_attribute(rows_meta: Sequence[Mapping], field: str) -> dict[tuple[str, int], str]:
    """``(trajectory_id, step) → meta[field]`` of each step's attack ``k = 0`` row.

    Args:
        rows_meta: Per row ``trajectory_id``, ``step``, ``variant``, ``attack_index`` and the
            variant's meta (``source``, ``goal_family``, ...).
        field: The meta key.

    Raises:
        ValueError: A step's attack row lacks ``field``.
    """
    out: dict[tuple[str, int], str] = {}
    for r in rows_meta:
        if r["variant"] == "attack" and int(r["attack_index"]) == 0:
            if field not in r:
                raise ValueError(f"row {r['trajectory_id']}|{r['step']}: attack meta has no {field!r}")
            out[(str(r["trajectory_id"]), int(r["step"]))] = str(r[field])
    return out


def _estimate(table: pd.DataFrame, settings: Settings) -> dict:
    n = int(table["trajectory_id"].nunique())
    rec: dict = {N_TRAJECTORIES: n, N_ROWS: int(len(table))}
    if n < settings.min_clusters or not {"attack", "clean"} <= set(table["variant"]):
        rec[ESTIMANDS_KEY] = None
        return rec
    est = estimands(table[["trajectory_id", "step", "variant", "score"]], n_boot=settings.n_boot,
                    seed=settings.seed, level=settings.level, interval=settings.interval)
    rec[ESTIMANDS_KEY] = est.to_dict()
    return rec


def estimands_by(table: pd.DataFrame, labels: Mapping[tuple[str, int], str], settings: Settings) -> dict:
    """E1/E2/E3[c] with cluster-bootstrap intervals per label of the test steps.

    Args:
        table: Test score table (``trajectory_id, step, variant, score``).
        labels: ``(trajectory_id, step) → label`` (:func:`step_attribute`); steps without a label
            are left out.
        settings: Bootstrap settings and ``min_clusters``.

    Returns:
        ``{label: {"n_trajectories", "n_rows", "estimands": {"e1", "e2", "e3"} or None}}`` in
        label order.
    """
    lab = np.asarray([labels.get((str(t), int(s))) for t, s in zip(table["trajectory_id"], table["step"])],
                     dtype=object)
    return {str(v): _estimate(table[lab == v].reset_index(drop=True), settings)
            for v in sorted({x for x in lab if x is not None})}


def transfer_table(groups: Mapping[str, Sequence[str]], fit_score: Callable[[set, set], pd.DataFrame],
                   settings: Settings, seed: int = 0) -> dict:
    """Source × source transfer: train on one source's trajectories, score another's.

    Args:
        groups: Source → its trajectory ids (disjoint).
        fit_score: ``(train_ids, test_ids) → score table`` of the test trajectories' rows, the
            detector fitted on the training trajectories' clean and attack rows.
        settings: Bootstrap settings.
        seed: Seed of the diagonal's halves.

    Returns:
        ``{"sources": [...], "e1": {train: {test: interval dict or None}}, "n_trajectories":
        {source: n}}``; the diagonal is the two-half cross-fit within the source.

    Raises:
        ValueError: Two sources share a trajectory.
    """
    names = sorted(groups)
    seen: set[str] = set()
    for s in names:
        ids = {str(t) for t in groups[s]}
        if ids & seen:
            raise ValueError(f"transfer table: source {s} shares trajectories with another source")
        seen |= ids
    out: dict = {SOURCES: names, N_TRAJECTORIES: {s: len(groups[s]) for s in names}, E1: {}}
    for a in names:
        out[E1][a] = {}
        for b in names:
            if a == b:
                ids = sorted(str(t) for t in groups[a])
                order = np.random.default_rng(seed).permutation(len(ids))
                half = {ids[i] for i in order[: len(ids) // 2]}
                rest = set(ids) - half
                if not half or not rest:
                    out[E1][a][b] = None
                    continue
                table = pd.concat([fit_score(half, rest), fit_score(rest, half)], ignore_index=True)
            else:
                table = fit_score({str(t) for t in groups[a]}, {str(t) for t in groups[b]})
            table = table[table["variant"].isin(["attack", "clean"])].reset_index(drop=True)
            rec = _estimate(table, settings)
            out[E1][a][b] = rec[ESTIMANDS_KEY][E1] if rec[ESTIMANDS_KEY] else None
    return out


def row_counts(rows_meta: Sequence[Mapping]) -> dict:
    """What the surface did with the pool's texts, per attack source (never dropped, counted).

    Returns:
        ``{"attack_rows", "adapted_rows", "banner_overflow_rows", "control_token_mismatches"}``,
        each ``{source: n}`` over the rows (``adapted``: attack rows ``i_dom`` rewrote to one
        line without ``"``; ``banner_overflow``: ``i_vis`` attack and control rows whose text does
        not fit the box; ``control_token_mismatches``: control rows whose token count differs
        from their attack's).
    """
    keys = (ATTACK_ROWS, ADAPTED_ROWS, BANNER_OVERFLOW_ROWS, CONTROL_TOKEN_MISMATCHES)
    out: dict[str, dict[str, int]] = {k: {} for k in keys}

    def add(k: str, s: str) -> None:
        out[k][s] = out[k].get(s, 0) + 1

    for r in rows_meta:
        if r["variant"] == "clean" or "source" not in r:
            continue
        s = str(r["source"])
        if r["variant"] == "attack":
            add(ATTACK_ROWS, s)
            if r.get("adapted"):
                add(ADAPTED_ROWS, s)
        elif r.get("token_delta", 0) != 0:
            add(CONTROL_TOKEN_MISMATCHES, s)
        if r.get("text_fits") is False:
            add(BANNER_OVERFLOW_ROWS, s)
    return {k: dict(sorted(v.items())) for k, v in out.items()}


def _source_labels(rows_meta: Sequence[Mapping], plan) -> dict[tuple[str, int], str]:
    """Each test step's source: its trajectory's held-out source under ``split.wording=source``
    (a shared text counts as its owner's: :func:`ipi.attacks.wording.source_owner`), else the
    family of the template its attack used."""
    labels = step_attribute(rows_meta, "source")
    if plan is not None and plan.scheme == "source":
        labels = {key: plan.family_of[key[0]] for key in labels}
    return labels


def attack_record(pool, rows_meta: Sequence[Mapping], table: pd.DataFrame, settings: Settings, *,
                  plan=None, fit_score: Callable[[set, set], pd.DataFrame] | None = None, seed: int = 0) -> dict:
    """``run.attack`` of results.json: the pool, its provenance, row counts, estimands by source.

    Args:
        pool: The run's :class:`~ipi.attacks.pool.AttackPool`.
        rows_meta: Per row ``trajectory_id``, ``step``, ``variant``, ``attack_index`` and the meta.
        table: The test score table.
        settings: Bootstrap settings.
        plan: The wording plan; with scheme ``source`` the transfer table is added.
        fit_score: As :func:`transfer_table` (None: no transfer table, a detector that is not
            refitted: external scores).
        seed: Seed of the transfer table's diagonal halves.
    """
    rec: dict = {
        NAME: pool.name, "digest": pool.digest, SOURCES: list(pool.sources),
        BENIGN_FROM: list(pool.benign_from),
        # what was read: each source's repository commit or installed package version
        "provenance": [{"source": p.source, "origin": p.origin, "version": p.version, "note": p.note}
                       for p in pool.provenance],
        POOL: {TEMPLATES: len(pool.templates), GOALS: len(pool.goals), BENIGN: len(pool.benign)},
        COUNTS: row_counts(rows_meta),
        BY_SOURCE: estimands_by(table, _source_labels(rows_meta, plan), settings),
        BY_GOAL_FAMILY: estimands_by(table, step_attribute(rows_meta, "goal_family"), settings),
    }
    if plan is not None and plan.scheme == "source":
        groups: dict[str, list[str]] = {}
        for t, fam in plan.family_of.items():
            groups.setdefault(fam, []).append(t)
        rec[HELDOUT_SOURCE] = True
        rec[TRANSFER] = (transfer_table(groups, fit_score, settings, seed) if fit_score is not None
                           else "not run (the transfer table refits the detector; external scores are not refitted)")
    return rec
