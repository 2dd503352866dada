"""Trajectory data: the native schema and importers that produce it.

Every importer has the signature ``importer(root, **kwargs) -> (trajectories, skipped)`` where
``skipped`` lists ``{"path": ..., "reason": ...}`` for inputs left out. A run finds its importer
through the ``_target_`` of ``conf/data/<format>.yaml`` (see ``docs/data.md``).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from ipi.data.browser_use import import_browser_use_report
from ipi.data.discover import bad_step, check_options
from ipi.data.images import DEFAULT_LIMITS, ImageLimits, screenshot_problem
from ipi.data.multimodal_mind2web import import_multimodal_mind2web_report
from ipi.data.online_mind2web import import_online_mind2web_report
from ipi.data.schema import DataError, Skip, Step, Trajectory, iter_native, read_native, write_native
from ipi.data.text import clean_trajectory
from ipi.data.webvoyager import import_webvoyager, import_webvoyager_report


def load_native(
    path: str | os.PathLike,
    *,
    on_bad_step: str = "skip",
    unknown_action: str = "keep",
    limit: int | None = None,
    image_limits: ImageLimits | None = DEFAULT_LIMITS,
) -> tuple[list[Trajectory], list[dict]]:
    """Read a native-schema JSONL file, in the importer signature, checking every step.

    Each step's screenshot is checked as the importers do and the ``unknown_action`` policy is
    applied to ``action_type == "unknown"``.

    Args:
        path: A ``.jsonl`` file written by :func:`write_native`.
        on_bad_step: ``"skip"``: a bad step moves to ``Trajectory.skipped`` with its reason;
            ``"error"``: raise :class:`DataError` naming the screenshot and step.
        unknown_action: ``"keep"``, ``"skip"`` or ``"error"``.
        limit: Stop after this many usable trajectories, in file order (later lines are not
            read). None reads the whole file.
        image_limits: The backbone's image limits (:func:`ipi.data.images.screenshot_problem`).

    Returns:
        ``(trajectories, skipped)``: the trajectories in file order, and
        ``{"path", "reason"}`` per trajectory left out because none of its steps is usable.

    Raises:
        DataError: A line is not a native-schema trajectory (message names the line), or a bad
            step under ``on_bad_step="error"`` / ``unknown_action="error"``.
        FileNotFoundError: ``path`` does not exist.
        ValueError: Bad ``on_bad_step`` or ``unknown_action``.
"""
    check_options(on_bad_step, unknown_action)
    trajectories, skipped = [], []
    for t in iter_native(path):
        if limit is not None and len(trajectories) >= limit:
            break
        steps, skips = [], list(t.skipped)
        for s in t.steps:
            problem = (
                "missing screenshot" if not Path(s.screenshot).is_file()
                else (f"unreadable screenshot: {p}" if (p := screenshot_problem(s.screenshot, limits=image_limits)) else None)
            )
            if problem is None and s.action_type == "unknown" and unknown_action != "keep":
                what = f"unknown action {s.action!r}" if s.action else "no action in the agent turn"
                if unknown_action == "error":
                    raise DataError(f"{path}: trajectory {t.trajectory_id} step {s.step}: {what}")
                skips.append(Skip(s.step, what, str(path)))
                continue
            if problem is not None:
                bad_step(skips, on_bad_step, s.step, problem, s.screenshot)
                continue
            steps.append(s)
        if not steps:
            skipped.append({"path": str(path), "reason": f"trajectory {t.trajectory_id}: no usable step"})
            continue
        skips.sort(key=lambda k: k.step)
        trajectories.append(clean_trajectory(replace(t, steps=tuple(steps), skipped=tuple(skips)),
                                             f"{path}: trajectory {t.trajectory_id}", on_bad_step))
    return trajectories, skipped


__all__ = [
    "DataError",
    "Skip",
    "Step",
    "Trajectory",
    "import_browser_use_report",
    "import_multimodal_mind2web_report",
    "import_online_mind2web_report",
    "import_webvoyager",
    "import_webvoyager_report",
    "load_native",
    "read_native",
    "write_native",
]
