"""Known answers end to end: ``python -m ipi.tools.known_answers`` (docs/selftest.md, "Known answers").

Runs ``train.py`` as a subprocess on the real shared trajectories, on constructed backbones whose
answer is planted (:mod:`ipi.backbone_planted`, ``conf/backbone/planted_*.yaml``) and on the
random tiny backbones, over a matrix of cells (backbone × surface × held-out wording) and repeats
(``split.seed = 0 .. R-1``), then reads every run's ``results.json`` and writes a table of claim
counts per cell, with the checks that stopped each refused claim. The cells and their known
answers are :data:`CELLS` (docs/selftest.md lists them).

Jobs of one (surface, held-out wording) run as one Hydra multirun and share the activation
cache. Nothing in a run is special-cased for this tool: it reads ``verdict.claim`` and
``verdict.checks`` of ``results.json`` as any reader would.

Examples::

    python -m ipi.tools.known_answers                       # the full matrix, 10 repeats
    python -m ipi.tools.known_answers --repeats 2 --cells semantic:i_dom,lexical:i_dom"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ipi.run.schemas import REPO_ROOT
from ipi.io import atomic_write_text
from ipi.progress import progress_bar

__all__ = ["CELLS", "Cell", "TOOL_KEYS", "chains", "claim_kind", "main", "merge", "parse_cells", "run_record",
           "stopping_checks", "summarise"]

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
#: (each VL twin runs its own vision tower; the surface case's answer is stopped before check 6).
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

#: The smallest share of repeats that must say "detects" where the answer is "detects".
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
    if not isinstance(v.get("claim"), str) or not v.get("checks"):
        # a verdict-less run must never count as "not detects" (it would meet every such cell)
        raise ValueError(f"known answers: {results_path} has no verdict (verdict.claim and verdict.checks); "
                         "a run without one cannot be counted")
    return {
        "cell": cell.name, "kind": cell.kind, "backbone": cell.backbone, "surface": cell.surface,
        "heldout_wording": cell.heldout, "split_seed": seed, "claim": v.get("claim"),
        "claim_kind": claim_kind(v.get("claim")), "claim_note": v.get("claim_note"),
        "stopped_by": stopping_checks(v),
        "checks": {str(c.get("id")): c.get("status") for c in v.get("checks") or []},
        "check_names": {str(c.get("id")): c.get("name") for c in v.get("checks") or [] if c.get("name")},
        "run": str(Path(results_path).parent),
    }


def summarise(records: list[dict], cells=CELLS, seeds: dict[str, list[int]] | list[int] | None = None) -> list[dict]:
    """Claim counts per cell, the checks that stopped the refused claims, and whether the answer was met.

    Args:
        records: :func:`run_record` lines.
        cells: The cells asked for. A cell with no run is a row with ``repeats`` 0 and ``met``
            False (never a silent omission). "detects" is met at :data:`MIN_DETECT_RATE` of the repeats.
        seeds: The split seeds asked for (one list for every cell, or per cell name): a seed
            without a run is listed in ``missing`` and the cell is not met. ``None``: not checked.

    Returns:
        One dict per cell.

    Raises:
        ValueError: Two runs of one cell on one split seed (a run would count twice).
    """
    out = []
    for cell in cells:
        rs = [r for r in records if r["cell"] == cell.name]
        got = Counter(r.get("split_seed") for r in rs)
        dup = sorted(k for k, n in got.items() if k is not None and n > 1)
        if dup:
            raise ValueError(f"known answers: {cell.name} has more than one run on split seed(s) "
                             f"{', '.join(map(str, dup))}; each split must count once")
        want = seeds.get(cell.name) if isinstance(seeds, dict) else seeds
        missing = sorted(set(want) - set(got)) if want is not None else []
        kinds = Counter(r["claim_kind"] for r in rs)
        stops = Counter(s for r in rs if r["claim_kind"] != "detects" for s in r["stopped_by"])
        n, d = len(rs), kinds.get("detects", 0)
        met = n > 0 and not missing and (d >= MIN_DETECT_RATE * n if cell.expect == "detects" else d == 0)
        names = {k: v for r in rs for k, v in (r.get("check_names") or {}).items()}
        out.append({"cell": cell.name, "backbone": cell.backbone, "surface": cell.surface,
                    "heldout_wording": cell.heldout, "expect": cell.expect, "repeats": n,
                    "detects": d, "separates": kinds.get("separates", 0), "none": kinds.get("none", 0),
                    "stopped_by": dict(sorted(stops.items(), key=lambda kv: (-kv[1], kv[0]))),
                    "check_names": dict(sorted(names.items())), "missing_seeds": missing, "met": bool(met)})
    return out


def markdown(summary: list[dict], meta: dict) -> str:
    """The table as markdown, with the command, wall time and load."""
    lines = [
        "# Known answers end to end", "",
        f"`{meta['command']}` — {meta['runs']} runs of `train.py`, wall {_secs(meta['wall_s'])}, "
        f"load average {meta['load_before']} before / {meta['load_after']} after, {meta['when']}"
        f" ({meta.get('groups_done', '?')} of {meta.get('groups', '?')} groups; wall per group: "
        + ", ".join(f"{k} {_secs(v)}" for k, v in (meta.get("wall_s_by_group") or {}).items()) + ").", "",
        "| cell | backbone | surface | held-out wording | known answer | repeats | detects | separates | "
        "none | checks that stopped a refused \"detects\" (runs) | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        answer = f"detects (≥ {MIN_DETECT_RATE:.0%})" if s["expect"] == "detects" else "never detects"
        stops = ", ".join(f"check {k} ×{v}" for k, v in s["stopped_by"].items()) or "—"
        lines.append(f"| {s['cell']} | {s['backbone']} | {s['surface']} | {'on' if s['heldout_wording'] else 'off'} | "
                     f"{answer} | {s['repeats']} | {s['detects']} | {s['separates']} | {s['none']} | {stops} | "
                     f"{'yes' if s['met'] else '**NO**'}{_why_not(s)} |")
    names = {k: v for s in summary for k, v in (s.get("check_names") or {}).items()}
    if names:
        lines += ["", "Checks (PROTOCOL.md §7): " + "; ".join(
            f"{k} {v}" for k, v in sorted(names.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 99)) + "."]
    return "\n".join(lines) + "\n"


def _secs(v) -> str:
    """Seconds for the table; ``None`` (runs collected, not timed) as ``n/a``."""
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):.0f} s"


def _why_not(s: dict) -> str:
    if s["repeats"] == 0:
        return " (no run)"
    if s.get("missing_seeds"):
        return f" (no run on split seed{'s' if len(s['missing_seeds']) > 1 else ''} {', '.join(map(str, s['missing_seeds']))})"
    return ""


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
              collect: bool = False) -> tuple[list[dict], float | None]:
    """One multirun of ``train.py`` for cells that share a surface and a held-out setting.

    A group whose ``logs/<tag>.done.json`` holds the same command and the same code
    (:func:`_code_version`) is read, not rerun. Otherwise the group's run folder is emptied
    first; whatever the folder holds, only runs whose recorded overrides are exactly this
    command's, one per (cell, split seed) asked for, are read.

    Returns:
        ``(records, wall seconds)``; the wall is ``None`` for runs collected, not timed.

    Raises:
        RuntimeError: ``train.py`` failed (its log is named).
"""
    surface, heldout = cells[0].surface, cells[0].heldout
    tag = f"{surface}_{'heldout' if heldout else 'shared'}"
    sweep = out / "runs" / tag
    backbones = ",".join(c.backbone for c in cells)
    fixed = [f"evaluation.heldout_wording={str(heldout).lower()}", *RUN_OVERRIDES, *cells[0].overrides]
    cmd = [python, str(REPO_ROOT / "train.py"), "-m", f"surface={surface}", f"backbone={backbones}",
           f"split.seed={','.join(map(str, seeds))}", *fixed, f"hydra.sweep.dir={sweep}",
           "hydra.sweep.subdir=${hydra.job.num}", *extra]
    log = out / "logs" / f"{tag}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    done = out / "logs" / f"{tag}.done.json"
    prev = json.loads(done.read_text()) if done.is_file() else {}
    wall: float | None
    code = _code_version()  # once, before the run: the version the runs are made with
    if prev.get("cmd") == cmd and prev.get("code") == code:  # finished earlier: read it
        wall = float(prev["wall_s"])
        print(f"known answers: {tag}: reading the finished runs of the same command ({done}; delete it to rerun)",
              file=sys.stderr)
    elif collect:  # read what a stopped matrix finished
        wall = None
        if not sweep.is_dir():
            return [], wall
    else:
        done.unlink(missing_ok=True)
        if sweep.exists():  # an earlier invocation's runs: never read beside this one's
            shutil.rmtree(sweep)
        t0 = time.perf_counter()
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n")
            f.flush()
            rc = subprocess.run(cmd, cwd=REPO_ROOT, stdout=f, stderr=subprocess.STDOUT, env=_env()).returncode
        wall = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"known answers: train.py failed (exit {rc}) for {tag}; see {log}")
        atomic_write_text(done, json.dumps({"cmd": cmd, "code": code, "wall_s": round(wall, 1),
                                            "load_after": _load()}))
    # what each job of this command records in .hydra/overrides.yaml (Hydra's own parse, so that
    # `x=true` and `x=True` compare equal)
    expected = {(c.backbone, int(sd)): _canonical([f"surface={surface}", f"backbone={c.backbone}", f"split.seed={sd}",
                                                   *fixed, *extra])
                for c in cells for sd in seeds}
    records, foreign = [], 0
    for job in sorted(sweep.iterdir() if sweep.is_dir() else [], key=lambda p: int(p.name) if p.name.isdigit() else -1):
        cfg_path = job / ".hydra" / "overrides.yaml"
        if not (job / "results.json").is_file() or not cfg_path.is_file():
            continue
        ov_list = _read_overrides(cfg_path)
        ov = dict(o.split("=", 1) for o in ov_list if "=" in o)
        key = (ov.get("backbone"), int(ov["split.seed"]) if str(ov.get("split.seed", "")).lstrip("-").isdigit() else None)
        if expected.get(key) != _canonical(ov_list):
            foreign += 1
            continue
        cell = next(c for c in cells if c.backbone == key[0])
        records.append(run_record(job / "results.json", cell, key[1]))
    if foreign:
        print(f"known answers: {tag}: {foreign} run(s) in {sweep} were made by another command (other seeds, cells "
              "or overrides) and are not counted", file=sys.stderr)
    return records, wall


def _canonical(overrides: list[str]) -> list[tuple]:
    """Overrides as Hydra parses them (``x=true`` and ``x=True`` alike), to compare a job's with a command's."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return [(str(o.type), o.get_key_element(), repr(o.value()))
                for o in OverridesParser.create().parse_overrides(list(overrides))]
    except Exception:  # noqa: BLE001 - an unparsable override never matches
        return [("unparsable", *overrides)]


def _code_version() -> str:
    """The repository's commit and whether its tracked files differ from it (a rerun after a code
    change must not read the runs the old code made)."""
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=30).stdout.strip()
        diff = subprocess.run(["git", "diff", "HEAD", "--", "ipi", "conf", "train.py"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    import hashlib

    return f"{rev or 'unknown'}" + (f"+{hashlib.sha256(diff.encode()).hexdigest()[:12]}" if diff else "")


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
    """One table from several runs of this tool (e.g. a matrix run in parts); walls add up.

    Raises:
        SystemExit: A folder without ``known_answers.json``, parts whose extra ``train.py``
            overrides differ, or one (cell, split seed) in two parts (it would count twice).
    """
    parts = []
    for f in folders:
        path = Path(f) / "known_answers.json"
        if not path.is_file():
            raise SystemExit(f"--merge: {path} does not exist (run the tool with --out {f} first, or --collect it)")
        parts.append(json.loads(path.read_text()))
    overrides = {json.dumps(p["meta"].get("overrides")) for p in parts}
    if len(overrides) > 1:
        raise SystemExit("--merge: the parts ran train.py with different extra overrides ("
                         + "; ".join(f"{f}: {p['meta'].get('overrides')}" for f, p in zip(folders, parts))
                         + "): their runs are not repeats of one cell")
    records = [r for p in parts for r in p["runs"]]
    seen = Counter((r["cell"], r.get("split_seed")) for r in records)
    dup = sorted(k for k, n in seen.items() if n > 1)
    if dup:
        raise SystemExit("--merge: " + ", ".join(f"{c} split seed {sd}" for c, sd in dup)
                         + " appear in more than one part; each split must count once")
    asked = {s_["cell"] for p in parts for s_ in p["summary"]} | {r["cell"] for r in records}
    cells = [c for c in CELLS if c.name in asked]
    seeds: dict[str, list[int]] = {}
    for p in parts:  # the seeds each part asked for, per cell it asked for (older tables: none recorded)
        for name in p["meta"].get("cells") or []:
            seeds.setdefault(name, []).extend(p["meta"].get("seeds") or [])
    summary = summarise(records, cells, seeds={c.name: seeds[c.name] for c in cells if c.name in seeds} or None)
    metas = [p["meta"] for p in parts]
    walls = [m.get("wall_s") for m in metas]
    meta = {"command": "; ".join(m["command"] for m in metas), "runs": len(records),
            "wall_s": round(sum(walls), 1) if None not in walls else None,
            "wall_s_by_group": {f"{i}:{k}": v for i, m in enumerate(metas) for k, v in m["wall_s_by_group"].items()},
            "groups_done": sum(m.get("groups_done", 0) for m in metas), "groups": sum(m.get("groups", 0) for m in metas),
            "load_before": metas[0]["load_before"], "load_after": metas[-1]["load_after"], "cpus": metas[0].get("cpus"),
            "threads_per_run": metas[0].get("threads_per_run"), "when": metas[-1]["when"], "parts": folders,
            "overrides": metas[0].get("overrides"), "cells": [c.name for c in cells]}
    result = {"meta": meta, "summary": summary, "runs": records,
              "all_met": bool(summary) and all(s["met"] for s in summary)}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "known_answers.json", json.dumps(result, indent=2))
    atomic_write_text(out / "known_answers.md", markdown(summary, meta))
    print(markdown(summary, meta))
    return result


#: Keys the tool sets per group (the cell's backbone, surface, held-out wording, split seeds, run
#: folders): an extra override of one would silently replace it (Hydra keeps the last value) and
#: the table would name a backbone or known answer the runs never had.
TOOL_KEYS = ("surface", "backbone", "split.seed", "evaluation.heldout_wording", "hydra")


def _tool_key(override: str) -> str | None:
    """The :data:`TOOL_KEYS` entry ``override`` sets (``backbone.loader.plant.gain=0`` -> ``backbone``), or None."""
    key = override.split("=", 1)[0].lstrip("+~").strip()
    for k in TOOL_KEYS:
        if key == k or key.startswith(k + ".") or key.startswith(k + "@"):
            return k
    return None


def parse_cells(text: str) -> list[Cell]:
    """``--cells``: ``all`` or comma-separated cell names, each one of :data:`CELLS` (in matrix order).

    Raises:
        SystemExit: An unknown or empty name (named, with the cells there are).
    """
    if text.strip() == "all":
        return list(CELLS)
    names = [n.strip() for n in text.split(",")]
    known = {c.name for c in CELLS}
    bad = [n for n in names if n not in known]
    if bad:
        raise SystemExit(f"--cells: no such cell {', '.join(repr(b) for b in bad)}; "
                         f"cells: all, {', '.join(c.name for c in CELLS)}")
    return [c for c in CELLS if c.name in set(names)]


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
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: at least 1 (split seeds 0..R-1)")
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: at least 1")
    owned = [o for o in args.overrides if _tool_key(o)]
    if owned:
        ap.error(f"override(s) {' '.join(owned)}: the tool sets {', '.join(sorted({_tool_key(o) for o in owned}))} "
                 "per cell (the table names each cell's backbone and known answer); choose cells with --cells and "
                 "repeats with --repeats, or change a plant in conf/backbone/planted_*.yaml")
    cells = parse_cells(args.cells)
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
        summary = summarise(records, cells, seeds=seeds)
        meta = {"command": command, "runs": len(records), "wall_s": round(time.perf_counter() - t0, 1),
                "cells": [c.name for c in cells], "seeds": seeds, "overrides": list(args.overrides),
                "wall_s_by_group": dict(walls), "groups_done": len(walls), "groups": len(groups),
                "load_before": load_before, "load_after": _load(), "cpus": os.cpu_count(), "jobs": args.jobs,
                "threads_per_run": _env()["OMP_NUM_THREADS"], "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        result = {"meta": meta, "summary": summary, "runs": list(records),
                  "all_met": bool(summary) and all(s["met"] for s in summary)}
        atomic_write_text(out / "known_answers.json", json.dumps(result, indent=2))
        atomic_write_text(out / "known_answers.md", markdown(summary, meta))

    def run_chain(chain: list[tuple[str, bool]], bar) -> None:
        for surface, heldout in chain:
            tag = f"{surface}:{'heldout' if heldout else 'shared'}"
            bar.describe(f"known answers: {tag} running (groups of {len(seeds)} seeds x their cells)")
            recs, wall = run_group(groups[(surface, heldout)], seeds, out, args.overrides, args.python,
                                   collect=args.collect)
            with lock:
                records.extend(recs)
                walls[tag] = wall
                print(f"known answers: {surface} (held-out wording {'on' if heldout else 'off'}): {len(recs)} runs, "
                      f"{_secs(wall)}", file=sys.stderr)
                write_table()
                bar.advance()

    errors = []
    # groups done / all, elapsed, ETA (each group is one train.py multirun, minutes)
    with progress_bar("known answers (groups)", len(groups)) as bar, \
            ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for fut in [pool.submit(run_chain, ch, bar) for ch in chains(list(groups))]:
            try:
                fut.result()
            except (RuntimeError, ValueError) as e:  # one failed chain does not stop the others; named at the end
                errors.append(str(e))
    if not walls:
        write_table()
    if errors:
        raise SystemExit("\n".join(errors))
    print(markdown(result["summary"], result["meta"]))
    return result


if __name__ == "__main__":
    main()
