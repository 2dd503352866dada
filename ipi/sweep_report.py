"""Summarise a Hydra multirun: a table of every job and layer × token-group heatmaps.

Usage (from the repository root)::

    python train.py -m layers=six_1,six_6 token_group=last_prompt,task
    python -m ipi.sweep_report outputs/train/multiruns/<time>

Every job folder (``<sweep>/<n>/``) holding a ``results.json`` is read: the estimands come from
it, the layer and token-group labels from its ``run`` section (``layers_config`` and the resolved
``layers``; ``token_groups``) and, when present, from ``.hydra/config.yaml`` (the
``token_group.name`` that was swept). The command writes into the sweep folder:

* ``sweep.csv`` — one row per job: job, overrides, surface, backbone, layers, token groups, E1,
  E3[c_scrambled] (and every other E3), each with its interval;
* ``heatmap_e1.png`` and ``heatmap_e3_c_scrambled.png`` — the estimate (with its CI) of each
  layer × token-group cell; one pair per surface/backbone when the sweep varies those too;
* ``sweep_report.md`` and a self-contained ``sweep_report.html`` with the heatmaps embedded.

A cell that two jobs claim (the sweep varied something else too) is an error naming both jobs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ipi.io import atomic_write_text

__all__ = ["collect", "main", "write_sweep_report"]

HEATMAP_ESTIMANDS = ("e1", "e3.c_scrambled")


def _job_dirs(sweep: Path) -> list[Path]:
    jobs = [p for p in sweep.iterdir() if p.is_dir() and (p / "results.json").is_file()]
    return sorted(jobs, key=lambda p: (0, int(p.name)) if p.name.isdigit() else (1, p.name))


def _overrides(job: Path) -> list[str]:
    f = job / ".hydra" / "overrides.yaml"
    if not f.is_file():
        return []
    from omegaconf import OmegaConf

    return [str(x) for x in OmegaConf.load(f)]


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
        Columns ``job, overrides, surface, backbone, layers, token_group`` and, for every
        estimand ``k`` found (``e1``, ``e2``, ``e3.<control>``), ``k``, ``k_ci_low``,
        ``k_ci_high``; plus ``claim``.

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
        run = res.get("run") or {}
        layers = run.get("layers")
        layer_label = str(run.get("layers_config", "?"))
        if layers is not None:
            layer_label += " " + str(list(layers))
        row = {
            "job": job.name,
            "overrides": " ".join(_overrides(job)),
            "surface": run.get("surface"),
            "backbone": run.get("backbone"),
            "layers": layer_label,
            "token_group": _token_group_name(job, run),
            "claim": (res.get("verdict") or {}).get("claim"),
        }
        ivs = {"e1": res.get("e1"), "e2": res.get("e2")}
        ivs.update({f"e3.{c}": iv for c, iv in (res.get("e3") or {}).items()})
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
    from ipi.evaluation.report import _CSS, _h, _img_tag
    from ipi.plots import plot_heatmap

    sweep = Path(sweep)
    df = collect(sweep)
    out: dict[str, Path] = {}
    csv = df.to_csv(index=False)
    out["csv"] = atomic_write_text(sweep / "sweep.csv", csv)
    figures: list[tuple[str, Path]] = []
    for (surface, backbone), part in df.groupby(["surface", "backbone"], dropna=False, sort=True):
        multi = df[["surface", "backbone"]].drop_duplicates().shape[0] > 1
        suffix = f"_{surface}_{backbone}" if multi else ""
        for key in HEATMAP_ESTIMANDS:
            if key not in part.columns or part[key].isna().all():
                continue
            name = key.replace(".", "_")
            path = sweep / f"heatmap_{name}{suffix}.png"
            label = "E1 attack vs clean" if key == "e1" else f"E3 attack vs {key.split('.', 1)[1]}"
            plot_heatmap(_grid(part, key), path, f"{label} · {surface} · {backbone}",
                         low=_grid(part, f"{key}_ci_low"), high=_grid(part, f"{key}_ci_high"))
            figures.append((label, path))
            out[path.stem] = path
    cols = ["job", "layers", "token_group", "surface", "e1", "e1_ci_low", "e1_ci_high"]
    cols += [c for c in ("e3.c_scrambled", "e3.c_scrambled_ci_low", "e3.c_scrambled_ci_high", "claim") if c in df]
    md = [f"# Sweep report — {sweep}", "", f"{len(df)} jobs.", ""]
    md += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df[cols].iterrows():
        md.append("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r) + " |")
    md.append("")
    md += [f"![{label}]({p.name})" for label, p in figures]
    out["md"] = atomic_write_text(sweep / "sweep_report.md", "\n".join(md) + "\n")
    html = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
            f"<title>sweep report</title><style>{_CSS}</style></head><body>",
            f"<h1>Sweep report</h1><p class=\"muted\">{_h(sweep)} · {len(df)} jobs</p>"]
    for label, p in figures:
        html.append(f"<figure>{_img_tag(p, label)}<figcaption>{_h(label)} per layer × token group "
                    "(estimate and 95% CI)</figcaption></figure>")
    html.append(df[cols].to_html(index=False, float_format=lambda v: f"{v:.3f}", border=0))
    html.append("</body></html>")
    out["html"] = atomic_write_text(sweep / "sweep_report.html", "\n".join(html))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: ``python -m ipi.sweep_report SWEEP_DIR``."""
    p = argparse.ArgumentParser(prog="python -m ipi.sweep_report",
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
