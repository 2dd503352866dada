"""The self-test's command line: jobs, the resumable journal, the summary and its table
(``python -m ipi.tools.simulate``; see :mod:`ipi.tools.simulate`)."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from ipi.evaluation.verdict import CHECKS, CLAIM_DETECTS, CLAIM_NONE
from ipi.io import atomic_write_text, text_lines
from ipi.progress import progress_bar
from ipi.protocol import CONTROLS
from ipi.tools.simulate.runner import init_worker, run_job, job_id
from ipi.tools.simulate.truths import (ALL_TRUTHS, COVERAGE_N_TEST, NULL_KFOLD_TRAJECTORIES, NULL_N_TEST, SPLITS,
                                       SWEEP_CELLS, TRUTHS, SimParams)


def summarise(records: list[dict]) -> dict:
    """Rates per truth: the claim, each check's PASS rate, CI coverage per estimand.

    Each rate comes with its exact (Clopper–Pearson) 95% interval over datasets.
    """

    from scipy.stats import binomtest

    def rate(k: int, n: int) -> dict:
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        return {"rate": k / n, "k": k, "n": n, "ci": [float(ci.low), float(ci.high)]}

    out: dict = {}
    cov = [r for r in records if r.get("kind") == "coverage"]
    if cov:
        table: dict = {}
        for method in cov[0]["covered"]:
            table[method] = {}
            for n_test in sorted({r["n_test"] for r in cov}):
                rs = [r for r in cov if r["n_test"] == n_test]
                table[method][str(n_test)] = {
                    k: {**rate(sum(r["covered"][method][k] for r in rs), len(rs)),
                        "mean_width": float(np.mean([r["width"][method][k] for r in rs
                                                     if r["width"][method][k] is not None]))}
                    for k in rs[0]["covered"][method]}
        out["coverage_by_n_test"] = table
    sw = [r for r in records if r.get("kind") == "sweep"]
    if sw:
        out["sweep_b"] = {"n_cells": sw[0]["n_cells"],
                          "familywise_false_claim": rate(sum(r["familywise_any_detects"] for r in sw), len(sw)),
                          "nominal_any_cell_false_claim": rate(sum(r["nominal_any_detects"] for r in sw), len(sw)),
                          "seconds_per_sweep": float(np.mean([r["seconds"] for r in sw]))}
    groups: dict[str, list[dict]] = {}
    for r in records:
        if r.get("truth") is not None:
            groups.setdefault(group_of(r), []).append(r)
    for name in sorted(groups, key=_group_order):
        rec = groups[name]
        n = len(rec)

        s = {"claim_detects": rate(sum(r["claim"] == CLAIM_DETECTS for r in rec), n),
             "claim_separates_or_more": rate(sum(r["claim"] != CLAIM_NONE for r in rec), n),
             "n_test_trajectories": sorted({int(r["n_test_trajectories"]) for r in rec})}
        s["check_pass"] = {cid: rate(sum(r["checks"][cid] == "PASS" for r in rec), n) for cid in rec[0]["checks"]}
        perm = [r["permutation"] for r in rec if r.get("permutation")]
        if perm:
            s["permutation"] = {
                "mean_null_mean": float(np.mean([q["null_mean"] for q in perm])),
                "max_abs_null_mean_off": float(np.max([abs(q["null_mean"] - 0.5) for q in perm])),
                "p_le_0.05": rate(sum(q["p_value"] <= 0.05 for q in perm), len(perm)),
            }
        keys = [k for k in rec[0]["estimands"] if rec[0]["estimands"][k]["covered"] is not None]
        s["coverage"] = {k: rate(sum(r["estimands"][k]["covered"] for r in rec), n) for k in keys}
        s["mean_true"] = {k: float(np.mean([r["estimands"][k]["true"] for r in rec])) for k in keys}
        s["mean_estimate"] = {k: float(np.mean([r["estimands"][k]["estimate"] for r in rec]))
                              for k in rec[0]["estimands"]}
        s["seconds_per_dataset"] = float(np.mean([r["seconds"] for r in rec]))
        beats = [r["true_beats_every_twin"] for r in rec if r.get("true_beats_every_twin") is not None]
        if beats:  # population event: the trained probe's true E3 above every twin's, every control
            s["true_beats_every_twin"] = rate(sum(beats), len(beats))
        if rec[0].get("n_twins"):
            s["n_twins"] = int(rec[0]["n_twins"])
            s["candidates"] = {k: rate(sum(candidate_detects(r)[k] for r in rec), n) for k in CANDIDATES}
            rho = [r["twin_rank_correlation_max"] for r in rec if r.get("twin_rank_correlation_max") is not None]
            if rho:
                s["twin_rank_correlation_max"] = float(max(rho))
            s["twin_guards_fired"] = rate(sum(bool(r.get("twin_guards")) for r in rec), n)
        out[name] = s
    return out


#: Constructions of check 6 measured beside the rule (``summary[group]["candidates"]``): with
#: fewer than 19 twins a distribution-free rank test cannot reach 0.05, so another construction
#: would have to hold the level by simulation (PROTOCOL.md §7.6).
CANDIDATES = {
    "rank": "the rank rule at level 1/(S+1), whatever S",
    "t_prediction": "a one-sided 95% Student-t prediction bound for a new twin (normal seed effects)",
}


def candidate_detects(record: dict) -> dict[str, bool]:
    """Whether each construction of :data:`CANDIDATES`, in place of check 6, would have licensed
    "detects" on one record: checks 0–5 PASS, the paired CI of E3[c] − mean twin E3[c] above 0 for
    every control, and the construction's own part for every control (``rank``: E3[c] above every
    twin's; ``t_prediction``: ``(E3[c] − mean) / (sd · sqrt(1 + 1/S)) > t_{S−1, 0.95}``)."""
    from scipy.stats import t as student_t

    no = dict.fromkeys(CANDIDATES, False)
    twin = record.get("twin_e3")
    if not twin or any(record["checks"].get(str(i)) != "PASS" for i in range(6)):
        return no
    by_c = twin[1]
    if any((record["estimands"].get(f"diff.e3.{c}") or {}).get("ci_low") is None
           or record["estimands"][f"diff.e3.{c}"]["ci_low"] <= 0.0 for c in by_c):
        return no
    out = {}
    nets = {c: np.asarray(v, dtype=np.float64) for c, v in by_c.items()}
    out["rank"] = all(v[0] > v[1:].max() for v in nets.values())
    s = len(next(iter(nets.values()))) - 1
    if s < 2:
        out["t_prediction"] = False
    else:
        q = float(student_t.ppf(0.95, s - 1))
        out["t_prediction"] = all(
            (v[0] - v[1:].mean()) > q * float(np.std(v[1:], ddof=1)) * math.sqrt(1.0 + 1.0 / s) for v in nets.values())
    return out


def group_of(record: dict) -> str:
    """The summary group of a run record: ``"<truth>"`` (holdout), ``"<truth>/kfold"``, and for the
    null ``"null/holdout/<n_test>"`` or ``"null/kfold/<n_test>"``."""
    truth, split = record["truth"], record.get("split", "holdout")
    if truth == "null":
        return f"null/{split}/{record['n_test_trajectories']}"
    if record.get("design") == "separates":
        return f"{truth}/separates-{split}/{record['n_test_trajectories']}"
    return truth if split == "holdout" else f"{truth}/{split}"


def _group_order(name: str) -> tuple:
    parts = name.split("/")
    return (ALL_TRUTHS.index(parts[0]), parts[1:2] != [] and parts[1] != "holdout",
            int(parts[2]) if len(parts) > 2 else 0)


def format_table(summary: dict) -> str:
    """The self-test table (Markdown), as written to docs/selftest.md."""

    def pct(r: dict) -> str:
        return f"{r['rate']:.3f} ({r['k']}/{r['n']}; 95% CI {r['ci'][0]:.3f}–{r['ci'][1]:.3f})"

    heads = {"a": "truth (a): content signal", "b": "truth (b): surface only",
             "c": "truth (c): bank wording, held out", "c_shared": "truth (c), wording shared",
             "twin_token": "twin_token: token identity shared by the twins",
             "twin_seed": "twin_seed: trained = another random draw",
             "null": "null: attack rows drawn as clean rows"}

    def head(name: str) -> str:
        parts = name.split("/")
        h = heads[parts[0]] + ("" if len(parts) == 1 else f", {parts[1]}")
        return h + (f", {parts[2]} test trajectories" if len(parts) > 2 else "")

    present = [k for k in summary if isinstance(summary[k], dict) and "claim_detects" in summary[k]]
    lines = ["| figure | " + " | ".join(head(t) for t in present) + " |", "|---" * (len(present) + 1) + "|"]

    def row(label: str, get) -> None:
        cells = []
        for t in present:
            try:
                cells.append(get(summary[t]))
            except KeyError:
                cells.append("n/a")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("claims \"detects malicious content\"", lambda s: pct(s["claim_detects"]))
    row("claims \"separates\" or more", lambda s: pct(s["claim_separates_or_more"]))
    row("test trajectories", lambda s: ", ".join(map(str, s["n_test_trajectories"])))
    row("coverage of the 95% CI of E1", lambda s: pct(s["coverage"]["e1"]))
    for k in ("e2", *(f"e3.{c}" for c in CONTROLS)):
        row(f"coverage of the 95% CI of {k.upper() if k == 'e2' else 'E3 ' + k[3:]}", lambda s, k=k: pct(s["coverage"][k]))
    if any("diff.e3.c_scrambled" in summary[t]["coverage"] for t in present):
        for c in CONTROLS:
            row(f"coverage of the paired 95% CI of E3 − mean twin E3 {c}",
                lambda s, c=c: pct(s["coverage"][f"diff.e3.{c}"]))
    if any("true_beats_every_twin" in summary[t] for t in present):
        row("trained beats every twin in truth (all controls)", lambda s: pct(s["true_beats_every_twin"]))
    for rule in CHECKS:
        row(f"check {rule.id} ({rule.name}) PASS", lambda s, cid=str(rule.id): pct(s["check_pass"][cid]))
    if any("candidates" in summary[t] for t in present):
        for name, what in CANDIDATES.items():
            row(f"\"detects\" if check 6 were {what}", lambda s, name=name: pct(s["candidates"][name]))
        row("largest Spearman correlation of two twins' scores (max over datasets)",
            lambda s: f"{s['twin_rank_correlation_max']:.3f}")
    if any("permutation" in summary[t] for t in present):
        row("permutation null: mean of null means / max |null mean − 0.5|",
            lambda s: (f"{s['permutation']['mean_null_mean']:.3f} / {s['permutation']['max_abs_null_mean_off']:.3f}"
                       if "permutation" in s else "n/a"))
    for k in ("e1", "e2", *(f"e3.{c}" for c in CONTROLS), "diff.e3.c_scrambled"):
        row(f"mean true {k} / mean estimate", lambda s, k=k: f"{s['mean_true'][k]:.3f} / {s['mean_estimate'][k]:.3f}")
    row("seconds per dataset (one worker)", lambda s: f"{s['seconds_per_dataset']:.2f}")
    if not present:
        lines = []
    if "sweep_b" in summary:
        sb = summary["sweep_b"]
        lines += ["", f"| {sb['n_cells']}-cell sweep under truth (b) | rate over sweeps |", "|---|---|",
                  f"| family-wise (Holm) false \"detects\" in any cell | {pct(sb['familywise_false_claim'])} |",
                  f"| nominal (no control) false \"detects\" in any cell | {pct(sb['nominal_any_cell_false_claim'])} |"]
    if "coverage_by_n_test" in summary:
        cov = summary["coverage_by_n_test"]
        keys = ("e1", "e2", *(f"e3.{c}" for c in CONTROLS))
        lines += ["", "| interval | test trajectories | " + " | ".join(keys) + " |", "|---" * (len(keys) + 2) + "|"]
        for method, by_n in cov.items():
            for n_test, d in by_n.items():
                lines.append(f"| {method} | {n_test} | " + " | ".join(
                    f"{d[k]['rate']:.3f} ({d[k]['k']}/{d[k]['n']})" for k in keys) + " |")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    """The command line's arguments."""
    import ipi.tools.simulate

    ap = argparse.ArgumentParser(prog="python -m ipi.tools.simulate",
                                 description=ipi.tools.simulate.__doc__.split("\n")[0])
    ap.add_argument("--n-datasets", type=int, default=200, help="datasets per truth (default 200)")
    ap.add_argument("--trajectories", type=int, default=80, help="trajectories per dataset (default 80)")
    ap.add_argument("--features", type=int, default=SimParams.n_features, help="feature dimension d")
    ap.add_argument("--content", type=float, default=SimParams.content, help="content signal of truth (a)")
    ap.add_argument("--wording", type=float, default=SimParams.wording,
                    help="per-template wording signal of truth (c) (default %(default)s)")
    ap.add_argument("--lexical", type=float, default=SimParams.lexical,
                    help="token-identity signal of truths twin_token and twin_seed (default %(default)s)")
    ap.add_argument("--seed-sd", type=float, default=SimParams.seed_sd,
                    help="SD of the log token-identity gain across network seeds, truth twin_seed (default %(default)s)")
    ap.add_argument("--twins", type=int, default=SimParams.n_twins,
                    help="random-weight twins per dataset (default %(default)s, as evaluation.random_twin_seeds; "
                         "0: check 6 NOT RUN)")
    ap.add_argument("--n-boot", type=int, default=SimParams.n_boot, help="bootstrap replicates (default %(default)s)")
    ap.add_argument("--permutations", type=int, default=SimParams.permutation_m,
                    help="refits M of the exact permutation test, verdict check 4 (default 199; 0: not run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--truths", default=",".join(TRUTHS),
                    help=f"comma-separated subset of {','.join(ALL_TRUTHS)} (default {','.join(TRUTHS)})")
    ap.add_argument("--coverage-datasets", type=int, default=None,
                    help="truth-(a) datasets per test-set size for the coverage table (default: --n-datasets; 0: skip)")
    ap.add_argument("--coverage-n-test", default=",".join(map(str, COVERAGE_N_TEST)),
                    help="test-set sizes of the coverage table (default 5,10,24,50)")
    ap.add_argument("--sweep-datasets", type=int, default=None,
                    help=f"simulated {SWEEP_CELLS}-cell sweeps under truth (b) (default: --n-datasets // 4; 0: skip)")
    ap.add_argument("--splits", default="holdout",
                    help=f"comma-separated split designs of the truths' datasets, of {','.join(SPLITS)} "
                         "(default holdout; K-fold uses k = 5 over the same 80 trajectories)")
    ap.add_argument("--null-datasets", type=int, default=None,
                    help="datasets per size of the null-\"separates\" table (default: --n-datasets; 0: skip)")
    ap.add_argument("--null-sizes", default=",".join(map(str, NULL_N_TEST)),
                    help="holdout test-set sizes of the null table (default %(default)s)")
    ap.add_argument("--null-kfold-sizes", default=",".join(map(str, NULL_KFOLD_TRAJECTORIES)),
                    help="with kfold in --splits: K-fold designs of the null table over this many trajectories, "
                         "every one tested, with check 4's permutation refits (default %(default)s)")
    ap.add_argument("--separates-power", type=int, default=None,
                    help="truth-(a) datasets per design of the null table: the power of \"separates\" beside its "
                         "false rate (default: --null-datasets; 0: skip)")
    ap.add_argument("--sweep-n-boot", type=int, default=1999,
                    help="bootstrap replicates of each sweep cell: p-values are (1 + k)/(B + 1), and Holm's "
                         "first threshold over 30 cells, 0.025/30, needs B >= 1200 (default %(default)s)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", default="outputs/selftest/selftest.json", help="JSON with every record + summary")
    ap.add_argument("--records", default=None,
                    help="JSON-Lines journal: each finished job is appended as it ends, and a rerun with the "
                         "same journal resumes (finished jobs are read, not rerun)")
    ap.add_argument("--journal-only", action="store_true",
                    help="run nothing: summarise every job of the --records journal (written by one or more "
                         "commands with the same parameters, e.g. to run the designs in a chosen order)")
    ap.add_argument("--summary-only", action="store_true",
                    help="write the command, parameters and summary to --out, not every record (the journal has them)")
    return ap


def _jobs(args: argparse.Namespace, p: SimParams, truths: list[str], splits: list[str]) -> list[tuple]:
    """Every job of the command, in running order: sweeps first (the longest), then the truths,
    the null and "separates"-power designs, then the cheap coverage datasets."""
    n_null = args.n_datasets if args.null_datasets is None else args.null_datasets
    null_sizes = [int(v) for v in args.null_sizes.split(",") if v.strip()]
    n_cov = args.n_datasets if args.coverage_datasets is None else args.coverage_datasets
    n_sweep = args.n_datasets // 4 if args.sweep_datasets is None else args.sweep_datasets
    sizes = [int(v) for v in args.coverage_n_test.split(",") if v.strip()]
    jobs = [("sweep", replace(p, n_boot=args.sweep_n_boot), i, args.seed) for i in range(n_sweep)]
    jobs += [("run", replace(p, split=sp), t, i, args.seed) for sp in splits for t in truths
             for i in range(args.n_datasets)]
    kfold_sizes = [int(v) for v in args.null_kfold_sizes.split(",") if v.strip()] if "kfold" in splits else []
    null_designs = [("holdout", n) for n in null_sizes] + [("kfold", n) for n in kfold_sizes]
    n_power = n_null if args.separates_power is None else args.separates_power
    jobs += [("null", p, sp, n, i, args.seed) for sp, n in null_designs for i in range(n_null)]
    jobs += [("null", p, sp, n, i, args.seed, "a") for sp, n in null_designs for i in range(n_power)]
    jobs += [("coverage", p, n, i, args.seed) for n in sizes for i in range(n_cov)]
    return jobs


def _read_journal(journal: Path | None) -> dict[str, dict]:
    """``{job id: record}`` of the jobs a ``--records`` journal holds (one JSON line per finished
    job); a last line cut by a kill is dropped from the file, so that job is rerun."""
    done: dict[str, dict] = {}
    if journal is not None and journal.exists():
        lines = text_lines(journal)
        for n, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    if n == len(lines):  # the last line cut by a kill: dropped, that job is rerun
                        atomic_write_text(journal, "".join(x + "\n" for x in lines[:-1]))
                        continue
                    raise ValueError(f"{journal}: line {n} is not JSON ({e})") from None
                done[rec["job_id"]] = rec
    return done


def _run_jobs(todo: list[tuple], workers: int, journal: Path | None, n_resumed: int) -> list[dict]:
    """Run ``todo`` (in ``workers`` processes when more than one), appending each record to the
    journal as its job ends; returns the fresh records."""
    fresh: list[dict] = []
    sink = journal.open("a") if journal is not None else None

    def keep(job, rec: dict) -> None:
        rec = {"job_id": job_id(job), **rec}
        fresh.append(rec)
        if sink is not None:
            sink.write(json.dumps(rec) + "\n")
            sink.flush()

    try:
        with progress_bar(f"simulate ({n_resumed} resumed)", len(todo)) as bar:
            if workers > 1 and todo:
                import multiprocessing as mp

                with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"),
                                         initializer=init_worker) as ex:
                    futures = {ex.submit(run_job, j): j for j in todo}
                    for fut in as_completed(futures):
                        keep(futures[fut], fut.result())
                        bar.advance()
            elif todo:
                init_worker()
                for j in todo:
                    keep(j, run_job(j))
                    bar.advance()
    finally:
        if sink is not None:
            sink.close()
    return fresh


def main(argv: list[str] | None = None) -> dict:
    """CLI: simulate, run the pipeline, print the table and write the records (JSON)."""
    ap = _parser()
    args = ap.parse_args(argv)
    p = SimParams(n_trajectories=args.trajectories, n_features=args.features, content=args.content,
                  wording=args.wording, lexical=args.lexical, seed_sd=args.seed_sd, n_twins=args.twins,
                  n_boot=args.n_boot, permutation_m=args.permutations)
    truths = [t.strip() for t in args.truths.split(",") if t.strip()]
    for t in truths:
        if t not in ALL_TRUTHS or t == "null":
            ap.error(f"--truths: unknown truth {t!r} (use {', '.join(ALL_TRUTHS[:-1])}; the null has --null-datasets)")
    splits = [t.strip() for t in args.splits.split(",") if t.strip()]
    for t in splits:
        if t not in SPLITS:
            ap.error(f"--splits: unknown split {t!r} (use {', '.join(SPLITS)})")
    jobs = _jobs(args, p, truths, splits)
    # Resume: jobs already in --records (one JSON line per finished job) are read, not rerun.
    journal = Path(args.records) if args.records else None
    done = _read_journal(journal)
    if args.journal_only:
        if not done:
            ap.error("--journal-only needs a non-empty --records journal")
        jobs, todo = [], []
    else:
        # Run in an order mixing the job kinds (a sweep job costs ~30 others), so that the bar's
        # ETA, the mean time per job done so far, holds from the first jobs on; records keep `jobs` order.
        todo = sorted((j for j in jobs if job_id(j) not in done),
                      key=lambda j: hashlib.sha256(job_id(j).encode()).hexdigest())
    t0 = time.perf_counter()
    fresh = _run_jobs(todo, args.workers, journal, len(done))
    wall = time.perf_counter() - t0
    by_id = {**done, **{r["job_id"]: r for r in fresh}}
    records = [by_id[job_id(j)] for j in jobs] if jobs else list(done.values())
    summary = summarise(records)
    command = "python -m ipi.tools.simulate " + " ".join(argv if argv is not None else sys.argv[1:])
    out = {"command": command.strip(), "params": asdict(p), "seed": args.seed, "workers": args.workers,
           "jobs": len(records), "jobs_resumed": len(records) - len(todo), "wall_s": wall,
           "cpu_s_of_jobs": float(sum(r.get("seconds", 0.0) for r in records)), "summary": summary}
    if not args.summary_only:
        out["records"] = records

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(out, indent=1))
    print(format_table(summary))
    brief = {k: v["claim_detects"]["rate"] for k, v in summary.items() if "claim_detects" in v and "null" not in k}
    brief.update({k: v["claim_separates_or_more"]["rate"] for k, v in summary.items() if k.startswith("null")})
    if "sweep_b" in summary:
        brief["sweep_b_familywise"] = summary["sweep_b"]["familywise_false_claim"]["rate"]
    print(f"\nclaim_detects.rate: {json.dumps(brief)}")
    print(f"{len(todo)} jobs run ({len(records) - len(todo)} resumed) in {wall:.0f} s with {args.workers} worker(s); "
          f"summary: {args.out}")
    return out
