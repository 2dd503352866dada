"""The attack pool of a run: one source's templates, goals and benign texts, and the chooser.

A run's ``attack`` config (``conf/attack/<name>.yaml``) names an attack source
(:mod:`ipi.attacks`); :class:`AttackPool` holds what the surfaces draw from: the source's
``templates`` and ``goals``, and ``benign`` texts for ``c_imperative`` (PROTOCOL.md §2): the
source's own, or those of the fallback source ``attack.benign`` for a source that has none.

:meth:`AttackPool.choose` picks one (template, goal) per ``(trajectory, step, k)`` as
:func:`ipi.surfaces.bank.attack_text` does (the ``project`` pool gives exactly its texts), and
:func:`ipi.attacks.slots.render` fills the other slots. Every attack row's ``meta`` records its
``source``, ``goal_source``, the item ids and any slot fills."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ipi.attacks.slots import render, slot_pools
from ipi.attacks.source import AttackSource, AttackSourceError, BenignText, Goal, Provenance, Template, slots_of
from ipi.surfaces.bank import stable_int
from ipi.data.text import text_problem

__all__ = ["AttackPool", "attack_key", "project_pool"]


def attack_key(trajectory_id: str, step: int, k: int) -> str:
    """Seed key of an attack's slot fills: ``"<trajectory_id>|<step>|<k>"`` (docs/attacks.md)."""
    return f"{trajectory_id}|{step}|{k}"


@dataclass(frozen=True, eq=False)
class AttackPool:
    """What a run's surfaces draw attack and benign texts from (module docstring).

    Attributes:
        name: The source family the run's ``attack`` config names (``"project"``, ``"mix"``).
        templates: Injection wrappers, source order.
        goals: Attacker goals, source order.
        benign: Benign texts for ``c_imperative``.
        benign_from: The families the benign texts come from (the source's own, or the fallback).
        provenance: Where the texts were read (each source's :class:`~ipi.attacks.source.Provenance`:
            the repository commit or the installed package version read).
    """

    name: str
    templates: tuple[Template, ...]
    goals: tuple[Goal, ...]
    benign: tuple[BenignText, ...]
    benign_from: tuple[str, ...]
    provenance: tuple[Provenance, ...] = ()

    def __post_init__(self):
        if not self.templates or not self.goals:
            raise AttackSourceError(f"attack={self.name}: the source has no templates or no goals "
                                    "(a benign-only source such as notinject is an attack.benign, not an attack)")
        if not self.benign:
            raise AttackSourceError(f"attack={self.name}: no benign text for c_imperative; set attack.benign "
                                    "to a source that has some (notinject)")
        for it in (*self.templates, *self.goals, *self.benign):  # what every prompt text meets (ipi.data.text)
            if (problem := text_problem(it.text)) is not None:
                raise AttackSourceError(f"attack={self.name}: {it.id} ({it.origin}): {problem}")

    @classmethod
    def from_source(cls, source: AttackSource, benign_fallback: AttackSource | None = None) -> AttackPool:
        """The pool of ``source``; its benign texts, else ``benign_fallback``'s.

        Raises:
            AttackSourceError: No templates or goals, or no benign text either way.
        """
        own = tuple(source.benign())
        benign = own or (tuple(benign_fallback.benign()) if benign_fallback is not None else ())
        provenance = tuple(source.provenance()) + (tuple(benign_fallback.provenance())
                                                   if benign and not own else ())
        return cls(source.family, tuple(source.templates()), tuple(source.goals()), benign,
                   tuple(dict.fromkeys(b.source for b in benign)), provenance)

    @functools.cached_property
    def digest(self) -> str:
        """SHA-256 (16 hex digits) of every item id and text, in order: what the rows depend on."""
        h = hashlib.sha256()
        for it in (*self.templates, *self.goals, *self.benign):
            h.update(f"{it.id}\x1f{it.text}\x1e".encode())
        return h.hexdigest()[:16]

    def __repr__(self) -> str:  # short and content-bound: make_rows' memo key reads it
        return f"AttackPool({self.name}:{self.digest})"

    @property
    def sources(self) -> tuple[str, ...]:
        """The attack source families of the templates, in order of first appearance."""
        return tuple(dict.fromkeys(t.source for t in self.templates))

    def choose(self, trajectory_id: str, step: int, k: int, templates: Sequence[int] | None = None,
               goals: Sequence[int] | None = None, context: Mapping[str, str] | None = None) -> tuple[str, dict]:
        """The attack text of one ``(trajectory, step, k)`` and its row metadata.

        Template ``T[(h0 + k) % len(T)]`` and goal ``G'[h % len(G')]`` exactly as
        :func:`ipi.surfaces.bank.attack_text` (``h0``, ``h`` the same stable hashes), where ``G'``
        are the allowed goals the template accepts; a template that accepts none of them is
        passed over for the next one (``k + 1``, ...).

        Args:
            trajectory_id: Trajectory id.
            step: 0-based step index.
            k: Attack index at this step.
            templates: Allowed template indices (a wording family), None for all.
            goals: Allowed goal indices, None for all.
            context: Slot values of the trajectory (``{"task": ...}``).

        Returns:
            ``(text, meta)``; meta has ``template``, ``goal`` (pool indices), ``goal_family``,
            ``source``, ``goal_source``, ``template_id``, ``goal_id`` and, when a slot other than
            ``{goal}`` was filled, ``fills``.

        Raises:
            ValueError: An empty family, or no template of it accepts a goal of it.
        """
        tpl = range(len(self.templates)) if templates is None else list(templates)
        gls = range(len(self.goals)) if goals is None else list(goals)
        if not tpl or not gls:
            raise ValueError("attack_text: empty template or goal family")
        h0 = stable_int("attack-template", trajectory_id, step)
        for off in range(len(tpl)):
            i = tpl[(h0 + k + off) % len(tpl)]
            t = self.templates[i]
            ok = gls if not t.goal_slots else [j for j in gls if t.accepts(self.goals[j])]
            if ok:
                break
        else:
            raise ValueError(f"attack={self.name}: no template of the family accepts one of its goals")
        j = ok[stable_int("attack-goal", trajectory_id, step, k) % len(ok)]
        g = self.goals[j]
        r = render(t, g, attack_key(trajectory_id, step, k), context)
        meta = {"template": i, "goal": j, "goal_family": g.family, "source": t.source,
                "goal_source": g.source, "template_id": t.id, "goal_id": g.id}
        if r.fills:
            meta["fills"] = dict(r.fills)
        return r.text, meta

    @functools.cached_property
    def longest_text(self) -> str:
        """The longest attack text the pool can give (what an ``i_vis`` banner is sized for).

        Every accepted (template, goal) pair, rendered with the longest value of every pooled
        slot; pairs in template-then-goal order, the first of equal length kept (for the project
        pool: :func:`ipi.surfaces.bank.all_attack_texts`' longest).
        """
        pools = slot_pools()
        longest = {s: max(v, key=len) for s, v in pools.items()}
        best = ""
        for t in self.templates:
            for g in self.goals:
                if not t.accepts(g):
                    continue
                ctx = {s: longest[s] for s in (*slots_of(t.text), *slots_of(g.text)) if s in longest}
                text = render(t, g, "longest", ctx).text
                if len(text) > len(best):
                    best = text
        return best


@functools.cache
def project_pool() -> AttackPool:
    """The pool of the project's own bank (the default ``attack=project``)."""
    from ipi.attacks.project import ProjectSource

    return AttackPool.from_source(ProjectSource())


def source_class(target: str) -> type:
    """The attack source class a config's ``_target_`` names, among the listed source modules.

    Found by its qualified name in :func:`ipi.attacks.available_sources` (nothing is imported
    by a computed name: tests/test_safety.py).

    Raises:
        AttackSourceError: No listed source class has that name (the known ones are named).
    """
    from ipi.attacks import available_sources

    classes = {f"{c.__module__}.{c.__qualname__}": c for c in available_sources(composite=True).values()}
    if target not in classes:
        raise AttackSourceError(f"attack._target_={target!r} is not an attack source class; known: "
                                f"{', '.join(sorted(classes))}")
    return classes[target]


@functools.lru_cache(maxsize=16)
def _pool(target: str, name: str, sources: tuple[str, ...] | None, benign: str | None) -> AttackPool:
    from ipi.attacks import load_source

    cls = source_class(target)
    src = cls([load_source(s) for s in sources]) if sources else cls()
    if src.family != name:
        raise AttackSourceError(f"attack={name}: _target_ {target} is the source {src.family!r}; "
                                f"attack.name must be {src.family!r}")
    fallback = load_source(benign) if benign else None
    return AttackPool.from_source(src, fallback)


def pool_from_config(attack) -> AttackPool:
    """The pool of an ``attack`` config node (``conf/attack/<name>.yaml``; :class:`ipi.run.schemas.AttackConf`).

    Args:
        attack: A mapping with ``_target_`` (the source class), ``name`` (its family),
            ``sources`` (a mix's members, or None for all) and ``benign`` (the fallback benign
            source, or None).

    Returns:
        The pool (one per distinct config in a process).

    Raises:
        AttackSourceError: An unknown class, a name that is not the class's family, a source
            without templates or goals, or no benign text.
    """
    sources = attack.get("sources")
    return _pool(str(attack["_target_"]), str(attack["name"]),
                 tuple(str(s) for s in sources) if sources else None,
                 str(attack["benign"]) if attack.get("benign") else None)
