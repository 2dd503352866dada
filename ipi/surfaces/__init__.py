"""Injection surfaces, attack/benign text banks and nuisance-matched controls (PROTOCOL.md §2).

Public API::

    from ipi.surfaces import make_variants, Variant
    from ipi.protocol import SURFACES, CONTROLS_BY_SURFACE  # the vocabulary lives in ipi.protocol
    variants = make_variants(trajectory_id, step, "i_dom", ("c_scrambled", "c_imperative"),
                             count_tokens=lambda s: count_plain_tokens(tok, s))  # ipi.replay
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
from ipi.surfaces.controls import (
    benign_imperative,
    imperative_tokens,
    match_token_count,
    scramble,
    scramble_tokens,
)
from ipi.surfaces.variants import Variant, make_variants

__all__ = [
    "ATTACK_GOALS",
    "ATTACK_GOAL_LIST",
    "ATTACK_TEMPLATES",
    "BENIGN_IMPERATIVES",
    "BannerSpec",
    "Variant",
    "attack_text",
    "banner_spec",
    "benign_imperative",
    "draw_banner",
    "imperative_tokens",
    "make_variants",
    "match_token_count",
    "scramble",
    "scramble_tokens",
    "stable_int",
    "text_fits",
    "wrap_text",
]
