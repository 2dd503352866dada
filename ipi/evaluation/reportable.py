"""Which estimates may be reported: an estimate the verdict could not use is marked, never dressed up.

An interval from a cluster bootstrap over too few test trajectories, from too few usable
replicates, or one that collapsed to a point (``ci_low == ci_high``: every replicate gave the
same value, e.g. E2 = 1.000 [1.000, 1.000] on 2 trajectories) is not a result. The verdict
already answers NOT RUN for such runs (PROTOCOL.md §7; docs/estimands.md); this module gives
every single estimate the same treatment, so that the estimands table (``report.md``,
``report.html``), the forest plot and W&B all say *which* numbers are not reportable and why
(docs/outputs.md, *Reportable estimates*).

:func:`reportability` maps each estimand key (:func:`estimand_entries`) to ``None``
(reportable) or a one-line reason (every rule that applies, joined by ``"; "``). The rules:

1. **undefined**: no estimate, or no interval;
2. **too few clusters**: fewer than ``min_clusters`` **effective** test trajectories (Kish, from
   the weights the estimand uses: ``results["bootstrap"]["effective_clusters_by_estimand"]``;
   older results: the trajectories contributing rows to both sides,
   ``clusters_by_estimand``, or ``n_clusters``; PROTOCOL.md §7.0), the same gate the verdict
   applies;
3. **too few replicates**: ``n_boot_used`` below ``min_boot_fraction`` × ``n_boot`` (the other
   replicates had no positive or no negative row and were dropped, so the interval describes
   the unusual draws that remained);
4. **degenerate interval**: ``ci_low == ci_high`` up to float rounding (relative 1e-9; a paired
   difference of two AUCs can differ from itself in the 16th digit across replicates).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ipi.evaluation.results import DEFAULTS, Reportability, ResultsView, Settings
from ipi.metrics.keys import (
    BOOTSTRAP,
    BY_SEED,
    C1,
    CI_HIGH,
    CI_LOW,
    CLUSTERS_BY_ESTIMAND,
    COLLAPSE_ONLY,
    DIFFERENCES,
    E1,
    E1_PAIRED,
    EFFECTIVE_CLUSTERS_BY_ESTIMAND,
    E2,
    E3,
    ESTIMATE,
    N_BOOT_KEY,
    N_BOOT_USED,
    N_CLUSTERS,
    PERMUTED,
    RANDOM_TWIN,
    REPORTABILITY,
    SEEDS,
    TRANSFER,
    dotted,
)

__all__ = ["BASELINE_LABELS", "estimand_entries", "mark", "mark_reportability", "reportability", "reportability_of"]

#: Display names of the baselines' estimands.
BASELINE_LABELS = {
    C1: "C1 metadata baseline",
    COLLAPSE_ONLY: "C2 collapse-only",
    PERMUTED: "permuted labels",
    TRANSFER: "cross-surface transfer",
}


def estimand_entries(results: Mapping) -> list[tuple[str, str, Mapping | None]]:
    """``(key, label, interval)`` for every estimand of a results dict, in report order.

    Keys are dotted paths into ``results`` (``e1``, ``e3.c_scrambled``, ``c1.e1``,
    ``c1.e3.c_scrambled``, ``differences.e1_minus_e3.c_scrambled``), the keys of
    ``bootstrap.clusters_by_estimand`` and of the verdict's ``reportability``. Order: E1, E2, E3
    per control, each baseline's E1 (and E2; C1's E3 per control), then the paired differences.
    """
    r = results
    rows: list[tuple[str, str, Mapping | None]] = [(E1, "E1 attack vs clean", r.get(E1))]
    if r.get(E1_PAIRED) is not None:
        rows.append((E1_PAIRED, "E1 over steps having attack and clean (check 1)", r.get(E1_PAIRED)))
    rows.append((E2, "E2 paired step", r.get(E2)))
    rows += [(dotted(E3, c), f"E3 attack vs {c}", iv) for c, iv in sorted((r.get(E3) or {}).items())]
    for key, label in BASELINE_LABELS.items():
        if isinstance(r.get(key), Mapping):
            rows.append((dotted(key, E1), f"{label} E1", r[key].get(E1)))
            if r[key].get(E2):
                rows.append((dotted(key, E2), f"{label} E2", r[key].get(E2)))
            if key == C1:  # metadata balance of the controls (docs/estimands.md)
                rows += [(dotted(C1, E3, c), f"{label} E3 attack vs {c}", iv)
                         for c, iv in sorted((r[key].get(E3) or {}).items())]
    twin = r.get(RANDOM_TWIN)
    if isinstance(twin, Mapping):  # the same probe on the random-weight twins (verdict check 6)
        env = " (max over seeds)" if len(twin.get(SEEDS) or ()) > 1 else ""
        rows += [(dotted(RANDOM_TWIN, E1), f"random twin{env} E1", twin.get(E1)),
                 (dotted(RANDOM_TWIN, E2), f"random twin{env} E2", twin.get(E2))]
        rows += [(dotted(RANDOM_TWIN, E3, c), f"random twin{env} E3 attack vs {c}", iv)
                 for c, iv in sorted((twin.get(E3) or {}).items())]
        for seed, est in (twin.get(BY_SEED) or {}).items():
            rows += [(dotted(RANDOM_TWIN, BY_SEED, seed, E1), f"random twin seed {seed} E1", est.get(E1)),
                     (dotted(RANDOM_TWIN, BY_SEED, seed, E2), f"random twin seed {seed} E2", est.get(E2))]
            rows += [(dotted(RANDOM_TWIN, BY_SEED, seed, E3, c), f"random twin seed {seed} E3 attack vs {c}", iv)
                     for c, iv in sorted((est.get(E3) or {}).items())]

    def diffs(prefix: str, label: str, tree: Mapping) -> None:
        for k, iv in sorted(tree.items()):
            if isinstance(iv, Mapping) and ESTIMATE in iv:
                rows.append((dotted(prefix, k), f"{label}{k}", iv))
            elif isinstance(iv, Mapping):  # e.g. {control: iv}, or {seed: {control: iv}}
                diffs(dotted(prefix, k), f"{label}{k} ", iv)

    diffs(DIFFERENCES, "", r.get(DIFFERENCES) or {})
    return rows


def _num(x) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) or math.isinf(x) else x


def _count(v) -> int | None:
    if isinstance(v, Mapping):
        v = v.get(N_CLUSTERS)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _clusters(boot: Mapping, key: str) -> int | None:
    """Test trajectories behind one estimand: per-estimand count if recorded, else the run's."""
    by = boot.get(CLUSTERS_BY_ESTIMAND)
    if isinstance(by, Mapping):
        v = by.get(key)
        if v is None:  # nested, e.g. {"e3": {"c_scrambled": 4}}
            v = by
            for part in key.split("."):
                v = v.get(part) if isinstance(v, Mapping) else None
        if _count(v) is not None:
            return _count(v)
    return _count(boot.get(N_CLUSTERS))


def _effective(boot: Mapping, key: str) -> float | None:
    """Kish effective test trajectories behind one estimand (``effective_clusters_by_estimand``), or None."""
    v = boot.get(EFFECTIVE_CLUSTERS_BY_ESTIMAND)
    for part in key.split("."):
        v = v.get(part) if isinstance(v, Mapping) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def reportability(results: Mapping, *, min_clusters: int = DEFAULTS.min_clusters,
                  min_boot_fraction: float = DEFAULTS.min_boot_fraction) -> dict[str, str | None]:
    """Whether each estimate may be reported, and if not, why (rules in the module docstring).

    Args:
        results: A results dict (``results.json``): intervals ``{"estimate", "ci_low",
            "ci_high", "n_boot_used"}`` and ``bootstrap`` (``n_boot``, ``n_clusters``, and
            ``clusters_by_estimand`` when present).
        min_clusters: Fewest test trajectories (``evaluation.min_clusters``).
        min_boot_fraction: Fewest usable replicates as a fraction of ``n_boot``
            (``evaluation.min_boot_fraction``).

    Returns:
        ``{estimand key: None | reason}``, keys as in :func:`estimand_entries`; an undefined
        estimate gets that reason alone, otherwise every failed rule is listed.
    """
    boot = results.get(BOOTSTRAP) or {}
    n_boot = boot.get(N_BOOT_KEY)
    out: dict[str, str | None] = {}
    for key, _label, iv in estimand_entries(results):
        iv = iv or {}
        est, lo, hi = (_num(iv.get(k)) for k in (ESTIMATE, CI_LOW, CI_HIGH))
        n_clusters = _clusters(boot, key)
        n_eff = _effective(boot, key)
        used = iv.get(N_BOOT_USED)
        if est is None:
            out[key] = "undefined (no estimate)"
            continue
        if lo is None or hi is None:
            out[key] = "undefined interval"
            continue
        reasons = []
        if n_eff is not None and n_eff < min_clusters:
            reasons.append(f"only {n_eff:.1f} effective test trajectories (Kish, from the weights it uses; "
                           f"{n_clusters} contribute) (< {min_clusters})")
        elif n_eff is None and n_clusters is not None and n_clusters < min_clusters:
            reasons.append(f"only {n_clusters} test trajector{'y contributes' if n_clusters == 1 else 'ies contribute'} "
                           f"(< {min_clusters})")
        if isinstance(n_boot, (int, float)) and isinstance(used, (int, float)) and n_boot > 0 \
                and used < min_boot_fraction * n_boot:
            reasons.append(f"only {int(used)} of {int(n_boot)} bootstrap replicates usable "
                           f"(< {min_boot_fraction:.0%})")
        if math.isclose(lo, hi, rel_tol=1e-9, abs_tol=1e-12):  # equal up to float rounding
            reasons.append("degenerate interval (every replicate gave the same value)")
        out[key] = "; ".join(reasons) or None
    return out


def mark(results: Mapping, settings: Settings = DEFAULTS) -> Reportability:
    """The reportability marks of a results dict with the thresholds of ``settings``.

    Returns:
        The :class:`~ipi.evaluation.results.Reportability` (``min_clusters``,
        ``min_boot_fraction``, :func:`reportability`'s marks).
    """
    marks = reportability(results, min_clusters=settings.min_clusters,
                          min_boot_fraction=settings.min_boot_fraction)
    return Reportability(min_clusters=int(settings.min_clusters),
                         min_boot_fraction=float(settings.min_boot_fraction), estimands=marks)


def mark_reportability(results: Mapping, min_clusters: int = DEFAULTS.min_clusters,
                       min_boot_fraction: float = DEFAULTS.min_boot_fraction) -> dict:
    """``results["reportability"]``: the thresholds and :func:`reportability`'s marks.

    Returns:
        ``{"min_clusters", "min_boot_fraction", "estimands": {key: None | reason},
        "not_reportable": int}`` (:meth:`~ipi.evaluation.results.Reportability.to_dict`).
    """
    return mark(results, Settings(min_clusters=min_clusters, min_boot_fraction=min_boot_fraction)).to_dict()


def reportability_of(results: Mapping) -> dict[str, str | None]:
    """The marks stored in ``results["reportability"]``, or computed with the default thresholds.

    Runs record theirs (with the configured thresholds) in ``results.json``; a results dict
    without them (an older file) gets :func:`reportability` with the defaults.
    """
    stored = ResultsView(results).get(REPORTABILITY)
    if isinstance(stored, Mapping) and isinstance(stored.get("estimands"), Mapping):
        return dict(stored["estimands"])
    return reportability(results)
