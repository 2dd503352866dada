"""The report's behaviour stage (docs/behaviour.md): its verdict lines and its sections.

Read from ``results.json``'s ``behaviour`` block (a run with ``behaviour.enabled``); a run
without it gets nothing from here, so its report is unchanged. Every line and section names the
measure its numbers come from: **free run** (generated actions labelled hijacked / resisted /
other) or **likelihood** (the teacher-forced hijack propensity shift, the block's ``likelihood``).

* **Verdict lines**: after the verdict's checks, the separately labelled claims of each measure
  that ran — free run: "predicts hijack" (E4) and "uses this direction" (the ablation);
  likelihood: "predicts hijack" (E4 (likelihood)) and "lowers the hijack shift" (its ablation) —
  each with its status and detail; they are not checks of PROTOCOL.md §7 and never change the
  licensed claim above them.
* **Behaviour (free run)** section, right after the estimands: the warning when the backbone's
  weights are not trained (the labels are then meaningless), the label counts, the hijack rate
  per surface × variant, E4 with its C1 analogue and gate, and the ablation table (hijack rate of
  each arm, the paired changes, probe − random).
* **Behaviour (likelihood)** section after it: what is scored, the rows with and without a goal
  action, E4 (likelihood) with C1 and the gate, ρ(score, shift), the mean shift, and the ablation
  table (mean shift of each arm, the paired changes, probe − random).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ipi.evaluation.results import ResultsView
from ipi.metrics.keys import (ABLATION, ARM_NONE, ARM_PROBE, ARM_RANDOM, ATTACK_ROWS, BEHAVIOUR, BY_VARIANT, C1_E4,
                              CHANGED_LABELS, CHANGES, CLAIMS, COUNTS, CUT_BY_MAX_NEW_TOKENS, DETAIL, E4,
                              E4_MINUS_C1_E4, HIJACKED, LABELS_FILE, LAYERS, LIKELIHOOD, LOWERS_SHIFT, MAX_NEW_TOKENS,
                              MEAN_SHIFT, N_CLUSTERS, N_ROWS, NO_GOAL_ACTION, NO_GOAL_ACTION_BY_FAMILY, NOT_ESTIMABLE,
                              NOTE, OTHER, PREDICTS_HIJACK, PROBE_MINUS_RANDOM, RANDOM_SEED, RATES, REPORTABLE,
                              RESISTED, ROWS, SCORED, SETTINGS, SHIFT_NOT_POSITIVE, SHIFT_POSITIVE, SHIFT_REPORTABLE,
                              SPEARMAN, STATUS, TABLE_FILE, TRAJECTORIES, UNPARSED, USES_DIRECTION, VARIANTS,
                              WITH_GOAL_ACTION)
from ipi.reporting import layout

__all__ = ["CLAIM_LINES", "LIKELIHOOD_CLAIM_LINES", "sections", "verdict_blocks", "with_behaviour"]

#: The free run's separately labelled claims: (results key, id shown, name shown).
CLAIM_LINES = ((PREDICTS_HIJACK, "E4", "predicts hijack"), (USES_DIRECTION, "ablation", "uses this direction"))
#: The likelihood measure's (the block's ``likelihood.claims``).
LIKELIHOOD_CLAIM_LINES = ((PREDICTS_HIJACK, "E4 (likelihood)", "predicts hijack"),
                          (LOWERS_SHIFT, "ablation (likelihood)", "lowers the hijack shift"))
SEPARATE_NOTE = ("Separately labelled claims of the behaviour stage (docs/behaviour.md; E4 and ablation: free run, "
                 "E4 (likelihood) and ablation (likelihood): teacher-forced likelihood): not checks of "
                 "PROTOCOL.md §7; they never change the licensed claim above.")


def _block(results: Mapping) -> Mapping | None:
    b = results.get(BEHAVIOUR)
    return b if isinstance(b, Mapping) else None


def verdict_blocks(results: Mapping) -> list:
    """The verdict section's extra blocks: the note, then one line per separately labelled claim."""
    b = _block(results)
    if b is None:
        return []
    out: list = [layout.Text(SEPARATE_NOTE, "strong")]
    if b.get(NOTE):
        out.append(layout.Text(b[NOTE], "warn"))
    lines = [(ResultsView(b).section(CLAIMS), CLAIM_LINES)] if _free_run(b) else []
    lik = b.get(LIKELIHOOD)
    if isinstance(lik, Mapping):
        lines.append((ResultsView(lik).section(CLAIMS), LIKELIHOOD_CLAIM_LINES))
    for got, names in lines:
        for key, cid, name in names:
            c = got.get(key) or {}
            out.append(layout.CheckLine(cid, name, str(c.get(STATUS, "NOT RUN")), str(c.get(DETAIL, "")), ()))
    return out


def _free_run(b: Mapping) -> bool:
    """Whether the free run ran (its ``e4``; a block without ``measure`` is a free-run block)."""
    return E4 in b


def _why(reason) -> str:
    return "yes" if reason is None else f"no: {reason}"


def sections(results: Mapping) -> list:
    """The "Behaviour (free run)" and "Behaviour (likelihood)" sections of the measures that ran."""
    b = _block(results)
    if b is None:
        return []
    out = _free_run_section(b) if _free_run(b) else []
    if isinstance(b.get(LIKELIHOOD), Mapping):
        out.append(_likelihood_section(b, b[LIKELIHOOD]))
    return out


def _free_run_section(b: Mapping) -> list:
    """The free run's section (module docstring)."""
    view = ResultsView(b)
    blocks: list = []
    if b.get(NOTE):
        blocks.append(layout.Text(b[NOTE], "warn"))
    s, counts = view.section(SETTINGS), view.section(COUNTS)
    blocks.append(layout.Text(
        f"The backbone's own next action on {counts.get(ROWS, '?')} test rows of "
        f"{counts.get(TRAJECTORIES, '?')} trajectories ({', '.join(s.get(VARIANTS, []))}; greedy, at most "
        f"{s.get(MAX_NEW_TOKENS, '?')} new tokens; {counts.get(CUT_BY_MAX_NEW_TOKENS, '?')} cut by the bound, "
        f"{counts.get(UNPARSED, '?')} with no parsable action), labelled hijacked / resisted / other "
        f"against the goal of the step's attack row; the labels with the generated text are in "
        f"{b.get(LABELS_FILE, '?')}.", "muted"))
    blocks.append(layout.Grid(("variant", "hijacked", "resisted", "other"),
                              tuple((v, *(str(c.get(k, 0)) for k in (HIJACKED, RESISTED, OTHER)))
                                    for v, c in view.section(COUNTS, BY_VARIANT).items())))
    blocks.append(layout.Text("Hijack rate per surface × variant (step-weighted; cluster-bootstrap CI over test "
                              "trajectories). Clean and control rows: the attacker's action without the injection.",
                              "strong"))
    blocks.append(layout.Grid(("surface · variant", "hijack rate", "rows", "trajectories"),
                              tuple((f"{surf} · {v}", layout.Estimate(r), str(r.get(N_ROWS, "?")),
                                     str(r.get(N_CLUSTERS, "?")))
                                    for surf, by in view.section(RATES).items() for v, r in by.items())))
    e4, rep, ec = view.section(E4), view.section(E4, REPORTABLE), view.section(E4, COUNTS)
    blocks.append(layout.Text(
        f"E4 = AUC(probe score | hijacked vs resisted attack rows): {ec.get(HIJACKED, 0)} hijacked, "
        f"{ec.get(RESISTED, 0)} resisted, {ec.get(OTHER, 0)} other; {e4.get(N_CLUSTERS, 0)} trajectories "
        "hold both kinds (the gate's count).", "strong"))
    rows = [("E4 (probe)", layout.Estimate(e4.get(E4)), _why(rep.get(E4)))]
    if C1_E4 in e4:
        rows += [("E4 of C1 (metadata)", layout.Estimate(e4.get(C1_E4)), _why(rep.get(C1_E4))),
                 ("E4 − C1 E4", layout.Estimate(e4.get(E4_MINUS_C1_E4)), _why(rep.get(E4_MINUS_C1_E4)))]
    blocks.append(layout.Grid(("estimand", "value", "reportable"), tuple(rows)))
    ab = b.get(ABLATION)
    if isinstance(ab, Mapping):
        r, ch = ab.get(RATES) or {}, ab.get(CHANGES) or {}
        changed = ab.get(CHANGED_LABELS) or {}
        blocks.append(layout.Text(
            f"Ablation on {ab.get(N_ROWS, '?')} attack rows of {ab.get(N_CLUSTERS, '?')} trajectories: the "
            f"probe's direction (each fold's probe) projected out of the residual stream at blocks "
            f"{ab.get(LAYERS)} at every position, against a random direction of equal norm "
            f"(seed {ab.get(RANDOM_SEED)}); paired cluster-bootstrap CIs.", "strong"))
        blocks.append(layout.Grid(("arm", "hijack rate", "change vs no ablation", "labels changed"), (
            ("no ablation", layout.Estimate(r.get(ARM_NONE)), "", ""),
            ("probe direction", layout.Estimate(r.get(ARM_PROBE)), layout.Estimate(ch.get(ARM_PROBE)),
             str(changed.get(ARM_PROBE, "?"))),
            ("random direction", layout.Estimate(r.get(ARM_RANDOM)), layout.Estimate(ch.get(ARM_RANDOM)),
             str(changed.get(ARM_RANDOM, "?"))),
            ("Δ probe − Δ random", layout.Estimate(ab.get(PROBE_MINUS_RANDOM)), "", ""))))
    else:
        blocks.append(layout.Text("Ablation not run (behaviour.ablation.enabled=false).", "muted"))
    summary = " · ".join(f"{name}: {view.section(CLAIMS, key).get(STATUS, 'NOT RUN')}" for key, _, name in CLAIM_LINES)
    return [layout.Section("behaviour", "Behaviour (free run)", tuple(blocks), summary=summary)]


def _likelihood_section(b: Mapping, lik: Mapping) -> layout.Section:
    """The likelihood measure's section (module docstring)."""
    view = ResultsView(lik)
    blocks: list = []
    if b.get(NOTE) and not _free_run(b):
        blocks.append(layout.Text(b[NOTE], "warn"))
    c, e4 = view.section(COUNTS), view.section(E4)
    ec, rep, srep = view.section(E4, COUNTS), view.section(E4, REPORTABLE), view.section(E4, SHIFT_REPORTABLE)
    blocks.append(layout.Text(
        f"Teacher-forced hijack propensity on {c.get(ROWS, '?')} attack and clean test rows of "
        f"{c.get(TRAJECTORIES, '?')} trajectories (no generation): {lik.get(SCORED, '')}. "
        f"{c.get(WITH_GOAL_ACTION, '?')} of {c.get(ATTACK_ROWS, '?')} attack rows have a goal action "
        f"(none: {c.get(NO_GOAL_ACTION_BY_FAMILY) or {}}); every row is in {lik.get(TABLE_FILE, '?')}.", "muted"))
    blocks.append(layout.Text(
        f"E4 (likelihood) = AUC(probe score | attack rows with shift > 0 vs shift ≤ 0): "
        f"{ec.get(SHIFT_POSITIVE, 0)} with shift > 0, {ec.get(SHIFT_NOT_POSITIVE, 0)} ≤ 0, "
        f"{ec.get(NO_GOAL_ACTION, 0)} without a goal action; {e4.get(N_CLUSTERS, 0)} trajectories hold both "
        "kinds (the gate's count)." + (f" Not estimable: {e4[NOT_ESTIMABLE]}." if e4.get(NOT_ESTIMABLE) else ""),
        "strong"))
    rows = [("E4 (likelihood, probe)", layout.Estimate(e4.get(E4)), _why(rep.get(E4)))]
    if C1_E4 in e4:
        rows += [("E4 (likelihood) of C1 (metadata)", layout.Estimate(e4.get(C1_E4)), _why(rep.get(C1_E4))),
                 ("E4 − C1 E4 (likelihood)", layout.Estimate(e4.get(E4_MINUS_C1_E4)), _why(rep.get(E4_MINUS_C1_E4)))]
    rows += [("ρ(score, shift) (likelihood)", layout.Estimate(e4.get(SPEARMAN)), _why(srep.get(SPEARMAN))),
             ("mean shift, nats (likelihood)", layout.Estimate(e4.get(MEAN_SHIFT)), _why(srep.get(MEAN_SHIFT)))]
    blocks.append(layout.Grid(("estimand", "value", "reportable"), tuple(rows)))
    ab = lik.get(ABLATION)
    if isinstance(ab, Mapping):
        ms, ch = ab.get(MEAN_SHIFT) or {}, ab.get(CHANGES) or {}
        blocks.append(layout.Text(
            f"Ablation (likelihood) on {ab.get(N_ROWS, '?')} attack rows of {ab.get(N_CLUSTERS, '?')} "
            f"trajectories: attack and clean rows scored again with each fold's probe direction projected out at "
            f"blocks {ab.get(LAYERS)}, and with a random direction of equal norm (seed {ab.get(RANDOM_SEED)}); "
            "mean shift in nats, paired cluster-bootstrap CIs.", "strong"))
        blocks.append(layout.Grid(("arm", "mean shift", "change vs no ablation"), (
            ("no ablation", layout.Estimate(ms.get(ARM_NONE)), ""),
            ("probe direction", layout.Estimate(ms.get(ARM_PROBE)), layout.Estimate(ch.get(ARM_PROBE))),
            ("random direction", layout.Estimate(ms.get(ARM_RANDOM)), layout.Estimate(ch.get(ARM_RANDOM))),
            ("Δ probe − Δ random", layout.Estimate(ab.get(PROBE_MINUS_RANDOM)), ""))))
    else:
        why = view.section(CLAIMS).get(LOWERS_SHIFT, {}).get(DETAIL, "")
        blocks.append(layout.Text(f"Ablation (likelihood) not run: {why}.", "muted"))
    summary = " · ".join(f"{cid}: {view.section(CLAIMS, key).get(STATUS, 'NOT RUN')}"
                         for key, cid, _ in LIKELIHOOD_CLAIM_LINES)
    return layout.Section("behaviour_likelihood", "Behaviour (likelihood)", tuple(blocks), summary=summary)


def with_behaviour(report: list, results: Mapping) -> list:
    """``report`` with the verdict's extra lines and the behaviour section right after the estimands
    (after the verdict when there is no estimands section); unchanged without a ``behaviour`` block."""
    if _block(results) is None:
        return report
    out = [replace(s, blocks=(*s.blocks, *verdict_blocks(results))) if s.id == "verdict" else s for s in report]
    ids = [s.id for s in out]
    at = next((ids.index(k) + 1 for k in ("estimands", "verdict") if k in ids), 0)
    return [*out[:at], *sections(results), *out[at:]]
