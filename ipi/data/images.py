"""Screenshots: the checks decided at import, and the one conversion every replay uses.

Two rules (``docs/data.md``, "Screenshots"): every image the processor may refuse is a counted
skip decided at import (:func:`screenshot_problem`), and every image mode Pillow can open
replays as the picture a person sees (:func:`to_rgb`)."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import PIL
from PIL import Image

from ipi.data.discover import is_lfs_pointer
from ipi.data.schema import DataError
from ipi.io import content_digest, text_lines

__all__ = [
    "DEFAULT_LIMITS",
    "LFS_POINTER_REASON",
    "MAX_SCREENSHOT_PIXELS",
    "MIN_SCREENSHOT_SIDE",
    "ImageLimits",
    "decode_memo",
    "root_image_dir",
    "write_image_bytes",
    "image_limits_for",
    "load_rgb",
    "resized_size",
    "screenshot_problem",
    "to_rgb",
]

#: Largest screenshot (width × height) accepted: Pillow's decompression-bomb limit
#: (``PIL.Image.MAX_IMAGE_PIXELS``, 89,478,485 by default). Checked from the header.
MAX_SCREENSHOT_PIXELS = Image.MAX_IMAGE_PIXELS or 89_478_485
#: Smallest screenshot side accepted (an ``i_vis`` banner needs 32 x 32 pixels).
MIN_SCREENSHOT_SIDE = 32
#: Skip reason of a Git LFS pointer file.
LFS_POINTER_REASON = "Git LFS pointer file, not an image (fetch the content with `git lfs pull`)"


@dataclass(frozen=True)
class ImageLimits:
    """What the backbone's image processor accepts (Qwen2.5-VL ``smart_resize``).

    Attributes:
        min_pixels: Smallest resized ``height * width`` (``size.shortest_edge``).
        max_pixels: Largest resized ``height * width`` (``size.longest_edge``).
        factor: ``patch_size * merge_size``: resized sides are multiples of it (one patch of
            the merged grid); a side under it is refused.
    """

    min_pixels: int = 56 * 56
    max_pixels: int = 12_845_056
    factor: int = 28


#: The Qwen2.5-VL processor's own defaults (``preprocessor_config.json``).
DEFAULT_LIMITS = ImageLimits()


def image_limits_for(image_size: dict | None, processor_path: str | os.PathLike | None = None) -> ImageLimits:
    """Limits of a backbone: its ``image_size`` and, when found, its processor's patch and merge sizes.

    Args:
        image_size: ``{"shortest_edge": min_pixels, "longest_edge": max_pixels}`` or None
            (the processor's own ``min_pixels``/``max_pixels``).
        processor_path: Folder with ``preprocessor_config.json`` (optional).

    Returns:
        The limits.
    """
    cfg: dict = {}
    if processor_path is not None:
        p = Path(processor_path) / "preprocessor_config.json"
        if p.is_file():
            try:
                cfg = json.loads(p.read_text())
            except (OSError, ValueError):
                cfg = {}
    factor = int(cfg.get("patch_size", 14)) * int(cfg.get("merge_size", 2))
    lo = int((image_size or {}).get("shortest_edge") or cfg.get("min_pixels") or DEFAULT_LIMITS.min_pixels)
    hi = int((image_size or {}).get("longest_edge") or cfg.get("max_pixels") or DEFAULT_LIMITS.max_pixels)
    return ImageLimits(min_pixels=lo, max_pixels=hi, factor=factor)


def resized_size(width: int, height: int, limits: ImageLimits = DEFAULT_LIMITS) -> tuple[int, int]:
    """``(width, height)`` the Qwen2.5-VL image processor resizes an image to.

    Calls transformers' own ``smart_resize`` (``models/qwen2_vl/image_processing_qwen2_vl.py``),
    so the rules cannot drift from the processor's.

    Raises:
        ValueError: The processor would refuse the image (e.g. "absolute aspect ratio must be
            smaller than 200").
    """
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    h, w = smart_resize(height, width, factor=limits.factor, min_pixels=limits.min_pixels,
                        max_pixels=limits.max_pixels)
    return w, h


def root_image_dir(base: str | os.PathLike, root: str | os.PathLike) -> Path:
    """The folder under ``base`` where an importer writes the screenshots of data root ``root``.

    Each root gets its own folder, named by a digest of its resolved path, so two roots with
    the same trajectory and step names never share a file.

    Args:
        base: The importer's ``image_dir``.
        root: The data root being imported.

    Returns:
        ``<base>/root-<16 hex digits>``.
"""
    import hashlib

    digest = hashlib.sha256(os.path.realpath(root).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return Path(base) / f"root-{digest}"


def write_image_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically unless the file already holds exactly these bytes.

    Compared by content, never by size or name alone: a file of equal size holding other bytes is
    rewritten (a new inode, so every memo keyed by :func:`ipi.io.stat_fingerprint` sees it).
    """
    from ipi.io import atomic_path

    path = Path(path)
    if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return path
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return path


#: The file of screenshot contents (SHA-256 hex, one per line) that decoded, under the Pillow
#: version in its name, set by :func:`decode_memo`; None: decode every time.
_DECODE_MEMO_FILE: Path | None = None
#: Contents (SHA-256) known to decode: decoded in this process, or read from the memo file.
_DECODED: set[str] = set()
#: Memo files already read into :data:`_DECODED` by this process.
_READ: set[Path] = set()


@contextmanager
def decode_memo(cache_dir: str | os.PathLike | None) -> Iterator[None]:
    """Remember, in ``cache_dir``, the screenshot contents that decoded, while the block runs.

    A content that decoded once decodes again under the same Pillow version, so its SHA-256
    (:func:`ipi.io.content_digest`) is appended to
    ``<cache_dir>/decoded_screenshots.pillow-<version>.txt`` and :func:`screenshot_problem` does
    not decode it again. Keyed by content, never by path.

    Args:
        cache_dir: The folder of the memo file, or None (no memo on disk; the in-process one stays).

    Yields:
        Nothing.
"""
    global _DECODE_MEMO_FILE
    new = Path(cache_dir) / f"decoded_screenshots.pillow-{PIL.__version__}.txt" if cache_dir is not None else None
    old, _DECODE_MEMO_FILE = _DECODE_MEMO_FILE, new
    try:
        yield
    finally:
        _DECODE_MEMO_FILE = old


def _known_decoded(digest: str) -> bool:
    memo = _DECODE_MEMO_FILE
    if memo is not None and memo not in _READ:
        _READ.add(memo)
        try:
            _DECODED.update(line.strip() for line in text_lines(memo, errors="replace")
                            if len(line.strip()) == 64)
        except OSError:  # no memo yet
            pass
    return digest in _DECODED


def _remember_decoded(digest: str) -> None:
    _DECODED.add(digest)
    if _DECODE_MEMO_FILE is not None:
        try:
            _DECODE_MEMO_FILE.parent.mkdir(parents=True, exist_ok=True)
            with open(_DECODE_MEMO_FILE, "a", encoding="ascii") as f:  # one short O_APPEND write
                f.write(digest + "\n")
        except OSError:  # a read-only cache: decode again next time
            pass


def _decodes(path: str | os.PathLike) -> str | None:
    """None when ``path`` decodes as the replay decodes it (:func:`load_rgb`), else the reason."""
    digest = content_digest(path)
    if _known_decoded(digest):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the size was checked
            load_rgb(path)
    except DataError as e:
        cause = e.__cause__
        return f"cannot decode ({type(cause).__name__}: {cause})" if cause is not None else f"cannot decode ({e})"
    _remember_decoded(digest)
    return None


def screenshot_problem(path: str | os.PathLike, max_pixels: int | None = None,
                       limits: ImageLimits | None = DEFAULT_LIMITS) -> str | None:
    """Why an existing screenshot cannot be used, or None.

    Refused: an empty, truncated, corrupt or non-image file (``PIL.Image.verify``); a Git LFS
    pointer file (named as such); a header claiming more than ``max_pixels`` pixels (before
    anything is decoded) or a side under :data:`MIN_SCREENSHOT_SIDE`; with ``limits``, an image
    the processor would refuse (aspect ratio over 200, a resized side under one patch, resized
    pixels over ``limits.max_pixels``); and a file that fails to decode exactly as the replay
    decodes it (:func:`load_rgb`). So ``data.on_bad_step`` decides at import, never
    mid-extraction. A content that decoded before is not decoded again (:func:`decode_memo`).

    Args:
        path: The screenshot.
        max_pixels: Largest accepted ``width * height``; default :data:`MAX_SCREENSHOT_PIXELS`.
        limits: The backbone's image limits (None: no processor check).

    Returns:
        A one-line reason, or None when the file is usable.
"""
    limit = MAX_SCREENSHOT_PIXELS if max_pixels is None else max_pixels
    try:
        size = os.stat(path).st_size
        if size == 0:
            return "empty file (0 bytes)"
        if is_lfs_pointer(path):
            return LFS_POINTER_REASON
        with warnings.catch_warnings():
            # Pillow warns between 1x and 2x its limit; the explicit check below decides.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                w, h = im.size
                if w * h > limit:
                    return f"image too large ({w}x{h} = {w * h} pixels > {limit})"
                if min(w, h) < MIN_SCREENSHOT_SIDE:
                    return f"image too small ({w}x{h}; at least {MIN_SCREENSHOT_SIDE}x{MIN_SCREENSHOT_SIDE})"
                im.verify()
    except Image.DecompressionBombError as e:
        return f"image too large ({e})"
    except Exception as e:  # PIL raises OSError, SyntaxError, struct.error, ValueError, ...
        return f"{type(e).__name__}: {e}"
    if limits is not None:
        try:
            rw, rh = resized_size(w, h, limits)
        except ValueError as e:
            return f"refused by the image processor ({w}x{h}: {e})"
        if min(rw, rh) < limits.factor:
            return f"refused by the image processor ({w}x{h} resizes to {rw}x{rh}, a side under one {limits.factor}-pixel patch)"
        if rw * rh > limits.max_pixels:
            return (f"refused by the image processor ({w}x{h} resizes to {rw}x{rh} = {rw * rh} pixels "
                    f"> max_pixels {limits.max_pixels})")
    return _decodes(path)


def _composite(rgba: Image.Image) -> Image.Image:
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def to_rgb(im: Image.Image) -> Image.Image:
    """The picture a person sees, as an 8-bit RGB image (a new image; ``im`` is not changed).

    * ``I;16`` (and ``I;16L``/``I;16B``/``I;16N``) and ``I``: 16-bit greyscale range, scaled
      ``v / 257`` (65535 → 255), clipped; Pillow's own ``convert`` would clip at 255 instead,
      turning most of a 16-bit screenshot white.
    * ``F``: float greyscale in [0, 1], scaled by 255 and clipped.
    * Transparency (``RGBA``, ``LA``, ``PA``, ``P`` or ``L``/``RGB`` with a ``transparency``
      entry, premultiplied ``RGBa``/``La``): composited over white, as a page shows it.
    * Anything else (``1``, ``L``, ``P``, ``CMYK``, ``YCbCr``, ``LAB``, ``HSV``): Pillow's
      conversion to RGB.

    Args:
        im: An image Pillow opened (any mode).

    Returns:
        A new ``RGB`` image of the same size.
    """
    mode = im.mode
    if mode.startswith("I;16") or mode == "I":
        a = np.asarray(im).astype(np.float64)
        return Image.fromarray(np.clip(np.rint(a / 257.0), 0, 255).astype(np.uint8), "L").convert("RGB")
    if mode == "F":
        a = np.asarray(im).astype(np.float64)
        return Image.fromarray(np.clip(np.rint(a * 255.0), 0, 255).astype(np.uint8), "L").convert("RGB")
    if mode in ("RGBa", "La"):
        return _composite(im.convert("RGBA"))
    if mode in ("RGBA", "LA", "PA") or "transparency" in im.info:
        return _composite(im.convert("RGBA"))
    if mode == "RGB":
        return im.copy()
    return im.convert("RGB")


def load_rgb(path: str | os.PathLike, step: int | None = None) -> Image.Image:
    """Open a screenshot and return :func:`to_rgb` of it.

    Raises:
        DataError: The file cannot be decoded, for whatever reason Pillow or its codecs give
            (``OSError``, ``SyntaxError``, ``zlib.error``, ``struct.error``, ...; message names
            the file and step).
    """
    try:
        with Image.open(path) as im:
            im.load()
            return to_rgb(im)
    except Exception as e:  # PIL and its codecs raise many types; every one means "cannot decode"
        where = f": step {step}" if step is not None else ""
        raise DataError(f"{path}{where}: cannot decode screenshot ({type(e).__name__}: {e})") from e
