"""Gallery of every surface × variant of one step, as one PNG.

Usage (from the repository root)::

    python -m ipi.reporting.gallery [--data-root ../shared/data/webvoyager] \\
        --trajectory examples/taskAmazon--0 --step 0 --out outputs/gallery.png

One row per surface (those that ship, :func:`ipi.surfaces.registry.surfaces`, and a run's own;
titled by its ``gallery_title``): a surface that needs the screenshot (``i_vis``) shows each variant's
downscaled screenshot plus an enlarged crop of the banner region; a text surface (``i_dom``,
``i_tool``) shows text panels of the changed region of its field (element list, tool result),
with the inserted text highlighted and its token count.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from ipi.data.schema import Step
from ipi.data.webvoyager import import_webvoyager
from ipi.io import atomic_path
from ipi.surfaces.surface import Surface, TextSurface, Variant
from ipi.surfaces.registry import surfaces

CELL_W = 520
GAP = 16
MARGIN = 20
BG = (245, 245, 245)
INK = (20, 20, 20)
MUTED = (90, 90, 90)
HIGHLIGHT = (255, 236, 120)
MARKER = (170, 210, 255)
CONTEXT_CHARS = 220


def _shared_dir() -> Path:
    shared = os.environ.get("IPI_SHARED")
    return Path(shared) if shared else Path(__file__).resolve().parents[2].parent / "shared"


def default_tokenizer_path() -> Path:
    """Default Qwen2.5-VL tokenizer: ``$IPI_SHARED/models/...`` or ``<repo>/../shared/models/...``.

    Returns:
        Path of the tokenizer folder.
    """
    return _shared_dir() / "models" / "qwen2_5_vl_processor"


def default_data_root() -> Path:
    """Default WebVoyager root, as in ``conf/data/webvoyager.yaml``: ``$IPI_DATA_DIR`` or ``../shared/data/webvoyager``."""
    env = os.environ.get("IPI_DATA_DIR")
    return Path(env) if env else _shared_dir() / "data" / "webvoyager"


def token_counter(path: str | os.PathLike) -> Callable[[str], int]:
    """Return a token counter backed by ``transformers.AutoTokenizer``.

    Args:
        path: Tokenizer folder (or hub id).

    Returns:
        ``f(text) ->`` the number of tokens of ``text`` tokenised as plain characters, as replay
        tokenises recorded text (:func:`ipi.replay.count_plain_tokens`).
    """
    from transformers import AutoTokenizer

    from ipi.replay import count_plain_tokens

    tok = AutoTokenizer.from_pretrained(str(path))
    return lambda text: count_plain_tokens(tok, text)


def _font(size: int) -> ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def _layout_segments(
    segments: Sequence[tuple[str, str]], font: ImageFont.ImageFont, width: int
) -> list[list[tuple[str, str, float]]]:
    """Word-wrap styled segments; returns lines of ``(text, style, x)`` runs."""
    segments = [(t.replace("\t", "  "), st) for t, st in segments]
    full = "".join(t for t, _ in segments)
    styles = [st for t, st in segments for _ in t]
    lines: list[list[tuple[str, str, float]]] = [[]]
    x = 0.0
    space = font.getlength(" ")
    for m in re.finditer(r"\n|[^ \n]+", full):
        if m.group() == "\n":
            lines.append([])
            x = 0.0
            continue
        i0, i1 = m.span()
        # Runs of one style inside the word (a word may be half context, half injection).
        runs: list[tuple[str, str]] = []
        for i in range(i0, i1):
            if runs and runs[-1][1] == styles[i]:
                runs[-1] = (runs[-1][0] + full[i], styles[i])
            else:
                runs.append((full[i], styles[i]))
        w = sum(font.getlength(t) for t, _ in runs)
        gap = space if (i0 > 0 and full[i0 - 1] == " " and lines[-1]) else 0.0
        if lines[-1] and x + gap + w > width:
            lines.append([])
            x, gap = 0.0, 0.0
        if gap:
            sp_style = styles[i0 - 1] if styles[i0 - 1] == styles[i0] else "normal"
            lines[-1].append((" ", sp_style, x))
            x += gap
        for t, st in runs:
            for ch in t:  # break over-long words (URLs, gibberish) between characters
                cw = font.getlength(ch)
                if lines[-1] and x + cw > width:
                    lines.append([])
                    x = 0.0
                if lines[-1] and lines[-1][-1][1] == st:  # runs on a line are contiguous
                    prev = lines[-1][-1]
                    lines[-1][-1] = (prev[0] + ch, st, prev[2])
                else:
                    lines[-1].append((ch, st, x))
                x += cw
    return lines


def _text_panel(segments: Sequence[tuple[str, str]], width: int, size: int = 15) -> Image.Image:
    """Render styled segments (``normal``/``inject``/``marker``) into a white panel."""
    font = _font(size)
    pad = 10
    lines = _layout_segments(segments, font, width - 2 * pad)
    ascent, descent = font.getmetrics()
    lh = ascent + descent + 4
    img = Image.new("RGB", (width, 2 * pad + lh * len(lines)), (255, 255, 255))
    d = ImageDraw.Draw(img)
    for i, line in enumerate(lines):
        y = pad + i * lh
        for text, style, x in line:
            if style in ("inject", "marker"):
                w = font.getlength(text)
                color = HIGHLIGHT if style == "inject" else MARKER
                d.rectangle([pad + x, y - 1, pad + x + w, y + lh - 3], fill=color)
            d.text((pad + x, y), text, fill=INK, font=font)
    return img


def _context(text: str, start: int, end: int, n: int = CONTEXT_CHARS) -> tuple[str, str]:
    """Up to ``n`` characters before ``start`` and after ``end``, with ellipses when cut."""
    a = max(0, start - n)
    b = min(len(text), end + n)
    before = ("… " if a > 0 else "") + text[a:start]
    after = text[end:b] + (" …" if b < len(text) else "")
    return before, after


def _text_segments(v: Variant, surface: TextSurface) -> list[tuple[str, str]]:
    field = getattr(v, surface.field)
    start, end = v.meta["insert_start"], v.meta["insert_end"]
    if v.variant == "clean":
        before, after = _context(field, start, end)
        if not field:
            before = "(empty)"
        lead = "\n" if (surface.new_line and field) else " "
        return [(before + lead, "normal"), (">> insertion point <<", "marker"),
                (" " + after if after else "", "normal")]
    before, after = _context(field, start, end)
    return [(before, "normal"), (field[start:end], "inject"), (after, "normal")]


def _label(v: Variant, surface: Surface) -> tuple[str, str]:
    title = v.variant if v.variant != "attack" else f"attack (k={v.attack_index})"
    if surface.needs_image:
        if v.variant == "clean":
            info = "clean screenshot (crop: banner region)"
        elif v.injected_text is None:
            info = "empty box, no text"
        else:
            info = f"{len(v.injected_text)} chars"
            if "goal_family" in v.meta and v.variant == "attack":
                info += f" · template {v.meta['template']} · goal {v.meta['goal_family']}"
            if not v.meta.get("text_fits", True):
                info += " · TEXT CLIPPED"
        return title, info
    info = f"{v.meta['n_tokens']} tokens in field (diff {v.meta['token_delta']:+d} vs attack)"
    if v.injected_text is not None:
        info += f" · {len(v.injected_text)} chars"
    if v.variant == "attack":
        info += f" · {v.meta['goal_family']}"
    return title, info


def _vis_cell(v: Variant, step: Step, width: int) -> Image.Image:
    img = v.image(step)
    thumb = img.resize((width, max(1, round(img.height * width / img.width))), Image.LANCZOS)
    x0, y0, x1, y1 = v.banner.box
    m = 8
    crop = img.crop((max(0, x0 - m), max(0, y0 - m), min(img.width, x1 + m),
                     min(img.height, y1 + m)))
    scale = min(width / crop.width, 320 / crop.height)
    zoom = crop.resize((max(1, round(crop.width * scale)), max(1, round(crop.height * scale))),
                       Image.LANCZOS)
    # Outline the banner box on the thumbnail (the box is the nuisance held fixed).
    d = ImageDraw.Draw(thumb)
    s = width / img.width
    d.rectangle([x0 * s - 2, y0 * s - 2, x1 * s + 1, y1 * s + 1], outline=(0, 160, 255), width=2)
    cell = Image.new("RGB", (width, thumb.height + 6 + zoom.height), BG)
    cell.paste(thumb, (0, 0))
    cell.paste(zoom, ((width - zoom.width) // 2, thumb.height + 6))
    return cell


def _labelled(cell: Image.Image, title: str, info: str) -> Image.Image:
    tf, inf = _font(20), _font(14)
    head = 50
    out = Image.new("RGB", (cell.width, cell.height + head), BG)
    d = ImageDraw.Draw(out)
    d.text((2, 2), title, fill=INK, font=tf)
    d.text((2, 28), info, fill=MUTED, font=inf)
    out.paste(cell, (0, head))
    return out


def build_gallery(
    trajectory_id: str,
    step: Step,
    count_tokens: Callable[[str], int],
    *,
    task: str = "",
    n_attacks: int = 1,
    cell_width: int = CELL_W,
    shown: Sequence[Surface] | None = None,
    wording=None,
) -> Image.Image:
    """Render every surface × variant of one step into one image.

    Args:
        trajectory_id: Trajectory id (seeds the variants).
        step: The step.
        count_tokens: Token counter for the text surfaces.
        task: Task instruction, shown in the header.
        n_attacks: Attack rows per surface.
        cell_width: Width of one cell in pixels.
        shown: The surfaces, one row each, in order; None: the surfaces that ship
            (:func:`ipi.surfaces.registry.surfaces`).
        wording: The wording family the attacks are drawn from (the run's attack pool bound to
            the trajectory's task: :class:`ipi.attacks.wording.WordingFamily`); None: the bank.

    Returns:
        The gallery (RGB).
    """
    rows: list[tuple[Surface, list[Image.Image]]] = []
    for surface in (surfaces() if shown is None else shown):
        variants = surface.make_variants(trajectory_id, step, surface.controls, n_attacks=n_attacks,
                                         count_tokens=count_tokens, wording=wording)
        cells = []
        for v in variants:
            if surface.needs_image:
                body = _vis_cell(v, step, cell_width)
            else:
                body = _text_panel(_text_segments(v, surface), cell_width)
            cells.append(_labelled(body, *_label(v, surface)))
        rows.append((surface, cells))

    n_cols = max(len(c) for _, c in rows)
    width = 2 * MARGIN + n_cols * cell_width + (n_cols - 1) * GAP
    header_h, title_h = 70, 34
    height = MARGIN + header_h
    for _, cells in rows:
        height += title_h + max(c.height for c in cells) + 2 * GAP
    out = Image.new("RGB", (width, height), BG)
    d = ImageDraw.Draw(out)
    d.text((MARGIN, MARGIN), f"{trajectory_id} · step {step.step} · action: {step.action}",
           fill=INK, font=_font(26))
    if task:
        d.text((MARGIN, MARGIN + 34), f"task: {task[:220]}", fill=MUTED, font=_font(16))
    y = MARGIN + header_h
    for surface, cells in rows:
        d.line([(MARGIN, y), (width - MARGIN, y)], fill=(180, 180, 180), width=2)
        d.text((MARGIN, y + 6), surface.gallery_title, fill=(0, 90, 170), font=_font(20))
        y += title_h
        for i, c in enumerate(cells):
            out.paste(c, (MARGIN + i * (cell_width + GAP), y))
        y += max(c.height for c in cells) + 2 * GAP
    return out


def save_png_atomic(image: Image.Image, path: str | os.PathLike) -> Path:
    """Write ``image`` as PNG via a temporary file in the same folder and ``os.replace``.

    Args:
        image: Image to write.
        path: Destination.

    Returns:
        The destination path.
    """
    with atomic_path(path) as tmp:
        image.save(tmp, format="PNG")
    return Path(path)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ipi.reporting.gallery",
        description="Write one PNG showing every surface and variant (attack and controls) "
        "of one recorded step.",
    )
    p.add_argument("--data-root", default=str(default_data_root()),
                   help="WebVoyager results folder to import (default: $IPI_DATA_DIR or ../shared/data/webvoyager).")
    p.add_argument("--trajectory", required=True,
                   help="Trajectory id, e.g. examples/taskAmazon--0 (folder relative to root).")
    p.add_argument("--step", type=int, default=0, help="0-based step index (default 0).")
    p.add_argument("--out", required=True, help="Output PNG path.")
    p.add_argument("--tokenizer", default=None,
                   help="Tokenizer folder for token matching "
                   f"(default {default_tokenizer_path()}).")
    p.add_argument("--n-attacks", type=int, default=1, help="Attack rows per surface (default 1).")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (see module docstring).

    Args:
        argv: Arguments (default ``sys.argv[1:]``).

    Returns:
        Exit status (0 on success).
    """
    args = _parser().parse_args(argv)

    trajectories = import_webvoyager(args.data_root)
    want = args.trajectory.strip("/")
    matches = [t for t in trajectories if t.trajectory_id == want]
    if not matches:
        matches = [t for t in trajectories if t.trajectory_id.endswith("/" + want)]
    if len(matches) != 1:
        ids = ", ".join(t.trajectory_id for t in trajectories[:10])
        print(f"error: trajectory {want!r} not found (or ambiguous) under {args.data_root}; "
              f"e.g. {ids}", file=sys.stderr)
        return 2
    traj = matches[0]
    steps = {s.step: s for s in traj.steps}
    if args.step not in steps:
        print(f"error: step {args.step} not usable in {traj.trajectory_id}; "
              f"usable steps: {sorted(steps)}", file=sys.stderr)
        return 2
    count = token_counter(args.tokenizer or default_tokenizer_path())
    img = build_gallery(traj.trajectory_id, steps[args.step], count, task=traj.task,
                        n_attacks=args.n_attacks)
    out = save_png_atomic(img, args.out)
    print(f"wrote {out} ({img.width}x{img.height})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
