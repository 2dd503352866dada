"""Summary of every attack source: counts, goal families and what the surfaces will have to carry.

``python -m ipi.attacks`` prints one Markdown table per question (docs/attacks.md quotes them):

* counts — templates, goals, benign texts, and goals per family;
* surface fit — over every accepted template × goal pair rendered with one fixed key, how many
  texts hold a double quote (the ``i_dom`` entry wraps text in ``"…"``), a newline (one
  element-list entry, one banner paragraph), and their length in characters (min / median /
  max; the ``i_vis`` banner is sized for the project bank's longest attack).
"""

from __future__ import annotations

import statistics
import sys

from ipi.attacks import AttackSourceError, available_sources, render, validate_source

__all__ = ["main", "surface_fit"]


def surface_fit(src) -> dict:
    """Double quotes, newlines and lengths of a source's rendered attacks and its benign texts.

    Args:
        src: An attack source.

    Returns:
        ``{"pairs", "quote", "newline", "min", "median", "max", "benign_quote", "benign_max"}``
        (lengths in characters; zeros when the source has no pair).
    """
    texts = [render(t, g, "summary").text for t in src.templates() for g in src.goals() if t.accepts(g)]
    lens = [len(x) for x in texts] or [0]
    return {"pairs": len(texts), "quote": sum('"' in x for x in texts), "newline": sum("\n" in x for x in texts),
            "min": min(lens), "median": int(statistics.median(lens)), "max": max(lens),
            "benign_quote": sum('"' in b.text for b in src.benign()),
            "benign_max": max((len(b.text) for b in src.benign()), default=0)}


def main(argv: list[str] | None = None) -> int:
    """Print the tables (module docstring).

    A source that cannot be read (a missing or other-version package: :class:`AttackSourceError`)
    is left out of the tables with its one-line reason on stderr.

    Returns:
        0 when every source was read, 1 when one or more were left out.
    """
    sources, failed = {}, 0
    for name, cls in available_sources().items():
        try:
            src = cls()
            validate_source(src)
            src.provenance()
        except AttackSourceError as e:
            sys.stderr.write(f"python -m ipi.attacks: source {name} left out: {e}\n")
            failed += 1
            continue
        sources[name] = src
    out = sys.stdout
    out.write("| source | templates | goals | benign | goals per family | license |\n|---|---|---|---|---|---|\n")
    for name, src in sources.items():
        c = validate_source(src)
        fams: dict[str, int] = {}
        for g in src.goals():
            fams[g.family] = fams.get(g.family, 0) + 1
        lic = " + ".join(dict.fromkeys(p.license for p in src.provenance()))
        fam_s = ", ".join(f"{k} {v}" for k, v in sorted(fams.items())) or "—"
        out.write(f"| {name} | {c['templates']} | {c['goals']} | {c['benign']} | {fam_s} | {lic} |\n")
    out.write("\n| source | template × goal pairs | with `\"` | with newline | chars min / median / max "
              "| benign with `\"` | benign max chars |\n|---|---|---|---|---|---|---|\n")
    for name, src in sources.items():
        f = surface_fit(src)
        out.write(f"| {name} | {f['pairs']} | {f['quote']} | {f['newline']} | {f['min']} / {f['median']} / "
                  f"{f['max']} | {f['benign_quote']} | {f['benign_max']} |\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
