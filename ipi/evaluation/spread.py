"""Split spread: the estimands and claims of re-rolled trajectory splits (``split.repeats``).

The intervals of PROTOCOL.md §5 hold the split fixed, so re-rolling ``split.seed`` until a
verdict passes would be invisible in any one run. With ``split.repeats=R`` the run refits and
re-evaluates the whole pipeline on the splits of seeds ``split.seed + 1 … split.seed + R − 1``
and reports, beside the pre-registered split's verdict (which stays **the** verdict), each
estimand's min / median / max over all ``R`` splits and how many of them license each claim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ipi.metrics.keys import (CLAIM, CLAIMS as CLAIMS_KEY, E1, E2, E3, ESTIMANDS_KEY, ESTIMATE, N_SPLITS,
                              PREREGISTERED_SEED, SEEDS, SPREAD_MAX, SPREAD_MEDIAN, SPREAD_MIN, VERDICT, dotted)

__all__ = ["split_spread"]

CLAIMS = ("detects malicious content", "separates clean steps from this attack surface on this split", "none")


def _flat(results: Mapping) -> dict[str, float | None]:
    out = {E1: (results.get(E1) or {}).get(ESTIMATE), E2: (results.get(E2) or {}).get(ESTIMATE)}
    for c, iv in sorted((results.get(E3) or {}).items()):
        out[dotted(E3, c)] = (iv or {}).get(ESTIMATE)
    return out


def split_spread(main: Mapping, repeats: Sequence[Mapping], seeds: Sequence[int]) -> dict:
    """Spread over the pre-registered split (``main``) and the re-rolled ones.

    Args:
        main: The pre-registered split's results (estimands and verdict).
        repeats: Results of the other seeds, in order.
        seeds: All ``R`` seeds, the pre-registered one first.

    Returns:
        ``{"seeds", "n_splits", "preregistered_seed", "estimands": {k: {"min", "median", "max",
        "values"}}, "claims": {claim: number of splits licensing it}, "claim_by_seed"}``. A
        split licenses "separates ..." also when it licenses "detects ...": counts are of
        splits whose claim is *at least* that strong.
    """
    allr = [main, *repeats]
    if len(allr) != len(seeds):
        raise ValueError(f"split_spread: {len(allr)} results for {len(seeds)} seeds")
    flats = [_flat(r) for r in allr]
    est = {}
    for k in flats[0]:
        vals = [f.get(k) for f in flats]
        ok = [v for v in vals if v is not None]
        est[k] = {SPREAD_MIN: float(min(ok)) if ok else None, SPREAD_MEDIAN: float(np.median(ok)) if ok else None,
                  SPREAD_MAX: float(max(ok)) if ok else None, "values": vals}
    claims = [(r.get(VERDICT) or {}).get(CLAIM, CLAIMS[-1]) for r in allr]
    strength = {CLAIMS[0]: 2, CLAIMS[1]: 1}
    counts = {CLAIMS[0]: sum(strength.get(c, 0) >= 2 for c in claims),
              CLAIMS[1]: sum(strength.get(c, 0) >= 1 for c in claims)}
    return {SEEDS: [int(s) for s in seeds], N_SPLITS: len(allr), PREREGISTERED_SEED: int(seeds[0]),
            ESTIMANDS_KEY: est, CLAIMS_KEY: counts, "claim_by_seed": dict(zip(map(str, seeds), claims))}

