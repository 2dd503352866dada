"""The registry of injection surfaces: one :class:`~ipi.surfaces.surface.Surface` object per name.

``conf/surface/<name>.yaml`` names each surface's class in ``_target_``; the registry reads the
repository's ``conf/surface/`` once and builds one object per class. These are the surfaces that
*ship*: :func:`surfaces` lists them, and :data:`ipi.protocol.SURFACES`, the controls per surface,
the transfer sources, the gallery rows and the attention detector's untrusted groups come from
that list (docs/surfaces.md, "Adding a surface").

A config file found elsewhere (a Hydra searchpath entry) names a surface that does not ship: the
run naming it registers it (:func:`register`, via :func:`ipi.run.validation.run_surface`) and
:func:`get_surface` finds it from then on, but it is never *listed*, so a job of a ``-m`` sweep
gives the same results as the same run alone.

Order (:func:`surfaces`): the surfaces that need the screenshot first, then the text surfaces,
by name within each. Torch-free; imports nothing of :mod:`ipi.protocol`."""

from __future__ import annotations

import functools
import importlib
import inspect
from pathlib import Path

import yaml

from ipi.surfaces.surface import Surface

__all__ = ["CONF_DIR", "find_surface", "get_surface", "register", "surface_class", "surface_names", "surfaces"]

#: The config group of the surfaces that ship (``surface=<name>``).
CONF_DIR = Path(__file__).resolve().parents[2] / "conf" / "surface"

_REGISTRY: dict[str, Surface] = {}


def surface_class(target: str, where: str) -> type[Surface]:
    """Import the class a ``_target_`` names and check that it is a concrete :class:`Surface`.

    Args:
        target: Dotted path ``package.module.Class``.
        where: What named it, for the message (a config file, ``surface._target_``).

    Returns:
        The class.

    Raises:
        ValueError: No such module or class, or not a concrete ``Surface`` subclass (one line
            naming ``where`` and the target).
    """
    module, _, attr = str(target).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr) if module else None
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{where}: _target_={target!r}: cannot import it ({e})") from None
    if cls is None:
        raise ValueError(f"{where}: _target_={target!r} is not a dotted path package.module.Class")
    if not (isinstance(cls, type) and issubclass(cls, Surface)) or inspect.isabstract(cls):
        raise ValueError(f"{where}: _target_={target!r} is not a concrete subclass of "
                         "ipi.surfaces.surface.Surface (docs/surfaces.md, 'Adding a surface')")
    return cls


def register(cls: type[Surface], where: str = "") -> Surface:
    """Resolve a surface class (idempotent for the same class) and return its object.

    A class that does not ship is found by :func:`get_surface` from then on, never listed by
    :func:`surfaces` (see the module docstring).

    Args:
        cls: A concrete :class:`Surface` subclass.
        where: What named it, for the messages.

    Returns:
        The registered object of ``cls``.

    Raises:
        ValueError: An inconsistent declaration (:meth:`Surface.check`), or another class
            already registered under the same name.
    """
    _load()
    return _add(cls, where)


def _add(cls: type[Surface], where: str) -> Surface:
    have = _REGISTRY.get(getattr(cls, "name", None))
    if have is not None:
        if type(have) is not cls:
            theirs = f"{type(have).__module__}.{type(have).__qualname__}"
            raise ValueError(f"{where + ': ' if where else ''}surface {cls.name!r} is already {theirs}; "
                             f"rename {cls.__module__}.{cls.__qualname__}")
        return have
    surface = cls()
    surface.check()
    _REGISTRY[surface.name] = surface
    return surface


@functools.cache
def _load() -> tuple[str, ...]:
    """Register the surfaces of :data:`CONF_DIR` (once per process); returns their names."""
    files = sorted(CONF_DIR.glob("*.yaml"))
    if not files:
        raise ValueError(f"{CONF_DIR}: no surface config files (conf/surface/<name>.yaml)")
    for path in files:
        try:
            node = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: not valid YAML ({e})") from None
        if not isinstance(node, dict) or not node.get("_target_"):
            raise ValueError(f"{path}: no _target_ naming the surface's class "
                             "(e.g. _target_: ipi.surfaces.i_vis.BannerSurface)")
        cls = surface_class(node["_target_"], str(path))
        if getattr(cls, "name", None) != path.stem or node.get("name") != path.stem:
            raise ValueError(f"{path}: the file name, its name ({node.get('name')!r}) and the class's name "
                             f"({getattr(cls, 'name', None)!r}) must be the same")
        _add(cls, str(path))
    return tuple(p.stem for p in files)


def surfaces() -> tuple[Surface, ...]:
    """The surfaces that ship, screenshot surfaces first, then by name (see the module docstring)."""
    return tuple(sorted((_REGISTRY[n] for n in _load()), key=lambda s: (not s.needs_image, s.name)))


def surface_names() -> tuple[str, ...]:
    """Names of :func:`surfaces`, in that order."""
    return tuple(s.name for s in surfaces())


def find_surface(name: str) -> Surface | None:
    """The surface called ``name`` (shipped, or resolved by a run's config), or None."""
    _load()
    return _REGISTRY.get(str(name))


def get_surface(surface: str | Surface) -> Surface:
    """The surface object of a name (a :class:`Surface` is returned as is).

    Raises:
        ValueError: Unknown name (one line naming the surfaces that ship).
    """
    if isinstance(surface, Surface):
        return surface
    found = find_surface(surface)
    if found is None:
        raise ValueError(f"unknown surface {surface!r}; allowed: {', '.join(surface_names())}")
    return found
