"""Injection surfaces, attack/benign text banks and nuisance-matched controls (PROTOCOL.md §2).

Public API::

    from ipi.surfaces import get_surface, make_variants, surfaces, Variant
    dom = get_surface("i_dom")                 # the surface object (ipi.surfaces.surface.Surface)
    dom.controls, dom.needs_image, dom.token_matched, dom.untrusted_group
    variants = make_variants(trajectory_id, step, "i_dom", dom.controls,
                             count_tokens=lambda s: count_plain_tokens(tok, s))  # ipi.replay

One module per surface (``i_vis``, ``i_dom``, ``i_tool``), each a :class:`Surface` named by
``conf/surface/<name>.yaml`` (:mod:`ipi.surfaces.registry`); :data:`ipi.protocol.SURFACES` is read
from the registry.
"""

from ipi.surfaces.bank import (
    ATTACK_GOAL_LIST,
    ATTACK_GOALS,
    ATTACK_TEMPLATES,
    BENIGN_IMPERATIVES,
    attack_text,
    stable_int,
)
from ipi.surfaces.banner import BannerSpec, banner_spec, draw_banner, text_fits, wrap_text
from ipi.surfaces.surface import Surface, TextSurface
from ipi.surfaces.controls import (
    benign_imperative,
    match_token_count,
    scramble,
    scramble_tokens,
)
from ipi.surfaces.registry import get_surface, surface_names, surfaces
from ipi.surfaces.variants import Variant, make_variants

__all__ = [
    "ATTACK_GOALS",
    "ATTACK_GOAL_LIST",
    "ATTACK_TEMPLATES",
    "BENIGN_IMPERATIVES",
    "BannerSpec",
    "Surface",
    "TextSurface",
    "Variant",
    "attack_text",
    "banner_spec",
    "benign_imperative",
    "draw_banner",
    "get_surface",
    "make_variants",
    "match_token_count",
    "scramble",
    "scramble_tokens",
    "stable_int",
    "surface_names",
    "surfaces",
    "text_fits",
    "wrap_text",
]
