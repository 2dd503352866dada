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

from ipi.metrics.keys import BEHAVIOUR
from ipi.reporting import layout

__all__ = ["CLAIM_LINES", "LIKELIHOOD_CLAIM_LINES", "sections", "verdict_blocks", "with_behaviour"]

#: The free run's separately labelled claims: (results key, id shown, name shown).
CLAIM_LINES = (("predicts_hijack", "E4", "predicts hijack"), ("uses_direction", "ablation", "uses this direction"))
#: The likelihood measure's (the block's ``likelihood.claims``).
LIKELIHOOD_CLAIM_LINES = (("predicts_hijack", "E4 (likelihood)", "predicts hijack"),
                          ("lowers_shift", "ablation (likelihood)", "lowers the hijack shift"))
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
    claims = b.get("claims") or {}
    out: list = [layout.Text(SEPARATE_NOTE, "strong")]
    if b.get("note"):
        out.append(layout.Text(b["note"], "warn"))
    lines = [(claims, CLAIM_LINES)] if _free_run(b) else []
    lik = b.get("likelihood")
    if isinstance(lik, Mapping):
        lines.append((lik.get("claims") or {}, LIKELIHOOD_CLAIM_LINES))
    for got, names in lines:
        for key, cid, name in names:
            c = got.get(key) or {}
            out.append(layout.CheckLine(cid, name, str(c.get("status", "NOT RUN")), str(c.get("detail", "")), ()))
    return out


def _free_run(b: Mapping) -> bool:
    """Whether the free run ran (its ``e4``; a block without ``measure`` is a free-run block)."""
    return "e4" in b


def _why(reason) -> str:
    return "yes" if reason is None else f"no: {reason}"


def sections(results: Mapping) -> list:
    """The "Behaviour (free run)" and "Behaviour (likelihood)" sections of the measures that ran."""
    b = _block(results)
    if b is None:
        return []
    out = _free_run_section(b) if _free_run(b) else []
    if isinstance(b.get("likelihood"), Mapping):
        out.append(_likelihood_section(b, b["likelihood"]))
    return out


def _free_run_section(b: Mapping) -> list:
    """The free run's section (module docstring)."""
    blocks: list = []
    if b.get("note"):
        blocks.append(layout.Text(b["note"], "warn"))
    s = b.get("settings") or {}
    counts = b.get("counts") or {}
    blocks.append(layout.Text(
        f"The backbone's own next action on {counts.get('rows', '?')} test rows of "
        f"{counts.get('trajectories', '?')} trajectories ({', '.join(s.get('variants', []))}; greedy, at most "
        f"{s.get('max_new_tokens', '?')} new tokens; {counts.get('cut_by_max_new_tokens', '?')} cut by the bound, "
        f"{counts.get('unparsed', '?')} with no parsable action), labelled hijacked / resisted / other "
        f"against the goal of the step's attack row; the labels with the generated text are in "
        f"{b.get('labels_file', '?')}.", "muted"))
    by_v = counts.get("by_variant") or {}
    blocks.append(layout.Grid(("variant", "hijacked", "resisted", "other"),
                              tuple((v, *(str(c.get(k, 0)) for k in ("hijacked", "resisted", "other")))
                                    for v, c in by_v.items())))
    rates = b.get("rates") or {}
    blocks.append(layout.Text("Hijack rate per surface × variant (step-weighted; cluster-bootstrap CI over test "
                              "trajectories). Clean and control rows: the attacker's action without the injection.",
                              "strong"))
    blocks.append(layout.Grid(("surface · variant", "hijack rate", "rows", "trajectories"),
                              tuple((f"{surf} · {v}", layout.Estimate(r), str(r.get("n_rows", "?")),
                                     str(r.get("n_clusters", "?")))
                                    for surf, by in rates.items() for v, r in by.items())))
    e4 = b.get("e4") or {}
    rep = e4.get("reportable") or {}
    ec = e4.get("counts") or {}
    blocks.append(layout.Text(
        f"E4 = AUC(probe score | hijacked vs resisted attack rows): {ec.get('hijacked', 0)} hijacked, "
        f"{ec.get('resisted', 0)} resisted, {ec.get('other', 0)} other; {e4.get('n_clusters', 0)} trajectories "
        "hold both kinds (the gate's count).", "strong"))
    rows = [("E4 (probe)", layout.Estimate(e4.get("e4")), _why(rep.get("e4")))]
    if "c1_e4" in e4:
        rows += [("E4 of C1 (metadata)", layout.Estimate(e4.get("c1_e4")), _why(rep.get("c1_e4"))),
                 ("E4 − C1 E4", layout.Estimate(e4.get("e4_minus_c1_e4")), _why(rep.get("e4_minus_c1_e4")))]
    blocks.append(layout.Grid(("estimand", "value", "reportable"), tuple(rows)))
    ab = b.get("ablation")
    if isinstance(ab, Mapping):
        r, ch = ab.get("rates") or {}, ab.get("changes") or {}
        changed = ab.get("changed_labels") or {}
        blocks.append(layout.Text(
            f"Ablation on {ab.get('n_rows', '?')} attack rows of {ab.get('n_clusters', '?')} trajectories: the "
            f"probe's direction (each fold's probe) projected out of the residual stream at blocks "
            f"{ab.get('layers')} at every position, against a random direction of equal norm "
            f"(seed {ab.get('random_seed')}); paired cluster-bootstrap CIs.", "strong"))
        blocks.append(layout.Grid(("arm", "hijack rate", "change vs no ablation", "labels changed"), (
            ("no ablation", layout.Estimate(r.get("none")), "", ""),
            ("probe direction", layout.Estimate(r.get("probe")), layout.Estimate(ch.get("probe")),
             str(changed.get("probe", "?"))),
            ("random direction", layout.Estimate(r.get("random")), layout.Estimate(ch.get("random")),
             str(changed.get("random", "?"))),
            ("Δ probe − Δ random", layout.Estimate(ab.get("probe_minus_random")), "", ""))))
    else:
        blocks.append(layout.Text("Ablation not run (behaviour.ablation.enabled=false).", "muted"))
    claims = b.get("claims") or {}
    summary = " · ".join(f"{name}: {(claims.get(key) or {}).get('status', 'NOT RUN')}"
                         for key, _, name in CLAIM_LINES)
    return [layout.Section("behaviour", "Behaviour (free run)", tuple(blocks), summary=summary)]


def _likelihood_section(b: Mapping, lik: Mapping) -> layout.Section:
    """The likelihood measure's section (module docstring)."""
    blocks: list = []
    if b.get("note") and not _free_run(b):
        blocks.append(layout.Text(b["note"], "warn"))
    c = lik.get("counts") or {}
    e4 = lik.get("e4") or {}
    ec, rep, srep = e4.get("counts") or {}, e4.get("reportable") or {}, e4.get("shift_reportable") or {}
    blocks.append(layout.Text(
        f"Teacher-forced hijack propensity on {c.get('rows', '?')} attack and clean test rows of "
        f"{c.get('trajectories', '?')} trajectories (no generation): {lik.get('scored', '')}. "
        f"{c.get('with_goal_action', '?')} of {c.get('attack_rows', '?')} attack rows have a goal action "
        f"(none: {c.get('no_goal_action_by_family') or {}}); every row is in {lik.get('table_file', '?')}.", "muted"))
    blocks.append(layout.Text(
        f"E4 (likelihood) = AUC(probe score | attack rows with shift > 0 vs shift ≤ 0): "
        f"{ec.get('shift_positive', 0)} with shift > 0, {ec.get('shift_not_positive', 0)} ≤ 0, "
        f"{ec.get('no_goal_action', 0)} without a goal action; {e4.get('n_clusters', 0)} trajectories hold both "
        "kinds (the gate's count)." + (f" Not estimable: {e4['not_estimable']}." if e4.get("not_estimable") else ""),
        "strong"))
    rows = [("E4 (likelihood, probe)", layout.Estimate(e4.get("e4")), _why(rep.get("e4")))]
    if "c1_e4" in e4:
        rows += [("E4 (likelihood) of C1 (metadata)", layout.Estimate(e4.get("c1_e4")), _why(rep.get("c1_e4"))),
                 ("E4 − C1 E4 (likelihood)", layout.Estimate(e4.get("e4_minus_c1_e4")),
                  _why(rep.get("e4_minus_c1_e4")))]
    rows += [("ρ(score, shift) (likelihood)", layout.Estimate(e4.get("spearman")), _why(srep.get("spearman"))),
             ("mean shift, nats (likelihood)", layout.Estimate(e4.get("mean_shift")), _why(srep.get("mean_shift")))]
    blocks.append(layout.Grid(("estimand", "value", "reportable"), tuple(rows)))
    ab = lik.get("ablation")
    if isinstance(ab, Mapping):
        ms, ch = ab.get("mean_shift") or {}, ab.get("changes") or {}
        blocks.append(layout.Text(
            f"Ablation (likelihood) on {ab.get('n_rows', '?')} attack rows of {ab.get('n_clusters', '?')} "
            f"trajectories: attack and clean rows scored again with each fold's probe direction projected out at "
            f"blocks {ab.get('layers')}, and with a random direction of equal norm (seed {ab.get('random_seed')}); "
            "mean shift in nats, paired cluster-bootstrap CIs.", "strong"))
        blocks.append(layout.Grid(("arm", "mean shift", "change vs no ablation"), (
            ("no ablation", layout.Estimate(ms.get("none")), ""),
            ("probe direction", layout.Estimate(ms.get("probe")), layout.Estimate(ch.get("probe"))),
            ("random direction", layout.Estimate(ms.get("random")), layout.Estimate(ch.get("random"))),
            ("Δ probe − Δ random", layout.Estimate(ab.get("probe_minus_random")), ""))))
    else:
        why = (lik.get("claims") or {}).get("lowers_shift", {}).get("detail", "")
        blocks.append(layout.Text(f"Ablation (likelihood) not run: {why}.", "muted"))
    claims = lik.get("claims") or {}
    summary = " · ".join(f"{cid}: {(claims.get(key) or {}).get('status', 'NOT RUN')}"
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
