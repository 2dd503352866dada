"""What a run writes for people: ``results.json``, ``report.md``, ``report.html`` and the figures.

Everything is written atomically (:mod:`ipi.io`). ``report.md`` and ``report.html`` render the one
list of sections of :func:`ipi.reporting.layout.report_sections`, so they carry the same content
in the same order: the verdict and the headline estimands E1, E2, E3 first, then the figures,
baselines, random-weight twins, paired differences, permutation test, split spread, data counts,
run description and resolved config — folded (``<details>``) in the HTML, each with a one-line
summary. The HTML embeds every figure as base64, so the one file can be mailed or archived on its
own; no table has more than :data:`ipi.reporting.layout.MAX_COLUMNS` columns and every cell
wraps, so the page has no horizontal scroll (docs/outputs.md, "report.html").
:func:`write_run_report` writes them all.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Mapping
from pathlib import Path

from ipi.io import atomic_write_text
from ipi.metrics.keys import RUN, SOURCE, SOURCE_TWIN
from ipi.reporting import attack_sections, behaviour_sections
from ipi.reporting.layout import (
    FIGURES,
    Bullets,
    CheckLine,
    Code,
    EstimandTable,
    Estimate,
    Figure,
    Grid,
    KeyValues,
    Section,
    Side,
    Text,
    interval_text,
    report_sections,
    split_columns,
)

__all__ = ["FIGURES", "REPORT_CSS", "html_escape", "img_tag", "render_html", "render_report", "write_report",
           "write_results", "write_run_report"]


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


def _title(results: Mapping) -> str:
    run = results.get(RUN) or {}
    return " · ".join(str(x) for x in (run.get("surface"), run.get("backbone")) if x) or "score table"


def _sources(results: Mapping) -> list[str]:
    return [f"{what}: {results[key]}" for key, what in ((SOURCE, "score table"), (SOURCE_TWIN, "twin score table"))
            if results.get(key)]


# ---------------------------------------------------------------------------------------- Markdown


def _md_escape(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _md_cell(c) -> str:
    if isinstance(c, Estimate):
        t = interval_text(c.iv)
        return f"~~{t}~~" if c.why else t
    return _md_escape(c)


def _unreportable(grids: list[Grid]) -> dict[str, list[str]]:
    """``{reason: [label, ...]}`` of the struck-through cells of a grid (each estimand once)."""
    seen: set = set()
    out: dict[str, list[str]] = {}
    for g in grids:
        for row in g.rows:
            for c in row:
                if isinstance(c, Estimate) and c.why and c.key not in seen:
                    seen.add(c.key)
                    out.setdefault(c.why, []).append(c.label)
    return out


def _md_unreportable(grids: list[Grid]) -> list[str]:
    by_reason = _unreportable(grids)
    if not by_reason:
        return []
    return ["Struck through, not reportable:", "",
            *(f"- {why}: {', '.join(labels)}" for why, labels in by_reason.items()), ""]


def _md_blocks(blocks, out: list[str]) -> None:
    for i, b in enumerate(blocks):
        if isinstance(b, Text):
            text = {"claim": f"**Licensed claim: {b.text}**", "muted": f"*{b.text}*", "warn": f"**{b.text}**",
                    "strong": f"**{b.text}**"}.get(b.style, b.text)
            out += [f"{b.label} {text}" if b.label else text, ""]
        elif isinstance(b, Bullets):
            out += [f"- {x}" for x in b.items] + [""]
        elif isinstance(b, CheckLine):
            out.append(f"- [{b.status}] {b.id}. {b.name}: {b.detail}")
            if b.rule:
                out.append(f"  - rule: {b.rule}")
            if b.numbers:
                out.append("  - numbers: " + "; ".join(f"{k} {v}" for k, v in b.numbers))
            if i + 1 == len(blocks) or not isinstance(blocks[i + 1], CheckLine):
                out.append("")  # the checks are one list
        elif isinstance(b, EstimandTable):
            out += [f"| estimand | estimate | {b.level:.0%} CI | replicates used | reportable | decides |",
                    "|---|---|---|---|---|---|"]
            for key, label, iv, why in b.rows:
                iv = iv if isinstance(iv, Mapping) else {}
                parts = interval_text(iv).split(" ", 1)
                est, ci = (parts[0], parts[1]) if len(parts) == 2 else ("n/a", "n/a")
                label = _md_escape(label) if why is None else f"~~{_md_escape(label)}~~"
                mark = "yes" if why is None else f"**no**: {_md_escape(why)}"
                out.append(f"| {label} | {est} | {ci} | {iv.get('n_boot_used', '')} | {mark} | {b.decides(key)} |")
            out.append("")
        elif isinstance(b, Grid):
            parts = split_columns(b)
            for g in parts:
                out += ["| " + " | ".join(_md_escape(h) for h in g.head) + " |", "|---" * len(g.head) + "|"]
                out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in g.rows]
                out.append("")
            out += _md_unreportable(parts)
        elif isinstance(b, KeyValues):
            for k, v, more in b.items:
                out.append(f"- {k}: {v}")
                out += [f"  - {x}" for x in more]
            out.append("")
        elif isinstance(b, Figure):
            out += [f"![{b.name}]({b.src})", "", f"*{b.caption}*", ""]
        elif isinstance(b, Code):
            out += [f"```{b.lang}", b.text.rstrip("\n"), "```", ""]
        elif isinstance(b, Side):
            for col in b.columns:
                _md_blocks(col, out)
        else:
            raise TypeError(f"report.md: no rendering for block {type(b).__name__}")


def render_report(results: Mapping, figures: Mapping[str, str] | None = None, config_yaml: str | None = None) -> str:
    """``report.md``: the sections of :func:`~ipi.reporting.layout.report_sections` in Markdown.

    Args:
        results: The dict written to ``results.json``.
        figures: ``{name: file name relative to the report}`` of figures to link (see
            :data:`~ipi.reporting.layout.FIGURES`), or None.
        config_yaml: The resolved run config as YAML (the last section), or None.

    Returns:
        Markdown text.
    """
    out = [f"# ipi report — {_title(results)}", ""]
    out += [f"*{x}*" for x in _sources(results)] + ([""] if _sources(results) else [])
    for s in behaviour_sections.with_behaviour(
            attack_sections.with_sections(report_sections(results, figures, config_yaml), results), results):
        out += [f"## {s.title}", ""]
        _md_blocks(s.blocks, out)
    return "\n".join(out)


def write_report(results: Mapping, out_dir: str | Path, figures: Mapping[str, str] | None = None,
                 config_yaml: str | None = None) -> Path:
    """Write ``report.md`` atomically and return its path (arguments as in :func:`render_report`)."""
    path = Path(out_dir) / "report.md"
    atomic_write_text(path, render_report(results, figures, config_yaml))
    return path


# -------------------------------------------------------------------------------------------- HTML

#: Stylesheet of report.html and sweep.html. Tables wrap their cells (no horizontal scroll at
#: 900 px and wider); the verdict's checks are one line each until opened.
REPORT_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#1a1a1a;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.3em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.4em}
nav.toc{font-size:.9em;color:#555;margin:.2em 0 1em}nav.toc a{color:#2457a6;text-decoration:none}
section>details>summary{cursor:pointer;border-bottom:1px solid #ddd;padding:.35em 0;margin-top:.5em}
section>details>summary h2{display:inline;border:0;margin:0;padding:0;font-size:1.15em}
section>details>summary .sum{color:#555;font-size:.9em;margin-left:.8em}
section>details[open]>summary{margin-bottom:.6em}
.claim{font-size:1.25em;padding:.6em 1em;border-radius:6px;margin:.6em 0}
.claim.detects{background:#e3f5e1;border:1px solid #6fbf73}.claim.separates{background:#fff6dc;border:1px solid #e0b84d}
.claim.none{background:#fde7e7;border:1px solid #e07b7b}
table{border-collapse:collapse;margin:.5em 0;font-size:.92em;max-width:100%}
td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top;overflow-wrap:break-word}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.iv{text-align:right;font-variant-numeric:tabular-nums}td.iv .ci{display:block;font-size:.85em;color:#555;white-space:nowrap}
td.iv.unreportable{color:#8a8a8a;background:#f4f4f4}td.iv.unreportable span{text-decoration:line-through}
table.kv th{font-weight:normal;background:#f8f8f8}table.kv td{overflow-wrap:anywhere}
.PASS{color:#1b7a1b;font-weight:600}.FAIL{color:#b21f1f;font-weight:600}.INCONCLUSIVE{color:#a86b00;font-weight:600}
.NOTRUN{color:#777;font-weight:600;white-space:nowrap}
details.check{border-bottom:1px solid #eee}
details.check>summary{display:flex;gap:.7em;align-items:baseline;cursor:pointer;padding:.3em 0;list-style:none}
details.check>summary::-webkit-details-marker{display:none}
details.check>summary::before{content:"\\25B8";color:#888}details.check[open]>summary::before{content:"\\25BE"}
details.check .status{flex:0 0 8.6em}
details.check .cname{flex:0 0 22.5em;font-weight:600;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
details.check .lead{flex:1 1 0;min-width:0;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;color:#333}
details.check[open] .lead,details.check[open] .cname{white-space:normal}details.check table{margin-left:1.6em}
@media (max-width:1100px){details.check>summary{flex-wrap:wrap;row-gap:0}details.check .cname{flex:1 1 auto}details.check .lead{flex:1 1 100%;padding-left:1.4em}}
.side{display:flex;flex-wrap:wrap;gap:0 2em;align-items:flex-start}.side>div{flex:1 1 520px;min-width:0}
.side>div:has(figure){flex:0 1 440px}
figure{margin:1em 0}figure img{max-width:100%;box-sizing:border-box;border:1px solid #ddd}figcaption{font-size:.9em;color:#555}
pre{background:#f6f8fa;padding:.8em;white-space:pre-wrap;overflow-wrap:anywhere;font-size:.85em;border-radius:4px}
.muted{color:#666;font-size:.9em}li{overflow-wrap:anywhere}
tr.unreportable td{color:#8a8a8a;background:#f4f4f4}tr.unreportable td.est{text-decoration:line-through}
td.why{font-size:.88em}.warn{background:#fff3cd;border:1px solid #e0b84d;padding:.5em .8em;border-radius:4px}
figure img{cursor:zoom-in}
#lightbox{display:none;position:fixed;inset:0;z-index:10;background:rgba(20,20,20,.9);overflow:auto;cursor:zoom-out}
#lightbox img{display:block;margin:1em auto;max-width:none;background:#fff;border:0}
#lightbox p{color:#eee;text-align:center;margin:.5em;font-size:.9em}
"""

#: Opening ``report.html#twins`` (or following a contents link) unfolds that section.
_OPEN_ON_HASH = """<script>
(function(){function open(){var t=location.hash&&document.getElementById(location.hash.slice(1));
var d=t&&t.querySelector('details');if(d){d.open=true;}}
window.addEventListener('hashchange',open);open();})();
</script>"""

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
var m=/^#full-(\\w+)$/.exec(location.hash),f=m&&document.querySelector('img[alt="'+m[1]+'"]');
if(f){big.setAttribute('src',f.getAttribute('src'));lb.style.display='block';}})();
</script>"""

#: Contents-line names of the sections (their titles otherwise).
_NAV = {"verdict": "Verdict", "estimands": "E1 · E2 · E3", "figures": "Figures", "baselines": "Baselines",
        "twins": "Random-weight twins", "differences": "Paired differences", "other": "Other estimands",
        "permutation": "Permutation test", "spread": "Split spread", "counts": "Data counts", "run": "Run",
        "behaviour": "Behaviour (free run)", "behaviour_likelihood": "Behaviour (likelihood)",
        "config": "Config"}


def html_escape(x) -> str:
    """``str(x)`` escaped for HTML text and attribute values (quotes included)."""
    return html.escape(str(x), quote=True)


_h = html_escape  # short name for the many f-strings below


def img_tag(path: Path, alt: str) -> str:
    """An ``<img>`` tag with the PNG at ``path`` embedded as a data URI (self-contained HTML)."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{_h(alt)}" src="data:image/png;base64,{data}">'


def _html_cell(c) -> str:
    if not isinstance(c, Estimate):
        return f"<td>{_h(c)}</td>"
    parts = interval_text(c.iv).split(" ", 1)
    inner = f'<span class="est">{_h(parts[0])}</span>' + (f' <span class="ci">{_h(parts[1])}</span>'
                                                          if len(parts) == 2 else "")
    key = f' data-key="{_h(c.key)}"' if c.key else ""
    if c.why:
        return f'<td class="iv unreportable"{key} title="not reportable: {_h(c.why)}">{inner}</td>'
    return f'<td class="iv"{key}>{inner}</td>'


class _HtmlBlocks:
    """Renders blocks to HTML lines; figures are read from ``base_dir`` and embedded."""

    def __init__(self, base_dir: Path):
        self.base = base_dir
        self.figures = 0

    def render(self, blocks, out: list[str]) -> None:
        for b in blocks:
            getattr(self, f"_{type(b).__name__.lower()}")(b, out)

    def _text(self, b: Text, out):
        if b.style == "claim":
            cls = {"detects malicious content": "detects", "none": "none"}.get(b.text, "separates")
            out.append(f'<div class="claim {cls}">Licensed claim: <b>{_h(b.text)}</b></div>')
            return
        lead = f"<b>{_h(b.label)}</b> " if b.label else ""
        cls = {"muted": ' class="muted"', "warn": ' class="warn"'}.get(b.style, "")
        text = f"<b>{_h(b.text)}</b>" if b.style == "strong" else _h(b.text)
        out.append(f"<p{cls}>{lead}{text}</p>")

    def _bullets(self, b: Bullets, out):
        out.append("<ul>" + "".join(f"<li>{_h(x)}</li>" for x in b.items) + "</ul>")

    def _checkline(self, b: CheckLine, out):
        status_cls = b.status.replace(" ", "")
        out.append(f'<details class="check"><summary><span class="status {_h(status_cls)}">{_h(b.status)}</span>'
                   f'<span class="cname">{_h(b.id)}. {_h(b.name)}</span><span class="lead">{_h(b.detail)}</span>'
                   "</summary>")
        if b.rule:
            out.append(f'<p class="muted"><b>Rule.</b> {_h(b.rule)}</p>')
        self.render(b.tables, out)
        out.append("</details>")

    def _estimandtable(self, b: EstimandTable, out):
        out.append(f"<table><tr><th>estimand</th><th>estimate</th><th>{b.level:.0%} CI</th>"
                   "<th>replicates used</th><th>reportable</th><th>decides</th></tr>")
        for key, label, iv, why in b.rows:
            iv = iv if isinstance(iv, Mapping) else {}
            parts = interval_text(iv).split(" ", 1)
            est, ci = (parts[0], parts[1]) if len(parts) == 2 else ("n/a", "n/a")
            cls = "" if why is None else ' class="unreportable"'
            mark = "yes" if why is None else f"no: {_h(why)}"
            out.append(f'<tr{cls}><td>{_h(label)}</td><td class="num est" data-key="{_h(key)}">{_h(est)}</td>'
                       f'<td class="num est">{_h(ci)}</td><td class="num">{_h(iv.get("n_boot_used", ""))}</td>'
                       f'<td class="why">{mark}</td><td>{_h(b.decides(key))}</td></tr>')
        out.append("</table>")

    def _grid(self, b: Grid, out):
        parts = split_columns(b)
        for g in parts:
            out.append('<table class="grid"><tr>' + "".join(f"<th>{_h(h)}</th>" for h in g.head) + "</tr>")
            out += ["<tr>" + "".join(_html_cell(c) for c in row) + "</tr>" for row in g.rows]
            out.append("</table>")
        by_reason = _unreportable(parts)
        if by_reason:
            reasons = "; ".join(f"{_h(why)}: {_h(', '.join(labels))}" for why, labels in by_reason.items())
            out.append(f'<p class="muted">Struck through, not reportable: {reasons}.</p>')

    def _keyvalues(self, b: KeyValues, out):
        rows = []
        for k, v, more in b.items:
            extra = ""
            if more:
                extra = (f"<details><summary>list ({len(more)})</summary><ul>"
                         + "".join(f"<li>{_h(x)}</li>" for x in more) + "</ul></details>")
            rows.append(f"<tr><th>{_h(k)}</th><td>{_h(v)}{extra}</td></tr>")
        out.append('<table class="kv">' + "".join(rows) + "</table>")

    def _figure(self, b: Figure, out):
        path = Path(b.src) if Path(b.src).is_absolute() else self.base / b.src
        if not path.is_file():
            return
        self.figures += 1
        out.append(f"<figure>{img_tag(path, b.name)}<figcaption>{_h(b.caption)} Click the figure for full size."
                   "</figcaption></figure>")

    def _code(self, b: Code, out):
        out.append(f"<pre>{_h(b.text)}</pre>")

    def _side(self, b: Side, out):
        out.append('<div class="side">')
        for col in b.columns:
            out.append("<div>")
            self.render(col, out)
            out.append("</div>")
        out.append("</div>")


def _html_section(s: Section, blocks: _HtmlBlocks) -> list[str]:
    out = [f'<section id="{_h(s.id)}">']
    if s.folded:
        out.append(f"<details><summary><h2>{_h(s.title)}</h2>"
                   + (f'<span class="sum">{_h(s.summary)}</span>' if s.summary else "") + "</summary>")
    else:
        out.append(f"<h2>{_h(s.title)}</h2>")
    blocks.render(s.blocks, out)
    out.append("</details></section>" if s.folded else "</section>")
    return out


def render_html(results: Mapping, figures: Mapping[str, str | Path] | None = None,
                config_yaml: str | None = None, base_dir: str | Path | None = None) -> str:
    """``report.html``: the sections of :func:`~ipi.reporting.layout.report_sections`, self-contained.

    The verdict and the headline estimands are open; every other section is a ``<details>``
    whose summary line carries its key numbers. A contents line links every section (opening
    it); figures open at full size on click.

    Args:
        results: The dict written to ``results.json``.
        figures: ``{name: PNG path}`` (relative paths are taken under ``base_dir``); each is
            embedded as a base64 ``data:`` URI, so the HTML needs no other file; a missing file is
            left out.
        config_yaml: The resolved run config as YAML (the last section), or None.
        base_dir: Folder that relative figure paths are under (default: the working directory).

    Returns:
        HTML text.
    """
    title = _title(results)
    sections = behaviour_sections.with_behaviour(attack_sections.with_sections(
        report_sections(results, {k: str(v) for k, v in (figures or {}).items()}, config_yaml), results), results)
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>ipi report — {_h(title)}</title><style>{REPORT_CSS}</style></head><body>",
           f"<h1>ipi report — {_h(title)}</h1>"]
    out += [f'<p class="muted">{_h(x)}</p>' for x in _sources(results)]
    out.append('<nav class="toc">' + " · ".join(f'<a href="#{_h(s.id)}">{_h(_NAV.get(s.id, s.title))}</a>'
                                                for s in sections) + "</nav>")
    blocks = _HtmlBlocks(Path(base_dir) if base_dir is not None else Path("."))
    for s in sections:
        out += _html_section(s, blocks)
    out.append(_OPEN_ON_HASH)
    if blocks.figures:
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
        config: The resolved config (plain dict) shown at the end of both reports, or None.
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
    cfg_yaml = None
    if config is not None:
        from omegaconf import OmegaConf

        cfg_yaml = OmegaConf.to_yaml(OmegaConf.create(dict(config)))
    paths["report_md"] = write_report(results, out_dir, figures, cfg_yaml)
    if html_report:
        paths["report_html"] = atomic_write_text(
            out_dir / "report.html", render_html(results, figures, cfg_yaml, base_dir=out_dir))
    if before_results is not None:
        before_results()
    paths["results"] = write_results(results, out_dir)
    return paths
