"""The self-test's runner: one simulated dataset through the real pipeline (split, probe, cross-fit,
:func:`~ipi.evaluation.assess.assess`) per job, the jobs of the coverage and sweep designs, and
the worker setup; see :mod:`ipi.tools.simulate`."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pandas as pd

from ipi.evaluation.assess import ScoreTables, Settings, assess
from ipi.evaluation.verdict import CLAIM_DETECTS
from ipi.metrics.compare import Estimates
from ipi.metrics.twins import rank_correlations
from ipi.detectors.crossfit import cross_fit
from ipi.probe.folds import make_folds
from ipi.progress import quiet_lightning
from ipi.protocol import CONTROLS
from ipi.reporting.sweep import claim_p_values, familywise, twin_e3_networks
from ipi.surfaces.bank import attack_text
from ipi.attacks.wording import wording_plan
from ipi.detectors.linear import LogisticDetector
from ipi.run.schemas import ProbeConf
from ipi.tools.simulate.truths import (ALL_TRUTHS, SPLITS, SWEEP_CELLS, SimParams, simulate_dataset, trajectory_ids,
                                       true_estimands)


#: The estimands :func:`true_estimands` returns.
_ESTIMAND_KEYS = ("e1", "e2", *(f"e3.{c}" for c in CONTROLS))


def _probe(l2: float) -> LogisticDetector:
    """The logistic probe at ``C = l2`` with the other ``probe.*`` settings at the schema's defaults, seed 0."""
    p = ProbeConf()
    return LogisticDetector(l2=l2, max_iter=p.max_iter, tol=p.tol, solver=p.solver.value, seed=0)


def _flat(est: Estimates) -> dict[str, dict]:
    """JSON-ready intervals by flat key: ``e1, e2, e3.<c>``; with twins ``diff.e3.<c>`` (E3 − mean
    twin E3, check 6's paired interval)."""
    main = est.main
    flat = {"e1": main.e1.to_dict(), "e2": main.e2.to_dict()}
    flat.update({f"e3.{c}": iv.to_dict() for c, iv in main.e3.items()})
    if est.random_twin is not None:
        flat.update({f"diff.e3.{c}": x.to_dict() for c, x in est.differences.twin.e3_mean.items()})
    return flat


def _split_and_templates(p: SimParams, rng: np.random.Generator, n_t: int):
    """Trajectory holdout, the held-out wording plan and the real template chooser."""

    split_seed = int(rng.integers(0, 2**31 - 1))
    folds = make_folds(trajectory_ids(n_t), p.split, test_fraction=p.test_fraction, k=p.k, seed=split_seed)
    plan = wording_plan(folds, split_seed) if p.heldout_wording else None

    def template_of(tid: str, st: int) -> int:
        fam = plan.family(tid) if plan is not None else None
        kw = {"templates": fam.templates, "goals": fam.goals} if fam is not None else {}
        return attack_text(tid, st, **kw)[1]["template"]

    test_templates = plan.families["test"].templates if plan is not None and p.split == "holdout" else None
    return folds, plan, template_of, test_templates


def run_dataset(p: SimParams, truth: str, index: int, seed: int, key: tuple | None = None) -> dict:
    """Simulate dataset ``index`` of ``truth`` and run the real pipeline on it.

    Seeds: ``numpy.random.SeedSequence(seed, spawn_key=key or (truth_index, index))`` drives the
    data, the split, the label permutation and the bootstrap draws, so a result does not depend
    on the number of workers; twin ``j`` (``p.n_twins`` of them, 0: check 6 NOT RUN) draws from
    ``spawn_key=(*key, 1, j)``, the token-identity gains of truth ``twin_seed`` from
    ``(*key, 2)``. Attack templates come from the real chooser restricted to each trajectory's
    held-out wording family (:func:`ipi.attacks.wording.wording_plan`).

    Returns:
        A JSON-ready record: truth, index, the claim, every check's status, each estimand's
        estimate/CI with its true value and whether the CI covers it, and the wall time.
"""

    t0 = time.perf_counter()
    pt = (replace(p, heldout_wording=False).for_truth("c") if truth == "c_shared" else p.for_truth(truth))
    holdout = pt.split == "holdout"
    ss = np.random.SeedSequence(seed, spawn_key=key if key is not None else (ALL_TRUTHS.index(truth), index))
    rng = np.random.default_rng(ss)
    key = key if key is not None else (ALL_TRUTHS.index(truth), index)
    folds, plan, template_of, test_templates = _split_and_templates(pt, rng, pt.n_trajectories)
    # Token-identity gains: 1 for every network, except under twin_seed (one draw per network,
    # index 0 the "trained" one: exchangeable with the twins).
    gains = (np.exp(pt.seed_sd * np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(*key, 2)))
                    .standard_normal(pt.n_twins + 1)) if truth == "twin_seed" else np.ones(pt.n_twins + 1))
    twins = [(np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(*key, 1, j))), float(gains[j]))
             for j in range(1, pt.n_twins + 1)]
    trained = ((np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(*key, 1, 0))), float(gains[0]))
               if truth == "twin_seed" else None)
    sim = simulate_dataset(pt, rng, template_of=template_of, twins=twins or None, trained=trained)
    meta, x, collapse, dirs = sim[:4]
    x_twins, dirs_twins = (sim[4], sim[5]) if twins else ([], [])
    perm_seed, boot_seed = (int(v) for v in rng.integers(0, 2**31 - 1, size=2))
    null_seed = int(rng.integers(0, 2**31 - 1))
    md = meta[["step", "horizon", "prompt_len", "delta_prompt_len"]].to_numpy(dtype=np.float64)
    probe = _probe(pt.l2)
    fits = cross_fit(probe, meta, x, folds, metadata=md, collapse=collapse, permuted=True, permute_seed=perm_seed,
                     l2=pt.l2, permutation_m=pt.permutation_m, permutation_seed=null_seed)
    main_table = fits.score_table(meta)
    # The random-weight twins: the same probe on the same folds (verdict check 6).
    twin_tables, twin_w = {}, []
    for j, xt in enumerate(x_twins, start=1):
        tf = cross_fit(probe, meta, xt, folds, l2=pt.l2)
        tbl = main_table[["trajectory_id", "step", "variant"]].copy()
        tbl["score"] = tf.test_scores
        twin_tables[j] = tbl
        twin_w.append(tf.fitted[0].probe_.effective_weights()[0].detach().numpy())
    assessed = assess(ScoreTables(main_table, fits.baselines, twin_tables or None, fits.permutation_input()),
                      Settings(n_boot=pt.n_boot, seed=boot_seed, pretrained=True if twin_tables else None,
                               min_clusters=pt.min_clusters, heldout_wording=pt.heldout_wording, split=pt.split))
    v, perm = assessed.verdict, assessed.estimates.permutation
    w, _ = fits.fitted[0].probe_.effective_weights()
    p_trained = pt.twin(trained[1]) if trained is not None else pt
    # The analytic truth is one probe's; K-fold scores come from k probes (no single target).
    truth_vals = (true_estimands(w.detach().numpy(), p_trained, dirs, test_templates) if holdout
                  else dict.fromkeys(_ESTIMAND_KEYS))
    if twin_tables and holdout:
        tv = [true_estimands(wt, pt.twin(float(g)), dt, test_templates)
              for wt, dt, g in zip(twin_w, dirs_twins, gains[1:])]
        for c in CONTROLS:
            truth_vals[f"diff.e3.{c}"] = truth_vals[f"e3.{c}"] - float(np.mean([t[f"e3.{c}"] for t in tv]))
        # Does the trained probe beat every twin in the population (the event exchangeability bounds)?
        beats_all = all(truth_vals[f"e3.{c}"] > max(t[f"e3.{c}"] for t in tv) for c in CONTROLS)
    else:
        beats_all = None
    res = assessed.to_dict()
    p_sep, p_det = claim_p_values(res)
    twin_e3 = twin_e3_networks(res)
    est = {}
    for key, iv in _flat(assessed.estimates).items():
        tv = truth_vals.get(key)
        est[key] = {**iv, "true": tv,
                    "covered": (None if tv is None else
                                bool(iv["ci_low"] is not None and iv["ci_low"] <= tv <= iv["ci_high"]))}
    return {
        "truth": truth,
        "split": pt.split,
        "index": index,
        "claim": v.claim,
        "checks": {str(c.id): c.status for c in v.checks},
        "estimands": est,
        "baselines": {k: b.e1.to_dict()["estimate"] for k, b in assessed.estimates.baselines.items()},
        "permutation": ({"p_value": perm.p_value, "null_mean": perm.null_mean, "null_sd": perm.null_sd,
                         "e1_refit": perm.e1_refit} if perm is not None else None),
        "n_test_trajectories": len(set().union(*(set(te) for _, te in folds))),
        "p_separates": p_sep,
        "p_detects": p_det,
        "twin_e3": list(twin_e3) if twin_e3 is not None else None,
        "n_twins": len(twin_tables),
        "twin_guards": list(assessed.estimates.random_twin.guards) if twin_tables else None,
        "twin_rank_correlation_max": _max_twin_rank_correlation(twin_tables),
        "true_beats_every_twin": beats_all,
        "gains": [float(g) for g in gains] if truth == "twin_seed" else None,
        "seconds": time.perf_counter() - t0,
    }


def _max_twin_rank_correlation(twin_tables: dict) -> float | None:
    """The largest Spearman correlation between two twins' scores (what check 6's distinctness guard
    reads; :func:`ipi.metrics.twins.rank_correlations`), or None with fewer than two twins."""
    if len(twin_tables) < 2:
        return None
    return float(max(rank_correlations({k: t["score"].to_numpy() for k, t in twin_tables.items()}).values()))


def trajectories_for_test_size(p: SimParams, n_test: int) -> int:
    """Trajectories ``n`` whose holdout at ``p.test_fraction`` tests exactly ``n_test`` of them."""
    n = max(2, int(round(n_test / p.test_fraction)))
    while round(p.test_fraction * n) < n_test:
        n += 1
    while round(p.test_fraction * n) > n_test:
        n -= 1
    return n


def null_params(p: SimParams, split: str, n_test: int) -> SimParams:
    """The "separates" design: ``split`` at ``n_test`` test trajectories (holdout: the test half of
    a larger set; K-fold: ``n_test`` trajectories, every one tested); no twins. Holdout runs no
    permutation refits (check 1 reads the bootstrap alone); K-fold runs check 4's M refits, which
    check 1 needs there (PROTOCOL.md §7.1)."""
    n = trajectories_for_test_size(p, n_test) if split == "holdout" else int(n_test)
    return replace(p, split=split, n_trajectories=n, n_twins=0,
                   permutation_m=0 if split == "holdout" else p.permutation_m)


def coverage_dataset(p: SimParams, n_test: int, index: int, seed: int) -> dict:
    """Interval coverage on one truth-(a) dataset with ``n_test`` test trajectories.

    The dataset has ``n`` trajectories with ``round(test_fraction · n) == n_test``; only the
    probe is fitted (the baselines do not enter E1/E2/E3), its test rows are scored and
    bootstrapped once per interval method (expanded, percentile) on the same draws, and each interval is checked
    against the fitted probe's analytic population estimand (:func:`true_estimands`).

    Returns:
        ``{"n_test", "index", "covered": {method: {estimand: bool}}, "width": {method: {estimand: float}}}``.
    """

    n = trajectories_for_test_size(p, n_test)
    pt = replace(p.for_truth("a"), n_trajectories=n, split="holdout")
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(20, n_test, index)))
    folds, plan, template_of, test_templates = _split_and_templates(pt, rng, n)
    meta, x, _, dirs = simulate_dataset(pt, rng, template_of=template_of)
    boot_seed = int(rng.integers(0, 2**31 - 1))
    fits = cross_fit(_probe(pt.l2), meta, x, folds, l2=pt.l2)
    table = fits.score_table(meta)
    w, _ = fits.fitted[0].probe_.effective_weights()
    truth_vals = true_estimands(w.detach().numpy(), pt, dirs, test_templates)
    covered, width = {}, {}
    for method in ("expanded", "percentile"):
        res = _flat(assess(ScoreTables(table), Settings(n_boot=pt.n_boot, seed=boot_seed, interval=method)).estimates)
        covered[method] = {k: bool(iv["ci_low"] is not None and iv["ci_low"] <= truth_vals[k] <= iv["ci_high"])
                           for k, iv in res.items()}
        width[method] = {k: (iv["ci_high"] - iv["ci_low"]) if iv["ci_low"] is not None else None
                         for k, iv in res.items()}
    return {"n_test": len(folds[0][1]), "index": index, "covered": covered, "width": width}


def sweep_dataset(p: SimParams, index: int, seed: int, n_cells: int = SWEEP_CELLS) -> dict:
    """One simulated ``n_cells``-cell sweep under truth (b); claims with and without Holm.

    Every cell is a full :func:`run_dataset` under truth (b) with its own features (independent
    cells: the least favourable case for a family of tests). The family-wise claim of each cell
    is what ``python -m ipi.reporting.sweep`` licenses (:func:`ipi.reporting.sweep.familywise`);
    with twins, check 6's family-wise rank part is applied as
    :func:`ipi.reporting.sweep.familywise_rank` applies it.

    Returns:
        ``{"index", "n_cells", "nominal_any_detects", "familywise_any_detects",
        "familywise_any_separates", "rank_familywise_any" (None without twins), "p_detects_min",
        "seconds"}``.
"""

    cells = [run_dataset(p, "b", index, seed, key=(30, index, j)) for j in range(n_cells)]
    df = pd.DataFrame({"job": [str(j) for j in range(n_cells)], "overrides": [f"cell={j}" for j in range(n_cells)],
                       "claim": [c["claim"] for c in cells], "p_separates": [c["p_separates"] for c in cells],
                       "p_detects": [c["p_detects"] for c in cells]})
    if all(c.get("twin_e3") is not None for c in cells):
        # check 6's family-wise rank part, as the sweep report applies it (the twins of each cell
        # are exchangeable with its trained network, cells independent: jointly exchangeable)
        df["_twin_e3"] = [c["twin_e3"] for c in cells]
    fw = familywise(df, alpha=(1.0 - 0.95) / 2.0)
    return {"index": index, "n_cells": n_cells,
            "nominal_any_detects": bool((df.claim == CLAIM_DETECTS).any()),
            "familywise_any_detects": bool((fw.claim_familywise == CLAIM_DETECTS).any()),
            "familywise_any_separates": bool((fw.claim_familywise != "none").any()),
            "rank_familywise_any": (bool(any(fw.rank_familywise)) if fw.rank_familywise.notna().all() else None),
            "p_detects_min": float(df.p_detects.min()),
            "seconds": float(sum(c["seconds"] for c in cells))}


def init_worker() -> None:
    import torch

    torch.set_num_threads(1)

    quiet_lightning()


def run_job(args) -> dict:
    kind, rest = args[0], args[1:]
    if kind == "null":  # (p, split, n_test, index, seed[, truth]): "separates" under the null or under (a)
        p, split, n_test, index, seed, *truth = rest
        truth = truth[0] if truth else "null"
        key = (40 if truth == "null" else 41, SPLITS.index(split), n_test or 0, index)
        rec = run_dataset(null_params(p, split, n_test), truth, index, seed, key=key)
        return {"kind": "null", "design": "separates", **rec}
    if kind == "coverage":
        return {"kind": "coverage", **coverage_dataset(*rest)}
    if kind == "sweep":
        return {"kind": "sweep", **sweep_dataset(*rest)}
    p, truth, index, seed = rest
    key = None if p.split == "holdout" else (ALL_TRUTHS.index(truth), index, 1 + SPLITS.index(p.split))
    return run_dataset(p, truth, index, seed, key=key)


def job_id(job: tuple) -> str:
    """A job's identity in the journal: its kind and its place (truth, split, size, index), not ``p``.

    The parameters are the same for every job of one command; a journal is only valid for the
    command that wrote it (the CLI refuses nothing here: use one journal per command line).
    """
    kind = job[0]
    if kind == "sweep":
        return f"sweep/{job[2]}/{job[3]}"
    if kind == "coverage":
        return f"coverage/{job[2]}/{job[3]}/{job[4]}"
    if kind == "null":
        truth = job[6] if len(job) > 6 else "null"
        return f"{'null' if truth == 'null' else 'separates-' + truth}/{job[2]}/{job[3]}/{job[4]}/{job[5]}"
    return f"run/{job[1].split}/{job[2]}/{job[3]}/{job[4]}"
