"""What a run writes for people: ``results.json``, ``report.md``, ``report.html`` and the figures.

Everything is written atomically (:mod:`ipi.io`). ``report.md`` and ``report.html`` carry the same
content in the same order — verdict first, then the estimands table, the figures, the data counts
and the run description; the HTML adds the resolved config and embeds every figure as base64, so
the one file can be mailed or archived on its own. :func:`write_run_report` writes them all.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Mapping
from pathlib import Path

from ipi.evaluation.reportable import estimand_entries, reportability_of
from ipi.evaluation.results import DEFAULTS
from ipi.evaluation.spread import spread_lines
from ipi.io import atomic_write_text
from ipi.metrics.keys import (
    BOOTSTRAP,
    BY_SEED,
    C1,
    CHECKS,
    CLAIM,
    CLUSTERS_BY_ESTIMAND,
    COUNTS,
    DIFFERENCES,
    E1,
    E1_MINUS_TWIN_E1,
    E1_MINUS_TWIN_E1_BY_SEED,
    E1_MINUS_TWIN_E1_PREDICTIVE,
    E2,
    E3,
    E3_MINUS_TWIN_E3,
    E3_MINUS_TWIN_E3_BY_SEED,
    E3_MINUS_TWIN_E3_PREDICTIVE,
    PERMUTATION,
    RANDOM_TWIN,
    REPORTABILITY,
    RUN,
    SEEDS,
    SOURCE,
    SPLIT_SPREAD,
    VERDICT,
)
from ipi.reporting import attack_sections
from ipi.surfaces.registry import find_surface

#: Figure file names in a run folder, in report order, with their captions.
FIGURES = {
    "roc": ("roc.png", ("ROC curves on the test split: attack vs clean (E1) and attack vs each "
                        "control (E3), step-weighted like the estimands.")),
    "forest": ("forest.png", ("Every estimand with its cluster-bootstrap interval; the dashed line "
                              "is chance (0.5) for AUCs and 0 for paired differences. Grey hollow points are "
                              "not reportable; the reason is printed beside them.")),
    "gallery": ("gallery.png", "Every surface × variant of one test step (what the probe saw)."),
}


def _clean(obj):
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_results(results: dict, out_dir: str | Path) -> Path:
    """Write ``results.json`` (temp name, then rename): never half-written.

    Args:
        results: JSON-ready results; NaN/inf become ``null``.
        out_dir: Run directory.

    Returns:
        Path of ``results.json``.
    """
    path = Path(out_dir) / "results.json"
    atomic_write_text(path, json.dumps(_clean(results), indent=2, sort_keys=True, allow_nan=False) + "\n")
    return path


def _estimate_and_ci(iv: dict | None) -> tuple[str, str] | None:
    """``("0.123", "[0.100, 0.150]")`` of an interval (``[n/a]`` without bounds), None without estimate."""
    if not iv or iv.get("estimate") is None:
        return None
    lo, hi = iv.get("ci_low"), iv.get("ci_high")
    return f"{iv['estimate']:.3f}", (f"[{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "[n/a]")


def _fmt(iv: dict | None) -> str:
    parts = _estimate_and_ci(iv)
    return "n/a" if parts is None else f"{parts[0]} | {parts[1]} | {iv.get('n_boot_used', 0)}"


def estimand_rows(results: Mapping) -> list[tuple[str, dict | None]]:
    """``(label, interval)`` for every estimand of a results dict, in report order.

    Order: E1, E2, E3 per control, each baseline's E1 (and E2), the random twin's E1, E2 and
    E3 per control, then the paired differences.
    Intervals are ``{"estimate", "ci_low", "ci_high", "n_boot_used"}`` dicts.
    """
    return [(label, iv) for _key, label, iv in estimand_entries(results)]


def _not_reportable_note(marks: Mapping[str, str | None], results: Mapping) -> str | None:
    n = sum(v is not None for v in marks.values())
    if not n:
        return None
    rep = results.get(REPORTABILITY) or {}
    return (f"{n} of {len(marks)} estimates are marked not reportable (the verdict could not use them: "
            f"fewer than {rep.get('min_clusters', DEFAULTS.min_clusters)} contributing test trajectories, fewer than "
            f"{rep.get('min_boot_fraction', DEFAULTS.min_boot_fraction):.0%} of the bootstrap replicates usable, "
            "or a degenerate interval). Do not report them as results.")


def twin_rows(results: Mapping) -> list[tuple]:
    """``(label, trained, [twin seed ...], envelope, trained − envelope, trained − new twin)`` per
    E1, E2, each E3[c].

    Empty when the results have no random-weight twin (``results["random_twin"]``). The twin
    columns follow ``results["random_twin"]["seeds"]``; the envelope is the per-draw maximum
    over the seeds (``results["random_twin"]``'s own intervals), the difference the paired one
    of ``results["differences"]`` and the last the seed-predictive interval (trained − mean twin
    ∓ the Student-t prediction half-width of the init-seed SD: ``*_predictive``; E1 and each
    E3[c]; E2 has none).
    """
    twin = results.get(RANDOM_TWIN)
    if not isinstance(twin, Mapping):
        return []
    seeds = [str(s) for s in twin.get(SEEDS) or []]
    by_seed = twin.get(BY_SEED) or {}
    d = results.get(DIFFERENCES) or {}

    def per_seed(name: str, control: str | None = None) -> list[dict | None]:
        out = []
        for s in seeds:
            est = by_seed.get(s) or {}
            out.append((est.get(E3) or {}).get(control) if control else est.get(name))
        return out

    rows = [("E1 attack vs clean", results.get(E1), per_seed(E1), twin.get(E1), d.get(E1_MINUS_TWIN_E1),
             d.get(E1_MINUS_TWIN_E1_PREDICTIVE)),
            ("E2 paired step", results.get(E2), per_seed(E2), twin.get(E2), None, None)]
    for c, iv in sorted((results.get(E3) or {}).items()):
        rows.append((f"E3 attack vs {c}", iv, per_seed(E3, c), (twin.get(E3) or {}).get(c),
                     (d.get(E3_MINUS_TWIN_E3) or {}).get(c), (d.get(E3_MINUS_TWIN_E3_PREDICTIVE) or {}).get(c)))
    return rows


def twin_difference_rows(results: Mapping) -> list[tuple[str, list[dict | None]]]:
    """``(label, [trained − twin seed, paired ...])`` for E1 and each E3[c], seeds in order."""
    twin = results.get(RANDOM_TWIN)
    if not isinstance(twin, Mapping):
        return []
    seeds = [str(s) for s in twin.get(SEEDS) or []]
    d = results.get(DIFFERENCES) or {}
    e1 = d.get(E1_MINUS_TWIN_E1_BY_SEED) or {}
    e3 = d.get(E3_MINUS_TWIN_E3_BY_SEED) or {}
    rows = [("E1 attack vs clean", [e1.get(s) for s in seeds])]
    for c in sorted(results.get(E3) or {}):
        rows.append((f"E3 attack vs {c}", [(e3.get(s) or {}).get(c) for s in seeds]))
    return rows


def _twin_seeds(results: Mapping) -> list[str]:
    return [str(s) for s in (results.get(RANDOM_TWIN) or {}).get(SEEDS) or []]


def _random_backbone(results: Mapping) -> bool:
    """Whether the run's own backbone has random weights (``run.random_twin.backbone_pretrained`` False)."""
    return ((results.get(RUN) or {}).get(RANDOM_TWIN) or {}).get("backbone_pretrained") is False


def _twin_headers(results: Mapping) -> tuple[list[str], list[str]]:
    """Column heads of the two twin tables (the side-by-side one, the per-seed differences)."""
    seeds = _twin_seeds(results)
    env = "max over twin seeds" if len(seeds) > 1 else "random twin"
    main = (["estimand", "trained"] + [f"twin seed {s}" for s in seeds]
            + ([env] if len(seeds) > 1 else []) + [f"trained − {env}, paired"]
            + (["trained − new twin, seed-predictive"] if len(seeds) > 1 else []))
    return main, ["estimand"] + [f"trained − twin seed {s}, paired" for s in seeds]


def _twin_cells(row) -> list[str]:
    label, a, per, env, d, pred = row
    cells = [label, _short_iv(a), *(_short_iv(x) for x in per)]
    if len(per) > 1:
        cells.append(_short_iv(env))
    cells.append(_short_iv(d) if d else "—")
    if len(per) > 1:
        cells.append(_short_iv(pred) if pred else "—")
    return cells


def _short_iv(iv: dict | None) -> str:
    parts = _estimate_and_ci(iv)
    return "n/a" if parts is None else f"{parts[0]} {parts[1]}"


#: Said under the side-by-side table when the backbone's own weights are random.
RANDOM_BACKBONE_NOTE = ("The backbone's own weights are random (backbone.pretrained=false): a network with random "
                        "weights cannot read malicious intent, so this run can license at most \"separates\"; "
                        "its twin is the same architecture with other random weights.")


def _twin_caption(results: Mapping) -> str:
    seeds = _twin_seeds(results)
    n = len(seeds)
    which = (f"{n} random-weight twins (seeds {', '.join(seeds)})" if n > 1
             else f"the random-weight twin{f' (seed {seeds[0]})' if seeds else ''}")
    bound = (f" With {n} twins, features no better than random ones would beat all of them with probability "
             f"at most 1/{n + 1} whatever the CI." if n else "")
    return (f"The same probe, folds and rows on {which}: the same architecture and config with the "
            "architecture's own random initialisation. Check 6 needs, for every control, the paired CI of "
            f"E3 − {'max over twin seeds (per bootstrap draw)' if n > 1 else 'twin'} E3 above 0 (the "
            "trained backbone beats every twin seed) and the seed-predictive CI of E3 − mean twin E3 above 0 "
            "(it beats a new random draw: the Student-t prediction interval from the twins' spread on "
            "these rows, which needs at least 2 seeds; docs/estimands.md)."
            f"{bound}")




def construction_note(results: Mapping) -> str | None:
    """Why verdict check 2 is decided by construction on this run's surface (docs/estimands.md).

    C1 sees four metadata scalars: step, horizon, prompt length and Δprompt length. On a surface
    whose injected text lengthens the prompt (``i_dom``, ``i_tool``) Δprompt length alone
    separates attack from clean rows (C1 E1 = 1.000): check 2 fails whatever the probe does. On
    ``i_vis`` the banner is drawn on the screenshot and leaves the prompt length unchanged, so
    C1's inputs are equal for the attack and clean rows of a step (C1 E1 ≈ 0.5) and check 2
    reduces to the probe separating at all. The surface object says which
    (:meth:`ipi.surfaces.surface.Surface.construction_note`).

    Returns:
        One paragraph, or None without C1 results.
    """
    c1 = ((results.get(C1) or {}).get(E1) or {}).get("estimate")
    if c1 is None:
        return None
    surface = find_surface((results.get(RUN) or {}).get("surface"))
    head = f"C1 (metadata baseline) E1 = {c1:.3f}. "
    if surface is not None:
        return head + surface.construction_note()
    return head + ("Whether check 2 is decided by construction depends on the surface: on text surfaces "
                   "Δprompt length separates attack from clean (C1 = 1.000), on i_vis it is 0 (C1 ≈ 0.5).")


def permutation_lines(results: Mapping) -> list[str]:
    """The exact permutation test's numbers (PROTOCOL.md §7.4), one fact per line."""
    p = results.get(PERMUTATION)
    if not isinstance(p, Mapping):
        return []
    out = [f"M = {p['m']} refits, labels permuted within each training (trajectory, step), seed {p.get('seed')}",
           f"observed E1 {p['e1']:.3f}; null mean {p['null_mean']:.3f}, SD {p['null_sd']:.3f}, "
           f"2.5–97.5% [{p['null_q025']:.3f}, {p['null_q975']:.3f}]",
           f"p = (1 + {p['n_ge']}) / ({p['m']} + 1) = {p['p_value']:.4f}; "
           f"null-mean tolerance max(0.02, 3·SD/√M) = {p['tolerance']:.3f}"]
    if p.get("e1_refit") is not None:
        out.append(f"E1 of the same refit on the true labels {p['e1_refit']:.4f} (equals E1 up to solver tolerance)")
    return out


def cluster_lines(results: Mapping) -> list[str]:
    """Per-estimand contributing test trajectories (PROTOCOL.md §7.0), flagged when below the gate."""
    v = results.get(VERDICT) or {}
    rep = v.get(REPORTABILITY) or {}
    mc = v.get("min_clusters")
    return [f"{k}: {x['clusters']}" + ("" if x["reportable"] else f" (< {mc}: not used by the verdict)")
            for k, x in rep.items()]


def _bootstrap_text(bs: Mapping) -> str:
    return ", ".join(f"{k}={v}" for k, v in bs.items() if k != CLUSTERS_BY_ESTIMAND)


def render_report(results: dict, figures: Mapping[str, str] | None = None) -> str:
    """A Markdown report a person reads: verdict first, then estimands, figures, counts.

    Args:
        results: The dict written to ``results.json``.
        figures: ``{name: file name relative to the report}`` of figures to link (see
            :data:`FIGURES`), or None.

    Returns:
        Markdown text.
    """
    r = results
    lines = [f"# ipi report — {r.get('run', {}).get('surface', '')}", ""]
    v = r.get(VERDICT)
    if v:
        lines += ["## Verdict (PROTOCOL.md §7)", "", f"**Licensed claim: {v[CLAIM]}**", ""]
        if v.get("claim_note"):
            lines += [f"*{v['claim_note']}*", ""]
        lines += [f"- [{c['status']}] {c['id']}. {c['name']}: {c['detail']}" for c in v[CHECKS]]
        lines.append("")
        note = construction_note(r)
        if note:
            lines += [f"Check 2 on this surface: {note}", ""]
        perm = permutation_lines(r)
        if perm:
            lines += ["Exact permutation test (check 4):", ""] + [f"- {x}" for x in perm] + [""]
        cl = cluster_lines(r)
        if cl:
            lines += [f"Test trajectories contributing rows to both sides of each estimand "
                      f"(min_clusters {v.get('min_clusters')}):", ""] + [f"- {x}" for x in cl] + [""]
    if r.get(SPLIT_SPREAD):
        lines += spread_lines(r[SPLIT_SPREAD])
    marks = reportability_of(r)
    lines += ["## Estimands (PROTOCOL.md §5)", ""]
    note = _not_reportable_note(marks, r)
    if note:
        lines += [f"**{note}**", ""]
    lines += ["| estimand | estimate | 95% CI | replicates used | reportable |", "|---|---|---|---|---|"]
    for key, label, iv in estimand_entries(r):
        why = marks.get(key)
        mark = "yes" if why is None else f"**no**: {why}"
        label = label if why is None else f"~~{label}~~"
        lines.append(f"| {label} | {_fmt(iv)} | {mark} |")
    lines.append("")
    lines += attack_sections.markdown_lines(r)  # operating point; attack source (issue 25)
    trows = twin_rows(r)
    if trows:
        head, dhead = _twin_headers(r)
        lines += ["## Trained vs random-weight twin (check 6)", "", _twin_caption(r), "",
                  "| " + " | ".join(h if i == 0 else f"{h} [95% CI]" for i, h in enumerate(head)) + " |",
                  "|---" * len(head) + "|"]
        lines += ["| " + " | ".join(_twin_cells(row)) + " |" for row in trows]
        drows = twin_difference_rows(r)
        if len(dhead) > 2:  # several seeds: each seed's own paired difference too
            lines += ["", "| " + " | ".join(h if i == 0 else f"{h} [95% CI]" for i, h in enumerate(dhead)) + " |",
                      "|---" * len(dhead) + "|"]
            lines += ["| " + " | ".join([label, *(_short_iv(x) for x in ivs)]) + " |" for label, ivs in drows]
        if _random_backbone(r):
            lines += ["", RANDOM_BACKBONE_NOTE]
        lines.append("")
    if figures:
        lines += ["## Figures", ""]
        for name, rel in figures.items():
            caption = FIGURES.get(name, (None, name))[1]
            lines += [f"![{name}]({rel})", "", f"*{caption}*", ""]
    counts = r.get(COUNTS)
    if counts:
        lines += ["## Data", ""]
        for k, val in counts.items():
            if k in ("skipped_steps", "skipped_trajectories") and isinstance(val, list):
                lines.append(f"- {k}: {len(val)}")
                lines += [f"  - {s}" for s in val[:50]]
            else:
                lines.append(f"- {k}: {val}")
        lines.append("")
    run = r.get(RUN)
    if run:
        lines += ["## Run", ""] + [f"- {k}: {val}" for k, val in run.items()
                                   if k not in attack_sections.OWN_SECTION] + [""]
    bs = r.get(BOOTSTRAP)
    if bs:
        lines += ["Cluster bootstrap over test trajectories: " + _bootstrap_text(bs), ""]
    return "\n".join(lines)


def write_report(results: dict, out_dir: str | Path, figures: Mapping[str, str] | None = None) -> Path:
    """Write ``report.md`` atomically and return its path (``figures`` as in :func:`render_report`)."""
    path = Path(out_dir) / "report.md"
    atomic_write_text(path, render_report(results, figures))
    return path


#: Stylesheet of report.html and sweep.html.
REPORT_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#1a1a1a;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
.claim{font-size:1.25em;padding:.6em 1em;border-radius:6px;margin:.6em 0}
.claim.detects{background:#e3f5e1;border:1px solid #6fbf73}.claim.separates{background:#fff6dc;border:1px solid #e0b84d}
.claim.none{background:#fde7e7;border:1px solid #e07b7b}
table{border-collapse:collapse;margin:.5em 0;font-size:.92em}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.PASS{color:#1b7a1b;font-weight:600}.FAIL{color:#b21f1f;font-weight:600}.INCONCLUSIVE{color:#a86b00;font-weight:600}.NOT.RUN,.NOTRUN{color:#777;font-weight:600;white-space:nowrap}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #ddd}figcaption{font-size:.9em;color:#555}
pre{background:#f6f8fa;padding:.8em;overflow:auto;font-size:.85em;border-radius:4px}
.muted{color:#666;font-size:.9em}
td.num{white-space:nowrap}
tr.unreportable td{color:#8a8a8a;background:#f4f4f4}tr.unreportable td.est{text-decoration:line-through}
td.why{font-size:.88em}.warn{background:#fff3cd;border:1px solid #e0b84d;padding:.5em .8em;border-radius:4px}
figure img{cursor:zoom-in}
#lightbox{display:none;position:fixed;inset:0;z-index:10;background:rgba(20,20,20,.9);overflow:auto;cursor:zoom-out}
#lightbox img{display:block;margin:1em auto;max-width:none;background:#fff;border:0}
#lightbox p{color:#eee;text-align:center;margin:.5em;font-size:.9em}
"""

#: Click any figure to see it at full size (the gallery is far wider than the page); click again to
#: close. ``report.html#full-gallery`` (or ``#full-forest``, ``#full-roc``) opens with it shown.
_LIGHTBOX = """<div id="lightbox" title="click to close"><p>full size: click anywhere or press Esc to close</p>
<img alt="figure at full size"></div>
<script>
(function(){var lb=document.getElementById('lightbox'),big=lb.querySelector('img');
document.querySelectorAll('figure img').forEach(function(im){im.title='click for full size';
im.addEventListener('click',function(){big.setAttribute('src',im.getAttribute('src'));lb.style.display='block';});});
lb.addEventListener('click',function(){lb.style.display='none';});
document.addEventListener('keydown',function(e){if(e.key==='Escape'){lb.style.display='none';}});
var m=/^#full-(\w+)$/.exec(location.hash),f=m&&document.querySelector('img[alt="'+m[1]+'"]');
if(f){big.setAttribute('src',f.getAttribute('src'));lb.style.display='block';}})();
</script>"""


def html_escape(x) -> str:
    """``str(x)`` escaped for HTML text and attribute values (quotes included)."""
    return html.escape(str(x), quote=True)


_h = html_escape  # short name for the many f-strings below


def _num(x, fmt: str = ".3f") -> str:
    return "n/a" if x is None else format(float(x), fmt)


def img_tag(path: Path, alt: str) -> str:
    """An ``<img>`` tag with the PNG at ``path`` embedded as a data URI (self-contained HTML)."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{_h(alt)}" src="data:image/png;base64,{data}">'


def render_html(results: Mapping, figures: Mapping[str, str | Path] | None = None,
                config_yaml: str | None = None, base_dir: str | Path | None = None) -> str:
    """A self-contained HTML report: verdict, estimands, figures (base64), counts, run, config.

    Args:
        results: The dict written to ``results.json``.
        figures: ``{name: PNG path}`` (relative paths are taken under ``base_dir``); each is
            embedded as a base64 ``data:`` URI, so the HTML needs no other file.
        config_yaml: The resolved run config as YAML (shown at the end), or None.
        base_dir: Folder that relative figure paths are under.

    Returns:
        HTML text.
    """
    r = results
    run = r.get(RUN) or {}
    title = " · ".join(str(x) for x in (run.get("surface"), run.get("backbone")) if x) or "score table"
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>ipi report — {_h(title)}</title><style>{REPORT_CSS}</style></head><body>",
           f"<h1>ipi report — {_h(title)}</h1>"]
    if r.get(SOURCE):
        out.append(f'<p class="muted">score table: {_h(r[SOURCE])}</p>')
    v = r.get(VERDICT)
    if v:
        cls = {"detects malicious content": "detects", "none": "none"}.get(v[CLAIM], "separates")
        out += ["<h2>Verdict (PROTOCOL.md §7)</h2>",
                f'<div class="claim {cls}">Licensed claim: <b>{_h(v[CLAIM])}</b></div>',
                "<table><tr><th>#</th><th>check</th><th>status</th><th>numbers behind it</th></tr>"]
        for c in v[CHECKS]:
            status_cls = c["status"].replace(" ", "")
            out.append(f'<tr><td>{c["id"]}</td><td>{_h(c["name"])}</td>'
                       f'<td class="{status_cls}">{_h(c["status"])}</td><td>{_h(c["detail"])}</td></tr>')
        out.append("</table>")
        if v.get("claim_note"):
            out.insert(len(out) - len(v[CHECKS]) - 2, f'<p class="muted">{_h(v["claim_note"])}</p>')
        note = construction_note(r)
        if note:
            out.append(f"<p><b>Check 2 on this surface.</b> {_h(note)}</p>")
        perm = permutation_lines(r)
        if perm:
            out.append("<p><b>Exact permutation test (check 4).</b></p><ul>"
                       + "".join(f"<li>{_h(x)}</li>" for x in perm) + "</ul>")
        cl = cluster_lines(r)
        if cl:
            out.append(f"<details><summary>Test trajectories contributing rows to both sides of each estimand "
                       f"(min_clusters {_h(v.get('min_clusters'))})</summary><ul>"
                       + "".join(f"<li>{_h(x)}</li>" for x in cl) + "</ul></details>")
    sp = r.get(SPLIT_SPREAD)
    if sp:
        out += [f"<h2>Split spread ({sp['n_splits']} splits; pre-registered seed {sp['preregistered_seed']})</h2>",
                "<p>The verdict above is the pre-registered split's. Re-rolled splits "
                f"(seeds {_h(', '.join(map(str, sp['seeds'])))}):</p>",
                "<table><tr><th>estimand</th><th>min</th><th>median</th><th>max</th></tr>"]
        for k, d in sp["estimands"].items():
            out.append(f"<tr><td>{_h(k)}</td>" + "".join(f"<td>{_num(d[x])}</td>" for x in ("min", "median", "max"))
                       + "</tr>")
        out.append("</table><ul>" + "".join(f"<li>splits licensing &quot;{_h(c)}&quot;: {k}/{sp['n_splits']}</li>"
                                            for c, k in sp["claims"].items()) + "</ul>")
    bs = r.get(BOOTSTRAP) or {}
    level = bs.get("level", DEFAULTS.level)
    marks = reportability_of(r)
    out.append("<h2>Estimands (PROTOCOL.md §5)</h2>")
    note = _not_reportable_note(marks, r)
    if note:
        out.append(f'<p class="warn">{_h(note)}</p>')
    out.append(f"<table><tr><th>estimand</th><th>estimate</th><th>{level:.0%} CI</th>"
               "<th>replicates used</th><th>reportable</th></tr>")
    for key, label, iv in estimand_entries(r):
        iv = iv or {}
        why = marks.get(key)
        ci = (f"[{_num(iv.get('ci_low'))}, {_num(iv.get('ci_high'))}]"
              if iv.get("ci_low") is not None and iv.get("ci_high") is not None else "n/a")
        cls = "" if why is None else ' class="unreportable"'
        mark = "yes" if why is None else f"no: {_h(why)}"
        out.append(f'<tr{cls}><td>{_h(label)}</td><td class="num est">{_num(iv.get("estimate"))}</td>'
                   f'<td class="num est">{ci}</td><td class="num">{_h(iv.get("n_boot_used", ""))}</td>'
                   f'<td class="why">{mark}</td></tr>')
    out.append("</table>")
    out += attack_sections.html_parts(r)  # operating point; attack source (issue 25)
    trows = twin_rows(r)
    if trows:
        head, dhead = _twin_headers(r)
        out += ["<h2>Trained vs random-weight twin (check 6)</h2>", f"<p>{_h(_twin_caption(r))}</p>",
                "<table><tr>" + "".join(f"<th>{_h(h if i == 0 else h + ' [CI]')}</th>" for i, h in enumerate(head))
                + "</tr>"]
        for row in trows:
            cells = _twin_cells(row)
            out.append(f"<tr><td>{_h(cells[0])}</td>" + "".join(f'<td class="num">{_h(c)}</td>' for c in cells[1:])
                       + "</tr>")
        out.append("</table>")
        if len(dhead) > 2:
            out.append("<table><tr>" + "".join(f"<th>{_h(h if i == 0 else h + ' [CI]')}</th>"
                                               for i, h in enumerate(dhead)) + "</tr>")
            for label, ivs in twin_difference_rows(r):
                out.append(f"<tr><td>{_h(label)}</td>" + "".join(f'<td class="num">{_h(_short_iv(x))}</td>'
                                                                  for x in ivs) + "</tr>")
            out.append("</table>")
        if _random_backbone(r):
            out.append(f"<p><b>{_h(RANDOM_BACKBONE_NOTE)}</b></p>")
    if bs:
        out.append('<p class="muted">Cluster bootstrap over test trajectories: '
                   + _h(_bootstrap_text(bs)) + "</p>")
    if figures:
        out.append("<h2>Figures</h2>")
        base = Path(base_dir) if base_dir is not None else Path(".")
        for name, rel in figures.items():
            path = Path(rel) if Path(rel).is_absolute() else base / rel
            if not path.is_file():
                continue
            caption = FIGURES.get(name, (None, name))[1] + " Click the figure for full size."
            out.append(f"<figure>{img_tag(path, name)}<figcaption>{_h(caption)}</figcaption></figure>")
    counts = r.get(COUNTS)
    if counts:
        out += ["<h2>Data</h2>", "<table>"]
        details = []
        for k, val in counts.items():
            if isinstance(val, list):
                out.append(f"<tr><td>{_h(k)}</td><td class=\"num\">{len(val)}</td></tr>")
                if val:
                    items = "".join(f"<li>{_h(json.dumps(s, ensure_ascii=False))}</li>" for s in val[:200])
                    more = f"<li>… {len(val) - 200} more</li>" if len(val) > 200 else ""
                    details.append(f"<details><summary>{_h(k)} ({len(val)})</summary><ul>{items}{more}</ul></details>")
            elif isinstance(val, dict):
                inner = ", ".join(f"{_h(a)}: {_h(b)}" for a, b in val.items())
                out.append(f"<tr><td>{_h(k)}</td><td>{inner}</td></tr>")
            else:
                out.append(f'<tr><td>{_h(k)}</td><td class="num">{_h(val)}</td></tr>')
        out.append("</table>")
        out += details
    if run:
        out += ["<h2>Run</h2>", "<table>"]
        out += [f"<tr><td>{_h(k)}</td><td>{_h(val)}</td></tr>" for k, val in run.items()
                if k not in attack_sections.OWN_SECTION]
        out.append("</table>")
    if config_yaml:
        out += ["<h2>Resolved config</h2>", f"<pre>{_h(config_yaml)}</pre>"]
    if figures:
        out.append(_LIGHTBOX)
    out.append("</body></html>")
    return "\n".join(out)


def write_run_report(results: dict, out_dir: str | Path, *, scores=None, config: Mapping | None = None,
                     gallery: str | Path | None = None, plots: bool = True, html_report: bool = True,
                     title: str = "", before_results=None) -> dict[str, Path]:
    """Write the figures, ``report.md``, ``report.html`` and, last, ``results.json`` of a run.

    ``results.json`` is written last (atomically), so its presence means the run finished: a run
    stopped by a signal or a kill at any point before leaves none (docs/reliability.md).

    Args:
        results: JSON-ready results (estimands, verdict, counts, run).
        out_dir: Run directory.
        scores: The probe's test-row score table (``trajectory_id, step, variant, score``) for the
            ROC figure, or None to skip it.
        config: The resolved config (plain dict) shown at the end of the HTML, or None.
        gallery: A gallery PNG already written into ``out_dir`` (linked and embedded), or None.
        plots: Whether to draw ``roc.png`` and ``forest.png``.
        html_report: Whether to write ``report.html``.
        title: Figure title (default: surface and backbone of ``results["run"]``).
        before_results: Called (no arguments) after the reports and before ``results.json``:
            for the caller's own files (``scores.csv``, ``run_info.json``), or None.

    Returns:
        ``{"results", "report_md", "report_html"?, "roc"?, "forest"?, "gallery"?}`` → paths.
    """
    out_dir = Path(out_dir)
    paths: dict[str, Path] = {}
    run = results.get(RUN) or {}
    title = title or " · ".join(str(x) for x in (run.get("surface"), run.get("backbone"),
                                                 run.get("layers_config"),
                                                 "+".join(run.get("token_groups") or [])) if x)
    figures: dict[str, str] = {}
    if plots:
        from ipi.reporting.plots import plot_forest, plot_roc

        if scores is not None:
            paths["roc"] = plot_roc(scores, out_dir / FIGURES["roc"][0], title=title and f"ROC · {title}")
            figures["roc"] = FIGURES["roc"][0]
        paths["forest"] = plot_forest(results, out_dir / FIGURES["forest"][0], title=title)
        figures["forest"] = FIGURES["forest"][0]
    if gallery is not None and Path(gallery).is_file():
        paths["gallery"] = Path(gallery)
        figures["gallery"] = Path(gallery).name if Path(gallery).parent == out_dir else str(gallery)
    paths["report_md"] = write_report(results, out_dir, figures)
    if html_report:
        cfg_yaml = None
        if config is not None:
            from omegaconf import OmegaConf

            cfg_yaml = OmegaConf.to_yaml(OmegaConf.create(dict(config)))
        paths["report_html"] = atomic_write_text(
            out_dir / "report.html", render_html(results, figures, cfg_yaml, base_dir=out_dir))
    if before_results is not None:
        before_results()
    paths["results"] = write_results(results, out_dir)
    return paths
