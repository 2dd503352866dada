"""Summarise a Hydra multirun: a table of every job, layer × token-group heatmaps and the
sweep's family-wise claims.

Usage (from the repository root)::

    python train.py -m layers=six_1,six_6 token_group=last_prompt,task
    python -m ipi.reporting.sweep outputs/train/multiruns/<time>

Every job folder holding a ``results.json`` (or a ``failed.json``) is one cell. What the command
writes (``sweep.csv``, the heatmaps, ``sweep_report.md``/``.html``, ``failed_cells.csv``,
``summary.*``) and the family-wise rules it applies (Holm over every cell's ``p_separates`` and
``p_detects``, the max-over-cells rank test of check 6, pre-registration, failed cells at p = 1;
PROTOCOL.md §7) are described once, in docs/sweeps.md "Claims from a sweep".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ipi.evaluation.results import KFOLD, ResultsView
from ipi.evaluation.verdict import CLAIM_DETECTS, CLAIM_SEPARATES, read_keys
from ipi.io import atomic_write_text
from ipi.sweep_records import cell_name, job_overrides, sweep_failures
from ipi.metrics.keys import (ATTACK, BACKBONE, BOOTSTRAP, BY_SEED, CI_HIGH, CI_LOW, CLAIM, DATA_ROOT, DIFFERENCES, E1,
                              E1_PAIRED, E2, E3, ESTIMATE, LAYERS, LAYERS_CONFIG, M_KEY, N_BOOT_KEY, NAME, NUMBERS,
                              OPERATING_POINT, P_KEY, P_VALUE, P_VALUES, PERMUTATION, PERMUTATION_P, RANDOM_TWIN, RUN,
                              SPLIT, STATUS, SURFACE, TOKEN_GROUPS, VERDICT, VS, at, dotted)
from ipi.reporting.report import REPORT_CSS, html_escape, img_tag
from ipi.reporting.summary import _detector_label

__all__ = ["collect", "family_sentence", "familywise", "familywise_rank", "holm", "main", "write_sweep_report"]

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


def _permutation_p(res: dict) -> float | None:
    """The check-4 permutation p-value when the run has one (exact permutation test)."""
    p = ResultsView(res).section(PERMUTATION)
    return next((float(p[k]) for k in (P_VALUE, P_KEY) if isinstance(p.get(k), (int, float))), None)


def claim_p_values(res: dict) -> tuple[float, float]:
    """``(p_separates, p_detects)`` of one cell's ``results.json`` (module docstring).

    A p-value a run did not record (older ``results.json``) counts as 1: no claim is licensed
    without its test.
    """
    view = ResultsView(res)
    claim = view.get(VERDICT, CLAIM)
    pv = view.section(P_VALUES)

    def num(x) -> float:
        return float(x) if isinstance(x, (int, float)) else 1.0

    p_e1 = pv.get(E1_PAIRED) if pv.get(E1_PAIRED) is not None else pv.get(E1)
    one = view.check(1) or {}
    p_sep = num(p_e1) if one.get(STATUS) == "PASS" else 1.0
    if (one.get(NUMBERS) or {}).get(SPLIT) == KFOLD:  # check 1's K-fold rule: the permutation test too
        p_sep = max(p_sep, num((one.get(NUMBERS) or {}).get(PERMUTATION_P)))
    if claim != CLAIM_DETECTS:
        return p_sep, 1.0
    # every interval a check reads (verdict.read_keys) that is tested against a fixed bound has a
    # one-sided p-value (E1 > 0.5, E3[c] > 0.5, a paired difference > 0); a baseline's own interval
    # (check 5's collapse-only E3, against its ceiling) has none
    parts = [num(_p_of(pv, key)) for key in read_keys(res, points=False) if _has_p(key)]
    return p_sep, max(parts, default=1.0)


def _has_p(key: str) -> bool:
    """Whether ``results.json`` records a one-sided bootstrap p-value for the interval ``key``."""
    head = key.split(".")[1] if key.startswith(DIFFERENCES + ".") else key.split(".")[0]
    return head in (E1, E1_PAIRED, E3) or key.startswith(DIFFERENCES + ".")


def _p_of(pv: Mapping, key: str):
    """The p-value of the interval ``key`` in ``p_values`` (its path without ``differences.``), or None."""
    return at(pv, key.removeprefix(DIFFERENCES + "."))


def twin_e3_networks(res: dict) -> tuple[list[str], dict[str, list[float]]] | None:
    """``(seeds, {control: [E3 of the trained network, then of each twin seed]})`` of one cell, or
    None without twins (the input of :func:`familywise_rank`)."""
    view = ResultsView(res)
    seeds = [str(s) for s in view.twin_seeds]
    if not seeds or not isinstance(view.twin_by_seed or {}, dict):
        return None
    out = {}
    for c, iv in view.section(E3).items():
        vals = [(iv or {}).get(ESTIMATE)] + [view.section(RANDOM_TWIN, BY_SEED, s, E3).get(c, {}).get(ESTIMATE)
                                             for s in seeds]
        if any(v is None for v in vals):
            return None
        out[c] = [float(v) for v in vals]
    return seeds, out


def familywise_rank(e3_by_network) -> dict:
    """Family-wise rank test of check 6 over a sweep's cells: the max over cells (single-step max-T).

    Under exchangeability of the S + 1 networks *jointly over all cells* (the same S twin seeds
    serve every cell), network ``n``'s best margin ``M_n = max_k min_c (E3_n[k, c] − max_{m≠n}
    E3_m[k, c])`` is exchangeable across networks, so the trained network's ``M_0`` is the
    largest with probability ``<= 1/(S+1)``. Cell ``k`` keeps its rank part family-wise when
    its trained margin ``min_c (E3_0[k, c] − max_{m>=1} E3_m[k, c])`` exceeds every twin's
    ``M_n`` (Westfall & Young 1993); the family-wise error of the rank part is then ``<= 1/(S+1)``.

    Args:
        e3_by_network: ``[S+1, K, C]`` E3 estimates (network 0 = trained; K cells; C controls).

    Returns:
        ``{"cells": [K] bool, "p_family": (1 + #{n >= 1: M_n >= M_0})/(S+1), "margin": [K],
        "twin_best": max_{n>=1} M_n, "level": 1/(S+1)}``.
    """
    e = np.asarray(e3_by_network, dtype=np.float64)
    n_net = e.shape[0]
    margins = np.empty(e.shape[:2])
    for n in range(n_net):
        others = np.delete(e, n, axis=0).max(axis=0)  # [K, C]
        margins[n] = (e[n] - others).min(axis=1)
    best = margins.max(axis=1)
    twin_best = float(best[1:].max()) if n_net > 1 else -math.inf
    return {"cells": (margins[0] > twin_best).tolist(), "p_family": (1 + int(np.sum(best[1:] >= best[0]))) / n_net,
            "margin": margins[0].tolist(), "twin_best": twin_best, "level": 1.0 / n_net}


def family_sentence(n_cells: int, alpha: float, n_boot: int | None, n_twins: int | None,
                    kfold_m: int | None = None) -> str:
    """What the sweep's S, B and M let a claim survive: N, α, B, the p floor 1/(B+1) against Holm's
    first threshold α/N; under K-fold the permutation test's floor 1/(M+1) likewise (check 1 needs
    it there); and the rank test's family level 1/(S+1)."""
    parts = []
    if n_boot:
        floor = 1.0 / (n_boot + 1)
        need = math.ceil(n_cells / alpha - 1)
        ok = floor <= alpha / n_cells
        parts.append(f"B = {n_boot} bootstrap replicates: the smallest p-value is 1/(B+1) = {floor:.5f}, "
                     + (f"at or below Holm's first threshold alpha/N = {alpha / n_cells:.5f}, so a cell's claim can "
                        "survive" if ok else
                        f"above Holm's first threshold alpha/N = {alpha / n_cells:.5f}: no cell's claim can survive "
                        f"Holm here; evaluation.n_boot >= {need} is needed for {n_cells} cells"))
    if kfold_m:
        floor = 1.0 / (kfold_m + 1)
        parts.append(f"K-fold cells: \"separates\" also needs the exact permutation test, whose smallest p-value "
                     f"is 1/(M+1) = {floor:.5f} with M = {kfold_m} refits, "
                     + ("at or below alpha/N, so it can survive Holm" if floor <= alpha / n_cells else
                        f"above alpha/N = {alpha / n_cells:.5f}: no K-fold cell's \"separates\" can survive Holm here; "
                        f"evaluation.permutation.m >= {math.ceil(n_cells / alpha - 1)} is needed"))
    if n_twins:
        lvl = 1.0 / (n_twins + 1)
        parts.append(f"check 6's rank part over the family (max over cells, the same {n_twins} twin seeds in every "
                     f"cell): level 1/(S+1) = {lvl:.3f}" + ("" if lvl <= alpha * 2 + 1e-12 else
                                                               f", above {2 * alpha:g}: more twin seeds are needed "
                                                               "for a family-wise \"detects\""))
    return "; ".join(parts)


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


def familywise(df: pd.DataFrame, alpha: float, preregistered: str | None = None,
               n_failed: int = 0) -> pd.DataFrame:
    """Add ``p_separates, p_detects, claim_familywise, preregistered`` to a :func:`collect` table.

    Args:
        df: One row per cell with ``claim``, ``p_separates``, ``p_detects`` and ``overrides``.
        alpha: Family-wise level (one-sided), e.g. 0.025.
        preregistered: Space-separated ``key=value`` overrides naming one cell, or None.
        n_failed: Cells of the sweep whose job failed: members of the family with p = 1.

    Returns:
        A copy with ``claim_familywise`` (Holm over all ``len(df) + n_failed`` cells; the pre-registered
        cell keeps its own claim) and ``preregistered`` (bool).

    Raises:
        ValueError: ``preregistered`` names no cell or several cells of the sweep.
    """
    out = df.copy()
    pad = [1.0] * int(n_failed)
    sep = holm([*out["p_separates"], *pad], alpha)[: len(out)]
    det = holm([*out["p_detects"], *pad], alpha)[: len(out)]
    out["rank_familywise"] = None
    twins = list(out["_twin_e3"]) if "_twin_e3" in out else []
    if twins and all(t is not None for t in twins):
        seeds = {tuple(t[0]) for t in twins}
        controls = {tuple(sorted(t[1])) for t in twins}
        if len(seeds) == 1 and len(controls) == 1:
            cs = next(iter(controls))
            e3 = [[[t[1][c][n] for c in cs] for t in twins] for n in range(len(next(iter(seeds))) + 1)]
            fam = familywise_rank(e3)
            out["rank_familywise"] = fam["cells"]
            det = [d and r for d, r in zip(det, fam["cells"])]
        else:  # different twin seeds or controls per cell: no joint exchangeability, no family rank
            det = [False] * len(det)
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
    return "+".join(run.get(TOKEN_GROUPS) or []) or "?"


def collect(sweep: str | Path) -> pd.DataFrame:
    """One row per finished job of a multirun folder.

    Args:
        sweep: The multirun folder (``outputs/train/multiruns/<time>``).

    Returns:
        Columns ``job, overrides, surface, backbone, detector, attack, layers, token_group, data_root`` and, for
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
        view = ResultsView(res)
        run = view.run
        layer_label = str(run.get(LAYERS_CONFIG, "?")) + ("" if run.get(LAYERS) is None
                                                          else f" {list(run[LAYERS])}")
        row = {
            "job": job.name,
            "overrides": " ".join(_overrides(job)),
            "surface": run.get(SURFACE),
            "backbone": run.get(BACKBONE),
            "detector": _detector_label(run),
            "attack": view.section(RUN, ATTACK).get(NAME, "project"),
            "layers": layer_label,
            "token_group": _token_group_name(job, run),
            "data_root": run.get(DATA_ROOT),
            "claim": view.get(VERDICT, CLAIM),
            "level": float(view.level),
            "preregistered_spec": _preregistered(job),
        }
        row["p_separates"], row["p_detects"] = claim_p_values(res)
        row["n_boot"] = view.get(BOOTSTRAP, N_BOOT_KEY)
        row["_twin_e3"] = twin_e3_networks(res)
        row["p_permutation"] = _permutation_p(res)
        row["_kfold_m"] = (view.get(PERMUTATION, M_KEY)
                           if ((view.check(1) or {}).get(NUMBERS) or {}).get(SPLIT) == KFOLD else None)
        ivs = {E1: res.get(E1), E2: res.get(E2)}
        ivs.update({dotted(E3, c): iv for c, iv in view.section(E3).items()})
        ivs.update({f"tpr_at_fpr.{neg}": iv for neg, iv in view.section(OPERATING_POINT, VS).items()})
        for k, iv in ivs.items():
            row.update({k: (iv or {}).get(ESTIMATE), f"{k}_ci_low": (iv or {}).get(CI_LOW),
                        f"{k}_ci_high": (iv or {}).get(CI_HIGH)})
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"{sweep}: no job folder with results.json")
    return pd.DataFrame(rows)


def failed_cells(sweep: str | Path) -> pd.DataFrame:
    """One row per failed job of a multirun folder: ``job, cell, error, message``.

    ``cell`` is the job's overrides that not every job shares (the swept values); ``message`` is
    the first line of the reason (the whole one is in the job's ``failed.json``).
    """
    records = sweep_failures(sweep)
    jobs = job_overrides(sweep)
    common = set.intersection(*map(set, jobs)) if len(jobs) > 1 else set()
    return pd.DataFrame(
        [{"job": str(failure["job"]), "cell": cell_name(failure.get("overrides") or [], common),
          "error": failure.get("error"),
          "message": str(failure.get("message", "")).splitlines()[0] if failure.get("message") else ""}
         for failure in records], columns=["job", "cell", "error", "message"])


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


def file_part(name) -> str:
    """A user-given name (detector label, attack, surface) as a safe part of a file name.

    Spaces become ``_`` and parentheses are dropped; a name holding any other character outside
    ``[A-Za-z0-9._-]`` (``/``, ``$``, ``:``...) has those replaced by ``_`` and gains 8 hex digits
    of its SHA-256, so two names never share a file.
    """
    name = str(name)
    plain = name.replace(" ", "_").replace("(", "").replace(")", "")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", plain)
    return safe if safe == plain else f"{safe}-{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


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
    failed = failed_cells(sweep)
    try:
        df = collect(sweep)
    except FileNotFoundError:
        if failed.empty or not sweep.is_dir():
            raise
        raise FileNotFoundError(f"{sweep}: every job failed ({len(failed)}; failed_jobs.json and each "
                                "job's failed.json say why)") from None
    specs = set(df["preregistered_spec"].dropna())
    if len(specs) > 1:
        raise ValueError(f"{sweep}: jobs name different pre-registered cells ({sorted(specs)}); "
                         "set evaluation.preregistered once for the whole sweep")
    levels = set(df["level"])
    if len(levels) > 1:
        raise ValueError(f"{sweep}: jobs use different evaluation.level values {sorted(levels)}")
    prereg = next(iter(specs), None)
    alpha = (1.0 - levels.pop()) / 2.0
    twins = [t for t in df["_twin_e3"] if t is not None]
    n_twins = len(twins[0][0]) if twins else None
    n_boot = int(min(df["n_boot"].dropna())) if df["n_boot"].notna().any() else None
    kfold_m = int(min(df["_kfold_m"].dropna())) if df["_kfold_m"].notna().any() else None
    df = familywise(df, alpha, prereg, n_failed=len(failed)).drop(columns=["preregistered_spec", "_twin_e3",
                                                                           "_kfold_m"])
    n_cells = len(df) + len(failed)
    family = (f"Family: {n_cells} cells (every job of this sweep"
              + (f", {len(failed)} of them failed: p = 1" if len(failed) else "") + "). A claim is licensed under Holm's "
              f"family-wise error control at one-sided alpha = {alpha:g} over the {n_cells} cells "
              f"(column claim_familywise); the column claim is each cell's own verdict at the nominal level"
              + (f". Pre-registered cell: {prereg} (keeps its nominal claim)." if prereg else
                 "; no cell was pre-registered (evaluation.preregistered).")
              + (" " + family_sentence(n_cells, alpha, n_boot, n_twins, kfold_m) + "."
                 if (n_boot or n_twins or kfold_m) else ""))
    out: dict[str, Path] = {}
    csv = df.to_csv(index=False)
    out["csv"] = atomic_write_text(sweep / "sweep.csv", csv)
    if len(failed):
        out["failed_csv"] = atomic_write_text(sweep / "failed_cells.csv", failed.to_csv(index=False))
    figures: list[tuple[str, Path]] = []
    roots = sorted(str(r) for r in df["data_root"].dropna().unique())
    for (surface, backbone, detector, attack, root), part in df.groupby(
            ["surface", "backbone", "detector", "attack", "data_root"], dropna=False, sort=True):
        multi = df[["surface", "backbone", "detector"]].drop_duplicates().shape[0] > 1
        suffix = f"_{file_part(surface)}_{file_part(backbone)}" if multi else ""
        if df["attack"].nunique() > 1:
            suffix += f"_{file_part(attack)}"
        if df["detector"].nunique() > 1:
            suffix += f"_{file_part(detector)}"
        if len(roots) > 1:  # a sweep over data roots: one heatmap per root
            suffix += f"_root{roots.index(str(root)) if str(root) in roots else 'NA'}"
            detector = f"{detector} · data.root={root}"
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
    cols = ["job", "layers", "token_group", "surface", "attack", "detector",
            *(["data_root"] if len(roots) > 1 else []), "e1", "e1_ci_low", "e1_ci_high"]
    cols += [c for c in ("e3.c_scrambled", "e3.c_scrambled_ci_low", "e3.c_scrambled_ci_high",
                         "tpr_at_fpr.clean", "tpr_at_fpr.clean_ci_low", "tpr_at_fpr.clean_ci_high", "claim",
                         "p_separates", "p_detects", "claim_familywise", "preregistered") if c in df]
    md = [f"# Sweep report — {sweep}", "",
          f"{len(df) + len(failed)} jobs" + (f", {len(failed)} failed (below)." if len(failed) else "."), "",
          family, ""]
    if len(failed):
        md += ["## Failed cells", "", "| job | cell | error | reason |", "|---|---|---|---|"]
        md += [f"| {r.job} | {r.cell} | {r.error} | {str(r.message).replace('|', '/')} |"
               for r in failed.itertuples()]
        md += ["", "## Finished cells", ""]
    md += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df[cols].iterrows():
        md.append("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r) + " |")
    md.append("")
    md += [f"![{label}]({p.name})" for label, p in figures]
    out["md"] = atomic_write_text(sweep / "sweep_report.md", "\n".join(md) + "\n")
    html = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
            f"<title>sweep report</title><style>{REPORT_CSS}</style></head><body>",
            f"<h1>Sweep report</h1><p class=\"muted\">{html_escape(sweep)} · {len(df) + len(failed)} jobs"
            + (f", {len(failed)} failed" if len(failed) else "") + "</p>",
            f"<p><strong>{html_escape(family)}</strong></p>"]
    if len(failed):
        html.append("<h2>Failed cells</h2>" + failed.to_html(index=False, border=0))
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
    n_failed = len(pd.read_csv(paths["failed_csv"])) if "failed_csv" in paths else 0
    if n_failed:
        print(f"failed cells: {n_failed} (listed in sweep_report.md and {paths['failed_csv']})")
    print(f"family: {len(df) + n_failed} cells; claims licensed family-wise (Holm): "
          + ", ".join(f"{c}: {int((df.claim_familywise == c).sum())}" for c in (CLAIM_DETECTS, CLAIM_SEPARATES))
          + (f"; pre-registered: job {df.job[df.preregistered].iloc[0]}" if df.preregistered.any() else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
