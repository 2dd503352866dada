"""Benchmarks: ``python -m ipi.bench [--only NAME]`` prints one JSON line per benchmark.

Speed targets live here, never in timed unit tests. Sections:

* ``bootstrap``: every estimand (E1, E2, E3 × 3 controls) × 1000 cluster-bootstrap replicates on a
  5,000-row score table, vectorised vs a plain loop over ``sklearn.metrics.roc_auc_score``, on one
  core (:func:`ipi.metrics.bench.bench_bootstrap`; target < 2 s, see docs/estimands.md).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable


def _bootstrap(args) -> dict:
    from ipi.metrics.bench import bench_bootstrap

    return bench_bootstrap(n_rows=args.rows, n_boot=args.n_boot, seed=args.seed)


#: Benchmark name -> function of the parsed arguments returning a JSON-ready dict.
BENCHMARKS: dict[str, Callable] = {"bootstrap": _bootstrap}


def main(argv: list[str] | None = None) -> list[dict]:
    """Run the selected benchmarks; print each result as one JSON line."""
    ap = argparse.ArgumentParser(prog="python -m ipi.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=sorted(BENCHMARKS), action="append",
                    help="run only this benchmark (repeatable; default: all)")
    ap.add_argument("--rows", type=int, default=5000, help="bootstrap: rows of the score table")
    ap.add_argument("--n-boot", type=int, default=1000, help="bootstrap: replicates")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = []
    for name in args.only or list(BENCHMARKS):
        rec = BENCHMARKS[name](args)
        print(json.dumps(rec), flush=True)
        out.append(rec)
    return out


if __name__ == "__main__":
    main()
