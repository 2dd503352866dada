"""``i_vis`` banners: geometry, font and colours per step, and drawing.

A banner is a filled rectangle with text wrapped inside it. Its :class:`BannerSpec` depends only
on (trajectory, step, image size), never on the text drawn, so the attack and every control of
one step share the box, the colours and the font (PROTOCOL.md §2). The default font is Pillow's
bundled scalable font (independent of system fonts); a TTF path may be given instead. Boxes are
half-open pixel ranges, like ``Image.crop``."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

from ipi.surfaces.bank import all_attack_texts, stable_int

#: High-contrast (fill, text) colour pairs. No white or near-white fill, so that even an empty
#: box (``c_occlusion``) is visible on the mostly white pages of web screenshots.
PALETTE: tuple[tuple[tuple[int, int, int], tuple[int, int, int]], ...] = (
    ((200, 16, 46), (255, 255, 255)),  # red / white
    ((255, 214, 0), (0, 0, 0)),  # yellow / black
    ((20, 20, 20), (255, 235, 59)),  # black / yellow
    ((13, 71, 161), (255, 255, 255)),  # blue / white
    ((27, 94, 32), (255, 255, 255)),  # green / white
    ((239, 108, 0), (0, 0, 0)),  # orange / black
    ((106, 27, 154), (255, 255, 255)),  # purple / white
    ((0, 131, 143), (255, 255, 255)),  # teal / white
)

#: Width of the box as a fraction of the image width (uniform in this range).
WIDTH_FRACTION = (0.35, 0.70)
#: Initial font size as a fraction of the image height (uniform in this range).
FONT_FRACTION = (0.026, 0.036)
#: The box may take at most this fraction of the image height; the font shrinks until it does.
MAX_HEIGHT_FRACTION = 0.5
MIN_FONT_SIZE = 8


@dataclass(frozen=True)
class BannerSpec:
    """Geometry and style of one step's banner (shared by attack and all controls).

    Attributes:
        box: ``(x0, y0, x1, y1)`` in screenshot pixels, half-open (``x1``/``y1`` excluded).
        fill: RGB fill colour of the box.
        text_color: RGB colour of the text.
        font_size: Font size in pixels.
        font_path: TTF file, or ``None`` for Pillow's bundled scalable font.
        padding: Inner margin between the box edge and the text, in pixels.
        image_size: ``(width, height)`` of the screenshot the spec was made for.
    """

    box: tuple[int, int, int, int]
    fill: tuple[int, int, int]
    text_color: tuple[int, int, int]
    font_size: int
    font_path: str | None
    padding: int
    image_size: tuple[int, int]

    def to_dict(self) -> dict:
        """Return a JSON-serialisable dict of the spec."""
        return {
            "box": list(self.box),
            "fill": list(self.fill),
            "text_color": list(self.text_color),
            "font_size": self.font_size,
            "font_path": self.font_path,
            "padding": self.padding,
            "image_size": list(self.image_size),
        }


@functools.lru_cache(maxsize=64)
def load_font(size: int, font_path: str | None = None) -> ImageFont.ImageFont:
    """Load a font of ``size`` pixels (cached).

    Args:
        size: Font size in pixels.
        font_path: A TTF/OTF file, or ``None`` for Pillow's bundled scalable font.

    Returns:
        A Pillow font.
    """
    if font_path is None:
        return ImageFont.load_default(size=size)
    return ImageFont.truetype(font_path, size=size)


def line_height(font: ImageFont.ImageFont, font_size: int) -> int:
    """Vertical advance between wrapped lines, in pixels."""
    try:
        ascent, descent = font.getmetrics()
    except AttributeError:  # bitmap fallback font
        ascent, descent = font_size, 0
    return int(ascent + descent + max(1, round(0.15 * font_size)))


def wrap_text(text: str, font: ImageFont.ImageFont, max_width: int) -> list[str]:
    """Greedy word wrap by measured pixel width.

    Words are separated by single spaces; newlines start a new line; a word wider than
    ``max_width`` is broken between characters. A line takes words while it fits, found by a
    galloping search over how many of the next words fit (the same lines as a word-by-word loop).

    Args:
        text: Text to wrap.
        font: Font used to measure (``font.getlength``).
        max_width: Maximum line width in pixels.

    Returns:
        The lines, without trailing spaces.
"""
    def fits(s: str) -> bool:
        return font.getlength(s) <= max_width

    lines: list[str] = []
    for para in text.split("\n"):
        words = para.split(" ")
        cur, i, n = "", 0, len(words)
        while i < n:
            if not cur:
                while i < n and not words[i]:  # an empty word on an empty line leaves it empty
                    i += 1
                if i == n:
                    break
            head, nxt = (f"{cur} " if cur else ""), words[i:]

            def line(k: int, head: str = head, nxt: list[str] = nxt) -> str:  # cur + the next k words
                return head + " ".join(nxt[:k])

            # largest k with line(k) fitting: gallop (1, 2, 4, ...) then bisect
            lo, hi = 0, 1
            while i + hi <= n and fits(line(hi)):
                lo, hi = hi, 2 * hi
            hi = min(hi, n - i + 1)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if fits(line(mid)) else (lo, mid)
            if lo:
                cur, i = line(lo), i + lo
                continue
            word = words[i]  # words[i] does not fit after cur: a new line starts with it
            if cur:
                lines.append(cur)
            i += 1
            if fits(word):
                cur = word
                continue
            # Break an over-long word between characters.
            piece = ""
            for ch in word:
                if piece and font.getlength(piece + ch) > max_width:
                    lines.append(piece)
                    piece = ""
                piece += ch
            cur = piece
        lines.append(cur)
    return [ln.rstrip() for ln in lines]


def _worst_case(text: str) -> str:
    """``text`` with every letter replaced by a wide letter of the same case.

    Scrambled and imperative controls have the same character count as the attack but other
    letters; sizing the box for wide letters keeps every control inside the box.
    """
    return "".join("W" if c.isupper() else "m" if c.isalpha() else "0" if c.isdigit() else c
                   for c in text)


@functools.lru_cache(maxsize=1)
def _longest_bank_text() -> str:
    return max(all_attack_texts(), key=len)


def _required_height(text: str, font_size: int, inner_w: int) -> int:
    font = load_font(font_size)
    n = len(wrap_text(_worst_case(text), font, inner_w))
    return (n + 1) * line_height(font, font_size)  # one spare line of slack


def banner_spec(
    trajectory_id: str,
    step: int,
    image_size: tuple[int, int],
    *,
    reference_text: str | None = None,
) -> BannerSpec:
    """Return the deterministic banner of one (trajectory, step).

    A ``random.Random`` seeded by the SHA-256 of ``(trajectory_id, step)`` draws, in order: the
    box width (35–70 % of the image width), the initial font size (2.6–3.6 % of the image
    height), the palette entry, and the box position (fully inside the image). The box height
    is what the longest text to hold needs when wrapped (wide letters, one spare line); over half
    the image height, the font shrinks one pixel at a time (not below 8 px).

    The text to hold is the longest attack text of the bank, so any attack ``k`` of the step and
    its same-length controls fit; the result never depends on which variant is drawn.

    Args:
        trajectory_id: Trajectory id.
        step: 0-based step index.
        image_size: Screenshot ``(width, height)`` in pixels.
        reference_text: The longest text to hold instead of the bank's (a run's attack pool:
            :attr:`ipi.attacks.pool.AttackPool.longest_text`).

    Returns:
        The banner spec.

    Raises:
        ValueError: The image is too small for a banner (under 32 × 32 pixels).
"""
    width, height = int(image_size[0]), int(image_size[1])
    if width < 32 or height < 32:
        raise ValueError(f"image too small for a banner: {width}x{height}")
    rng = random.Random(stable_int("banner", trajectory_id, step))
    box_w = max(16, int(round(width * rng.uniform(*WIDTH_FRACTION))))
    font_size = max(MIN_FONT_SIZE, int(round(height * rng.uniform(*FONT_FRACTION))))
    fill, text_color = PALETTE[rng.randrange(len(PALETTE))]
    u_x, u_y = rng.random(), rng.random()

    ref = reference_text if reference_text else _longest_bank_text()
    max_h = int(height * MAX_HEIGHT_FRACTION)
    while True:
        padding = max(2, font_size // 2)
        inner_w = max(1, box_w - 2 * padding)
        box_h = _required_height(ref, font_size, inner_w) + 2 * padding
        if box_h <= max_h or font_size <= MIN_FONT_SIZE:
            break
        font_size -= 1
    box_h = min(box_h, height)
    x0 = int(u_x * (width - box_w + 1))
    y0 = int(u_y * (height - box_h + 1))
    return BannerSpec(
        box=(x0, y0, x0 + box_w, y0 + box_h),
        fill=fill,
        text_color=text_color,
        font_size=font_size,
        font_path=None,  # Pillow's bundled scalable font
        padding=padding,
        image_size=(width, height),
    )


def text_fits(spec: BannerSpec, text: str) -> bool:
    """Whether ``text`` wrapped at the box width fits inside the box height.

    Args:
        spec: Banner spec.
        text: Text to test.

    Returns:
        True when every wrapped line lies inside the box (text is clipped otherwise).
    """
    x0, y0, x1, y1 = spec.box
    font = load_font(spec.font_size, spec.font_path)
    lines = wrap_text(text, font, max(1, x1 - x0 - 2 * spec.padding))
    return len(lines) * line_height(font, spec.font_size) <= (y1 - y0) - 2 * spec.padding


def draw_banner(image: Image.Image, spec: BannerSpec, text: str | None) -> Image.Image:
    """Draw a banner on a copy of ``image``.

    The box is filled with ``spec.fill``; ``text`` is word-wrapped by measured pixel width at
    the box width minus padding and drawn top-left aligned. Drawing is clipped to the box, so no
    pixel outside it changes even if a text overflows. ``text=None`` (or ``""``) draws the empty
    box (``c_occlusion``).

    Args:
        image: The screenshot (any mode; converted to RGB). Never mutated.
        spec: Banner spec of the step.
        text: Text to draw, or ``None`` for an empty box.

    Returns:
        A new RGB image of the same size.

    Raises:
        ValueError: The box does not lie inside the image.
    """
    out = image.convert("RGB") if image.mode != "RGB" else image.copy()
    x0, y0, x1, y1 = spec.box
    if not (0 <= x0 < x1 <= out.width and 0 <= y0 < y1 <= out.height):
        raise ValueError(f"banner box {spec.box} is not inside the {out.width}x{out.height} image")
    panel = Image.new("RGB", (x1 - x0, y1 - y0), spec.fill)
    if text:
        font = load_font(spec.font_size, spec.font_path)
        draw = ImageDraw.Draw(panel)
        lh = line_height(font, spec.font_size)
        y = spec.padding
        for line in wrap_text(text, font, max(1, panel.width - 2 * spec.padding)):
            draw.text((spec.padding, y), line, fill=spec.text_color, font=font)
            y += lh
    out.paste(panel, (x0, y0))
    return out
