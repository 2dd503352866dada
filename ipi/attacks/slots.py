"""Deterministic filling of placeholder slots in foreign templates and goals.

:func:`render` puts the goal into the template and fills every other slot, looking each value up
in this order:

1. the goal's own :attr:`~ipi.attacks.source.Goal.slots` (goal-bound);
2. the caller's ``context`` (e.g. ``{"task": <the trajectory's task>}``);
3. the pool of ``data/slots.yaml`` for that slot kind, one value chosen by
   :func:`ipi.surfaces.bank.stable_int` of ``("attack-slot", key, slot)``.

A slot found in none, or left in the result, raises
:class:`~ipi.attacks.source.AttackSourceError`. The same slot in the template and the goal gets
one value; values are inserted in one pass and never re-read as slots."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

import yaml

from ipi.attacks.source import SLOT_RE, AttackSourceError, Goal, Template, slots_of
from ipi.surfaces.bank import stable_int

__all__ = ["Rendered", "render", "slot_pools"]

_SLOTS_FILE = "data/slots.yaml"


@functools.cache
def slot_pools() -> Mapping[str, tuple[str, ...]]:
    """Slot kind → the values that may fill it (``ipi/attacks/data/slots.yaml``).

    Raises:
        AttackSourceError: The file is malformed (names it).
    """
    path = resources.files("ipi.attacks").joinpath(_SLOTS_FILE)
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    out: dict[str, tuple[str, ...]] = {}
    for kind, spec in (raw or {}).items():
        vals = spec.get("values") if isinstance(spec, dict) else None
        if not vals or not all(isinstance(v, str) and v and not SLOT_RE.search(v) for v in vals):
            raise AttackSourceError(f"{path}: slot {kind!r} needs non-empty string values without slots")
        out[str(kind)] = tuple(vals)
    return out


@dataclass(frozen=True)
class Rendered:
    """One attack text and where it came from.

    Attributes:
        text: The template with the goal and every slot filled.
        template: Template id.
        goal: Goal id.
        goal_family: The goal's family.
        sources: ``(template source, goal source)`` (differ only when a mix pairs across sources).
        fills: Slot → the value used (``goal`` excluded), for the run record.
    """

    text: str
    template: str
    goal: str
    goal_family: str
    sources: tuple[str, str]
    fills: Mapping[str, str]


def _value(slot: str, goal: Goal, context: Mapping[str, str], key: str) -> str:
    if slot in goal.slots:
        return goal.slots[slot]
    if slot in context:
        return str(context[slot])
    pools = slot_pools()
    if slot in pools:
        pool = pools[slot]
        return pool[stable_int("attack-slot", key, slot) % len(pool)]
    raise AttackSourceError(f"no value for slot {{{slot}}}: not in the goal, the context or {_SLOTS_FILE}")


def render(template: Template, goal: Goal, key: str, context: Mapping[str, str] | None = None) -> Rendered:
    """Put ``goal`` into ``template`` and fill every other slot (module docstring).

    Args:
        template: The wrapper (one ``{goal}`` slot).
        goal: The goal; ``template.accepts(goal)`` must hold.
        key: Seed of the pool choices, e.g. ``"<trajectory_id>|<step>|<k>"``.
        context: Caller-given slot values (``task``, ...); a goal-bound value wins over them.

    Returns:
        The :class:`Rendered` text with its fills.

    Raises:
        AttackSourceError: The template does not accept the goal, a slot has no value, or a
            slot is left in the result.
    """
    if not template.accepts(goal):
        raise AttackSourceError(f"{template.id} needs goal slots {list(template.goal_slots)}; {goal.id} lacks them")
    ctx = dict(context or {})
    fills = {s: _value(s, goal, ctx, key)
             for s in (*slots_of(template.text), *slots_of(goal.text)) if s != "goal"}
    goal_text = SLOT_RE.sub(lambda m: fills[m[1]], goal.text)
    text = SLOT_RE.sub(lambda m: goal_text if m[1] == "goal" else fills[m[1]], template.text)
    # Only the goal's filled text and pool values were inserted, neither re-read: a slot here means
    # a value itself looks like a slot (a goal-bound value); refuse rather than show "{x}".
    left = slots_of(text)
    if left:
        raise AttackSourceError(f"{template.id} x {goal.id}: slots {list(left)} left after filling")
    return Rendered(text=text, template=template.id, goal=goal.id, goal_family=goal.family,
                    sources=(template.source, goal.source), fills=fills)
