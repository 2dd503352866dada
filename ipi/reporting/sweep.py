"""Summarise a Hydra multirun: a table of every job and layer × token-group heatmaps.

Usage (from the repository root)::

    python train.py -m layers=six_1,six_6 token_group=last_prompt,task
    python -m ipi.reporting.sweep outputs/train/multiruns/<time>

Every job folder (``<sweep>/<n>/``) holding a ``results.json`` is read: the estimands come from
it, the layer and token-group labels from its ``run`` section (``layers_config`` and the resolved
``layers``; ``token_groups``) and, when present, from ``.hydra/config.yaml`` (the
``token_group.name`` that was swept). The command writes into the sweep folder:

* ``sweep.csv`` — one row per job: job, overrides, surface, backbone, layers, token groups, E1,
  E3[c_scrambled] (and every other E3), each with its interval;
* ``heatmap_e1.png`` and ``heatmap_e3_c_scrambled.png`` — the estimate (with its CI) of each
  layer × token-group cell; one pair per surface/backbone when the sweep varies those too;
* ``sweep_report.md`` and a self-contained ``sweep_report.html`` with the heatmaps embedded;
* ``summary.md``, ``summary.csv``, ``summary.tex`` — the paper's table, rows surface × detector
  (:mod:`ipi.reporting.summary`).

A cell that two jobs claim (the sweep varied something else too) is an error naming both jobs.

**Family-wise error control** (PROTOCOL.md §7: "a claim for one cell of a sweep needs
family-wise error control over the sweep's cells, or a cell named as pre-registered before the
sweep"). Every job of the folder is one cell of the family (``N`` cells, stated in the report).
A cell's claim as its own run states it (``claim``, nominal level) is re-licensed under Holm's
step-down procedure over the ``N`` cells (``claim_familywise``; :func:`familywise`):

* ``p_separates`` = the one-sided bootstrap p-value of ``E1 <= 0.5`` (``results.json``
  ``p_values.e1``), when the cell's check 1 passed; 1 otherwise.
* ``p_detects`` = the largest of the bootstrap p-values of the claim's tests — E1 (check 1),
  the paired ``E1 − C1 E1 <= 0`` (check 2), every ``E3[c] <= 0.5`` (check 3), and with a
  random-weight twin every ``E3[c] − max_s E3_twin_s[c] <= 0`` and every seed-predictive
  ``E3[c] − new twin E3[c] <= 0`` (check 6) — when the cell's
  own verdict licenses "detects malicious content"; 1 otherwise. The claim holds only if every
  test rejects (an intersection-union test), so the largest p is a valid p-value for it
  (Berger 1982). The other conditions (C1 E1 below 0.95, check 4's permutation test with its
  null centred on 0.5, check 5, the cluster gate) must hold in the cell's own verdict at their
  nominal levels: they guard against a broken pipeline and generic collapse rather than against
  chance separation, and with M = 199 refits a permutation p cannot fall below 1/200, above any
  Holm threshold of a 30-cell family (0.025/30). ``p_permutation`` is reported beside them.
* Holm at one-sided ``α = (1 − level)/2`` (0.025 for 95% intervals: the level of a single
  cell's "CI low > 0.5" check): sort the ``N`` p-values; the ``i``-th smallest is rejected while
  ``p_(i) <= α / (N − i + 1)`` for it and every smaller one. Holm controls the family-wise error
  under any dependence between cells (they share test trajectories). Run separately for the two
  claims; a cell gets "detects" when its ``p_detects`` is rejected, else "separates" when its
  ``p_separates`` is, else "none".
* ``evaluation.preregistered`` (the same in every job: set it on the sweep's command line, e.g.
  ``'evaluation.preregistered="layers=six_3 token_group=last_prompt"'``) names one cell by its
  overrides before the sweep runs; that cell keeps its nominal claim. The other cells still get
  Holm over all ``N`` cells.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ipi.evaluation.results import DEFAULTS
from ipi.io import atomic_write_text
from ipi.metrics.keys import (
    BOOTSTRAP,
    CHECKS,
    CLAIM,
    E1,
    E1_MINUS_C1_E1,
    E2,
    E3,
    E3_MINUS_TWIN_E3,
    E3_MINUS_TWIN_E3_PREDICTIVE,
    OPERATING_POINT,
    P_VALUE,
    P_VALUES,
    PERMUTATION,
    RUN,
    VERDICT,
    dotted,
)
from ipi.reporting.report import REPORT_CSS, html_escape, img_tag
from ipi.reporting.summary import _detector_label

__all__ = ["collect", "familywise", "holm", "main", "write_sweep_report"]

CLAIM_DETECTS = "detects malicious content"
CLAIM_SEPARATES = "separates clean steps from this attack surface on this split"

HEATMAP_ESTIMANDS = (E1, dotted(E3, "c_scrambled"))


def _job_dirs(sweep: Path) -> list[Path]:
    jobs = [p for p in sweep.iterdir() if p.is_dir() and (p / "results.json").is_file()]
    return sorted(jobs, key=lambda p: (0, int(p.name)) if p.name.isdigit() else (1, p.name))


def _overrides(job: Path) -> list[str]:
    f = job / ".hydra" / "overrides.yaml"
    if not f.is_file():
        return []
    from omegaconf import OmegaConf

    return [str(x) for x in OmegaConf.load(f)]


def _preregistered(job: Path) -> str | None:
    f = job / ".hydra" / "config.yaml"
    if not f.is_file():
        return None
    from omegaconf import OmegaConf

    v = OmegaConf.select(OmegaConf.load(f), "evaluation.preregistered", default=None)
    return None if v in (None, "") else str(v)


def _check_status(res: dict, cid: int) -> str | None:
    for c in (res.get(VERDICT) or {}).get(CHECKS) or []:
        if c.get("id") == cid:
            return c.get("status")
    return None


def _permutation_p(res: dict) -> float | None:
    """The check-4 permutation p-value when the run has one (exact permutation test)."""
    for path in ((PERMUTATION, P_VALUE), (PERMUTATION, "p")):
        cur = res
        for k in path:
            cur = cur.get(k) if isinstance(cur, dict) else None
        if isinstance(cur, (int, float)):
            return float(cur)
    return None


def claim_p_values(res: dict) -> tuple[float, float]:
    """``(p_separates, p_detects)`` of one cell's ``results.json`` (module docstring).

    A p-value a run did not record (older ``results.json``) counts as 1: no claim is licensed
    without its test.
    """
    claim = (res.get(VERDICT) or {}).get(CLAIM)
    pv = res.get(P_VALUES) or {}

    def num(x) -> float:
        return float(x) if isinstance(x, (int, float)) else 1.0

    p_sep = num(pv.get(E1)) if _check_status(res, 1) == "PASS" else 1.0
    if claim != CLAIM_DETECTS:
        return p_sep, 1.0
    parts = [num(pv.get(E1)), num(pv.get(E1_MINUS_C1_E1))]
    e3 = pv.get(E3) or {}
    parts += [num(e3.get(c)) for c in (res.get(E3) or {})]
    if _check_status(res, 6) is not None:  # check 6: E3[c] − max over twin seeds (docs/estimands.md)
        twin = pv.get(E3_MINUS_TWIN_E3) or {}
        parts += [num(twin.get(c)) for c in (res.get(E3) or {})]
        pred = pv.get(E3_MINUS_TWIN_E3_PREDICTIVE) or {}  # and a new random draw (seed-predictive)
        parts += [num(pred.get(c)) for c in (res.get(E3) or {})]
    return p_sep, max(parts)


def holm(p_values, alpha: float) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected at family-wise level ``alpha``.

    Args:
        p_values: One p-value per hypothesis (the family), shape ``[N]``.
        alpha: Family-wise error rate.

    Returns:
        ``[N]`` booleans, True where rejected (the ``i``-th smallest p is rejected when
        ``p_(j) <= alpha / (N − j + 1)`` for every ``j <= i``).
    """
    p = [float(x) for x in p_values]
    order = sorted(range(len(p)), key=lambda i: p[i])
    out = [False] * len(p)
    for rank, i in enumerate(order):
        if p[i] > alpha / (len(p) - rank):
            break
        out[i] = True
    return out


def familywise(df: pd.DataFrame, alpha: float, preregistered: str | None = None) -> pd.DataFrame:
    """Add ``p_separates, p_detects, claim_familywise, preregistered`` to a :func:`collect` table.

    Args:
        df: One row per cell with ``claim``, ``p_separates``, ``p_detects`` and ``overrides``.
        alpha: Family-wise level (one-sided), e.g. 0.025.
        preregistered: Space-separated ``key=value`` overrides naming one cell, or None.

    Returns:
        A copy with ``claim_familywise`` (Holm over all ``len(df)`` cells; the pre-registered
        cell keeps its own claim) and ``preregistered`` (bool).

    Raises:
        ValueError: ``preregistered`` names no cell or several cells of the sweep.
    """
    out = df.copy()
    sep = holm(out["p_separates"], alpha)
    det = holm(out["p_detects"], alpha)
    out["claim_familywise"] = [CLAIM_DETECTS if d else CLAIM_SEPARATES if s else "none"
                               for s, d in zip(sep, det)]
    out["preregistered"] = False
    if preregistered:
        want = set(preregistered.split())
        hit = [i for i, o in enumerate(out["overrides"]) if want <= set(str(o).split())]
        if len(hit) != 1:
            jobs = ", ".join(out["job"].iloc[hit]) if hit else "none"
            raise ValueError(f"evaluation.preregistered={preregistered!r} must name exactly one cell of the "
                             f"sweep by its overrides; it matches {len(hit)} (jobs: {jobs})")
        i = out.index[hit[0]]
        out.loc[i, "preregistered"] = True
        out.loc[i, "claim_familywise"] = out.loc[i, "claim"]
    return out


def _token_group_name(job: Path, run: dict) -> str:
    f = job / ".hydra" / "config.yaml"
    if f.is_file():
        from omegaconf import OmegaConf

        cfg = OmegaConf.load(f)
        name = OmegaConf.select(cfg, "token_group.name", default=None)
        if name is not None:
            return str(name)
    return "+".join(run.get("token_groups") or []) or "?"


def collect(sweep: str | Path) -> pd.DataFrame:
    """One row per finished job of a multirun folder.

    Args:
        sweep: The multirun folder (``outputs/train/multiruns/<time>``).

    Returns:
        Columns ``job, overrides, surface, backbone, detector, attack, layers, token_group`` and, for
        every estimand ``k`` found (``e1``, ``e2``, ``e3.<control>``, the operating point
        ``tpr_at_fpr.<clean|control>``), ``k``, ``k_ci_low``, ``k_ci_high``; plus ``claim``, ``level``, ``preregistered_spec`` (the jobs'
        ``evaluation.preregistered``), ``p_separates`` and ``p_detects`` (:func:`claim_p_values`).

    Raises:
        FileNotFoundError: ``sweep`` does not exist or holds no job with ``results.json``.
        ValueError: A ``results.json`` is not valid JSON (message names the file).
    """
    sweep = Path(sweep)
    if not sweep.is_dir():
        raise FileNotFoundError(f"{sweep}: no such sweep folder")
    rows = []
    for job in _job_dirs(sweep):
        try:
            res = json.loads((job / "results.json").read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{job / 'results.json'}: not valid JSON ({e})") from e
        run = res.get(RUN) or {}
        layers = run.get("layers")
        layer_label = str(run.get("layers_config", "?"))
        if layers is not None:
            layer_label += " " + str(list(layers))
        row = {
            "job": job.name,
            "overrides": " ".join(_overrides(job)),
            "surface": run.get("surface"),
            "backbone": run.get("backbone"),
            "detector": _detector_label(run),
            "attack": (run.get("attack") or {}).get("name", "project"),
            "layers": layer_label,
            "token_group": _token_group_name(job, run),
            "claim": (res.get(VERDICT) or {}).get(CLAIM),
            "level": float((res.get(BOOTSTRAP) or {}).get("level", DEFAULTS.level)),
            "preregistered_spec": _preregistered(job),
        }
        row["p_separates"], row["p_detects"] = claim_p_values(res)
        row["p_permutation"] = _permutation_p(res)
        ivs = {E1: res.get(E1), E2: res.get(E2)}
        ivs.update({dotted(E3, c): iv for c, iv in (res.get(E3) or {}).items()})
        op = res.get(OPERATING_POINT) or {}
        ivs.update({f"tpr_at_fpr.{neg}": iv for neg, iv in (op.get("vs") or {}).items()})
        for k, iv in ivs.items():
            iv = iv or {}
            row[k] = iv.get("estimate")
            row[f"{k}_ci_low"] = iv.get("ci_low")
            row[f"{k}_ci_high"] = iv.get("ci_high")
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"{sweep}: no job folder with results.json")
    return pd.DataFrame(rows)


def _layer_key(label: str):
    # order rows by the first resolved layer index when present, else by name
    try:
        first = label.split("[", 1)[1].split("]", 1)[0].split(",")[0]
        return (0, int(first), label)
    except (IndexError, ValueError):
        return (1, 0, label)


def _grid(df: pd.DataFrame, col: str) -> pd.DataFrame:
    dup = df[df.duplicated(["layers", "token_group"], keep=False)]
    if len(dup):
        a = dup.iloc[0]
        jobs = dup[(dup.layers == a.layers) & (dup.token_group == a.token_group)].job.tolist()
        raise ValueError(f"sweep: jobs {', '.join(jobs)} share layers={a.layers!r} token_group="
                         f"{a.token_group!r}; the sweep varies something else too")
    g = df.pivot(index="layers", columns="token_group", values=col)
    g = g.reindex(sorted(g.index, key=_layer_key))
    return g[sorted(g.columns)].astype(float)


def write_sweep_report(sweep: str | Path) -> dict[str, Path]:
    """Write ``sweep.csv``, the heatmaps and ``sweep_report.md``/``.html`` into the sweep folder.

    Args:
        sweep: The multirun folder.

    Returns:
        ``{name: path}`` of everything written.

    Raises:
        FileNotFoundError, ValueError: See :func:`collect` and the duplicate-cell rule.
    """
    from ipi.reporting.plots import plot_heatmap

    sweep = Path(sweep)
    df = collect(sweep)
    specs = set(df["preregistered_spec"].dropna())
    if len(specs) > 1:
        raise ValueError(f"{sweep}: jobs name different pre-registered cells ({sorted(specs)}); "
                         "set evaluation.preregistered once for the whole sweep")
    levels = set(df["level"])
    if len(levels) > 1:
        raise ValueError(f"{sweep}: jobs use different evaluation.level values {sorted(levels)}")
    prereg = next(iter(specs), None)
    alpha = (1.0 - levels.pop()) / 2.0
    df = familywise(df, alpha, prereg).drop(columns=["preregistered_spec"])
    n_cells = len(df)
    family = (f"Family: {n_cells} cells (every job of this sweep). A claim is licensed under Holm's "
              f"family-wise error control at one-sided alpha = {alpha:g} over the {n_cells} cells "
              f"(column claim_familywise); the column claim is each cell's own verdict at the nominal level"
              + (f". Pre-registered cell: {prereg} (keeps its nominal claim)." if prereg else
                 "; no cell was pre-registered (evaluation.preregistered)."))
    out: dict[str, Path] = {}
    csv = df.to_csv(index=False)
    out["csv"] = atomic_write_text(sweep / "sweep.csv", csv)
    figures: list[tuple[str, Path]] = []
    for (surface, backbone, detector, attack), part in df.groupby(["surface", "backbone", "detector", "attack"],
                                                                   dropna=False, sort=True):
        multi = df[["surface", "backbone", "detector"]].drop_duplicates().shape[0] > 1
        suffix = f"_{surface}_{backbone}" if multi else ""
        if df["attack"].nunique() > 1:
            suffix += f"_{attack}"
        if df["detector"].nunique() > 1:
            suffix += f"_{detector}".replace(" ", "_").replace("(", "").replace(")", "")
        for key in HEATMAP_ESTIMANDS:
            if key not in part.columns or part[key].isna().all():
                continue
            name = key.replace(".", "_")
            path = sweep / f"heatmap_{name}{suffix}.png"
            label = "E1 attack vs clean" if key == "e1" else f"E3 attack vs {key.split('.', 1)[1]}"
            plot_heatmap(_grid(part, key), path, f"{label} · {surface} · {backbone} · {detector}"
                         + (f" · attack={attack}" if df["attack"].nunique() > 1 else ""),
                         low=_grid(part, f"{key}_ci_low"), high=_grid(part, f"{key}_ci_high"))
            figures.append((label, path))
            out[path.stem] = path
    cols = ["job", "layers", "token_group", "surface", "attack", "detector", "e1", "e1_ci_low", "e1_ci_high"]
    cols += [c for c in ("e3.c_scrambled", "e3.c_scrambled_ci_low", "e3.c_scrambled_ci_high",
                         "tpr_at_fpr.clean", "tpr_at_fpr.clean_ci_low", "tpr_at_fpr.clean_ci_high", "claim",
                         "p_separates", "p_detects", "claim_familywise", "preregistered") if c in df]
    md = [f"# Sweep report — {sweep}", "", f"{len(df)} jobs.", "", family, ""]
    md += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df[cols].iterrows():
        md.append("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r) + " |")
    md.append("")
    md += [f"![{label}]({p.name})" for label, p in figures]
    out["md"] = atomic_write_text(sweep / "sweep_report.md", "\n".join(md) + "\n")
    html = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
            f"<title>sweep report</title><style>{REPORT_CSS}</style></head><body>",
            f"<h1>Sweep report</h1><p class=\"muted\">{html_escape(sweep)} · {len(df)} jobs</p>",
            f"<p><strong>{html_escape(family)}</strong></p>"]
    for label, p in figures:
        html.append(f"<figure>{img_tag(p, label)}<figcaption>{html_escape(label)} per layer × token group "
                    "(estimate and 95% CI)</figcaption></figure>")
    html.append(df[cols].to_html(index=False, float_format=lambda v: f"{v:.3f}", border=0))
    html.append("</body></html>")
    out["html"] = atomic_write_text(sweep / "sweep_report.html", "\n".join(html))
    from ipi.reporting.summary import write_summary_tables

    # the paper's table: rows surface × detector (docs/sweeps.md, docs/detectors.md)
    out.update(write_summary_tables(sweep, dict(zip(df["job"].astype(str), df["claim_familywise"]))))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: ``python -m ipi.reporting.sweep SWEEP_DIR``."""
    p = argparse.ArgumentParser(prog="python -m ipi.reporting.sweep",
                                description="Heatmaps and a table of a train.py multirun folder.")
    p.add_argument("sweep", help="multirun folder, e.g. outputs/train/multiruns/2026-01-01_12-00-00")
    args = p.parse_args(argv)
    try:
        paths = write_sweep_report(args.sweep)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, path in paths.items():
        print(f"{name}: {path}")
    df = pd.read_csv(paths["csv"])
    print(f"family: {len(df)} cells; claims licensed family-wise (Holm): "
          + ", ".join(f"{c}: {int((df.claim_familywise == c).sum())}" for c in (CLAIM_DETECTS, CLAIM_SEPARATES))
          + (f"; pre-registered: job {df.job[df.preregistered].iloc[0]}" if df.preregistered.any() else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
