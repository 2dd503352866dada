"""The paper's one-table summary of a multirun over surfaces and/or detectors.

One row per job — surface × detector (and layers / token group when the sweep varies them) —
and the columns a paper reports for each: E1, E2, C1 E1 (metadata baseline), E3 per control,
cross-surface transfer E1, permuted-label E1 with the permutation test's null p (verdict check
4), collapse-only E1 (C2), and the licensed claim (the cell's own verdict and, over the whole
sweep, under Holm's family-wise control; :mod:`ipi.reporting.sweep`). Every estimate is printed
with its interval, ``0.812 [0.700, 0.905]``; an estimate that the run's report marks not
reportable (too few clusters, too few bootstrap replicates, a degenerate interval:
:mod:`ipi.evaluation.reportable`) is struck through and flagged in Markdown (``~~…~~ n/r``) and
daggered in LaTeX (``…$^\\dagger$``), with the reason in the CSV. A cell a run did not compute
(a control that does not apply to the surface, transfer off, an external detector's permuted
fit) is ``—``.

Written by ``python -m ipi.reporting.sweep DIR`` as ``summary.md``, ``summary.csv`` and
``summary.tex`` (booktabs; needs ``\\usepackage{booktabs}``), through pandas'
``DataFrame.to_markdown`` / ``to_csv`` / ``to_latex``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ipi.evaluation.reportable import reportability_of
from ipi.evaluation.results import ResultsView
from ipi.io import atomic_write_text
from ipi.metrics.keys import (C1, CI_HIGH, CI_LOW, CLAIM, COLLAPSE_ONLY, DETECTOR, E1, E2, E3, ESTIMATE, LABEL,
                              LAYERS_CONFIG, NAME, P_VALUE, PERMUTATION, PERMUTED, SURFACE, TOKEN_GROUPS, TRANSFER,
                              VERDICT, at, dotted)

__all__ = ["summary_rows", "write_summary_tables"]

DASH = "—"


def _detector_label(run: dict) -> str:
    det = run.get(DETECTOR) or {}
    name = det.get(NAME, "logistic")  # runs from before detectors existed ran the probe
    return f"external ({det[LABEL]})" if name == "external" and det.get(LABEL) else name


def _columns(results: list[dict]) -> list[tuple[str, str]]:
    """``(label, estimand key)`` of the summary columns, controls in sorted order."""
    controls = sorted({c for r in results for c in ResultsView(r).section(E3)})
    cols = [("E1", E1), ("E2", E2), ("C1 E1", dotted(C1, E1))]
    cols += [(f"E3 {c}", dotted(E3, c)) for c in controls]
    cols += [("transfer E1", dotted(TRANSFER, E1)), ("permuted E1", dotted(PERMUTED, E1)),
             ("collapse-only E1", dotted(COLLAPSE_ONLY, E1))]
    return cols


def summary_rows(jobs: list[tuple[str, dict]], familywise: dict[str, str] | None = None) -> pd.DataFrame:
    """The summary's long form: one row per job, every estimand as estimate / CI / reason.

    Args:
        jobs: ``[(job name, results.json dict)]``.
        familywise: ``{job: claim under Holm over the sweep}`` (:func:`ipi.reporting.sweep.familywise`).

    Returns:
        Columns ``job, surface, detector, layers, token_groups``, per estimand label ``L``:
        ``L``, ``L ci_low``, ``L ci_high``, ``L not_reportable`` (the reason, or empty), then
        ``permutation p``, ``claim``, ``claim family-wise``.
    """
    cols = _columns([r for _, r in jobs])
    rows = []
    for job, res in jobs:
        view = ResultsView(res)
        run = view.run
        marks = reportability_of(res)
        row = {"job": job, "surface": run.get(SURFACE), "detector": _detector_label(run),
               "layers": str(run.get(LAYERS_CONFIG, "")), "token_groups": "+".join(run.get(TOKEN_GROUPS) or [])}
        for label, key in cols:
            iv = at(res, key)  # the interval at a dotted key (e3.c_scrambled), {} without an estimate
            iv = iv if isinstance(iv, dict) and iv.get(ESTIMATE) is not None else {}
            row.update({label: iv.get(ESTIMATE), f"{label} ci_low": iv.get(CI_LOW), f"{label} ci_high":
                        iv.get(CI_HIGH), f"{label} not_reportable": (marks.get(key) or "") if iv else ""})
        row["permutation p"] = view.get(PERMUTATION, P_VALUE)
        row["claim"] = view.get(VERDICT, CLAIM)
        row["claim family-wise"] = (familywise or {}).get(job)
        rows.append(row)
    return pd.DataFrame(rows)


def _fmt(est, lo, hi) -> str:
    if est is None or pd.isna(est):
        return DASH
    if lo is None or hi is None or pd.isna(lo) or pd.isna(hi):
        return f"{est:.3f}"
    return f"{est:.3f} [{lo:.3f}, {hi:.3f}]"


def _display(long: pd.DataFrame, style: str) -> pd.DataFrame:
    """The printed table: one cell per estimand, marks for not-reportable cells."""
    labels = [c for c in long.columns if f"{c} ci_low" in long.columns]
    vary = [c for c in ("layers", "token_groups") if long[c].nunique() > 1]
    out = long[["surface", "detector", *vary]].copy()
    for label in labels:
        cells = []
        for _, r in long.iterrows():
            text = _fmt(r[label], r[f"{label} ci_low"], r[f"{label} ci_high"])
            if r[f"{label} not_reportable"] and text != DASH:
                text = f"~~{text}~~ n/r" if style == "md" else f"{text}$^\\dagger$"
            cells.append(text)
        out[label] = cells
        if label == "permuted E1":
            out["null p"] = [DASH if pd.isna(p) else f"{p:.3f}" for p in long["permutation p"]]
    out["claim"] = long["claim"].map(_short_claim)
    if long["claim family-wise"].notna().any():
        out["claim (Holm, sweep)"] = long["claim family-wise"].map(_short_claim)
    return out.sort_values(["surface", "detector"], kind="stable").reset_index(drop=True)


#: Claims in the table (the full wording is in the legend and in each run's report).
SHORT_CLAIMS = {"detects malicious content": "detects",
                "separates clean steps from this attack surface on this split": "separates",
                "none": "none"}


def _short_claim(claim) -> str:
    if claim is None or (isinstance(claim, float) and pd.isna(claim)):
        return DASH
    return SHORT_CLAIMS.get(str(claim), str(claim))


def _latex_escape(s: str) -> str:
    """Escape LaTeX specials of labels and claims (our ``$^\\dagger$`` marks hold none of them)."""
    for a, b in (("_", r"\_"), ("%", r"\%"), ("&", r"\&"), ("#", r"\#")):
        s = s.replace(a, b)
    return s


def write_summary_tables(sweep: str | Path, familywise: dict[str, str] | None = None,
                         jobs: list[tuple[str, dict]] | None = None) -> dict[str, Path]:
    """Write ``summary.md``, ``summary.csv``, ``summary.tex`` into the sweep folder.

    Args:
        sweep: The multirun folder.
        familywise: ``{job: claim under Holm}``, or None.
        jobs: ``[(job, results)]``; default: every ``<sweep>/<job>/results.json``.

    Returns:
        ``{"summary_md", "summary_csv", "summary_tex"}`` paths.
    """
    sweep = Path(sweep)
    if jobs is None:
        jobs = [(p.parent.name, json.loads(p.read_text())) for p in sorted(sweep.glob("*/results.json"))]
    long = summary_rows(jobs, familywise)
    md_table = _display(long, "md")
    n_r = int(sum((long[c] != "").sum() for c in long.columns if c.endswith("not_reportable")))
    legend = ("Each cell: estimate [95% CI] (cluster bootstrap over test trajectories). "
              "C1 = metadata baseline; E3 = attack vs each nuisance-matched control; transfer = probe trained on the "
              "other surfaces; permuted = one permuted-label fit, null p = exact permutation test of verdict check 4; "
              "collapse-only = C2. — = not computed by that run. Claims: detects = \"detects malicious content\", "
              "separates = \"separates clean steps from this attack surface on this split\" (PROTOCOL.md §7); "
              "claim = the cell's own verdict, Holm = family-wise over the sweep's cells (docs/sweeps.md). "
              + (f"{n_r} estimates are not reportable (~~struck~~ n/r; reasons in summary.csv)." if n_r else
                 "Every estimate is reportable."))
    md = ["# Summary — surface × detector", "", md_table.to_markdown(index=False, disable_numparse=True), "", legend, ""]
    out = {"summary_md": atomic_write_text(sweep / "summary.md", "\n".join(md))}
    out["summary_csv"] = atomic_write_text(sweep / "summary.csv", long.to_csv(index=False))
    tex = _display(long, "tex")
    tex = tex.map(lambda v: _latex_escape(str(v)))
    tex.columns = [_latex_escape(str(c)) for c in tex.columns]
    caption = ("Estimates with 95\\% cluster-bootstrap CIs; rows surface $\\times$ detector. "
               + ("$^\\dagger$ not reportable (reason in summary.csv). " if n_r else "")
               + "--- = not computed.")
    body = tex.to_latex(index=False, escape=False, caption=caption, label="tab:ipi-summary",
                        column_format="l" * len(tex.columns))
    out["summary_tex"] = atomic_write_text(sweep / "summary.tex", body)
    return out
