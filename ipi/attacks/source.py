"""The shape every attack source yields: templates, goals, benign texts, and their provenance.

An **attack source** is one published corpus of indirect-prompt-injection text, read offline
(the sources: docs/attacks.md). A source yields three kinds of items, each recording its
``source`` family and an id unique over every source:

* :class:`Template` — an injection wrapper with one ``{goal}`` slot and possibly other
  placeholder slots (:mod:`ipi.attacks.slots`);
* :class:`Goal` — what the attacker wants the agent to do, in one of :data:`GOAL_FAMILIES`, with
  the :attr:`Goal.target` a hijack labeller checks the agent's next action against;
* :class:`BenignText` — instruction-like but harmless text for the ``c_imperative`` control
  (PROTOCOL.md §2).

One module per source implements :class:`AttackSource`; nothing outside a source's own module
branches on its name (STYLE.md)."""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Protocol, runtime_checkable

import yaml

from ipi.data.text import text_problem

__all__ = [
    "GOAL_FAMILIES",
    "MAX_TEXT_CHARS",
    "SLOT_RE",
    "TARGET_KINDS",
    "AttackSource",
    "AttackSourceError",
    "BenignText",
    "Goal",
    "Provenance",
    "Template",
    "check_text",
    "load_data",
    "slots_of",
    "validate_source",
]

#: Goal families: what the attacker wants. The first five are the project bank's
#: (:data:`ipi.surfaces.bank.ATTACK_GOALS`); the last three are added for published sources whose
#: goals fit none of them (AgentDojo's money transfers and unrequested actions, garak's and
#: PromptInject's "print this string").
GOAL_FAMILIES: Mapping[str, str] = {
    "redirect": "navigate the agent to an attacker-chosen URL",
    "exfiltrate": "send, type or post the user's private data where the attacker can read it",
    "click": "click an attacker-chosen page element",
    "credentials": "type, reveal or change a password, API key or login",
    "abandon": "stop the user's task, or answer a fixed token instead of doing it",
    "payment": "move the user's money to an attacker-controlled account",
    "act": "another state-changing action the user did not ask for (grant access, delete, book, "
           "invite, forward a link)",
    "say": "make the agent tell the user attacker-chosen text (a rogue string, a false claim, a link)",
}

#: Keys of :attr:`Goal.target`: what a hijack labeller looks for in the agent's next action.
TARGET_KINDS: Mapping[str, str] = {
    "url": "a URL or domain the agent is pushed to visit, type, post to or show",
    "element": "a page element the agent is pushed to click or type into ('[7]', 'login form')",
    "credential": "a password or secret the agent is pushed to type or set",
    "account": "a bank account (IBAN, account number, payee) money is pushed to",
    "recipient": "an e-mail address or user name data or messages are pushed to",
    "answer": "text the agent is pushed to answer or print (an abandon token, a rogue string)",
    "tool": "the tool or action name the attack wants called",
}

#: A placeholder slot: ``{name}`` with a lowercase identifier. Any other brace text (a JSON-like
#: ``{'url': ...}`` in a tool sequence, ``{{``) is literal.
SLOT_RE = re.compile(r"\{([a-z_][a-z0-9_]*)\}")

#: Upper bound on any item's text, in characters: a longer item is a loader bug, not a corpus.
MAX_TEXT_CHARS = 2000


class AttackSourceError(ValueError):
    """A source's data is missing, malformed or violates an item invariant (names the file)."""


def slots_of(text: str) -> tuple[str, ...]:
    """Placeholder slot names in ``text``, in order of first occurrence.

    Args:
        text: A template, goal or rendered text.

    Returns:
        Slot names without braces, e.g. ``("user", "model", "goal")``.
    """
    return tuple(dict.fromkeys(SLOT_RE.findall(text)))


def check_text(text: str, *, what: str) -> None:
    """Raise unless ``text`` is non-blank, bounded and printable.

    Printable: every character is printable (``str.isprintable``) or one of ``\\n``, ``\\t``;
    no control, format (zero-width, bidi) or private-use character sneaks into a prompt.

    Args:
        text: The text to check.
        what: Names the item in the error (``"agentdojo/important_instructions"``).

    Raises:
        AttackSourceError: Blank, longer than :data:`MAX_TEXT_CHARS`, or a non-printable
            character (its code point is named).
    """
    if not isinstance(text, str) or not text.strip():
        raise AttackSourceError(f"{what}: empty text")
    if len(text) > MAX_TEXT_CHARS:
        raise AttackSourceError(f"{what}: {len(text)} characters > {MAX_TEXT_CHARS}")
    if (problem := text_problem(text)) is not None:
        raise AttackSourceError(f"{what}: {problem}")
    for c in text:
        if not (c.isprintable() or c in "\n\t"):
            raise AttackSourceError(
                f"{what}: non-printable character U+{ord(c):04X} ({unicodedata.category(c)})")


def load_data(relpath: str) -> Any:
    """Parse a data file shipped in ``ipi/attacks/data/`` (``.json`` or ``.yaml``).

    Args:
        relpath: Path below ``ipi/attacks/data/`` (``"injecagent/injecagent.json"``).

    Returns:
        The parsed content.

    Raises:
        AttackSourceError: The file is missing or does not parse (names it).
    """
    path = resources.files("ipi.attacks").joinpath("data", *relpath.split("/"))
    try:
        text = path.read_text(encoding="utf-8")
        return json.loads(text) if relpath.endswith(".json") else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise AttackSourceError(f"ipi/attacks/data/{relpath}: {e}") from e


@dataclass(frozen=True)
class Template:
    """An injection wrapper around a goal.

    Attributes:
        id: ``"<source>/<name>"``, unique over every source.
        source: The source family that published it (``"agentdojo"``).
        text: The wrapper with exactly one ``{goal}`` slot; other slots are filled by
            :func:`ipi.attacks.slots.render`.
        name: The published name (attack class, probe, setting).
        origin: Where in the source it comes from (file and class or key).
        goal_slots: Slots that only a goal can fill (AgentDojo's ``{tools}``: the injection
            task's own tool sequence); the template pairs only with goals that carry them
            (:meth:`accepts`).
    """

    id: str
    source: str
    text: str
    name: str
    origin: str
    goal_slots: tuple[str, ...] = ()

    def accepts(self, goal: Goal) -> bool:
        """Whether ``goal`` carries every slot in :attr:`goal_slots`."""
        return all(s in goal.slots for s in self.goal_slots)


@dataclass(frozen=True)
class Goal:
    """An attacker goal, phrased as the source phrases it.

    Attributes:
        id: ``"<source>/<name>"``, unique over every source.
        source: The source family.
        family: One of :data:`GOAL_FAMILIES`.
        text: The goal as inserted into a template's ``{goal}`` slot (may itself hold slots,
            e.g. AgentDojo's ``{first_name}``).
        target: What a hijack labeller looks for; keys from :data:`TARGET_KINDS`, values
            tuples of strings (e.g. ``{"url": ("www.true-informations.com",)}``).
        origin: Where in the source it comes from.
        slots: Goal-bound slot values (e.g. ``{"tools": "You should use the tool ..."}``).
    """

    id: str
    source: str
    family: str
    text: str
    target: Mapping[str, tuple[str, ...]]
    origin: str
    slots: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BenignText:
    """Instruction-like but harmless text (the ``c_imperative`` control's material).

    Attributes:
        id: ``"<source>/<name>"``, unique over every source.
        source: The source family.
        text: The text.
        category: The source's own category (``"Common Queries"``, ``"ui"``, ...).
        origin: Where in the source it comes from.
    """

    id: str
    source: str
    text: str
    category: str
    origin: str


@dataclass(frozen=True)
class Provenance:
    """Where a source's texts come from, and under which license.

    Attributes:
        source: The source family.
        origin: Repository (``owner/name``) or package (``agentdojo==0.1.35``).
        version: Commit hash or package version.
        paths: Files inside the repository or package the texts are read from.
        license: SPDX identifier (``"MIT"``, ``"Apache-2.0"``).
        notice: Copyright line(s) the license asks to keep.
        note: Anything a user must know (a fork, what was left out and why).
    """

    source: str
    origin: str
    version: str
    paths: tuple[str, ...]
    license: str
    notice: str = ""
    note: str = ""


@runtime_checkable
class AttackSource(Protocol):
    """One published corpus of attack text (module docstring).

    ``family`` names the source; every item the source yields carries it in ``source`` (the mix
    keeps each item's own). Every method returns the same items on every call, in a fixed
    order, with no network access.
    """

    family: str

    def templates(self) -> tuple[Template, ...]:
        """Injection wrappers (each with one ``{goal}`` slot)."""
        ...

    def goals(self) -> tuple[Goal, ...]:
        """Attacker goals."""
        ...

    def benign(self) -> tuple[BenignText, ...]:
        """Benign instruction-like texts for ``c_imperative``."""
        ...

    def provenance(self) -> tuple[Provenance, ...]:
        """Origin and license of the texts (one entry per published corpus it reads)."""
        ...


def validate_source(src: AttackSource) -> dict[str, int]:
    """Check every invariant of a source's items; return its counts.

    Invariants: ids unique over all three kinds and prefixed ``<source>/``; every item's
    ``source`` non-empty (equal to ``src.family`` unless ``src`` is a composite whose
    ``members`` name it); texts pass :func:`check_text`; every template has exactly one
    ``{goal}`` slot and its :attr:`~Template.goal_slots` appear in its text; every goal's family
    is in :data:`GOAL_FAMILIES`, its target keys in :data:`TARGET_KINDS` with non-empty values,
    and it has no ``{goal}`` slot itself; every template accepts at least one goal of the source.

    Args:
        src: The source.

    Returns:
        ``{"templates": n, "goals": n, "benign": n}``.

    Raises:
        AttackSourceError: The first violation, naming the item.
    """
    allowed = set(getattr(src, "members", ()) or (src.family,))
    items: list = [*src.templates(), *src.goals(), *src.benign()]
    seen: set[str] = set()
    for it in items:
        if not it.source or it.source not in allowed:
            raise AttackSourceError(f"{it.id}: source {it.source!r} not in {sorted(allowed)}")
        if not it.id.startswith(f"{it.source}/"):
            raise AttackSourceError(f"{it.id}: id does not start with {it.source + '/'!r}")
        if it.id in seen:
            raise AttackSourceError(f"{it.id}: duplicate id")
        seen.add(it.id)
        check_text(it.text, what=it.id)
    for t in src.templates():
        if SLOT_RE.findall(t.text).count("goal") != 1:
            raise AttackSourceError(f"{t.id}: a template needs exactly one {{goal}} slot")
        missing = [s for s in t.goal_slots if s not in slots_of(t.text)]
        if missing:
            raise AttackSourceError(f"{t.id}: goal_slots {missing} not in its text")
    for g in src.goals():
        if g.family not in GOAL_FAMILIES:
            raise AttackSourceError(f"{g.id}: goal family {g.family!r} not in {list(GOAL_FAMILIES)}")
        bad = [k for k, v in g.target.items() if k not in TARGET_KINDS or not v or not all(v)]
        if bad:
            raise AttackSourceError(f"{g.id}: bad target keys or empty values {bad}")
        if "goal" in slots_of(g.text):
            raise AttackSourceError(f"{g.id}: a goal cannot hold a {{goal}} slot")
    goals: Sequence[Goal] = src.goals()
    for t in src.templates():
        if not any(t.accepts(g) for g in goals):
            raise AttackSourceError(f"{t.id}: no goal of the source carries {list(t.goal_slots)}")
    return {"templates": len(src.templates()), "goals": len(goals), "benign": len(src.benign())}
