"""The one gate of PROTOCOL.md §7.0: which intervals are evidence, and which estimates may be reported.

:func:`not_evidence` says why an interval cannot be evidence; the verdict calls it for every
interval a check reads and :func:`reportability` for every estimand of :func:`estimand_entries`,
so the reports, the forest plot, W&B and the checks never disagree (docs/outputs.md,
*Reportable estimates*). The rules, every one that applies joined by ``"; "``:

1. **undefined**: no estimate, or no interval;
2. **too few clusters**: fewer than ``min_clusters`` **effective** test trajectories
   (``results["bootstrap"]["effective_clusters_by_estimand"]``; a paired difference: the smaller
   of its two estimands'; results without it: ``clusters_by_estimand``, or ``n_clusters``);
3. **too few replicates**: ``n_boot_used`` below ``min_boot_fraction`` × ``n_boot``;
4. **degenerate interval**: ``ci_low == ci_high`` up to float rounding (relative 1e-9)."""

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
    ESTIMANDS_KEY,
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

__all__ = ["BASELINE_LABELS", "cluster_count", "estimand_entries", "mark", "not_evidence", "reportability",
           "reportability_of", "too_few_clusters"]

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
        rows.append((E1_PAIRED, "E1 over steps having attack and clean", r.get(E1_PAIRED)))
    rows.append((E2, "E2 paired step", r.get(E2)))
    rows += [(dotted(E3, c), f"E3 attack vs {c}", iv) for c, iv in sorted((r.get(E3) or {}).items())]
    for key, label in BASELINE_LABELS.items():
        if isinstance(r.get(key), Mapping):
            rows.append((dotted(key, E1), f"{label} E1", r[key].get(E1)))
            if r[key].get(E2):
                rows.append((dotted(key, E2), f"{label} E2", r[key].get(E2)))
            # C1's E3 (check 2) and the collapse-only E3 (check 5); the others' too, when present
            rows += [(dotted(key, E3, c), f"{label} E3 attack vs {c}", iv)
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


def _lookup(tree, key: str):
    """The value at a dotted ``key`` of a counts tree (flat keys of older files too), or None."""
    if not isinstance(tree, Mapping):
        return None
    if key in tree:
        return tree[key]
    v = tree
    for part in key.split("."):
        v = v.get(part) if isinstance(v, Mapping) else None
    return v


def cluster_count(boot: Mapping, key: str) -> tuple[float | None, int | None]:
    """``(effective, contributing)`` test trajectories behind estimand ``key`` (PROTOCOL.md §7.0).

    ``effective`` is the Kish count of ``bootstrap.effective_clusters_by_estimand`` (None when the
    results carry none); ``contributing`` the trajectories with rows on both sides
    (``clusters_by_estimand``), else the run's ``n_clusters`` (None when unknown).
    """
    eff = _lookup(boot.get(EFFECTIVE_CLUSTERS_BY_ESTIMAND), key)
    eff = float(eff) if isinstance(eff, (int, float)) and not isinstance(eff, bool) else None
    n = _count(_lookup(boot.get(CLUSTERS_BY_ESTIMAND), key))
    return eff, (n if n is not None else _count(boot.get(N_CLUSTERS)))


def too_few_clusters(results: Mapping, key: str, min_clusters: float) -> str | None:
    """Rule 2 alone (the cluster count behind ``key``), or None: for a check that reads no
    interval of ``key`` but needs its trajectories (check 4 reads E1's)."""
    eff, n = cluster_count(results.get(BOOTSTRAP) or {}, key)
    if eff is not None:
        if eff >= min_clusters:
            return None
        return (f"only {eff:.1f} effective test trajectories (Kish, from the weights it uses; {n} contribute) "
                f"(< min_clusters {min_clusters:g})")
    if n is not None and n < min_clusters:
        return (f"only {n} test trajector{'y contributes' if n == 1 else 'ies contribute'} "
                f"(< min_clusters {min_clusters:g})")
    return None


def not_evidence(results: Mapping, key: str, iv: Mapping | None, *, min_clusters: float = DEFAULTS.min_clusters,
                 min_boot_fraction: float = DEFAULTS.min_boot_fraction) -> str | None:
    """Why the interval ``iv`` of estimand ``key`` is not evidence, or None when it is: THE gate.

    Every check of the verdict and every reportability mark goes through this one function
    (rules 1–4 of the module docstring, every one that applies joined by ``"; "``; an undefined
    estimate or interval gets that reason alone).

    Args:
        results: The results dict (its ``bootstrap`` section holds the counts and ``n_boot``).
        key: The dotted estimand key (``e3.c_scrambled``, ``differences.e3_minus_c1_e3.c_scrambled``).
        iv: The interval ``{"estimate", "ci_low", "ci_high"[, "n_boot_used"]}``, or None.
        min_clusters: Fewest effective test trajectories (``evaluation.min_clusters``).
        min_boot_fraction: Fewest usable replicates as a fraction of ``n_boot``
            (``evaluation.min_boot_fraction``).

    Returns:
        The reason, or None.
    """
    iv = iv if isinstance(iv, Mapping) else {}
    est, lo, hi = (_num(iv.get(k)) for k in (ESTIMATE, CI_LOW, CI_HIGH))
    if est is None:
        return "undefined (no estimate)"
    if lo is None or hi is None:
        return "undefined interval"
    reasons = [r for r in (too_few_clusters(results, key, min_clusters),) if r]
    n_boot = (results.get(BOOTSTRAP) or {}).get(N_BOOT_KEY)
    used = iv.get(N_BOOT_USED)
    if isinstance(n_boot, (int, float)) and isinstance(used, (int, float)) and n_boot > 0 \
            and used < min_boot_fraction * n_boot:
        reasons.append(f"only {int(used)} of {int(n_boot)} bootstrap replicates usable "
                       f"(< {min_boot_fraction:.0%})")
    if math.isclose(lo, hi, rel_tol=1e-9, abs_tol=1e-12):  # equal up to float rounding
        reasons.append(f"degenerate interval [{lo:.3f}, {hi:.3f}] (every replicate gave the same value)")
    return "; ".join(reasons) or None


def reportability(results: Mapping, *, min_clusters: float = DEFAULTS.min_clusters,
                  min_boot_fraction: float = DEFAULTS.min_boot_fraction) -> dict[str, str | None]:
    """Whether each estimate may be reported, and if not, why: :func:`not_evidence` of every
    estimand of :func:`estimand_entries`.

    Args:
        results: A results dict (``results.json``).
        min_clusters: Fewest effective test trajectories (``evaluation.min_clusters``).
        min_boot_fraction: Fewest usable replicates as a fraction of ``n_boot``.

    Returns:
        ``{estimand key: None | reason}``, keys as in :func:`estimand_entries`.
    """
    return {key: not_evidence(results, key, iv, min_clusters=min_clusters, min_boot_fraction=min_boot_fraction)
            for key, _label, iv in estimand_entries(results)}


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


def reportability_of(results: Mapping) -> dict[str, str | None]:
    """The marks stored in ``results["reportability"]``, or computed with the default thresholds.

    Runs record theirs (with the configured thresholds) in ``results.json``; a results dict
    without them (an older file) gets :func:`reportability` with the defaults.
    """
    stored = ResultsView(results).get(REPORTABILITY)
    if isinstance(stored, Mapping) and isinstance(stored.get(ESTIMANDS_KEY), Mapping):
        return dict(stored[ESTIMANDS_KEY])
    return reportability(results)
