"""Progress bars with ETA for the long stages (import, rendering, extraction, bootstrap).

:func:`track`, :func:`progress_bar` and :func:`run_stages` draw :mod:`rich.progress` bars on
stderr; extraction draws one over rows from a Lightning callback (:func:`extraction_callbacks`).
All are silent in quiet mode (``quiet=true``, ``IPI_QUIET=1`` or ``CI`` set). When stderr is not
a terminal, each stage writes a plain line when it starts, every :data:`LINE_EVERY_S` seconds
while it runs and when it ends."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
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
    if is_quiet():
        quiet_libraries()


def quiet_libraries() -> None:
    """Silence the progress bars and warnings of transformers and huggingface_hub (quiet mode).

    Their own progress bars (checkpoint shards, downloads) are turned off, their loggers raised
    to ERROR, and their Python warnings ignored; the environment variables that do the same are
    set too, so DataLoader workers and subprocesses inherit them. Errors still show.
    """
    import huggingface_hub
    import transformers

    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    for name in ("transformers", "huggingface_hub", "accelerate", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", module=rf"{name}(\.|$)")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()


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

    def describe(self, description: str) -> None:
        return None


#: Seconds between two progress lines when stderr is not a terminal.
LINE_EVERY_S = 30.0


def _hms(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class _LineBar:
    """Progress as plain lines on stderr (a log file): one when the stage starts, one every
    :data:`LINE_EVERY_S` seconds while it runs (from a daemon thread, so a long unit of work
    between two advances still shows it is alive), one when it is described anew and one at the end.
    """

    def __init__(self, description: str, total: int | None):
        self.description, self.total, self.done = description, total, 0
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._beat, name="ipi-progress-lines", daemon=True)

    def start(self) -> None:
        self.line()
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.line()

    def _beat(self) -> None:
        while not self._stop.wait(LINE_EVERY_S):
            self.line()

    def advance(self, n: int = 1) -> None:
        self.done += n

    def describe(self, description: str) -> None:
        """Say what the stage does now (a plain line at once: a new step of a long stage)."""
        self.description = description
        self.line()

    def line(self) -> None:
        elapsed = time.monotonic() - self.t0
        done = self.done
        eta = (elapsed / done * (self.total - done)) if self.total and done else None
        share = f" ({100 * done / self.total:.0f} %)" if self.total else ""
        with self._lock:
            sys.stderr.write(f"{self.description}: {done}/{self.total if self.total is not None else '?'}{share}, "
                             f"elapsed {_hms(elapsed)}, ETA {_hms(eta)}\n")
            sys.stderr.flush()


class _Bar:
    def __init__(self, progress, task_id):
        self._progress, self._task = progress, task_id

    def advance(self, n: int = 1) -> None:
        self._progress.advance(self._task, n)

    def describe(self, description: str) -> None:
        self._progress.update(self._task, description=description)


#: The live rich display while a bar is open on a terminal: a bar opened inside another (a stage
#: of a tool, the extraction inside a benchmark) joins it as one more row, since a terminal holds
#: one live display at a time.
_LIVE = None


@contextmanager
def progress_bar(description: str, total: int | None) -> Iterator[_Bar | _LineBar | _NullBar]:
    """A rich progress bar (description, bar, done/total, elapsed, ETA) as a context manager.

    A bar opened while another is open becomes another row of the same display. When stderr is
    not a terminal, plain lines are written instead (module docstring).

    Args:
        description: Stage name shown left of the bar, e.g. ``"bootstrap"``.
        total: Number of units; ``None`` for an unknown total.

    Yields:
        An object with ``advance(n=1)`` and ``describe(text)`` (what the stage does now); a
        no-op in quiet mode.
    """
    global _LIVE
    if is_quiet():
        yield _NullBar()
        return
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)
    if not console.is_terminal:
        bar = _LineBar(description, total)
        bar.start()
        try:
            yield bar
        finally:
            bar.close()
        return
    outer = _LIVE is None
    if outer:
        _LIVE = Progress(*_columns(), console=console, transient=False)
        _LIVE.start()
    p = _LIVE
    try:
        yield _Bar(p, p.add_task(description, total=total))
    finally:
        if outer:
            p.stop()
            _LIVE = None


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


def run_stages(stages: Sequence[tuple[str, Callable[[], T]]], description: str) -> dict[str, T]:
    """Run named stages in order on one bar (stages done / all, elapsed, ETA) that names the running one.

    Bars the stages open themselves show below it (:func:`progress_bar`).

    Args:
        stages: ``(name, function of no argument)`` pairs, run in order.
        description: What the whole is, e.g. ``"bench"``; the bar reads ``"bench: twins (3/5)"``.

    Returns:
        ``{name: what its function returned}``, in stage order.
    """
    out: dict[str, T] = {}
    with progress_bar(description, len(stages)) as bar:
        for i, (name, fn) in enumerate(stages, 1):
            bar.describe(f"{description}: {name} ({i}/{len(stages)})")
            out[name] = fn()
            bar.advance()
    return out


def extraction_callbacks(quiet: bool | None = None, total_rows: int | None = None) -> list:
    """Lightning callbacks that draw the extraction progress (``Trainer.predict``).

    The bar counts *rows* (a batch holds whole step groups, several rows each), with elapsed
    time and ETA, drawn by :func:`progress_bar` like the other stages. Lightning is imported
    only when the bar is built (this module stays light to import).

    Args:
        quiet: Overrides :func:`is_quiet` when given.
        total_rows: Rows this extraction forwards (the bar's total).

    Returns:
        ``[RowProgress]``, or ``[]`` when quiet. Lightning's own bar stays off
        (``enable_progress_bar=False``).
    """
    if (is_quiet() if quiet is None else quiet):
        return []
    import lightning as L

    class RowProgress(L.Callback):
        description = "extraction (rows)"

        def __init__(self):
            self.total_rows = total_rows
            self._cm = None
            self._bar = None

        def on_predict_start(self, trainer, pl_module) -> None:
            if trainer.is_global_zero:
                self._cm = progress_bar(self.description, self.total_rows)
                self._bar = self._cm.__enter__()

        def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
            if self._bar is not None:
                # Under DDP rank 0 sees its share only: scale by the world size for the ETA.
                self._bar.advance(len(batch["row_ids"]) * trainer.world_size)

        def _close(self) -> None:
            if self._cm is not None:
                cm, self._cm, self._bar = self._cm, None, None
                cm.__exit__(None, None, None)

        def on_predict_end(self, trainer, pl_module) -> None:
            self._close()

        def on_exception(self, trainer, pl_module, exception) -> None:
            self._close()

    return [RowProgress()]


__all__ = ["extraction_callbacks", "is_quiet", "progress_bar", "quiet_libraries", "quiet_lightning", "run_stages",
           "set_quiet", "track"]


def quiet_lightning() -> None:
    """Silence Lightning's per-Trainer banners (GPU/TPU availability, tips); warnings still show."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda",
                 "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Lightning <= 2.6 builds torch's deprecated ``LeafSpec()`` for every DataLoader it wraps
    # (CombinedLoader -> lightning.pytorch.utilities._pytree); torch >= 2.9 warns on each
    # Trainer.predict. Not ours to fix and harmless (Lightning-AI/pytorch-lightning#21326).
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning)
