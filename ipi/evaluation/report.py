"""``results.json`` and ``report.md`` of a run, written atomically."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ipi.io import atomic_write_text


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


def _fmt(iv: dict | None) -> str:
    if not iv or iv.get("estimate") is None:
        return "n/a"
    lo, hi = iv.get("ci_low"), iv.get("ci_high")
    ci = f"[{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "[n/a]"
    return f"{iv['estimate']:.3f} | {ci} | {iv.get('n_boot_used', 0)}"


def render_report(results: dict) -> str:
    """A Markdown report a person reads: verdict first, then estimands, then counts.

    Args:
        results: The dict written to ``results.json``.

    Returns:
        Markdown text.
    """
    r = results
    lines = [f"# ipi report — {r.get('run', {}).get('surface', '')}", ""]
    v = r.get("verdict")
    if v:
        lines += ["## Verdict (PROTOCOL.md §7)", "", f"**Licensed claim: {v['claim']}**", ""]
        lines += [f"- [{c['status']}] {c['id']}. {c['name']}: {c['detail']}" for c in v["checks"]]
        lines.append("")
    lines += ["## Estimands (PROTOCOL.md §5)", "",
              "| estimand | estimate | 95% CI | replicates used |", "|---|---|---|---|"]
    lines.append(f"| E1 attack vs clean | {_fmt(r.get('e1'))} |")
    lines.append(f"| E2 paired step | {_fmt(r.get('e2'))} |")
    for c, iv in sorted((r.get("e3") or {}).items()):
        lines.append(f"| E3 attack vs {c} | {_fmt(iv)} |")
    names = {"c1": "C1 metadata baseline", "collapse_only": "C2 collapse-only", "permuted": "permuted labels",
             "transfer": "cross-surface transfer"}
    for key, label in names.items():
        if isinstance(r.get(key), dict):
            lines.append(f"| {label} E1 | {_fmt(r[key].get('e1'))} |")
            if r[key].get("e2"):
                lines.append(f"| {label} E2 | {_fmt(r[key].get('e2'))} |")
    diffs = r.get("differences") or {}
    for k, iv in sorted(diffs.items()):
        if isinstance(iv, dict) and "estimate" in iv:
            lines.append(f"| {k} | {_fmt(iv)} |")
        elif isinstance(iv, dict):
            for c, sub in sorted(iv.items()):
                lines.append(f"| {k} {c} | {_fmt(sub)} |")
    lines.append("")
    counts = r.get("counts")
    if counts:
        lines += ["## Data", ""]
        for k, val in counts.items():
            if k in ("skipped_steps", "skipped_trajectories") and isinstance(val, list):
                lines.append(f"- {k}: {len(val)}")
                lines += [f"  - {s}" for s in val[:50]]
            else:
                lines.append(f"- {k}: {val}")
        lines.append("")
    run = r.get("run")
    if run:
        lines += ["## Run", ""] + [f"- {k}: {val}" for k, val in run.items()] + [""]
    bs = r.get("bootstrap")
    if bs:
        lines += ["Cluster bootstrap over test trajectories: " + ", ".join(f"{k}={v}" for k, v in bs.items()), ""]
    return "\n".join(lines)


def write_report(results: dict, out_dir: str | Path) -> Path:
    """Write ``report.md`` atomically and return its path."""
    path = Path(out_dir) / "report.md"
    atomic_write_text(path, render_report(results))
    return path
