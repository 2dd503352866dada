"""Directional ablation: does the agent *use* the probe's direction, or is it merely decodable?

During free-run generation (:mod:`ipi.behaviour.generate`) a forward hook on decoder block ``k``
projects the layer's direction out of its output at every position (:func:`project_out`); the
direction is the probe's (:func:`probe_direction`), the control a random one of equal norm
(:func:`random_directions`). :func:`run_ablation` generates and labels the same rows three ways
(none, probe, random). Definitions: docs/behaviour.md §4."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ipi.behaviour.generate import GenerationCache, GenerationRequest, GenerationSettings, generate
from ipi.behaviour.labels import LabelTask, label_generations

__all__ = [
    "ARMS",
    "AblationRun",
    "ProjectOut",
    "probe_direction",
    "probe_directions",
    "project_out",
    "random_directions",
    "raw_weights",
    "run_ablation",
]

#: The three generations of :func:`run_ablation`, in order.
ARMS: tuple[str, ...] = ("none", "probe", "random")


def raw_weights(probe) -> np.ndarray:
    """The probe's weights in raw feature space, ``w_raw = coef / std`` (``[D]`` float64).

    Args:
        probe: A fitted :class:`ipi.probe.module.LinearProbe` (its ``effective_weights``) or a
            scikit-learn ``Pipeline(StandardScaler, LogisticRegression)``
            (:func:`ipi.probe.fit.fit_sklearn_reference`: ``coef_[0] / scale_``).

    Raises:
        TypeError: Neither kind.
    """
    if hasattr(probe, "effective_weights"):
        w, _ = probe.effective_weights()
        return w.detach().cpu().double().numpy().copy()
    steps = getattr(probe, "named_steps", None)
    if steps is not None:
        scaler, logreg = list(steps.values())[0], list(steps.values())[-1]
        scale = getattr(scaler, "scale_", None)
        scale = np.ones(logreg.coef_.shape[1]) if scale is None else np.asarray(scale, dtype=np.float64)
        return np.asarray(logreg.coef_[0], dtype=np.float64) / scale
    raise TypeError(f"raw_weights: a LinearProbe or a StandardScaler+LogisticRegression pipeline, "
                    f"got {type(probe).__name__}")


def probe_direction(w_raw, layers: Sequence[int], groups: Sequence[str], hidden_size: int, layer: int) -> np.ndarray:
    """The probe's residual-stream direction at one layer (docs/behaviour.md §4): ``Σ_g w_raw[layer, g]``.

    Args:
        w_raw: Raw-space weights ``[len(layers) * len(groups) * hidden_size]``, laid out as the
            features (layers outer, token groups, hidden innermost).
        layers: The decoder-block indices of the features, in feature order.
        groups: The token groups of the features, in feature order.
        hidden_size: Width ``H`` of the residual stream.
        layer: The block index whose direction is wanted (one of ``layers``).

    Returns:
        ``[H]`` float64.

    Raises:
        ValueError: ``w_raw`` does not have the layout's length, or ``layer`` is not in ``layers``.
    """
    w = np.asarray(w_raw, dtype=np.float64).reshape(-1)
    n = len(layers) * len(groups) * int(hidden_size)
    if w.size != n:
        raise ValueError(f"probe weights have {w.size} entries; layers {list(layers)} x groups {list(groups)} x "
                         f"hidden {hidden_size} = {n}")
    if layer not in layers:
        raise ValueError(f"layer {layer} is not among the probe's layers {list(layers)}")
    block = w.reshape(len(layers), len(groups), int(hidden_size))[list(layers).index(layer)]
    return block.sum(axis=0)


def probe_directions(w_raw, layers: Sequence[int], groups: Sequence[str], hidden_size: int,
                     at: Sequence[int] | None = None) -> dict[int, np.ndarray]:
    """:func:`probe_direction` at every layer of ``at`` (default: all the probe's layers)."""
    return {int(k): probe_direction(w_raw, layers, groups, hidden_size, int(k)) for k in (at or layers)}


def random_directions(directions: Mapping[int, np.ndarray], seed: int) -> dict[int, np.ndarray]:
    """A random direction per layer with the norm of the given one (the ablation's control).

    Each is ``n · g / ‖g‖`` with ``g ~ N(0, I)`` drawn by ``numpy.random.default_rng([seed, k])``
    and ``n`` the norm of ``directions[k]``.

    Args:
        directions: ``{layer: [H]}``.
        seed: Seed of the draws.

    Returns:
        ``{layer: [H]}`` float64.
"""
    out = {}
    for k, u in directions.items():
        u = np.asarray(u, dtype=np.float64)
        g = np.random.default_rng([int(seed), int(k)]).standard_normal(u.shape[-1])
        out[int(k)] = float(np.linalg.norm(u)) * g / np.linalg.norm(g)
    return out


def project_out(h: torch.Tensor, u_hat: torch.Tensor) -> torch.Tensor:
    """``h − (h · û) û`` along the last axis in ``h``'s dtype, computed in float64 (float32 for 16-bit ``h``).

    Args:
        h: ``[..., H]`` hidden states.
        u_hat: ``[H]`` unit vector.

    Returns:
        A new tensor like ``h``.
    """
    work = torch.float64 if h.dtype in (torch.float32, torch.float64) else torch.float32
    hw = h.to(work)
    u = u_hat.to(device=h.device, dtype=work)
    return (hw - (hw @ u).unsqueeze(-1) * u).to(h.dtype)


def _digest(v: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(v, dtype=np.float64).tobytes()).hexdigest()


@dataclass(frozen=True, eq=False)
class ProjectOut:
    """An intervention for :func:`ipi.behaviour.generate.generate`: project directions out of block outputs.

    Attributes:
        directions: ``{block index: [H] direction}`` (any norm but zero).
        name: What the directions are (``"probe"``, ``"random"``), recorded in the cache key.
    """

    directions: Mapping[int, np.ndarray]
    name: str
    _units: dict = field(init=False, repr=False)

    def __post_init__(self):
        if not self.directions:
            raise ValueError("ProjectOut: no direction")
        units = {}
        for k, u in self.directions.items():
            u = np.asarray(u, dtype=np.float64).reshape(-1)
            norm = float(np.linalg.norm(u))
            if not np.isfinite(norm) or norm == 0.0:
                raise ValueError(f"ProjectOut: the direction at layer {k} is zero or not finite")
            units[int(k)] = u / norm
        object.__setattr__(self, "_units", units)

    def identity(self) -> dict:
        """``{"kind": "project_out", "name", "layers": {k: sha256 of û}}`` (the generation key's part)."""
        layers = {str(k): _digest(u) for k, u in sorted(self._units.items())}
        return {"kind": "project_out", "name": self.name, "layers": layers}

    @contextlib.contextmanager
    def applied(self, backbone) -> Iterator[None]:
        """Hooks on the backbone's decoder blocks while the context is open; removed on exit (also on error).

        Raises:
            ValueError: A layer outside the backbone's blocks, or a direction of the wrong width.
        """
        handles = []
        try:
            for k, u in sorted(self._units.items()):
                if not 0 <= k < len(backbone.layers):
                    raise ValueError(f"ProjectOut: layer {k} outside the backbone's {len(backbone.layers)} blocks")
                if u.shape[0] != int(backbone.hidden_size):
                    raise ValueError(f"ProjectOut: direction of width {u.shape[0]} at layer {k}; "
                                     f"the residual stream is {backbone.hidden_size} wide")
                handles.append(backbone.layers[k].register_forward_hook(_hook(torch.from_numpy(u))))
            yield
        finally:
            for h in handles:
                h.remove()


def _hook(u_hat: torch.Tensor):
    def hook(_module, _inputs, output):
        if isinstance(output, tuple):
            return (project_out(output[0], u_hat), *output[1:])
        return project_out(output, u_hat)

    return hook


@dataclass(frozen=True)
class AblationRun:
    """The three generations of :func:`run_ablation` and what they give.

    Attributes:
        labels: ``{arm: label table}`` (:func:`ipi.behaviour.labels.label_generations`) for
            ``none``, ``probe``, ``random``, rows in the same order.
        effects: :class:`ipi.evaluation.hijack.AblationEffects` (hijack rates per arm, changes, probe −
            random), on the attack rows.
        directions: ``{"probe": {layer: [H]}, "random": {layer: [H]}}``.
        seed: The random direction's seed.
    """

    labels: dict
    effects: object
    directions: dict
    seed: int


def run_ablation(backbone, requests: Sequence[GenerationRequest], tasks: Sequence[LabelTask],
                 directions: Mapping[int, np.ndarray], *, settings: GenerationSettings = GenerationSettings(),
                 cache: GenerationCache | None = None, seed: int = 0, n_boot: int = 1000, boot_seed: int = 0,
                 level: float = 0.95, draws=None) -> AblationRun:
    """Free-run the same rows without ablation, with the probe direction and with a random one.

    Args:
        backbone: A backbone that generates (:func:`ipi.behaviour.generate.check_can_generate`).
        requests: The rows' prompts (:func:`ipi.behaviour.generate.requests_of_rows`).
        tasks: The rows' labelling inputs (:func:`ipi.behaviour.labels.label_tasks`), same rows.
        directions: The probe's ``{layer: [H]}`` (:func:`probe_directions`).
        settings: Generation settings (the same for the three arms).
        cache: Generation cache (each arm has its own keys: the intervention is part of them).
        seed: Seed of the random directions.
        n_boot: Bootstrap replicates.
        boot_seed: Seed of the cluster draws.
        level: Interval coverage.
        draws: Shared :class:`~ipi.metrics.bootstrap.Draws` (e.g. the run's), or None for fresh
            draws over the rows' trajectories.

    Returns:
        The :class:`AblationRun`; its effects are computed on the attack rows.

    Raises:
        ValueError: Requests and tasks name different rows, or no attack row.
    """
    from ipi.evaluation.hijack import ablation_effects

    if [r.row_id for r in requests] != [t.row_id for t in tasks]:
        raise ValueError("run_ablation: requests and tasks must list the same rows in the same order")
    rand = random_directions(directions, seed)
    arms = {"none": None, "probe": ProjectOut(directions, "probe"), "random": ProjectOut(rand, f"random[{seed}]")}
    labels = {}
    for arm, inter in arms.items():
        gens = generate(backbone, requests, settings, cache=cache, intervention=inter)
        labels[arm] = label_generations(tasks, {g.row_id: g.text for g in gens})
    effects = ablation_effects(labels, n_boot=n_boot, seed=boot_seed, level=level, draws=draws)
    return AblationRun(labels=labels, effects=effects,
                       directions={"probe": {int(k): np.asarray(v) for k, v in directions.items()}, "random": rand},
                       seed=int(seed))
