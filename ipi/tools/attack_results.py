"""Markdown tables of attack-source runs from their results.json files (docs/attacks_results.md).

    python -m ipi.tools.attack_results --sweep OUT/sweep_i_dom OUT/sweep_i_tool --loso OUT/loso_i_dom

``--sweep``: folders of ``train.py -m attack=...`` sweeps (one results.json per job folder): one
row per job with E1, E3 per control (cluster-bootstrap intervals), C1's E3 (Δprompt length), TPR at
the operating FPR vs clean, the checks 0–6 and the claim; then what the surface did with the
source's texts (``run.attack.counts``). ``--loso``: the folder of one ``split.wording=source`` run:
E1/E3 per held-out source, the source × source transfer table and E1/E3 by goal family.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path


def ci(x: Mapping | None) -> str:
    """``estimate [low, high]`` of an interval record, ``—`` for none."""
    return "—" if not x else f"{x['estimate']:.3f} [{x['ci_low']:.3f}, {x['ci_high']:.3f}]"


def _checks(d: Mapping) -> str:
    return " ".join(f"{c['id']}:{c['status']}" for c in d["verdict"]["checks"])


def sweep_table(results: list[dict]) -> list[str]:
    """One row per run: the estimands, checks and claim."""
    out = ["| attack | surface | test traj. | E1 (attack vs clean) | E3 c_scrambled | E3 c_imperative "
           "| C1 E3 c_scrambled / c_imperative | TPR at 1 % FPR vs clean | checks | claim |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for d in results:
        att = d["run"].get("attack")
        c1 = d["c1"]["e3"]
        op = d.get("operating_point", {}).get("vs", {}).get("clean")
        out.append(f"| {att['name'] if att else 'project'} | {d['run']['surface']} | {d['bootstrap']['n_clusters']} "
                   f"| {ci(d['e1'])} | {ci(d['e3'].get('c_scrambled'))} | {ci(d['e3'].get('c_imperative'))} "
                   f"| {c1['c_scrambled']['estimate']:.3f} / {c1['c_imperative']['estimate']:.3f} | {ci(op)} "
                   f"| {_checks(d)} | {d['verdict']['claim']} |")
    return out


def counts_table(results: list[dict]) -> list[str]:
    """Attack rows, rows ``i_dom`` adapted, control rows off their attack's token count, per source."""
    out = ["| attack | surface | attack rows | adapted rows | control token mismatches |", "|---|---|---|---|---|"]
    for d in results:
        att = d["run"].get("attack")
        if not att:  # the default bank records no attack block
            out.append(f"| project | {d['run']['surface']} | {d['counts']['rows_by_variant']['attack']} | 0 "
                       f"| {d['counts'].get('control_token_mismatches', 0)} |")
            continue
        c = att["counts"]

        def f(k: str, c=c) -> str:
            return ", ".join(f"{s} {n}" for s, n in c[k].items()) or "0"

        out.append(f"| {att['name']} | {d['run']['surface']} | {f('attack_rows')} | {f('adapted_rows')} "
                   f"| {f('control_token_mismatches')} |")
    return out


def _by(rec: Mapping, label: str) -> list[str]:
    out = [f"| {label} | test traj. | rows | E1 (attack vs clean) | E3 c_scrambled | E3 c_imperative |",
           "|---|---|---|---|---|---|"]
    for s, r in rec.items():
        e = r["estimands"] or {}
        e3 = e.get("e3") or {}
        out.append(f"| {s} | {r['n_trajectories']} | {r['n_rows']} | {ci(e.get('e1'))} "
                   f"| {ci(e3.get('c_scrambled'))} | {ci(e3.get('c_imperative'))} |")
    return out


def loso_tables(d: dict) -> list[str]:
    """Pooled line, per held-out source, transfer table, by goal family, counts."""
    att, w = d["run"]["attack"], d["run"]["wording"]
    out = [f"Pooled out-of-fold: E1 {ci(d['e1'])}; E3 c_scrambled {ci(d['e3'].get('c_scrambled'))}; "
           f"E3 c_imperative {ci(d['e3'].get('c_imperative'))}; checks {_checks(d)}; claim: "
           f"{d['verdict']['claim']}; wording scheme `{w['scheme']}`, overlap {w['overlap']}.", ""]
    out += _by(att["by_source"], "held-out source") + [""]
    t = att["transfer"]
    if isinstance(t, str):
        out.append(t)
    else:
        out.append("| trained on ↓ / scored on → | " + " | ".join(f"{b} ({t['n_trajectories'][b]})" for b in t["sources"])
                   + " |")
        out.append("|---|" + "---|" * len(t["sources"]))
        for a in t["sources"]:
            out.append(f"| {a} | " + " | ".join(ci(t["e1"][a][b]) for b in t["sources"]) + " |")
    out += [""] + _by(att["by_goal_family"], "goal family") + [""] + counts_table([d])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", nargs="*", default=[], help="sweep folders (job folders hold results.json)")
    ap.add_argument("--loso", nargs="*", default=[], help="run folders of split.wording=source runs")
    args = ap.parse_args(argv)
    for folder in args.sweep:
        results = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*/results.json"))]
        print(f"\n#### {folder}\n")
        print("\n".join(sweep_table(results) + [""] + counts_table(results)))
    for folder in args.loso:
        print(f"\n#### {folder}\n")
        print("\n".join(loso_tables(json.loads((Path(folder) / "results.json").read_text()))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
