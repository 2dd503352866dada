"""Published attack corpora as data: templates, goals and benign texts by source.

One module per source implements :class:`~ipi.attacks.source.AttackSource`;
:func:`~ipi.attacks.slots.render` fills a template with a goal and its other slots. Adding a
source is adding a module whose ``__all__`` exports one class with a ``family`` name and the
protocol's methods, and its name to the import line below (nothing is imported by a computed
name: tests/test_safety.py); :func:`available_sources` finds the class there. docs/attacks.md
describes every source, its license and counts."""

from __future__ import annotations

import functools

from ipi.attacks import agentdojo, garak, injecagent, mix, notinject, project
from ipi.attacks.source import (
    GOAL_FAMILIES,
    TARGET_KINDS,
    AttackSource,
    AttackSourceError,
    BenignText,
    Goal,
    Provenance,
    Template,
    validate_source,
)
from ipi.attacks.slots import Rendered, render

__all__ = [
    "GOAL_FAMILIES",
    "TARGET_KINDS",
    "AttackSource",
    "AttackSourceError",
    "BenignText",
    "Goal",
    "Provenance",
    "Rendered",
    "Template",
    "available_sources",
    "load_source",
    "render",
    "validate_source",
]

_METHODS = ("templates", "goals", "benign", "provenance")


def _is_source_class(obj: object) -> bool:
    return (isinstance(obj, type) and isinstance(getattr(obj, "family", None), str)
            and all(callable(getattr(obj, m, None)) for m in _METHODS))


#: The source modules (see the module docstring).
SOURCE_MODULES = (agentdojo, garak, injecagent, mix, notinject, project)


@functools.cache
def _discover() -> dict[str, type]:
    found: dict[str, type] = {}
    for m in SOURCE_MODULES:
        for name in getattr(m, "__all__", ()):
            obj = getattr(m, name)
            if _is_source_class(obj):
                if obj.family in found:
                    raise AttackSourceError(f"two attack sources named {obj.family!r}: "
                                            f"{found[obj.family].__module__}, {m.__name__}")
                found[obj.family] = obj
    return dict(sorted(found.items()))


def available_sources(*, composite: bool = False) -> dict[str, type]:
    """Source family → source class, for every module of :data:`SOURCE_MODULES`, in name order.

    Args:
        composite: Include composite sources (the mix).

    Returns:
        E.g. ``{"agentdojo": AgentDojoSource, "garak": GarakSource, ...}``. A source whose data
        needs an optional package is listed; instantiating or reading it raises
        :class:`AttackSourceError` saying how to install it.
    """
    return {k: v for k, v in _discover().items() if composite or not getattr(v, "composite", False)}


def load_source(family: str, **kwargs) -> AttackSource:
    """Instantiate the source called ``family`` (``"mix"`` included).

    Raises:
        AttackSourceError: No such source (the known ones are named).
    """
    classes = available_sources(composite=True)
    if family not in classes:
        raise AttackSourceError(f"unknown attack source {family!r}; known: {sorted(classes)}")
    return classes[family](**kwargs)
