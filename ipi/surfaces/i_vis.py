"""``i_vis``: a banner drawn on the screenshot (PROTOCOL.md §2; docs/surfaces.md).

The attack text is drawn in a filled box (:mod:`ipi.surfaces.banner`) that every variant of a
step shares. Controls match the attack's characters: ``c_scrambled`` is
:func:`~ipi.surfaces.controls.scramble` of the attack text, ``c_imperative``
:func:`~ipi.surfaces.controls.benign_imperative` of its character count, ``c_occlusion`` the
empty box. Page text and tool result are unchanged, so the prompt length is too."""

from __future__ import annotations

from typing import ClassVar

from PIL import Image

from ipi.surfaces.banner import banner_spec, text_fits
from ipi.surfaces.surface import Surface, Variant, attacks_of, seed_key
from ipi.surfaces.controls import benign_imperative, scramble

__all__ = ["BannerSurface"]


class BannerSurface(Surface):
    """A banner drawn on the screenshot (``conf/surface/i_vis.yaml``)."""

    name: ClassVar[str] = "i_vis"
    controls: ClassVar[tuple[str, ...]] = ("c_scrambled", "c_imperative", "c_occlusion")
    required_controls: ClassVar[tuple[str, ...]] = ("c_scrambled", "c_imperative")
    needs_image: ClassVar[bool] = True
    token_matched: ClassVar[bool] = False
    untrusted_group: ClassVar[str] = "image"
    gallery_title: ClassVar[str] = ("i_vis: banner drawn on the screenshot (box, colours, font fixed per step; "
                                    "controls keep the attack's character count and layout)")

    def construction_note(self) -> str:
        return ("On i_vis the banner is drawn on the screenshot and leaves the prompt length "
                "unchanged (Δprompt length 0), so C1's inputs are equal for the attack and clean rows "
                "of a step (expected C1 E1 ≈ 0.5).")

    def make_variants(self, trajectory_id, step, controls, *, n_attacks=1, count_tokens=None, wording=None):
        """Clean, attack(s) and controls with the step's banner (see :meth:`Surface.make_variants`).

        Every variant carries the step's :class:`~ipi.surfaces.banner.BannerSpec` (the clean row
        too, so an ``overlay`` token group pools the same patches) and ``meta["banner"]``,
        ``meta["text_fits"]``; controls also ``meta["n_chars"]``, the attack's character count.
        """
        self.check_args(controls, n_attacks, count_tokens)
        imp = wording.imperative_texts if wording is not None else None
        attacks = attacks_of(trajectory_id, step, n_attacks, wording)
        a0_text, a0_meta = attacks[0]
        with Image.open(step.screenshot) as im:
            size = im.size
        # The box holds the longest attack of the run's pool (the project bank by default), up to
        # the half-image cap; a text that still does not fit is flagged (meta["text_fits"]) and counted.
        pool = wording.attack_pool if wording is not None else None
        spec = banner_spec(trajectory_id, step.step, size,
                           reference_text=pool.longest_text if pool is not None else None)
        spec_d = spec.to_dict()

        def vis(variant: str, k: int, text: str | None, meta: dict) -> Variant:
            fits = True if text is None else text_fits(spec, text)
            m = {**meta, "banner": spec_d, "text_fits": fits}
            return Variant(self.name, variant, k, text, step.element_text, step.tool_result, spec, m)

        out = [vis("clean", -1, None, {})]
        for k, (text, meta) in enumerate(attacks):
            out.append(vis("attack", k, text, meta))
        for c in controls:
            key = seed_key(trajectory_id, step.step, c)
            if c == "c_scrambled":
                text = scramble(a0_text, key)
            elif c == "c_imperative":
                text = benign_imperative(len(a0_text), key, imp)
            else:  # c_occlusion: the empty box
                text = None
            out.append(vis(c, 0, text, {**a0_meta, "n_chars": len(a0_text)}))
        return out
