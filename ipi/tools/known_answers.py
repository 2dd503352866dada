"""Known answers end to end: ``python -m ipi.tools.known_answers`` (docs/selftest.md, "Known answers").

Runs ``train.py`` — the command a user runs, as a subprocess, on the real shared trajectories —
on constructed backbones whose answer is planted (:mod:`ipi.backbone_planted`,
``conf/backbone/planted_*.yaml``) and on the random tiny backbone, over a matrix of cells
(backbone × surface × held-out wording) and repeats (``split.seed = 0 .. R-1``: a new split,
hence new held-out wording, every repeat), then reads every run's ``results.json`` and writes a
table of claim counts per cell, with the checks that stopped each refused claim:

==================  =============  ==========================  =====================
backbone            surfaces       held-out wording            known answer
==================  =============  ==========================  =====================
planted_semantic    i_dom, i_tool  on                          "detects" (≥ 90 %)
planted_lexical     i_dom, i_tool  on and off                  never "detects"
planted_surface     i_dom, i_tool, on                          never "detects"
                    i_vis
tiny_qwen2_5_vl     i_dom, i_tool, on                          never "detects"
(random)            i_vis
==================  =============  ==========================  =====================

i_vis carries no planted content: the random vision tower cannot read the banner's words, so
the content kinds are not run there; the surface case (banner darkness) covers it.

Jobs of one (surface, held-out wording) run as ONE Hydra multirun (one process: imports, the
data import and the replay rows of each split are done once, ``ipi.run.stages.sweep_memo``), and
the activation cache is shared: a cell's rows are extracted once per split seed, and the
random-weight twins of every constructed backbone are the tiny backbone's twins (one entry per
seed and split, read by every kind). Nothing in a run is special-cased for this tool: it reads
``verdict.claim`` and ``verdict.checks`` of ``results.json`` as any reader would.

Examples::

    python -m ipi.tools.known_answers                       # the full matrix, 10 repeats
    python -m ipi.tools.known_answers --repeats 2 --cells semantic:i_dom,lexical:i_dom
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ipi.run.config import REPO_ROOT
from ipi.io import atomic_write_text

__all__ = ["CELLS", "Cell", "chains", "claim_kind", "main", "run_record", "stopping_checks", "summarise"]

#: What every cell's run adds to the defaults (none of it enters the verdict): no transfer
#: check (it does not enter the verdict) and no figures.
RUN_OVERRIDES = ("evaluation.transfer=false", "report.plots=false", "report.html=false", "report.gallery=false",
                 "quiet=true")
#: Text surfaces: the text-only backbones' token groups; the probe on block 1 (``layers=six_1``: the
#: plant is in the residual stream from block 0 on, so the main pass and every twin forward blocks
#: 0..1 only); page text capped at 500 characters (every variant of a step alike); half the
#: trajectories tested (21 of 42, so that the effective cluster count clears the gate).
TEXT_OVERRIDES = ("token_group=text", "layers=six_1", "extract.layers=[]", "data.max_element_chars=500",
                  "split.test_fraction=0.5")
#: i_vis: the tiny Qwen2.5-VL, the same probe block and split; 3 twins instead of the default 19
#: (each VL twin runs its own vision tower over five bannered screenshots per step: 19 would cost
#: ~3 hours on this CPU; the surface case's answer is stopped before check 6, which states its level).
VIS_OVERRIDES = ("layers=six_1", "extract.layers=[]", "split.test_fraction=0.5", "evaluation.random_twin_seeds=[1,2,3]")


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix.

    Attributes:
        kind: ``semantic`` | ``lexical`` | ``surface`` | ``random``.
        surface: ``i_dom`` | ``i_tool`` | ``i_vis``.
        heldout: ``evaluation.heldout_wording``.
        expect: ``detects`` (at least ``min_rate`` of the repeats) or ``not_detects`` (none).
    """

    kind: str
    surface: str
    heldout: bool = True
    expect: str = "not_detects"

    @property
    def backbone(self) -> str:
        """The config name: text-only constructed backbones on the text surfaces, the tiny
        Qwen2.5-VL on ``i_vis`` (``random``: the same architecture without a plant)."""
        if self.surface == "i_vis":
            return "tiny_qwen2_5_vl" if self.kind == "random" else f"planted_{self.kind}_vis"
        return "tiny_qwen2_text" if self.kind == "random" else f"planted_{self.kind}"

    @property
    def overrides(self) -> tuple[str, ...]:
        """What this cell's runs add to :data:`RUN_OVERRIDES` (text-only: no image token group)."""
        return TEXT_OVERRIDES if self.surface != "i_vis" else VIS_OVERRIDES

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.surface}" + ("" if self.heldout else ":shared_wording")


CELLS: tuple[Cell, ...] = (  # run in this order of (surface, held-out wording) groups
    Cell("semantic", "i_dom", expect="detects"),
    Cell("lexical", "i_dom"),
    Cell("surface", "i_dom"),
    Cell("random", "i_dom"),
    Cell("semantic", "i_tool", expect="detects"),
    Cell("lexical", "i_tool"),
    Cell("surface", "i_tool"),
    Cell("random", "i_tool"),
    Cell("lexical", "i_dom", heldout=False),
    Cell("lexical", "i_tool", heldout=False),
    Cell("surface", "i_vis"),
    Cell("random", "i_vis"),
)

#: The smallest share of repeats that must say "detects" where the answer is "detects" (issue 23).
MIN_DETECT_RATE = 0.9


def claim_kind(claim: str | None) -> str:
    """``detects`` | ``separates`` | ``none`` from the licensed claim's text."""
    c = (claim or "").strip().lower()
    if c.startswith("detects"):
        return "detects"
    if c.startswith("separates"):
        return "separates"
    return "none"


def stopping_checks(verdict: dict) -> list[str]:
    """The checks that did not PASS (``"3 FAIL"``, ``"6 NOT RUN"``, ...), in check order."""
    out = []
    for c in verdict.get("checks") or []:
        if str(c.get("status")) != "PASS":
            out.append(f"{c.get('id')} {c.get('status')}")
    return out


def run_record(results_path: Path, cell: Cell, seed: int) -> dict:
    """One run's line of the table, read from its ``results.json``."""
    res = json.loads(Path(results_path).read_text())
    v = res.get("verdict") or {}
    return {
        "cell": cell.name, "kind": cell.kind, "backbone": cell.backbone, "surface": cell.surface,
        "heldout_wording": cell.heldout, "split_seed": seed, "claim": v.get("claim"),
        "claim_kind": claim_kind(v.get("claim")), "claim_note": v.get("claim_note"),
        "stopped_by": stopping_checks(v),
        "checks": {str(c.get("id")): c.get("status") for c in v.get("checks") or []},
        "run": str(Path(results_path).parent),
    }


def summarise(records: list[dict], cells=CELLS, min_rate: float = MIN_DETECT_RATE) -> list[dict]:
    """Claim counts per cell, the checks that stopped the refused claims, and whether the answer was met."""
    out = []
    for cell in cells:
        rs = [r for r in records if r["cell"] == cell.name]
        if not rs:
            continue
        kinds = Counter(r["claim_kind"] for r in rs)
        stops = Counter(s for r in rs if r["claim_kind"] != "detects" for s in r["stopped_by"])
        n, d = len(rs), kinds.get("detects", 0)
        met = d >= min_rate * n if cell.expect == "detects" else d == 0
        out.append({"cell": cell.name, "backbone": cell.backbone, "surface": cell.surface,
                    "heldout_wording": cell.heldout, "expect": cell.expect, "repeats": n,
                    "detects": d, "separates": kinds.get("separates", 0), "none": kinds.get("none", 0),
                    "stopped_by": dict(sorted(stops.items(), key=lambda kv: (-kv[1], kv[0]))), "met": bool(met)})
    return out


def markdown(summary: list[dict], meta: dict) -> str:
    """The table as markdown, with the command, wall time and load."""
    lines = [
        "# Known answers end to end", "",
        f"`{meta['command']}` — {meta['runs']} runs of `train.py`, wall {meta['wall_s']:.0f} s, "
        f"load average {meta['load_before']} before / {meta['load_after']} after, {meta['when']}"
        f" ({meta.get('groups_done', '?')} of {meta.get('groups', '?')} groups; wall per group: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in (meta.get("wall_s_by_group") or {}).items()) + ").", "",
        "| cell | backbone | surface | held-out wording | known answer | repeats | detects | separates | "
        "none | checks that stopped a refused \"detects\" (runs) | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        answer = f"detects (≥ {MIN_DETECT_RATE:.0%})" if s["expect"] == "detects" else "never detects"
        stops = ", ".join(f"check {k} ×{v}" for k, v in s["stopped_by"].items()) or "—"
        lines.append(f"| {s['cell']} | {s['backbone']} | {s['surface']} | {'on' if s['heldout_wording'] else 'off'} | "
                     f"{answer} | {s['repeats']} | {s['detects']} | {s['separates']} | {s['none']} | {stops} | "
                     f"{'yes' if s['met'] else '**NO**'} |")
    return "\n".join(lines) + "\n"


def _env() -> dict:
    """The runs' environment: one intra-op thread unless ``OMP_NUM_THREADS`` is set (the tiny
    models' matmuls are far too small to share; on a busy 2-core machine two spinning threads made
    an extraction 3× slower), tokenizers without their own thread pool."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", env["OMP_NUM_THREADS"])
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def run_group(cells: list[Cell], seeds: list[int], out: Path, extra: list[str], python: str,
              collect: bool = False) -> tuple[list[dict], float]:
    """One multirun of ``train.py`` for cells that share a surface and a held-out setting.

    Returns:
        ``(records, wall seconds)``.

    Raises:
        RuntimeError: ``train.py`` failed (its log is named).
    """
    surface, heldout = cells[0].surface, cells[0].heldout
    tag = f"{surface}_{'heldout' if heldout else 'shared'}"
    sweep = out / "runs" / tag
    backbones = ",".join(c.backbone for c in cells)
    cmd = [python, str(REPO_ROOT / "train.py"), "-m", f"surface={surface}", f"backbone={backbones}",
           f"split.seed={','.join(map(str, seeds))}", f"evaluation.heldout_wording={str(heldout).lower()}",
           *RUN_OVERRIDES, *cells[0].overrides, f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=${hydra.job.num}",
           *extra]
    log = out / "logs" / f"{tag}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    done = out / "logs" / f"{tag}.done.json"
    if done.is_file() and json.loads(done.read_text()).get("cmd") == cmd:  # finished earlier: read it
        wall = float(json.loads(done.read_text())["wall_s"])
    elif collect:  # read what a stopped matrix finished
        wall = float("nan")
        if not sweep.is_dir():
            return [], wall
    else:
        t0 = time.perf_counter()
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n")
            f.flush()
            rc = subprocess.run(cmd, cwd=REPO_ROOT, stdout=f, stderr=subprocess.STDOUT, env=_env()).returncode
        wall = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"known answers: train.py failed (exit {rc}) for {tag}; see {log}")
        atomic_write_text(done, json.dumps({"cmd": cmd, "wall_s": round(wall, 1), "load_after": _load()}))
    records = []
    for job in sorted(sweep.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        cfg_path = job / ".hydra" / "overrides.yaml"
        if not (job / "results.json").is_file() or not cfg_path.is_file():
            continue
        ov = dict(o.split("=", 1) for o in _read_overrides(cfg_path))
        cell = next(c for c in cells if c.backbone == ov["backbone"])
        records.append(run_record(job / "results.json", cell, int(ov["split.seed"])))
    return records, wall


def _read_overrides(path: Path) -> list[str]:
    from omegaconf import OmegaConf

    return [str(o) for o in OmegaConf.load(path)]


def chains(groups: list[tuple[str, bool]]) -> list[list[tuple[str, bool]]]:
    """The (surface, held-out wording) groups as one chain per surface, in first-seen order.

    A surface's groups share activation-cache entries (the same rows, backbones and split seeds), so
    ``--jobs`` runs chains, never two groups of one surface, at once. ``i_vis`` first (each of its
    twins runs a vision tower over every bannered screenshot: its runs cost the most), then the
    longer chains.
    """
    by: dict[str, list[tuple[str, bool]]] = {}
    for g in groups:
        by.setdefault(g[0], []).append(g)
    return sorted(by.values(), key=lambda ch: (ch[0][0] != "i_vis", -len(ch)))


def merge(folders: list[str], out: Path) -> dict:
    """One table from several runs of this tool (e.g. a matrix run in parts); walls add up."""
    parts = [json.loads((Path(f) / "known_answers.json").read_text()) for f in folders]
    records = [r for p in parts for r in p["runs"]]
    summary = summarise(records, CELLS)
    metas = [p["meta"] for p in parts]
    meta = {"command": "; ".join(m["command"] for m in metas), "runs": len(records),
            "wall_s": round(sum(m["wall_s"] for m in metas), 1),
            "wall_s_by_group": {f"{i}:{k}": v for i, m in enumerate(metas) for k, v in m["wall_s_by_group"].items()},
            "groups_done": sum(m.get("groups_done", 0) for m in metas), "groups": sum(m.get("groups", 0) for m in metas),
            "load_before": metas[0]["load_before"], "load_after": metas[-1]["load_after"], "cpus": metas[0].get("cpus"),
            "threads_per_run": metas[0].get("threads_per_run"), "when": metas[-1]["when"], "parts": folders}
    result = {"meta": meta, "summary": summary, "runs": records, "all_met": all(s["met"] for s in summary)}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "known_answers.json", json.dumps(result, indent=2))
    atomic_write_text(out / "known_answers.md", markdown(summary, meta))
    print(markdown(summary, meta))
    return result


def main(argv: list[str] | None = None) -> dict:
    """CLI: run the matrix, write ``known_answers.json`` and ``known_answers.md``, print the table."""
    ap = argparse.ArgumentParser(prog="python -m ipi.tools.known_answers", description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=10, help="split seeds 0..R-1 per cell (default 10)")
    ap.add_argument("--cells", default="all",
                    help="comma-separated kind:surface[:shared_wording] (default: all %d cells)" % len(CELLS))
    ap.add_argument("--out", default="outputs/known_answers", help="folder for the runs, logs and the table")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--collect", action="store_true", help="run nothing: tabulate the runs already in --out")
    ap.add_argument("overrides", nargs="*", help="extra train.py overrides for every run (e.g. evaluation.n_boot=500)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="groups run at once (default 1); a surface's groups stay in one chain, in order, "
                         "so that they read each other's cache entries instead of extracting them twice")
    ap.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                    help="run nothing: one table from the known_answers.json of several --out folders")
    args = ap.parse_args(argv)
    if args.merge:
        return merge(args.merge, Path(args.out))
    cells = list(CELLS) if args.cells == "all" else [c for c in CELLS if c.name in set(args.cells.split(","))]
    if not cells:
        raise SystemExit(f"--cells {args.cells!r}: no such cell; cells: {', '.join(c.name for c in CELLS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(range(args.repeats))
    groups: dict[tuple, list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.surface, c.heldout), []).append(c)
    load_before, t0, records, walls = _load(), time.perf_counter(), [], {}
    command = " ".join(["python -m ipi.tools.known_answers", *(argv if argv is not None else sys.argv[1:])])
    result: dict = {}
    lock = threading.Lock()

    def write_table() -> None:  # the table so far, after every group (a stopped matrix keeps what it finished)
        nonlocal result
        summary = summarise(records, cells)
        meta = {"command": command, "runs": len(records), "wall_s": round(time.perf_counter() - t0, 1),
                "wall_s_by_group": dict(walls), "groups_done": len(walls), "groups": len(groups),
                "load_before": load_before, "load_after": _load(), "cpus": os.cpu_count(), "jobs": args.jobs,
                "threads_per_run": _env()["OMP_NUM_THREADS"], "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        result = {"meta": meta, "summary": summary, "runs": list(records), "all_met": all(s["met"] for s in summary)}
        atomic_write_text(out / "known_answers.json", json.dumps(result, indent=2))
        atomic_write_text(out / "known_answers.md", markdown(summary, meta))

    def run_chain(chain: list[tuple[str, bool]]) -> None:
        for surface, heldout in chain:
            tag = f"{surface}:{'heldout' if heldout else 'shared'}"
            recs, wall = run_group(groups[(surface, heldout)], seeds, out, args.overrides, args.python,
                                   collect=args.collect)
            with lock:
                records.extend(recs)
                walls[tag] = wall
                print(f"known answers: {surface} (held-out wording {'on' if heldout else 'off'}): {len(recs)} runs, "
                      f"{wall:.0f} s", file=sys.stderr)
                write_table()

    errors = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for fut in [pool.submit(run_chain, ch) for ch in chains(list(groups))]:
            try:
                fut.result()
            except RuntimeError as e:  # one failed chain does not stop the others; named at the end
                errors.append(str(e))
    if not walls:
        write_table()
    if errors:
        raise SystemExit("\n".join(errors))
    print(markdown(result["summary"], result["meta"]))
    return result


if __name__ == "__main__":
    main()
