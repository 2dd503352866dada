"""Progress bars with ETA for the long stages (import, rendering, extraction, bootstrap).

Import, rendering and bootstrap use :mod:`rich.progress` through :func:`track` and
:func:`progress_bar`; extraction, which runs inside ``Trainer.predict``, uses Lightning's
``RichProgressBar`` callback (:func:`extraction_callbacks`). Everything is silent when quiet mode
is on: ``quiet=true`` in the config (the task functions call :func:`set_quiet`), the environment
variable ``IPI_QUIET=1``, or ``CI`` set (CI logs are not a terminal). Bars are drawn on stderr, so
the results printed on stdout stay clean.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sized
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")

_QUIET: bool | None = None


def set_quiet(quiet: bool | None) -> None:
    """Turn every progress bar of this process off (``True``), on (``False``) or back to auto.

    Args:
        quiet: ``True`` silences bars; ``False`` shows them; ``None`` restores the default
            (quiet when ``IPI_QUIET`` is set to a true value or ``CI`` is set).
    """
    global _QUIET
    _QUIET = quiet


def is_quiet() -> bool:
    """Whether progress bars are off (see :func:`set_quiet`)."""
    if _QUIET is not None:
        return _QUIET
    if os.environ.get("IPI_QUIET", "").lower() in ("1", "true", "yes"):
        return True
    return bool(os.environ.get("CI"))


def _columns():
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("elapsed"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )


class _NullBar:
    def advance(self, n: int = 1) -> None:
        return None


class _Bar:
    def __init__(self, progress, task_id):
        self._progress, self._task = progress, task_id

    def advance(self, n: int = 1) -> None:
        self._progress.advance(self._task, n)


@contextmanager
def progress_bar(description: str, total: int | None) -> Iterator[_Bar | _NullBar]:
    """A rich progress bar (description, bar, done/total, elapsed, ETA) as a context manager.

    Args:
        description: Stage name shown left of the bar, e.g. ``"bootstrap"``.
        total: Number of units; ``None`` for an unknown total.

    Yields:
        An object with ``advance(n=1)``; a no-op in quiet mode.
    """
    if is_quiet():
        yield _NullBar()
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(*_columns(), console=Console(stderr=True), transient=False) as p:
        yield _Bar(p, p.add_task(description, total=total))


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate over ``items`` while showing a progress bar with ETA (nothing in quiet mode).

    Args:
        items: Any iterable.
        description: Stage name, e.g. ``"import webvoyager"``.
        total: Number of items (default ``len(items)`` when it has one).

    Yields:
        The items, unchanged and in order.
    """
    if total is None and isinstance(items, Sized):
        total = len(items)
    with progress_bar(description, total) as bar:
        for item in items:
            yield item
            bar.advance()


def extraction_callbacks(quiet: bool | None = None) -> list:
    """Lightning callbacks that draw the extraction progress (``Trainer.predict``).

    Args:
        quiet: Overrides :func:`is_quiet` when given.

    Returns:
        ``[RichProgressBar(refresh_rate=1)]`` (rows forwarded, elapsed, ETA), or ``[]`` when
        quiet; pass ``enable_progress_bar=bool(result)`` to the Trainer.
    """
    if (is_quiet() if quiet is None else quiet):
        return []
    from lightning.pytorch.callbacks import RichProgressBar

    class _ExtractionBar(RichProgressBar):
        @property
        def predict_description(self) -> str:
            return "extraction (rows)"

    return [_ExtractionBar(refresh_rate=1, leave=True, console_kwargs={"stderr": True})]


__all__ = ["extraction_callbacks", "is_quiet", "progress_bar", "set_quiet", "track"]
