"""Print docs/real_audit.md's tables from the audit runs' results.json (never typed by hand).

Usage: ``python docs/real_audit/table.py docs/real_audit/i_dom_project.json docs/real_audit/i_tool_project.json``
(each file is a run's ``results.json``, copied as ``<surface>_<attack>.json``). Every number and
every verdict line is read from those files; an estimand the run marks not reportable carries
``n/r`` and its reason.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: (label, dotted key in results.json); ``{c}`` is replaced by each control of the run.
ROWS = [
    ("E1 attack vs clean", "e1"),
    ("E1 paired (check 1)", "e1_paired"),
    ("E2 paired step", "e2"),
    ("C1 E1 (metadata baseline)", "c1.e1"),
    ("E3 vs {c}", "e3.{c}"),
    ("C1 E3 vs {c}", "c1.e3.{c}"),
    ("E3 − C1 E3 vs {c} (check 2)", "differences.e3_minus_c1_e3.{c}"),
    ("transfer E1 (probe of the other text surface)", "transfer.e1"),
    ("permuted-label E1", "permuted.e1"),
    ("collapse-only E1", "collapse_only.e1"),
    ("collapse-only E3 vs {c} (check 5)", "collapse_only.e3.{c}"),
    ("E3 − mean twin E3 vs {c} (check 6)", "differences.e3_minus_mean_twin_e3.{c}"),
    ("likelihood E4 (shift > 0 vs ≤ 0)", "behaviour.likelihood.e4.e4"),
    ("likelihood C1 E4", "behaviour.likelihood.e4.c1_e4"),
    ("likelihood E4 − C1 E4", "behaviour.likelihood.e4.e4_minus_c1_e4"),
    ("Spearman(score, shift)", "behaviour.likelihood.e4.spearman"),
    ("mean propensity shift (nats)", "behaviour.likelihood.e4.mean_shift"),
    ("ablation Δ_probe − Δ_random (nats)", "behaviour.likelihood.ablation.probe_minus_random"),
]


def _at(d, key: str):
    for k in key.split("."):
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _why(r: dict, key: str) -> str | None:
    rep = (r.get("reportability") or {}).get("estimands") or {}
    if key in rep:
        return rep[key]
    if key.startswith("behaviour.likelihood.e4."):
        e4 = _at(r, "behaviour.likelihood.e4") or {}
        name = key.rsplit(".", 1)[1]
        return (e4.get("reportable") or {}).get(name) or (e4.get("shift_reportable") or {}).get(name)
    return None


def cell(r: dict, key: str) -> str:
    iv = _at(r, key)
    if not isinstance(iv, dict) or iv.get("estimate") is None:
        return "—"
    lo, hi = iv.get("ci_low"), iv.get("ci_high")
    text = f"{iv['estimate']:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "")
    why = _why(r, key)
    return f"~~{text}~~ n/r ({why})" if why else text


def main(paths: list[str]) -> None:
    stems = [Path(p).stem for p in paths]
    if len(set(stems)) != len(stems):
        raise SystemExit(f"two runs share a name {stems}: copy each results.json as <surface>_<attack>.json")
    runs = {Path(p).stem: json.loads(Path(p).read_text()) for p in paths}
    controls = list(dict.fromkeys(c for r in runs.values() for c in r["run"]["controls"]))
    print("| estimand | " + " | ".join(runs) + " |")
    print("|---|" + "---|" * len(runs))
    for label, key in ROWS:
        for c in (controls if "{c}" in key else [None]):
            k = key.format(c=c) if c else key
            print(f"| {label.format(c=c)} | " + " | ".join(cell(r, k) for r in runs.values()) + " |")
    for name, r in runs.items():
        v = r["verdict"]
        print(f"\n**{name}** — licensed claim: **{v['claim']}**\n")
        print("| check | status | detail |\n|---|---|---|")
        for c in v["checks"]:
            print(f"| {c['id']}. {c['name']} | {c['status']} | {str(c['detail']).replace('|', '/')} |")
        for side in ("predicts_hijack", "lowers_shift"):
            cl = _at(r, f"behaviour.likelihood.claims.{side}")
            if cl:
                print(f"| likelihood: {side} | {cl['status']} | {str(cl['detail']).replace('|', '/')} |")


if __name__ == "__main__":
    main(sys.argv[1:])
