"""What a run's report says, and in which order: sections of blocks built from its results (docs/outputs.md).

:func:`report_sections` turns a results dict (``results.json``) into a list of
:class:`Section` s; :mod:`ipi.reporting.report` renders that one list as Markdown
(``report.md``) and as HTML (``report.html``), so both files carry the same content in the same
order:

1. **Verdict** (PROTOCOL.md §7): the licensed claim and one line per check — status, name and
   its detail; the numbers behind a check unfold under its line. Rendered from each check's
   ``status``, ``detail`` and ``numbers`` alone, whatever the check is. Then the run's
   **warnings** (open; only when it has any).
2. **Estimands E1, E2, E3** (PROTOCOL.md §5): the headline estimands with their intervals and
   "not reportable" marks, beside the ROC figure.
3. Folded sections (``<details>`` in the HTML), each with a one-line summary: figures (forest,
   gallery), baselines, random-weight twins, paired differences, permutation test, split
   spread, data counts, run description, resolved config.

Every estimand of :func:`ipi.evaluation.reportable.estimand_entries` is shown in an
:class:`EstimandTable` or a :class:`Grid` cell (:func:`shown_keys` lists them), and no table is
wider than :data:`MAX_COLUMNS`: a wider :class:`Grid` is cut into tables that repeat the row
labels (:func:`split_columns`); the twins' table is transposed (rows: trained, each twin seed;
columns: E1, E2, E3 per control), then check 6's paired difference E3 − mean twin E3.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from ipi.evaluation.reportable import (
    BASELINE_LABELS,
    cluster_count,
    estimand_entries,
    not_evidence,
    reportability_of,
)
from ipi.evaluation.results import CONSTRUCTED, DEFAULTS, ResultsView
from ipi.evaluation.verdict import read_keys
from ipi.metrics.keys import (
    at,
    ATTACK,
    BACKBONE,
    BACKBONE_PRETRAINED,
    BACKBONE_WEIGHTS,
    BEHAVIOUR,
    BOOTSTRAP,
    BY_SEED,
    C1,
    CHECK_ID,
    CHECKS,
    CI_HIGH,
    CI_LOW,
    CLAIM,
    CLAIM_NOTE,
    CLAIMS,
    CLUSTERS_BY_ESTIMAND,
    EFFECTIVE_CLUSTERS_BY_ESTIMAND,
    COUNT,
    COUNTS,
    DESIGN,
    DETAIL,
    DETECTOR,
    DIFFERENCES,
    E1,
    E1_PAIRED,
    E1_MINUS_E3,
    E1_REFIT,
    E2,
    E3,
    E3_MINUS_MEAN_TWIN_E3,
    ESTIMANDS_KEY,
    ESTIMATE,
    GUARDS,
    INTERVAL_KEY,
    LAYERS_CONFIG,
    M_KEY,
    MIN_BOOT_FRACTION_KEY,
    MIN_CLUSTERS_KEY,
    N_BOOT_KEY,
    N_CLUSTERS,
    N_GE,
    N_SPLITS,
    NAME,
    NULL_MEAN,
    NULL_Q025,
    NULL_Q975,
    NULL_SD,
    NUMBERS,
    P_VALUE,
    P_VALUES,
    PERMUTATION,
    PREREGISTERED_SEED,
    RANDOM_TWIN,
    REPLACED_CHARACTERS,
    REPORTABILITY,
    RULE,
    RUN,
    SEED_KEY,
    SEEDS,
    SPLIT,
    SPLIT_SPREAD,
    SPREAD_MAX,
    SPREAD_MEDIAN,
    SPREAD_MIN,
    STATUS,
    SURFACE,
    TOLERANCE,
    VERDICT,
    WARNINGS,
    dotted,
    e1_minus_baseline_e1,
    e3_minus_baseline_e3,
    OPERATING_POINT,
)
from ipi.surfaces.registry import find_surface

__all__ = [
    "FIGURES", "MAX_COLUMNS", "Bullets", "CheckLine", "Code", "EstimandTable", "Estimate", "Figure", "Grid",
    "KeyValues", "Section", "Side", "Text", "construction_note", "difference_label", "interval_text",
    "numbers_blocks", "permutation_lines", "report_sections", "shown_keys", "split_columns",
]

#: The most columns a table of the report may have; a wider grid is cut (:func:`split_columns`).
MAX_COLUMNS = 6
#: How many items of a long list (skipped steps, ...) a report lists.
MAX_LIST_ITEMS = 200
#: Top-level keys of ``results.json`` that hold no estimand: :func:`interval_keys` does not look
#: inside them (the verdict's numbers and the split spread repeat estimands; p-values are numbers).
NOT_ESTIMANDS = (VERDICT, REPORTABILITY, SPLIT_SPREAD, PERMUTATION, P_VALUES, BOOTSTRAP, COUNTS, RUN,
                 OPERATING_POINT,  # the operating point has its own section (ipi.reporting.attack_sections)
                 BEHAVIOUR)  # so has the free run (ipi.reporting.behaviour_sections)
#: ``run`` keys with their own section (ipi.reporting.attack_sections), left out of the Run list.
RUN_KEYS_SHOWN_ELSEWHERE = frozenset({ATTACK})

#: Figure file names in a run folder, in report order, with their captions.
FIGURES = {
    "roc": ("roc.png", ("ROC curves on the test split: attack vs clean (E1) and attack vs each "
                        "control (E3), step-weighted like the estimands.")),
    "forest": ("forest.png", ("Every estimand with its cluster-bootstrap interval; the dashed line "
                              "is chance (0.5) for AUCs and 0 for paired differences. Grey hollow points are "
                              "not reportable; the reason is printed beside them.")),
    "gallery": ("gallery.png", "Every surface × variant of one test step (what the probe saw)."),
}


# ------------------------------------------------------------------------------------------ blocks


@dataclass(frozen=True)
class Estimate:
    """A table cell holding one interval ``{"estimate", "ci_low", "ci_high", "n_boot_used"}``.

    Attributes:
        iv: The interval, or None (shown as ``n/a``).
        key: Its dotted estimand key (``random_twin.by_seed.1.e1``), or None.
        label: Its label in the estimands' order (:func:`estimand_entries`).
        why: Why it is not reportable, or None when it is.
    """

    iv: Mapping | None
    key: str | None = None
    label: str = ""
    why: str | None = None


Cell = str | Estimate


@dataclass(frozen=True)
class Text:
    """A paragraph; ``style`` is ``""``, ``"muted"``, ``"warn"``, ``"strong"`` or ``"claim"``."""

    text: str
    style: str = ""
    label: str = ""  # a bold lead-in ("Check 2 on this surface.")


@dataclass(frozen=True)
class Bullets:
    """A list of lines."""

    items: tuple[str, ...]


@dataclass(frozen=True)
class EstimandTable:
    """Estimands as rows: label, estimate, CI, replicates used, reportable (5 columns).

    Attributes:
        rows: ``(key, label, interval, why)`` per estimand (``why`` None when reportable).
        level: The interval's coverage (column head).
        readers: ``{key: [check ids]}``: the verdict checks that read each estimand
            (:func:`ipi.evaluation.verdict.read_keys`); an estimand no check reads decides nothing.
    """

    rows: tuple[tuple[str, str, Mapping | None, str | None], ...]
    level: float
    readers: Mapping[str, list[int]] | None = None

    def decides(self, key: str) -> str:
        """``"check 2"``, ``"checks 3, 6"`` or ``"nothing"`` (the table's last column)."""
        ids = (self.readers or {}).get(key) or []
        return f"check{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}" if ids else "nothing"


@dataclass(frozen=True)
class Grid:
    """A table of text and :class:`Estimate` cells; the first column labels the rows.

    Wider than :data:`MAX_COLUMNS`, it is rendered as several tables (:func:`split_columns`).
    """

    head: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]


@dataclass(frozen=True)
class KeyValues:
    """``key: value`` lines; an item's ``more`` lines (a list's items) fold under it."""

    items: tuple[tuple[str, str, tuple[str, ...]], ...]


@dataclass(frozen=True)
class CheckLine:
    """One verdict check: one line (status, id, name, detail), its rule and numbers unfold under it."""

    id: object
    name: str
    status: str
    detail: str
    numbers: tuple[tuple[str, str], ...]  # every leaf, flat (report.md)
    tables: tuple = ()  # the same numbers as KeyValues / Grid blocks (report.html)
    rule: str = ""  # the rule in words, as the verdict applied it (results.json verdict.checks[].rule)


@dataclass(frozen=True)
class Figure:
    """A figure of the run folder: ``src`` relative to the report (or absolute)."""

    name: str
    src: str
    caption: str


@dataclass(frozen=True)
class Code:
    """A preformatted block (the resolved config)."""

    text: str
    lang: str = ""


@dataclass(frozen=True)
class Side:
    """Columns of blocks shown side by side where the page is wide enough (one after the other in
    Markdown); ``columns`` is a tuple of block tuples."""

    columns: tuple


@dataclass(frozen=True)
class Section:
    """A section of the report.

    Attributes:
        id: Anchor name (``report.html#twins``).
        title: Heading.
        blocks: Its content.
        folded: Whether the HTML shows it closed (``<details>``) with ``summary`` beside the title.
        summary: One line of its key numbers, shown while it is folded.
    """

    id: str
    title: str
    blocks: tuple
    folded: bool = True
    summary: str = ""


# ---------------------------------------------------------------------------------------- helpers


def interval_text(iv: Mapping | None) -> str:
    """``"0.889 [0.823, 0.954]"``; ``[n/a]`` without bounds, ``n/a`` without an estimate."""
    if not isinstance(iv, Mapping) or iv.get(ESTIMATE) is None:
        return "n/a"
    lo, hi = iv.get(CI_LOW), iv.get(CI_HIGH)
    ci = f"[{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "[n/a]"
    return f"{iv[ESTIMATE]:.3f} {ci}"


def _value(x) -> str:
    """A number or other value of a check's numbers or the run description, as text."""
    if x is None:
        return "n/a"
    if isinstance(x, bool) or isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, (list, tuple)):  # every value: the cell wraps
        return f"[{', '.join(_value(v) for v in x)}]"
    return str(x)


def _is_interval(v) -> bool:
    return isinstance(v, Mapping) and ESTIMATE in v and CI_LOW in v and CI_HIGH in v


def flat_items(tree: Mapping, prefix: str = "") -> list[tuple[str, str]]:
    """``(dotted key, text)`` of every leaf of a nested dict; an interval dict is one leaf
    (``"0.001 [-0.006, 0.005]"``) followed by its other fields."""
    out: list[tuple[str, str]] = []
    for k, v in tree.items():
        name = f"{prefix}{k}"
        if _is_interval(v):
            out.append((name, interval_text(v)))
            rest = {a: b for a, b in v.items() if a not in (ESTIMATE, CI_LOW, CI_HIGH)}
            out += flat_items(rest, name + ".")
        elif isinstance(v, Mapping):
            out += flat_items(v, name + ".") if v else [(name, "{}")]
        else:
            out.append((name, _value(v)))
    return out


def numbers_blocks(numbers: Mapping) -> tuple:
    """A check's numbers as tables: entries that are dicts with the same fields (one per control,
    say) side by side as the columns of a :class:`Grid`, every other entry as ``key: value``."""
    groups = {k: dict(flat_items(v)) for k, v in numbers.items() if isinstance(v, Mapping) and not _is_interval(v)}
    fields = [list(g) for g in groups.values()]
    if len(groups) < 2 or any(f != fields[0] for f in fields):
        return (KeyValues(tuple((k, v, ()) for k, v in flat_items(numbers))),) if numbers else ()
    rest = {k: v for k, v in numbers.items() if k not in groups}
    grid = Grid(("", *groups), tuple((f, *(g[f] for g in groups.values())) for f in fields[0]))
    return ((KeyValues(tuple((k, v, ()) for k, v in flat_items(rest))),) if rest else ()) + (grid,)


def interval_keys(results: Mapping) -> list[str]:
    """Dotted key of every interval (a dict with ``estimate``, ``ci_low``, ``ci_high``) of a results
    dict outside :data:`NOT_ESTIMANDS`, in the dict's order; what the report must show."""
    out: list[str] = []

    def walk(tree: Mapping, prefix: tuple) -> None:
        for k, v in tree.items():
            if _is_interval(v):
                out.append(dotted(*prefix, k))
            elif isinstance(v, Mapping):
                walk(v, (*prefix, k))

    walk({k: v for k, v in results.items() if k not in NOT_ESTIMANDS}, ())
    return out


def _extra_label(key: str) -> str:
    """A reader's name for an interval key outside :func:`estimand_entries`
    (``collapse_only.e3.c_scrambled`` → ``C2 collapse-only E3 attack vs c_scrambled``)."""
    head, *rest = key.split(".")
    names = {E1: "E1", E2: "E2"}
    tail = (names[rest[0]] if len(rest) == 1 and rest[0] in names
            else f"E3 attack vs {rest[1]}" if len(rest) == 2 and rest[0] == E3 else " ".join(rest))
    return f"{BASELINE_LABELS[head]} {tail}".strip() if head in BASELINE_LABELS else key


def split_columns(grid: Grid, max_columns: int = MAX_COLUMNS) -> list[Grid]:
    """``grid`` as tables of at most ``max_columns`` columns, each repeating the label column.

    Raises:
        ValueError: If ``max_columns`` < 2 (a label and one value).
    """
    if max_columns < 2:
        raise ValueError(f"max_columns must be at least 2 (a label and a value), got {max_columns}")
    if len(grid.head) <= max_columns:
        return [grid]
    per = max_columns - 1
    out = []
    for start in range(1, len(grid.head), per):
        cols = [0, *range(start, min(start + per, len(grid.head)))]
        out.append(Grid(tuple(grid.head[i] for i in cols), tuple(tuple(r[i] for i in cols) for r in grid.rows)))
    return out


def difference_label(key: str) -> str:
    """A reader's name for a paired difference's key (``differences.e1_minus_c1_e1`` →
    ``E1 − C1 metadata baseline E1``); the key's own text for a name it does not know."""
    parts = key.split(".")
    if parts[0] == DIFFERENCES:
        parts = parts[1:]
    if not parts:
        return key
    name, rest = parts[0], parts[1:]
    baselines = {e1_minus_baseline_e1(b): label for b, label in BASELINE_LABELS.items()}
    if name in baselines and not rest:
        return f"E1 − {baselines[name]} E1"
    if name == E1_MINUS_E3 and len(rest) == 1:
        return f"E1 − E3 attack vs {rest[0]}"
    if name == E3_MINUS_MEAN_TWIN_E3 and len(rest) == 1:
        return f"E3 − mean over twin seeds E3, attack vs {rest[0]}, paired (check 6)"
    baselines_e3 = {e3_minus_baseline_e3(b): label for b, label in BASELINE_LABELS.items()}
    if name in baselines_e3 and len(rest) == 1:
        return f"E3 − {baselines_e3[name]} E3, attack vs {rest[0]}, paired"
    return " ".join(parts)


def shown_keys(sections: list[Section]) -> set[str]:
    """Every estimand key shown by the sections (estimand tables and grid cells)."""
    keys: set[str] = set()

    def walk(blocks):
        for b in blocks:
            if isinstance(b, EstimandTable):
                keys.update(r[0] for r in b.rows)
            elif isinstance(b, Grid):
                keys.update(c.key for row in b.rows for c in row if isinstance(c, Estimate) and c.key)
            elif isinstance(b, Side):
                for col in b.columns:
                    walk(col)

    for s in sections:
        walk(s.blocks)
    return keys


# --------------------------------------------------------------------------------------- sections


def _verdict(r: Mapping) -> Section | None:
    v = r.get(VERDICT)
    if not v:
        return None
    blocks: list = [Text(v[CLAIM], "claim")]
    if v.get(CLAIM_NOTE):
        blocks.append(Text(v[CLAIM_NOTE], "muted"))
    if ResultsView(r).backbone_weights == CONSTRUCTED:
        blocks.append(Text(CONSTRUCTED_NOTE, "strong"))
    for c in v.get(CHECKS) or []:
        numbers = c.get(NUMBERS) if isinstance(c.get(NUMBERS), Mapping) else {}
        blocks.append(CheckLine(c.get(CHECK_ID), str(c.get(NAME, "")), str(c.get(STATUS, "")),
                                str(c.get(DETAIL, "")), tuple(flat_items(numbers)), numbers_blocks(numbers),
                                str(c.get(RULE, ""))))
    return Section("verdict", "Verdict (PROTOCOL.md §7)", tuple(blocks), folded=False)


#: Said beside the verdict of a run on a constructed backbone (``run.backbone_weights``).
CONSTRUCTED_NOTE = ("Constructed backbone (backbone.constructed=true): its weights were built to plant a known "
                    "truth; it is not a model of any agent, and a claim here is about the planted truth only.")


def _bootstrap_sentence(r: Mapping) -> str | None:
    bs = r.get(BOOTSTRAP)
    if not isinstance(bs, Mapping) or not bs:
        return None
    level = ResultsView(r).level
    parts = [f"{level:.0%} {bs.get(INTERVAL_KEY, DEFAULTS.interval)} intervals of a cluster bootstrap over "
             f"{bs.get(N_CLUSTERS, 'the')} test trajectories"]
    if bs.get(N_BOOT_KEY) is not None:
        parts.append(f"B = {bs[N_BOOT_KEY]} replicates, seed {bs.get(SEED_KEY)}")
    return ("; ".join(parts) + ". An AUC of 0.5 is chance. Struck-through estimates are not reportable "
            "(docs/outputs.md).")


def _gate(r: Mapping) -> dict:
    """The run's reportability gate (``reportability``; the defaults without it), as
    :func:`ipi.evaluation.reportable.not_evidence` takes it."""
    rep = ResultsView(r).section(REPORTABILITY)
    return {"min_clusters": rep.get(MIN_CLUSTERS_KEY, DEFAULTS.min_clusters),
            "min_boot_fraction": rep.get(MIN_BOOT_FRACTION_KEY, DEFAULTS.min_boot_fraction)}


def _not_reportable_note(marks: Mapping[str, str | None], r: Mapping) -> str | None:
    n = sum(v is not None for v in marks.values())
    if not n:
        return None
    gate = _gate(r)
    return (f"{n} of {len(marks)} estimates are marked not reportable (the verdict could not use them: "
            f"fewer than {gate['min_clusters']} contributing test trajectories, fewer than "
            f"{gate['min_boot_fraction']:.0%} of the bootstrap replicates usable, "
            "or a degenerate interval). Do not report them as results.")


def _table(r: Mapping, rows, readers: Mapping[str, list[int]]) -> EstimandTable:
    """An :class:`EstimandTable` of ``rows`` at the run's interval level."""
    return EstimandTable(tuple(rows), ResultsView(r).level, readers)


def _group(key: str) -> str:
    head = key.split(".")[0]
    if head in (E1, E1_PAIRED, E2, E3):
        return "headline"
    if head in BASELINE_LABELS:
        return "baselines"
    if head == RANDOM_TWIN:
        return "twins"
    if head == DIFFERENCES:
        return "differences"
    return "other"


def _headline(r: Mapping, rows: list, marks: Mapping, figures: Mapping[str, str],
              readers: Mapping[str, list[int]]) -> Section:
    table = _table(r, rows, readers)
    blocks: list = []
    note = _not_reportable_note(marks, r)
    if note:
        blocks.append(Text(note, "warn"))
    lead = [table]
    sentence = _bootstrap_sentence(r)
    if sentence:
        lead.append(Text(sentence, "muted"))
    if "roc" in figures:
        blocks.append(Side((tuple(lead), (Figure("roc", figures["roc"], FIGURES["roc"][1]),))))
    else:
        blocks += lead
    return Section("estimands", "Estimands E1, E2, E3 (PROTOCOL.md §5)", tuple(blocks), folded=False)


def _figures(figures: Mapping[str, str]) -> Section | None:
    shown = [Figure(n, src, FIGURES.get(n, (None, n))[1]) for n, src in figures.items() if n != "roc"]
    if not shown:
        return None
    return Section("figures", "Figures", tuple(shown), summary=", ".join(
        {"forest": "every estimand (forest plot)", "gallery": "every variant of one test step"}.get(f.name, f.name)
        for f in shown))


def construction_note(results: Mapping) -> str | None:
    """What C1's E1 is on this run's surface, and why (the note on "separates" of check 2), as the
    surface says (:meth:`ipi.surfaces.surface.Surface.construction_note`).

    Args:
        results: The dict written to ``results.json``.

    Returns:
        One paragraph, or None without C1 results.
    """
    view = ResultsView(results)
    c1 = view.get(C1, E1, ESTIMATE)
    if c1 is None:
        return None
    surface = find_surface(view.get(RUN, SURFACE))
    head = f"C1 (metadata baseline) E1 = {c1:.3f}. "
    if surface is not None:
        return head + surface.construction_note()
    return head + ("What C1's E1 is depends on the surface: on text surfaces Δprompt length separates attack "
                   "from clean (C1 E1 = 1.000), on i_vis it is 0 (C1 E1 ≈ 0.5).")


#: What each baseline is, one sentence (docs/estimands.md, "Baselines"); which of its estimands
#: decide which check is the table's "decides" column (the verdict's declaration).
BASELINE_NOTES = {
    C1: "C1: logistic regression on four metadata scalars (step, horizon, prompt length, Δprompt length) "
        "on the probe's training rows.",
    "collapse_only": "C2 collapse-only: logistic regression on the per-layer collapse statistics alone.",
    "permuted": "Permuted labels: the probe trained once on permuted training labels (the paper's number; "
                "check 4 is the exact permutation test below).",
    "transfer": "Cross-surface transfer: a probe trained on the other surfaces, scored on this run's test rows.",
}


def _baselines(r: Mapping, rows: list, readers: Mapping[str, list[int]]) -> Section | None:
    if not rows:
        return None
    present = [k for k in BASELINE_LABELS if isinstance(r.get(k), Mapping)]
    blocks: list = [Bullets(tuple(BASELINE_NOTES[k] for k in present if k in BASELINE_NOTES))]
    note = construction_note(r)
    if note:
        blocks.append(Text(note, label="C1 on this surface."))
    blocks.append(_table(r, rows, readers))
    summary = " · ".join(f"{BASELINE_LABELS[k]} E1 {interval_text(ResultsView(r).get(k, E1)).split(' ')[0]}"
                         for k in present)
    return Section("baselines", "Baselines (PROTOCOL.md §5–§6)", tuple(blocks), summary=summary)


#: Said in the twins' section when the backbone's own weights are random (not on a constructed one,
#: whose planted weights check 6 judges like trained ones).
RANDOM_BACKBONE_NOTE = ("The backbone's own weights are random (backbone.pretrained=false): a network with random "
                        "weights cannot read malicious intent, so this run can license at most \"separates\"; "
                        "its twin is the same architecture with other random weights.")


def _twins(r: Mapping, marks: Mapping, labels: Mapping[str, str]) -> Section | None:
    """The twins' section: a transposed table of E1, E2, E3 per control (columns) for the trained
    backbone and each twin seed (rows), then check 6's paired difference E3 − mean twin E3."""
    view = ResultsView(r)
    twin = view.get(RANDOM_TWIN)
    if not isinstance(twin, Mapping):
        return None
    seeds = [str(s) for s in view.twin_seeds]
    controls = sorted(view.section(E3))
    names = {E1: "E1 attack vs clean", E2: "E2 paired step", **{c: f"E3 attack vs {c}" for c in controls}}

    def grid(corner: str, cols: list[str], lines: list[tuple[str, Mapping[str, str]]]) -> Grid:
        rows = []
        for name, keys in lines:
            cells: list[Cell] = [name]
            for col in cols:
                key = keys.get(col)
                iv = at(r, key) if key else None
                cells.append(Estimate(iv, key, labels.get(key, key), marks.get(key)) if iv is not None else "—")
            rows.append(tuple(cells))
        return Grid((corner, *(names[c] for c in cols)), tuple(rows))

    def estimands(*prefix) -> dict[str, str]:
        return {E1: dotted(*prefix, E1), E2: dotted(*prefix, E2), **{c: dotted(*prefix, E3, c) for c in controls}}

    constructed = CONSTRUCTED in (view.backbone_weights, view.get(RUN, RANDOM_TWIN, BACKBONE_WEIGHTS))
    own = CONSTRUCTED if constructed else "trained"
    lines = [(own, {E1: E1, E2: E2, **{c: dotted(E3, c) for c in controls}})]
    lines += [(f"twin seed {s}", estimands(RANDOM_TWIN, BY_SEED, s)) for s in seeds]
    diffs = [("mean over twin seeds (paired; check 6)",
              {c: dotted(DIFFERENCES, E3_MINUS_MEAN_TWIN_E3, c) for c in controls})]
    diffs = [(name, keys) for name, keys in diffs if any(at(r, k) is not None for k in keys.values())]
    which = f"{len(seeds)} random-weight twin{'s' if len(seeds) != 1 else ''}" + (
        f" (seeds {', '.join(seeds)})" if seeds else "")
    blocks: list = [Text(f"The same probe, folds and rows on {which}: the same architecture and config with the "
                         "architecture's own random initialisation. Check 6 reads each twin's E3 point estimate (the "
                         "rank rule) and the paired interval of E3 − mean twin E3; its rule and result are the "
                         "verdict's line 6.")]
    if twin.get(GUARDS):
        blocks.append(Text("Refused (check 6 NOT RUN): " + "; ".join(map(str, twin[GUARDS])), "warn"))
    if view.get(RUN, RANDOM_TWIN, BACKBONE_PRETRAINED) is False and not constructed:
        blocks.append(Text(RANDOM_BACKBONE_NOTE, "strong"))
    blocks.append(grid("AUC", [E1, E2, *controls], lines))
    if diffs:
        blocks += [Text(f"{own.capitalize()} minus the mean over twin seeds, paired on the same bootstrap draws:",
                        "muted"), grid(f"{own} − …", controls, diffs)]
    summary = f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''}" + (f" ({', '.join(seeds)})" if seeds else "")
    for c in controls:
        vals = [v for sd in seeds if (v := view.get(RANDOM_TWIN, BY_SEED, sd, E3, c, ESTIMATE)) is not None]
        if vals:
            summary += f"; E3 vs {c}: twins {min(vals):.3f}–{max(vals):.3f}"
    return Section("twins", f"{own.capitalize()} vs random-weight twins (check 6)", tuple(blocks), summary=summary)


def _differences(r: Mapping, rows: list, readers: Mapping[str, list[int]]) -> Section | None:
    if not rows:
        return None
    blocks: list = [Text("Paired differences: both estimands on the same bootstrap draws of test trajectories, "
                         "so the interval is that of the difference (docs/estimands.md).", "muted"),
                    _table(r, rows, readers)]
    p = r.get(P_VALUES)
    if isinstance(p, Mapping) and p:
        blocks += [Text("One-sided bootstrap p-values (of E1 ≤ 0.5, E3[c] ≤ 0.5, each difference ≤ 0): "
                        "what python -m ipi.reporting.sweep applies Holm's correction to.", "muted"),
                   KeyValues(tuple((k, v, ()) for k, v in flat_items(p)))]
    below = sum(1 for _k, _l, iv, _w in rows if isinstance(iv, Mapping) and iv.get(CI_LOW) is not None
                and iv[CI_LOW] > 0)
    return Section("differences", "Paired differences", tuple(blocks),
                   summary=f"{len(rows)} differences, {below} with CI low above 0")


def permutation_lines(results: Mapping) -> list[str]:
    """The exact permutation test's numbers (PROTOCOL.md §7.4), one fact per line."""
    p = results.get(PERMUTATION)
    if not isinstance(p, Mapping):
        return []
    out = [f"M = {p[M_KEY]} refits, labels permuted within each training (trajectory, step), seed {p.get(SEED_KEY)}",
           f"observed E1 {p[E1]:.3f}; null mean {p[NULL_MEAN]:.3f}, SD {p[NULL_SD]:.3f}, "
           f"2.5–97.5% [{p[NULL_Q025]:.3f}, {p[NULL_Q975]:.3f}]",
           f"p = (1 + {p[N_GE]}) / ({p[M_KEY]} + 1) = {p[P_VALUE]:.4f}; "
           f"null-mean tolerance max(0.02, 3·SD/√M) = {p[TOLERANCE]:.3f}"]
    if p.get(E1_REFIT) is not None:
        out.append(f"E1 of the same refit on the true labels {p[E1_REFIT]:.4f} (equals E1 up to solver tolerance)")
    if p.get(DESIGN):
        out.append(f"design: {p[DESIGN]}")
    return out


def _permutation(r: Mapping) -> Section | None:
    lines = permutation_lines(r)
    if not lines:
        return None
    p = r[PERMUTATION]
    return Section("permutation", "Exact permutation test (check 4)", (Bullets(tuple(lines)),),
                   summary=f"p = {p[P_VALUE]:.4f} with M = {p[M_KEY]}; observed E1 {p[E1]:.3f}, "
                           f"null mean {p[NULL_MEAN]:.3f}")


def _spread(r: Mapping) -> Section | None:
    sp = r.get(SPLIT_SPREAD)
    if not isinstance(sp, Mapping) or not sp:
        return None
    n = sp[N_SPLITS]
    rows = tuple((k, *(("n/a" if d.get(x) is None else f"{d[x]:.3f}") for x in (SPREAD_MIN, SPREAD_MEDIAN, SPREAD_MAX)))
                 for k, d in sp[ESTIMANDS_KEY].items())
    claims = tuple(f"splits licensing \"{c}\": {k}/{n}" for c, k in sp[CLAIMS].items())
    e1 = sp[ESTIMANDS_KEY].get(E1) or {}
    summary = (f"E1 {_value(e1.get(SPREAD_MIN))}–{_value(e1.get(SPREAD_MAX))} over {n} splits; "
               if e1 else f"{n} splits; ") + "; ".join(f"{c}: {k}/{n}" for c, k in sp[CLAIMS].items())
    return Section("spread",
                   f"Split spread ({n} splits: seeds {', '.join(map(str, sp[SEEDS]))}; "
                   f"pre-registered seed {sp[PREREGISTERED_SEED]})",
                   (Text("The verdict above is the pre-registered split's. Re-rolled splits:"),
                    Grid(("estimand", "min", "median", "max"), rows), Bullets(claims)),
                   summary=summary)


def cluster_lines(results: Mapping) -> list[str]:
    """Per-estimand contributing and Kish effective test trajectories (PROTOCOL.md §7.0), with the
    gate's reason where the one gate (:func:`ipi.evaluation.reportable.not_evidence`) refused it."""
    boot = ResultsView(results).section(BOOTSTRAP)
    if not isinstance(boot.get(CLUSTERS_BY_ESTIMAND), Mapping):
        return []
    marks = reportability_of(results)
    out = []
    for key, _label, _iv in estimand_entries(results):
        eff, n = cluster_count(boot, key)
        if n is None:
            continue
        line = f"{key}: {n}" + (f" ({eff:.1f} effective, Kish)" if eff is not None else "")
        out.append(line + (f" — not evidence: {marks[key]}" if marks.get(key) else ""))
    return out


def _counts(r: Mapping) -> Section | None:
    counts = r.get(COUNTS)
    blocks: list = []
    items = []
    if isinstance(counts, Mapping):
        for k, val in counts.items():
            if isinstance(val, (list, tuple)):
                more = tuple(json.dumps(s, ensure_ascii=False) for s in val[:MAX_LIST_ITEMS])
                if len(val) > MAX_LIST_ITEMS:
                    more += (f"… {len(val) - MAX_LIST_ITEMS} more",)
                items.append((str(k), str(len(val)), more))
            elif isinstance(val, Mapping) and all(not isinstance(x, (Mapping, list)) for x in val.values()):
                items.append((str(k), ", ".join(f"{a}: {_value(b)}" for a, b in val.items()), ()))
            elif isinstance(val, Mapping):
                items += [(f"{k}.{a}", b, ()) for a, b in flat_items(val)]
            else:
                items.append((str(k), _value(val), ()))
        blocks.append(KeyValues(tuple(items)))
    cl = cluster_lines(r)
    if cl:
        blocks += [Text(f"Test trajectories contributing rows to both sides of each estimand "
                        f"(min_clusters {ResultsView(r).get(VERDICT, MIN_CLUSTERS_KEY)} effective):"),
                   Bullets(tuple(cl))]
    bs = r.get(BOOTSTRAP)
    if isinstance(bs, Mapping) and bs:
        blocks.append(Text("Cluster bootstrap over test trajectories: "
                           + ", ".join(f"{k}={val}" for k, val in bs.items()
                                       if k not in (CLUSTERS_BY_ESTIMAND, EFFECTIVE_CLUSTERS_BY_ESTIMAND)), "muted"))
    if not blocks:
        return None
    c = counts if isinstance(counts, Mapping) else {}
    summary = ", ".join(f"{c[k]} {name}" for k, name in (("trajectories", "trajectories"), ("steps", "steps"),
                                                        ("rows", "rows"), ("rows_test", "test rows"))
                        if isinstance(c.get(k), (int, float)))
    skipped = [f"{len(c[k])} {k.replace('_', ' ')}" for k in ("skipped_steps", "skipped_trajectories")
               if isinstance(c.get(k), list)]
    replaced = sum(int(r.get(COUNT, 0)) for r in c.get(REPLACED_CHARACTERS) or () if isinstance(r, Mapping))
    if replaced:
        skipped.append(f"{replaced} character(s) no tokenizer takes replaced by U+FFFD "
                       f"(counts.replaced_characters)")
    return Section("counts", "Data counts", tuple(blocks), summary="; ".join(x for x in (summary, ", ".join(skipped))
                                                                             if x))


def _warnings(r: Mapping) -> Section | None:
    """``warnings`` of the results (inputs that can drive an estimand), open under the verdict."""
    ws = r.get(WARNINGS)
    if not isinstance(ws, (list, tuple)) or not ws:
        return None
    return Section("warnings", "Warnings", tuple(Text(str(w), "warn") for w in ws), folded=False,
                   summary=f"{len(ws)} warning{'s' if len(ws) != 1 else ''}")


def _run(r: Mapping) -> Section | None:
    run = r.get(RUN)
    if not isinstance(run, Mapping) or not run:
        return None
    run = {k: v for k, v in run.items() if k not in RUN_KEYS_SHOWN_ELSEWHERE}
    items = tuple((k, v, ()) for k, v in flat_items(run))
    detector = run.get(DETECTOR)
    summary = " · ".join(str(x) for x in (run.get(SURFACE), run.get(BACKBONE),
                                          run.get(LAYERS_CONFIG) and f"layers {run[LAYERS_CONFIG]}",
                                          detector.get(NAME) if isinstance(detector, Mapping) else detector,
                                          run.get(SPLIT)) if x)
    return Section("run", "Run", (KeyValues(items),), summary=summary)


def report_sections(results: Mapping, figures: Mapping[str, str] | None = None,
                    config_yaml: str | None = None) -> list[Section]:
    """The report of a results dict, section by section (module docstring for the order).

    Args:
        results: The dict written to ``results.json``.
        figures: ``{name: file name or path}`` of figures to show (names of :data:`FIGURES`;
            ``roc`` goes beside the headline table, the others into the figures section), or None.
        config_yaml: The resolved run config as YAML (the last section), or None.

    Returns:
        The sections in report order; a section without content (no twins, no permutation test,
        no split spread, ...) is left out.
    """
    r = results
    figures = {k: str(v) for k, v in (figures or {}).items()}
    marks = reportability_of(r)
    groups: dict[str, list] = {"headline": [], "baselines": [], "twins": [], "differences": [], "other": []}
    labels: dict[str, str] = {}
    for key, label, iv in estimand_entries(r):
        g = _group(key)
        labels[key] = (f"{difference_label(key)} ({label})" if g == "differences" and difference_label(key) != label
                       else label)
        groups[g].append((key, labels[key], iv, marks.get(key)))
    # Intervals of results.json outside the one list join their group's rows, through the same gate.
    known = set(labels)
    gate = _gate(r)
    extra = {k: not_evidence(r, k, at(r, k), **gate) for k in interval_keys(r) if k not in known}
    marks = {**marks, **extra}
    groups["baselines"] += [(k, _extra_label(k), at(r, k), why) for k, why in extra.items()
                            if _group(k) == "baselines"]
    order = list(BASELINE_LABELS)
    groups["baselines"].sort(key=lambda row: order.index(row[0].split(".")[0]))  # stable: per baseline
    readers = read_keys(r)
    sections = [_verdict(r), _warnings(r), _headline(r, groups["headline"], marks, figures, readers), _figures(figures),
                _baselines(r, groups["baselines"], readers), _twins(r, marks, labels),
                _differences(r, groups["differences"], readers)]
    # Whatever no section shows yet (a new kind of estimand) is listed, so every interval appears.
    shown = shown_keys([s for s in sections if s is not None])
    other = [row for row in groups["other"] if row[0] not in shown]
    other += [(k, _extra_label(k), at(r, k), marks.get(k)) for k in interval_keys(r)
              if k not in shown and k not in {row[0] for row in other}]
    if other:
        sections.append(Section("other", "Other estimands", (_table(r, other, readers),),
                                summary=f"{len(other)} estimands"))
    sections += [_permutation(r), _spread(r), _counts(r), _run(r)]
    if config_yaml:
        sections.append(Section("config", "Resolved config", (Code(config_yaml, "yaml"),),
                                summary="the composed Hydra config of this run"))
    return [s for s in sections if s is not None]
