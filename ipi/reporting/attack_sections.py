"""Report sections: the operating point, and the attack source's estimands and transfer.

Self-contained: each is a :class:`ipi.reporting.layout.Section` of blocks read from
``results.json`` (:func:`sections`), placed by :func:`with_sections` and rendered by the block
templates of :mod:`ipi.reporting.report` like every other section.

* **Operating point**: TPR at ``evaluation.operating_fpr`` for attack vs clean and attack vs each
  control, with its cluster-bootstrap interval (``operating_point``;
  :mod:`ipi.metrics.operating_point`).
* **Attack source** (runs on a published source, ``run.attack``): the pool, the rows the surface
  adapted or could not fit, E1/E3 per source and per goal family, and under
  ``split.wording=source`` the source × source transfer table (:mod:`ipi.evaluation.by_source`).
"""

from __future__ import annotations

from collections.abc import Mapping

from ipi.evaluation.results import ResultsView
from ipi.metrics.keys import (ADAPTED_ROWS, ATTACK, ATTACK_ROWS, BANNER_OVERFLOW_ROWS, BENIGN, BENIGN_FROM,
                              BY_GOAL_FAMILY, BY_SOURCE, CONTROL_TOKEN_MISMATCHES, COUNTS, E1, E3, ESTIMANDS_KEY, FPR,
                              GOALS, HELDOUT_SOURCE, N_NEGATIVE_STEPS, N_TRAJECTORIES, NAME, OPERATING_POINT, POOL,
                              RUN, SOURCES, TEMPLATES, TRANSFER, VS, dotted)
from ipi.reporting import layout

__all__ = ["sections", "with_sections"]

#: Sections these go before (the report's trailing sections), by id.
_BEFORE = ("other", "permutation", "spread", "counts", "run", "config")


def _operating(results: Mapping) -> list:
    op = ResultsView(results).section(OPERATING_POINT)
    if not op.get(VS):
        return []
    fpr = op[FPR]
    rows = tuple((f"attack vs {neg}", layout.Estimate(rec, key=dotted(OPERATING_POINT, VS, neg),
                                                      label=f"TPR at FPR {fpr:g}, attack vs {neg}"),
                  str(rec.get(N_NEGATIVE_STEPS, "?"))) for neg, rec in op[VS].items())
    caption = (f"TPR at FPR {fpr:g}: the share of attack rows flagged when the threshold flags at most "
               f"{fpr:.1%} of the negative rows (re-chosen in every cluster-bootstrap replicate). With n "
               "negative steps an FPR below 1/n flags no negative at all.")
    summary = " · ".join(f"vs {neg} {layout.interval_text(rec).split(' ')[0]}" for neg, rec in op[VS].items())
    return [layout.Section("operating-point", f"Operating point (TPR at FPR {fpr:g})",
                           (layout.Text(caption, "muted"), layout.Grid(("comparison", "TPR", "negative steps"), rows)),
                           summary=summary)]


def _by(rec: Mapping) -> tuple:
    rows = []
    for name, r in rec.items():
        est = r.get(ESTIMANDS_KEY) or {}
        e3 = est.get(E3) or {}
        rows.append((name, str(r[N_TRAJECTORIES]), layout.Estimate(est.get(E1)),
                     "; ".join(f"{c} {layout.interval_text(iv)}" for c, iv in e3.items()) or "n/a"))
    return tuple(rows)


def _attack(results: Mapping) -> list:
    att = ResultsView(results).get(RUN, ATTACK)
    if not isinstance(att, Mapping):
        return []
    counts = att.get(COUNTS, {})
    pool = att.get(POOL, {})
    srcs = sorted(counts.get(ATTACK_ROWS, {}))
    head = (f"attack={att[NAME]}: {pool.get(TEMPLATES)} templates, {pool.get(GOALS)} goals, "
            f"{pool.get(BENIGN)} benign texts (from {', '.join(att.get(BENIGN_FROM, []))}). Rows the surface "
            "had to adapt or could not fit are counted, never dropped.")
    keys = (ATTACK_ROWS, ADAPTED_ROWS, BANNER_OVERFLOW_ROWS, CONTROL_TOKEN_MISMATCHES)
    count_rows = tuple((s, *(str(counts.get(k, {}).get(s, 0)) for k in keys)) for s in srcs)
    held = att.get(HELDOUT_SOURCE)
    blocks: list = [layout.Text(head, "muted"),
                    layout.Grid(("source", "attack rows", "adapted (i_dom)", "banner overflow (i_vis)",
                                 "control token mismatches"), count_rows),
                    layout.Text(("E1 / E3 per held-out source (each fold tests one source, trained on the others)"
                                 if held else "E1 / E3 by source") + "; cluster-bootstrap CIs over the slice's test "
                                "trajectories, n/a under min_clusters.", "strong"),
                    layout.Grid(("source", "trajectories", "E1", "E3"), _by(att.get(BY_SOURCE, {}))),
                    layout.Text("E1 / E3 by goal family (goal families are confounded with sources).", "strong"),
                    layout.Grid(("goal family", "trajectories", "E1", "E3"), _by(att.get(BY_GOAL_FAMILY, {})))]
    tr = att.get(TRANSFER)
    if isinstance(tr, Mapping):
        names = tr[SOURCES]
        blocks += [layout.Text("Source × source transfer (E1): the run's detector trained on the row source's trajectories, "
                               "scored on the column source's; the diagonal is in-source (two seeded halves, "
                               "cross-fitted).", "strong"),
                   layout.Grid(("train \\ test", *names),
                               tuple((a, *(layout.Estimate(tr[E1][a][b]) for b in names)) for a in names))]
    elif tr:
        blocks.append(layout.Text(f"Source × source transfer: {tr}", "muted"))
    summary = " · ".join(f"{s} E1 {layout.interval_text((r.get(ESTIMANDS_KEY) or {}).get(E1)).split(' ')[0]}"
                         for s, r in att.get(BY_SOURCE, {}).items())
    return [layout.Section("attack", f"Attack source ({att[NAME]})", tuple(blocks), summary=summary)]


def sections(results: Mapping) -> list:
    """This module's sections (:class:`ipi.reporting.layout.Section`) present in ``results``: the
    operating point, then the attack source; none for a run without them."""
    return [*_operating(results), *_attack(results)]


def with_sections(report: list, results: Mapping) -> list:
    """``report`` (:func:`ipi.reporting.layout.report_sections`) with this module's sections
    before its trailing ones (other estimands, permutation test, spread, counts, run, config)."""
    i = next((k for k, s in enumerate(report) if s.id in _BEFORE), len(report))
    return [*report[:i], *sections(results), *report[i:]]
