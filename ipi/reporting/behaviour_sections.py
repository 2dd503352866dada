"""The report's free-run behaviour (docs/behaviour.md): its verdict lines and its section.

Read from ``results.json``'s ``behaviour`` block (a run with ``behaviour.enabled``); a run
without it gets nothing from here, so its report is unchanged.

* **Verdict lines**: after the verdict's checks, the two separately labelled claims "predicts
  hijack" (E4) and "uses this direction" (the ablation), each with its status and detail; they
  are not checks of PROTOCOL.md §7 and never change the licensed claim above them.
* **Behaviour (free run)** section, right after the estimands: the warning when the backbone's
  weights are not trained (the labels are then meaningless), the label counts, the hijack rate
  per surface × variant, E4 with its C1 analogue and gate, and the ablation table (hijack rate of
  each arm, the paired changes, probe − random).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ipi.metrics.keys import BEHAVIOUR
from ipi.reporting import layout

__all__ = ["CLAIM_LINES", "sections", "verdict_blocks", "with_behaviour"]

#: The separately labelled claims: (results key, id shown, name shown).
CLAIM_LINES = (("predicts_hijack", "E4", "predicts hijack"), ("uses_direction", "ablation", "uses this direction"))
SEPARATE_NOTE = ("Separately labelled claims of the free run (docs/behaviour.md): not checks of PROTOCOL.md §7; "
                 "they never change the licensed claim above.")


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
    for key, cid, name in CLAIM_LINES:
        c = claims.get(key) or {}
        out.append(layout.CheckLine(cid, name, str(c.get("status", "NOT RUN")), str(c.get("detail", "")), ()))
    return out


def _why(reason) -> str:
    return "yes" if reason is None else f"no: {reason}"


def sections(results: Mapping) -> list:
    """The "Behaviour (free run)" section of a run with a ``behaviour`` block (else none)."""
    b = _block(results)
    if b is None:
        return []
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


def with_behaviour(report: list, results: Mapping) -> list:
    """``report`` with the verdict's extra lines and the behaviour section right after the estimands
    (after the verdict when there is no estimands section); unchanged without a ``behaviour`` block."""
    if _block(results) is None:
        return report
    out = [replace(s, blocks=(*s.blocks, *verdict_blocks(results))) if s.id == "verdict" else s for s in report]
    ids = [s.id for s in out]
    at = next((ids.index(k) + 1 for k in ("estimands", "verdict") if k in ids), 0)
    return [*out[:at], *sections(results), *out[at:]]
