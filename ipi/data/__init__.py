"""Trajectory data: the native schema and importers that produce it.

Every importer has the signature ``importer(root, **kwargs) -> (trajectories, skipped)`` where
``skipped`` lists ``{"path": ..., "reason": ...}`` for inputs left out. :data:`IMPORTERS` maps a
kind name to its importer; :func:`load_trajectories` dispatches on it (see ``docs/data.md``).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ipi.data.multimodal_mind2web import import_multimodal_mind2web_report
from ipi.data.online_mind2web import import_online_mind2web_report
from ipi.data.schema import DataError, Skip, Step, Trajectory, read_native, write_native
from ipi.data.webvoyager import import_webvoyager, import_webvoyager_report


def load_native(path: str | os.PathLike) -> tuple[list[Trajectory], list[dict]]:
    """Read a native-schema JSONL file, in the importer signature.

    Args:
        path: A ``.jsonl`` file written by :func:`write_native`.

    Returns:
        ``(trajectories, [])``: the file's trajectories in file order; nothing is skipped.

    Raises:
        DataError: A line is not a native-schema trajectory (message names the line).
        FileNotFoundError: ``path`` does not exist.
    """
    return read_native(path), []


#: Importer registry: kind name -> ``importer(root, **kwargs) -> (trajectories, skipped)``.
IMPORTERS: dict[str, Callable[..., tuple[list[Trajectory], list[dict]]]] = {
    "webvoyager": import_webvoyager_report,
    "online_mind2web": import_online_mind2web_report,
    "multimodal_mind2web": import_multimodal_mind2web_report,
    "native": load_native,
}


def load_trajectories(
    kind: str, root: str | os.PathLike, **kwargs
) -> tuple[list[Trajectory], list[dict]]:
    """Load trajectories with the importer registered under ``kind``.

    Args:
        kind: A key of :data:`IMPORTERS` (``"webvoyager"``, ``"native"``).
        root: What the importer reads: a folder of WebVoyager task folders, a ``.jsonl`` file.
        **kwargs: Passed to the importer (e.g. ``on_bad_step``, ``max_element_chars`` for
            ``"webvoyager"``).

    Returns:
        ``(trajectories, skipped)`` as the importer returns them; ``skipped`` holds
        ``{"path": ..., "reason": ...}`` per input left out.

    Raises:
        ValueError: ``kind`` is not registered (the message lists the allowed kinds).
        DataError: Malformed input, as raised by the importer.
    """
    try:
        importer = IMPORTERS[kind]
    except KeyError:
        allowed = ", ".join(sorted(IMPORTERS))
        raise ValueError(f"unknown trajectory kind {kind!r}; allowed kinds: {allowed}") from None
    return importer(root, **kwargs)


__all__ = [
    "IMPORTERS",
    "DataError",
    "Skip",
    "Step",
    "Trajectory",
    "import_multimodal_mind2web_report",
    "import_online_mind2web_report",
    "import_webvoyager",
    "import_webvoyager_report",
    "load_native",
    "load_trajectories",
    "read_native",
    "write_native",
]
