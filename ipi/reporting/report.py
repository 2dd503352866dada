"""What a run writes for people: ``results.json``, ``report.md``, ``report.html`` and the figures.

Everything is written atomically (:mod:`ipi.io`). ``report.md`` and ``report.html`` render the one
list of sections of :func:`ipi.reporting.layout.report_sections`, so they carry the same content
in the same order: the verdict and the headline estimands E1, E2, E3 first, then the figures,
baselines, random-weight twins, paired differences, permutation test, split spread, data counts,
run description and resolved config — folded (``<details>``) in the HTML, each with a one-line
summary. The HTML embeds every figure as base64, so the one file can be mailed or archived on its
own; no table has more than :data:`ipi.reporting.layout.MAX_COLUMNS` columns and every cell
wraps, so the page has no horizontal scroll (docs/outputs.md, "report.html"). Each kind of block
has one Jinja2 template per format, side by side in :data:`TEMPLATES`; :func:`write_run_report`
writes them all.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Mapping
from pathlib import Path

from jinja2 import Environment
from markupsafe import Markup

from ipi.evaluation.results import ResultsView
from ipi.io import atomic_write_text
from ipi.metrics.keys import BACKBONE, LAYERS_CONFIG, N_BOOT_USED, SOURCE, SOURCE_TWIN, SURFACE, TOKEN_GROUPS
from ipi.reporting import attack_sections, behaviour_sections
from ipi.reporting.layout import (
    FIGURES,
    EstimandTable,
    Estimate,
    Figure,
    Grid,
    interval_text,
    report_sections,
    split_columns,
)

__all__ = ["FIGURES", "REPORT_CSS", "html_escape", "img_tag", "render_html", "render_report", "write_results",
           "write_run_report"]


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
    run = ResultsView(results).run
    return " · ".join(str(x) for x in (run.get(SURFACE), run.get(BACKBONE)) if x) or "score table"


def _sources(results: Mapping) -> list[str]:
    return [f"{what}: {results[key]}" for key, what in ((SOURCE, "score table"), (SOURCE_TWIN, "twin score table"))
            if results.get(key)]


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

#: Contents-line names of the sections (their titles otherwise).
_NAV = {"verdict": "Verdict", "estimands": "E1 · E2 · E3", "figures": "Figures", "baselines": "Baselines",
        "twins": "Random-weight twins", "differences": "Paired differences", "other": "Other estimands",
        "permutation": "Permutation test", "spread": "Split spread", "counts": "Data counts", "run": "Run",
        "behaviour": "Behaviour (free run)", "behaviour_likelihood": "Behaviour (likelihood)",
        "config": "Config"}


def html_escape(x) -> str:
    """``str(x)`` escaped for HTML text and attribute values (quotes included)."""
    return html.escape(str(x), quote=True)


def img_tag(path: Path, alt: str) -> str:
    """An ``<img>`` tag with the PNG at ``path`` embedded as a data URI (self-contained HTML)."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html_escape(alt)}" src="data:image/png;base64,{data}">'


# ------------------------------------------------------------------------------------------ blocks

#: One template per block kind: ``{kind: (Markdown, HTML)}``, Jinja2 source. A block kind of
#: :mod:`ipi.reporting.layout` is shown by adding its two templates here and nowhere else. Each
#: template sees the block as ``b``, the helpers of :class:`_Renderer` (``render`` for nested
#: blocks) and the filter ``cell`` (a grid cell); every line it writes ends in a newline. In HTML
#: every ``{{ }}`` is escaped unless it is already HTML (nested blocks, the stylesheet).
TEMPLATES: dict[str, tuple[str, str]] = {
    "Text": (
        "{% set w = {'claim': ('**Licensed claim: ', '**'), 'muted': ('*', '*'), 'warn': ('**', '**'), "
        "'strong': ('**', '**')}.get(b.style, ('', '')) %}"
        "{% if b.label %}{{ b.label }} {% endif %}{{ w[0] }}{{ b.text }}{{ w[1] }}\n\n",
        """\
{% if b.style == "claim" %}
<div class="claim {{ {"detects malicious content": "detects", "none": "none"}.get(b.text, "separates") }}">\
Licensed claim: <b>{{ b.text }}</b></div>
{% else %}
<p{% if b.style in ("muted", "warn") %} class="{{ b.style }}"{% endif %}>{% if b.label %}<b>{{ b.label }}</b> \
{% endif %}{% if b.style == "strong" %}<b>{{ b.text }}</b>{% else %}{{ b.text }}{% endif %}</p>
{% endif %}
"""),
    "Bullets": (
        "{% for x in b.items %}\n- {{ x }}\n{% endfor %}\n\n",
        "<ul>{% for x in b.items %}<li>{{ x }}</li>{% endfor %}</ul>\n"),
    "CheckLine": (  # consecutive checks are one list in Markdown
        """\
- [{{ b.status }}] {{ b.id }}. {{ b.name }}: {{ b.detail }}
{% if b.rule %}
  - rule: {{ b.rule }}
{% endif %}
{% if b.numbers %}
  - numbers: {{ b.numbers|map("join", " ")|join("; ") }}
{% endif %}
{% if not next_same %}

{% endif %}
""",
        """\
<details class="check"><summary><span class="status {{ b.status.replace(" ", "") }}">{{ b.status }}</span>\
<span class="cname">{{ b.id }}. {{ b.name }}</span><span class="lead">{{ b.detail }}</span></summary>
{% if b.rule %}
<p class="muted"><b>Rule.</b> {{ b.rule }}</p>
{% endif %}
{{ render(b.tables) }}</details>
"""),
    "EstimandTable": (
        """\
| estimand | estimate | {{ "{:.0%}".format(b.level) }} CI | replicates used | reportable | decides |
|---|---|---|---|---|---|
{% for r in estimand_rows(b) %}
| {% if r.why is none %}{{ r.label|md }}{% else %}~~{{ r.label|md }}~~{% endif %} | {{ r.est }} | {{ r.ci }} \
| {{ r.n }} | {% if r.why is none %}yes{% else %}**no**: {{ r.why|md }}{% endif %} | {{ r.decides }} |
{% endfor %}

""",
        """\
<table><tr><th>estimand</th><th>estimate</th><th>{{ "{:.0%}".format(b.level) }} CI</th><th>replicates used</th>\
<th>reportable</th><th>decides</th></tr>
{% for r in estimand_rows(b) %}
<tr{% if r.why is not none %} class="unreportable"{% endif %}><td>{{ r.label }}</td>\
<td class="num est" data-key="{{ r.key }}">{{ r.est }}</td><td class="num est">{{ r.ci }}</td>\
<td class="num">{{ r.n }}</td><td class="why">{% if r.why is none %}yes{% else %}no: {{ r.why }}{% endif %}</td>\
<td>{{ r.decides }}</td></tr>
{% endfor %}
</table>
"""),
    "Grid": (  # cut into tables of at most MAX_COLUMNS columns; struck-through cells listed below
        """\
{% set parts = split_columns(b) %}
{% for g in parts %}
| {{ g.head|map("md")|join(" | ") }} |
{{ "|---" * g.head|length }}|
{% for row in g.rows %}
| {{ row|map("cell")|join(" | ") }} |
{% endfor %}

{% endfor %}
{% set why = unreportable(parts) %}
{% if why %}
Struck through, not reportable:

{% for reason, labels in why.items() %}
- {{ reason }}: {{ labels|join(", ") }}
{% endfor %}

{% endif %}
""",
        """\
{% set parts = split_columns(b) %}
{% for g in parts %}
<table class="grid"><tr>{% for h in g.head %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in g.rows %}
<tr>{% for c in row %}{{ c|cell }}{% endfor %}</tr>
{% endfor %}
</table>
{% endfor %}
{% set why = unreportable(parts) %}
{% if why %}
<p class="muted">Struck through, not reportable: {% for reason, labels in why.items() %}{{ reason }}: \
{{ labels|join(", ") }}{% if not loop.last %}; {% endif %}{% endfor %}.</p>
{% endif %}
"""),
    "Estimate": (  # a grid cell holding an interval (struck through when not reportable)
        "{% if b.why %}~~{{ interval_text(b.iv) }}~~{% else %}{{ interval_text(b.iv) }}{% endif %}",
        """\
{% set p = interval_text(b.iv).split(" ", 1) %}
<td class="iv{% if b.why %} unreportable{% endif %}"{% if b.key %} data-key="{{ b.key }}"{% endif %}\
{% if b.why %} title="not reportable: {{ b.why }}"{% endif %}><span class="est">{{ p[0] }}</span>\
{% if p|length == 2 %} <span class="ci">{{ p[1] }}</span>{% endif %}</td>"""),
    "str": ("{{ b|md }}", "<td>{{ b }}</td>"),  # any other grid cell
    "KeyValues": (
        """\
{% for k, v, more in b.items %}
- {{ k }}: {{ v }}
{% for x in more %}
  - {{ x }}
{% endfor %}
{% endfor %}

""",
        """\
<table class="kv">{% for k, v, more in b.items %}<tr><th>{{ k }}</th><td>{{ v }}{% if more %}<details><summary>\
list ({{ more|length }})</summary><ul>{% for x in more %}<li>{{ x }}</li>{% endfor %}</ul></details>{% endif %}\
</td></tr>{% endfor %}</table>
"""),
    "Figure": (  # embedded in HTML; left out there when its file is missing
        "![{{ b.name }}]({{ b.src }})\n\n*{{ b.caption }}*\n\n",
        "{% set img = embed(b) %}{% if img %}<figure>{{ img }}<figcaption>{{ b.caption }} Click the figure for full "
        "size.</figcaption></figure>\n{% endif %}"),
    "Code": ("```{{ b.lang }}\n{{ b.text.rstrip('\\n') }}\n```\n\n", "<pre>{{ b.text }}</pre>\n"),
    "Side": (  # one after the other in Markdown
        "{% for col in b.columns %}{{ render(col) }}{% endfor %}",
        '<div class="side">\n{% for col in b.columns %}\n<div>\n{{ render(col) }}</div>\n{% endfor %}\n</div>\n'),
    "Section": (
        "## {{ b.title }}\n\n{{ render(b.blocks) }}",
        """\
<section id="{{ b.id }}">
{% if b.folded %}
<details><summary><h2>{{ b.title }}</h2>{% if b.summary %}<span class="sum">{{ b.summary }}</span>{% endif %}\
</summary>
{% else %}
<h2>{{ b.title }}</h2>
{% endif %}
{{ render(b.blocks) }}{% if b.folded %}</details>{% endif %}</section>
"""),
}

#: The page around the sections: ``(Markdown, HTML)``. In HTML, opening ``report.html#twins`` (or
#: following a contents link) unfolds that section; a click on a figure shows it at full size (the
#: gallery is far wider than the page), a click or Esc closes it; ``report.html#full-gallery`` (or
#: ``#full-forest``, ``#full-roc``) opens with it shown.
PAGE: tuple[str, str] = (
    """\
# ipi report — {{ title }}

{% for x in sources %}
*{{ x }}*
{% endfor %}
{% if sources %}

{% endif %}
{{ body }}""",
    """\
<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ipi report — {{ title }}</title><style>{{ css }}</style></head><body>
<h1>ipi report — {{ title }}</h1>
{% for x in sources %}
<p class="muted">{{ x }}</p>
{% endfor %}
<nav class="toc">{% for s in sections %}<a href="#{{ s.id }}">{{ nav.get(s.id, s.title) }}</a>\
{% if not loop.last %} · {% endif %}{% endfor %}</nav>
{{ body }}<script>
(function(){function open(){var t=location.hash&&document.getElementById(location.hash.slice(1));
var d=t&&t.querySelector('details');if(d){d.open=true;}}
window.addEventListener('hashchange',open);open();})();
</script>
{% if lightbox %}
<div id="lightbox" title="click to close"><p>full size: click anywhere or press Esc to close</p>
<img alt="figure at full size"></div>
<script>
(function(){var lb=document.getElementById('lightbox'),big=lb.querySelector('img');
document.querySelectorAll('figure img').forEach(function(im){im.title='click for full size';
im.addEventListener('click',function(){big.setAttribute('src',im.getAttribute('src'));lb.style.display='block';});});
lb.addEventListener('click',function(){lb.style.display='none';});
document.addEventListener('keydown',function(e){if(e.key==='Escape'){lb.style.display='none';}});
var m=/^#full-(\\w+)$/.exec(location.hash),f=m&&document.querySelector('img[alt="'+m[1]+'"]');
if(f){big.setAttribute('src',f.getAttribute('src'));lb.style.display='block';}})();
</script>
{% endif %}
</body></html>
""")

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


def _estimand_rows(b: EstimandTable) -> list[dict]:
    """The rows of an :class:`EstimandTable`, each cell as text (``why`` None when reportable)."""
    out = []
    for key, label, iv, why in b.rows:
        iv = iv if isinstance(iv, Mapping) else {}
        parts = interval_text(iv).split(" ", 1)
        est, ci = (parts[0], parts[1]) if len(parts) == 2 else ("n/a", "n/a")
        out.append({"key": key, "label": label, "est": est, "ci": ci, "n": iv.get(N_BOOT_USED, ""), "why": why,
                    "decides": b.decides(key)})
    return out


def _environment(html_out: bool) -> Environment:
    env = Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False,
                      finalize=(lambda x: x if isinstance(x, Markup) else html_escape(x)) if html_out else None)
    env.filters["md"] = lambda x: str(x).replace("|", "\\|").replace("\n", " ")  # a Markdown table cell
    env.filters["cell"] = lambda c: (Markup if html_out else str)(  # a grid cell: an Estimate or any value
        _COMPILED[html_out]["Estimate" if isinstance(c, Estimate) else "str"].render(b=c))
    env.globals.update(interval_text=interval_text, split_columns=split_columns, unreportable=_unreportable,
                       estimand_rows=_estimand_rows)
    return env


_ENV = {False: _environment(False), True: _environment(True)}
_COMPILED = {html_out: {kind: _ENV[html_out].from_string(t[html_out]) for kind, t in TEMPLATES.items()}
             for html_out in (False, True)}
_PAGE = {html_out: _ENV[html_out].from_string(PAGE[html_out]) for html_out in (False, True)}


class _Renderer:
    """Renders blocks through :data:`TEMPLATES` in one format; HTML figures are read from
    ``base_dir`` and embedded (``figures`` counts them)."""

    def __init__(self, html_out: bool, base_dir: Path = Path(".")):
        self.html, self.base, self.figures = html_out, base_dir, 0

    def render(self, blocks) -> str:
        """A sequence of blocks (or one block) as text; ``next_same``: the next block is of the same kind."""
        blocks, out = tuple(blocks) if isinstance(blocks, (list, tuple)) else (blocks,), []
        for i, b in enumerate(blocks):
            if type(b).__name__ not in _COMPILED[self.html]:
                raise TypeError(f"report.{'html' if self.html else 'md'}: no template for block {type(b).__name__}")
            out.append(_COMPILED[self.html][type(b).__name__].render(
                b=b, next_same=i + 1 < len(blocks) and type(blocks[i + 1]) is type(b), render=self.render,
                embed=self.embed))
        return (Markup if self.html else str)("".join(out))

    def embed(self, b: Figure) -> str | None:
        """The ``<img>`` of a figure, its PNG embedded; None when its file is missing."""
        path = Path(b.src) if Path(b.src).is_absolute() else self.base / b.src
        if not path.is_file():
            return None
        self.figures += 1
        return Markup(img_tag(path, b.name))


def _render(results: Mapping, figures, config_yaml, html_out: bool, base_dir: Path = Path(".")) -> str:
    """The page of :data:`PAGE` around the sections of ``results``, in one format."""
    sections = behaviour_sections.with_behaviour(attack_sections.with_sections(
        report_sections(results, {k: str(v) for k, v in (figures or {}).items()}, config_yaml), results), results)
    blocks = _Renderer(html_out, base_dir)
    body = blocks.render(sections)
    page = _PAGE[html_out].render(title=_title(results), sources=_sources(results), sections=sections, body=body,
                                  nav=_NAV, css=Markup(REPORT_CSS), lightbox=blocks.figures > 0)
    return page[:-1]  # every line ends in a newline; the file's last does not


# ----------------------------------------------------------------------------------------- reports


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
    return _render(results, figures, config_yaml, html_out=False)


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
    return _render(results, figures, config_yaml, html_out=True,
                   base_dir=Path(base_dir) if base_dir is not None else Path("."))



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
    run = ResultsView(results).run
    title = title or " · ".join(str(x) for x in (run.get(SURFACE), run.get(BACKBONE), run.get(LAYERS_CONFIG),
                                                 "+".join(run.get(TOKEN_GROUPS) or [])) if x)
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
    paths["report_md"] = atomic_write_text(out_dir / "report.md", render_report(results, figures, cfg_yaml))
    if html_report:
        paths["report_html"] = atomic_write_text(
            out_dir / "report.html", render_html(results, figures, cfg_yaml, base_dir=out_dir))
    if before_results is not None:
        before_results()
    paths["results"] = write_results(results, out_dir)
    return paths
