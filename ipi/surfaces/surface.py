"""The surface protocol: what every injection surface owns (PROTOCOL.md §2; docs/surfaces.md).

A *surface* is where an injection lands. Each surface is one module (``ipi.surfaces.i_vis``,
``ipi.surfaces.i_dom``, ``ipi.surfaces.i_tool``) holding one :class:`Surface` subclass, and one
config file ``conf/surface/<name>.yaml`` whose ``_target_`` names that class
(:mod:`ipi.surfaces.registry`). The object answers every question the rest of the code would
otherwise ask by comparing surface names (its attributes: :class:`Surface`).

:class:`TextSurface` is the shared machinery of surfaces whose injection is text in one recorded
field of the prompt: the subclass says where and how a text lands (:class:`Insertion`), the base
class builds the token-matched controls."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from PIL import Image

from ipi.data.images import load_rgb
from ipi.surfaces.bank import attack_text
from ipi.surfaces.banner import BannerSpec, draw_banner
from ipi.surfaces.controls import imperative_sentences, match_token_count, scramble, scramble_tokens

if TYPE_CHECKING:
    from ipi.data.schema import Step


class WordingFamily(Protocol):
    """What a surface draws one trajectory's texts from: :class:`ipi.attacks.wording.WordingFamily`
    (the run's attack pool, its held-out entries and the trajectory's task). The surfaces sit below
    ``ipi.attacks`` (pyproject's import contract), so they name only this shape."""

    @property
    def imperative_texts(self) -> tuple[str, ...]: ...

    @property
    def attack_pool(self): ...

    def attacks(self, trajectory_id: str, step: int, n_attacks: int) -> list[tuple[str, dict]]: ...

__all__ = ["PROMPT_FIELDS", "Insertion", "Surface", "TextSurface", "Variant", "attacks_of", "seed_key"]

#: Recorded fields of a step a text surface may change (what :class:`Variant` carries).
PROMPT_FIELDS: tuple[str, ...] = ("element_text", "tool_result")

#: A surface name: lower-case letters, digits and underscores, starting with a letter.
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Variant:
    """One variant of one (trajectory, step, surface): what the prompt will show.

    Attributes:
        surface: The surface's name (``i_vis``, ``i_dom``, ``i_tool``, ...).
        variant: ``clean``, ``attack``, ``c_scrambled``, ``c_imperative`` or ``c_occlusion``.
        attack_index: ``k`` of the attack (controls are matched to ``k = 0`` and carry 0);
            ``-1`` for clean.
        injected_text: The text inserted or drawn; ``None`` for clean and ``c_occlusion``.
        element_text: Page text the prompt will show.
        tool_result: Tool result block the prompt will show.
        banner: The step's banner spec on ``i_vis`` (clean rows carry it too, so that an
            ``overlay`` token group can pool the same patches), ``None`` on text surfaces.
        meta: JSON-serialisable details: ``template``/``goal``/``goal_family`` of the attack the
            row is (matched to); on text surfaces ``insert_start``/``insert_end`` (character
            span of the injected text in the changed field; for clean rows the insertion point,
            start == end), ``n_tokens`` (tokens of the whole changed field) and ``token_delta``
            (``n_tokens`` minus that of the attack ``k = 0`` row: 0 for matched controls,
            negative for clean), plus the surface's own keys (``i_dom``: ``position``, entries
            before the injected one, and ``label``); on ``i_vis`` ``banner`` (the spec as a
            dict) and ``text_fits``.
    """

    surface: str
    variant: str
    attack_index: int
    injected_text: str | None
    element_text: str
    tool_result: str
    banner: BannerSpec | None
    meta: dict

    def image(self, step: Step, screenshot: Image.Image | None = None) -> Image.Image:
        """Return the screenshot the prompt will show (a new RGB image, :func:`ipi.data.images.to_rgb`).

        Args:
            step: The step this variant was made from (its ``screenshot`` is opened).
            screenshot: ``step``'s screenshot already decoded (:func:`ipi.data.images.load_rgb`),
                shared by the variants of one step; returned as is for clean rows and never
                modified (the banner is drawn on a copy).

        Returns:
            The clean screenshot, or, for non-clean variants with a banner, the screenshot with
            the banner drawn (the empty box for ``c_occlusion``).

        Raises:
            DataError: The screenshot cannot be decoded (message names the file and step).
"""
        # Any mode Pillow opens, as a person sees it (16-bit grey, transparency, CMYK, ...).
        img = screenshot if screenshot is not None else load_rgb(step.screenshot, step.step)
        if self.banner is None or self.variant == "clean":
            return img
        return draw_banner(img, self.banner, self.injected_text)


def seed_key(trajectory_id: str, step: int, control: str) -> str:
    """Seed key of a control's text at one step (scrambling, imperative shuffle).

    Surface-independent on purpose: the attack text of a step is the same on every surface, and
    so is its scrambled / imperative source before token matching (docs/surfaces.md).
    """
    return f"{trajectory_id}\x1f{step}\x1f{control}"


def attacks_of(trajectory_id: str, step: Step, n_attacks: int,
               wording: WordingFamily | None) -> list[tuple[str, dict]]:
    """The ``n_attacks`` attack texts of a step and their metadata (:meth:`ipi.attacks.pool.AttackPool.choose`).

    Args:
        trajectory_id: Trajectory id.
        step: The recorded step.
        n_attacks: Attack rows per step.
        wording: The trajectory's wording family (its pool, held-out entries and task), or None
            for the whole project bank (:func:`ipi.surfaces.bank.attack_text`'s choices).

    Returns:
        ``[(text, {"template", "goal", "goal_family", "source", ...}), ...]`` for
        ``k = 0 .. n_attacks - 1``.
    """
    if wording is None:  # the project bank, as ipi.attacks.wording.full_family() draws it
        return [(t, {**m, "source": "project"})
                for t, m in (attack_text(trajectory_id, step.step, k) for k in range(n_attacks))]
    return wording.attacks(trajectory_id, step.step, n_attacks)


class Surface(ABC):
    """An injection surface (PROTOCOL.md §2): one subclass per module, named by its config file.

    Subclasses set the class attributes below and implement :meth:`make_variants` and
    :meth:`construction_note`; instances hold no state (the registry keeps one per surface).
    :meth:`check` refuses an inconsistent declaration when the class is registered.

    Attributes:
        name: The surface's name, as ``surface=<name>`` and ``conf/surface/<name>.yaml``.
        controls: The controls that apply, in the order rows are built (a subset of
            :data:`ipi.protocol.CONTROLS`).
        required_controls: The controls verdict check 3 requires (PROTOCOL.md §7):
            ``c_scrambled`` always, ``c_imperative`` where the surface has it.
        needs_image: The injection is in the screenshot: a text-only backbone cannot run it.
        token_matched: The controls match the attack's token count (building rows needs the
            backbone's tokenizer); otherwise they match its characters.
        untrusted_group: The token group the injected content lands in (one of
            :data:`ipi.protocol.TOKEN_GROUPS`).
        gallery_title: One line naming the surface and how its controls are matched (the
            gallery's row title).
    """

    name: ClassVar[str]
    controls: ClassVar[tuple[str, ...]]
    required_controls: ClassVar[tuple[str, ...]]
    needs_image: ClassVar[bool]
    token_matched: ClassVar[bool]
    untrusted_group: ClassVar[str]
    gallery_title: ClassVar[str]

    @abstractmethod
    def make_variants(
        self,
        trajectory_id: str,
        step: Step,
        controls: Sequence[str],
        *,
        n_attacks: int = 1,
        count_tokens: Callable[[str], int] | None = None,
        wording: WordingFamily | None = None,
    ) -> list[Variant]:
        """Build the clean, attack and control variants of one (trajectory, step) on this surface.

        Order: ``clean``, ``attack`` for ``k = 0 .. n_attacks - 1``, then the controls in the
        order given, each matched to attack ``k = 0``.

        Args:
            trajectory_id: Trajectory id (seeds every choice together with ``step.step``).
            step: The recorded step.
            controls: Controls to build, a subset of :attr:`controls`.
            n_attacks: Number of attack rows (``>= 1``).
            count_tokens: Token counter of the backbone's tokenizer; required when
                :attr:`token_matched`, unused otherwise.
            wording: The trajectory's held-out wording family (:mod:`ipi.attacks.wording`):
                attack templates, goals and ``c_imperative`` sentences are drawn from it only.
                None: the whole bank.

        Returns:
            The variants.

        Raises:
            ValueError: A control not applicable to the surface, a duplicate control,
                ``n_attacks < 1``, or ``count_tokens`` missing on a token-matched surface.
        """

    @abstractmethod
    def construction_note(self) -> str:
        """What C1's E1 (the metadata baseline) is expected to be on this surface, and why.

        C1 reads step, horizon, prompt length and Δprompt length (PROTOCOL.md §5): a surface
        whose injection lengthens the prompt gives C1 E1 = 1.000 by construction. C1's E1 is the
        note on "separates" of verdict check 2; the check itself is judged on E3[c] − C1 E3[c] on
        every surface (its rule: :data:`ipi.evaluation.verdict.CHECKS`). One or two sentences for
        report.md/html, after ``C1 (metadata baseline) E1 = x. ``.
        """

    def check_args(self, controls: Sequence[str], n_attacks: int,
                   count_tokens: Callable[[str], int] | None) -> None:
        """Refuse arguments :meth:`make_variants` cannot honour (one line naming the allowed values).

        Raises:
            ValueError: A control that does not apply, a duplicate control, ``n_attacks < 1``,
                or no ``count_tokens`` on a token-matched surface.
        """
        allowed = self.controls
        for c in controls:
            if c not in allowed:
                raise ValueError(f"control {c!r} does not apply to surface {self.name!r}; "
                                 f"allowed: {', '.join(allowed)}")
        if len(set(controls)) != len(controls):
            raise ValueError(f"duplicate control in {list(controls)!r}; allowed: {', '.join(allowed)}")
        if n_attacks < 1:
            raise ValueError(f"n_attacks must be >= 1, got {n_attacks}")
        if self.token_matched and count_tokens is None:
            raise ValueError(f"count_tokens is required for surface {self.name!r} (token matching)")

    def check(self) -> None:
        """Refuse an inconsistent declaration (called when the class is registered).

        The protocol's vocabulary (known controls and token groups) is checked by
        :func:`ipi.protocol.check_surface`.

        Raises:
            ValueError: One line naming the class and the attribute.
        """
        where = f"surface class {type(self).__module__}.{type(self).__qualname__}"
        missing = [a for a in ("name", "controls", "required_controls", "needs_image", "token_matched",
                               "untrusted_group", "gallery_title") if not hasattr(self, a)]
        if missing:
            raise ValueError(f"{where}: missing class attribute(s) {', '.join(missing)}")
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"{where}: name {self.name!r} is not lower-case letters, digits and '_'")
        if (not isinstance(self.controls, tuple) or not self.controls
                or not all(isinstance(c, str) for c in self.controls)
                or len(set(self.controls)) != len(self.controls)):
            raise ValueError(f"{where}: controls must be a non-empty tuple of distinct names, got {self.controls!r}")
        if not isinstance(self.required_controls, tuple) or not set(self.required_controls) <= set(self.controls):
            raise ValueError(f"{where}: required_controls {self.required_controls!r} must be a tuple "
                             f"within controls {self.controls!r}")
        if "c_scrambled" not in self.required_controls:
            raise ValueError(f"{where}: required_controls must include c_scrambled (PROTOCOL.md §7 check 3)")
        for flag in ("needs_image", "token_matched"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{where}: {flag} must be True or False, got {getattr(self, flag)!r}")
        for text in ("untrusted_group", "gallery_title"):
            if not isinstance(getattr(self, text), str) or not getattr(self, text):
                raise ValueError(f"{where}: {text} must be a non-empty string")

    def __repr__(self) -> str:
        return f"<surface {self.name}: {type(self).__module__}.{type(self).__qualname__}>"


class Insertion(ABC):
    """Where and how a text lands in one step's field, for :class:`TextSurface`.

    Attributes:
        original: The field as recorded (what clean rows show).
        meta: The surface's own keys for every row's ``meta`` (``i_dom``: ``position``,
            ``label``); ``{}`` when it has none.
    """

    original: str
    meta: dict

    @abstractmethod
    def line(self, text: str) -> str:
        """The injected unit as it appears in the field, wrapper included (token-matched first)."""

    def adapt(self, text: str) -> str:
        """``text`` as this field can carry it (default unchanged; ``i_dom``: one line, no ``"``).

        Applied to every attack and benign text before matching, so the controls are built from
        the adapted attack; rows whose attack changed carry ``meta["adapted"] = True`` and the run
        counts them (results.json ``run.attack.adapted_rows``): never dropped, never silent.
        """
        return text

    @abstractmethod
    def apply(self, text: str | None) -> tuple[str, int, int]:
        """Return ``(field, start, end)``: the new field and the character span of ``text`` in it.

        For ``text=None`` (clean) the field is :attr:`original` and the span is the empty span at
        the insertion point.
        """


def _memoised(count_tokens: Callable[[str], int]) -> Callable[[str], int]:
    """``count_tokens`` with a memo (one per step: its texts are not seen again)."""
    counted: dict[str, int] = {}

    def count(text: str) -> int:
        if text not in counted:
            counted[text] = count_tokens(text)
        return counted[text]

    return count


class TextSurface(Surface):
    """A surface whose injection is text in one recorded field of the prompt, token-count matched.

    Subclasses set :attr:`field` and :attr:`new_line` and implement :meth:`insertion`; the class
    attributes of :class:`Surface` stay theirs to declare. Controls are inserted at the attack's
    place with the attack's wrapper and token count (PROTOCOL.md §2; docs/surfaces.md, "Text-side
    controls are matched on tokens"): ``c_scrambled`` by :func:`~ipi.surfaces.controls.
    scramble_tokens`, ``c_imperative`` by whole sentences
    (:func:`~ipi.surfaces.controls.imperative_sentences`). Matching first counts the injected unit
    alone, then checks the whole changed field; if the field's count differs from the attack's
    (tokenizer merges across the boundary), it re-matches on the whole field.
    ``meta["token_delta"]`` reports any remaining difference (0 when exact).

    Attributes:
        field: The :class:`Variant` field the text lands in (one of :data:`PROMPT_FIELDS`).
        new_line: The injected unit starts a new line of the field (the gallery marks a clean
            row's insertion point on its own line).
        follows: The prompt text that directly follows the field in the replay template
            (:mod:`ipi.replay`), counted with the field: a tokenizer merges across the field's end
            (``i_tool``: an attack ending in ``.`` and the template's ``\n`` are one token ``.\n``),
            so a control matched on the field alone can make the prompt one token longer than the
            attack's. ``""`` when a special token follows (``i_dom``: ``<|im_end|>``).
            ``tests/surfaces/test_variants.py`` checks it against the rendered template.
    """

    field: ClassVar[str]
    new_line: ClassVar[bool] = False
    follows: ClassVar[str] = ""

    @abstractmethod
    def insertion(self, trajectory_id: str, step: Step) -> Insertion:
        """Where and how this step's injection lands (seeded by ``(trajectory_id, step.step)`` only)."""

    def construction_note(self) -> str:
        return (f"On {self.name} the injected text lengthens the prompt, so Δprompt length alone "
                "separates attack from clean rows by construction (expected C1 E1 = 1.000): an E1 form of "
                "check 2 could never pass here, which is one reason it is judged on E3 against the "
                "length-matched controls.")

    def check(self) -> None:
        super().check()
        if getattr(self, "field", None) not in PROMPT_FIELDS:
            raise ValueError(f"surface class {type(self).__qualname__}: field must be one of "
                             f"{', '.join(PROMPT_FIELDS)}, got {getattr(self, 'field', None)!r}")

    def make_variants(self, trajectory_id, step, controls, *, n_attacks=1, count_tokens=None, wording=None):
        self.check_args(controls, n_attacks, count_tokens)
        ins = self.insertion(trajectory_id, step)
        # Texts the field cannot carry as published (quotes, newlines on i_dom) are adapted, and
        # flagged per row (Insertion.adapt); the controls are built from the adapted attack.
        imp = tuple(ins.adapt(t) for t in wording.imperative_texts) if wording is not None else None
        attacks = [(ins.adapt(t), {**m, "adapted": ins.adapt(t) != t})
                   for t, m in attacks_of(trajectory_id, step, n_attacks, wording)]
        a0_text, a0_meta = attacks[0]
        # The searches below count the same field or line more than once (the attack's field, each
        # control's field before and after matching): a per-step memo of the pure counter.
        count_tokens = _memoised(count_tokens)

        def field_count(text: str) -> int:  # the field in its prompt context (``follows``)
            return count_tokens(ins.apply(text)[0] + self.follows)

        def line_count(text: str) -> int:
            return count_tokens(ins.line(text))

        target_field = field_count(a0_text)

        def row(variant: str, k: int, text: str | None, meta: dict) -> Variant:
            field, start, end = ins.apply(text)
            n = count_tokens(field + self.follows)
            m = {**meta, **ins.meta, "insert_start": start, "insert_end": end, "n_tokens": n,
                 "token_delta": n - target_field}
            shown = {"element_text": step.element_text, "tool_result": step.tool_result, self.field: field}
            return Variant(self.name, variant, k, text, shown["element_text"], shown["tool_result"], None, m)

        out = [row("clean", -1, None, {})]
        for k, (text, meta) in enumerate(attacks):
            out.append(row("attack", k, text, meta))
        target_line = line_count(a0_text)
        for c in controls:
            key = seed_key(trajectory_id, step.step, c)
            if c == "c_scrambled":
                text = scramble_tokens(a0_text, key, line_count, target_tokens=target_line)
                if field_count(text) != target_field:
                    text = match_token_count(scramble(a0_text, key), target_field, field_count)
            elif c == "c_imperative":
                # Whole sentences only (docs/surfaces.md): matched on the inserted line, then, if the
                # page context shifts a boundary token, on the whole field.
                text = imperative_sentences(target_line, key, line_count, bank=imp)
                if field_count(text) != target_field:
                    alt = imperative_sentences(target_field, key, field_count, bank=imp)
                    if abs(field_count(alt) - target_field) < abs(field_count(text) - target_field):
                        text = alt
            else:
                raise ValueError(f"surface {self.name!r}: no text control {c!r}; a TextSurface builds "
                                 "c_scrambled and c_imperative")
            out.append(row(c, 0, text, dict(a0_meta)))
        return out
