"""Screenshots: every Pillow mode replays as the picture a person sees; processor refusals are import skips."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from ipi.data.images import (
    LFS_POINTER_REASON,
    ImageLimits,
    image_limits_for,
    load_rgb,
    resized_size,
    screenshot_problem,
    to_rgb,
)
from ipi.data.schema import Step
from ipi.surfaces.variants import Variant

H, W = 40, 56
rng = np.random.default_rng(0)
GREY = rng.integers(0, 256, (H, W), dtype=np.uint8)
RGB = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
ALPHA = rng.integers(0, 256, (H, W), dtype=np.uint8)


def _grey_rgb(g: np.ndarray) -> np.ndarray:
    return np.repeat(g[..., None], 3, axis=2)


def _over_white(rgb: np.ndarray, a: np.ndarray) -> np.ndarray:
    a = a[..., None].astype(np.float64) / 255.0
    return np.rint(rgb * a + 255.0 * (1 - a)).astype(np.uint8)


def _palette_pair():
    """A 16-colour picture as P, with index 3 transparent; its twin shows index 3 as white."""
    idx = rng.integers(0, 16, (H, W), dtype=np.uint8)
    pal = rng.integers(0, 256, (16, 3), dtype=np.uint8)
    p = Image.frombytes("P", (W, H), idx.tobytes())
    p.putpalette(pal.flatten().tolist())
    opaque = pal[idx]
    p_t = p.copy()
    p_t.info["transparency"] = 3
    shown = np.where((idx == 3)[..., None], 255, opaque).astype(np.uint8)
    return p, opaque, p_t, shown


def _cases():
    """(name, image in that mode, 8-bit RGB twin of what a person sees, tolerance)."""
    g16 = GREY.astype(np.uint16) * 257
    p, p_twin, p_t, p_t_twin = _palette_pair()
    bw = (GREY > 127).astype(np.uint8) * 255
    rgba = np.dstack([RGB, ALPHA])
    cases = [
        ("L", Image.fromarray(GREY), _grey_rgb(GREY), 0),
        ("RGB", Image.fromarray(RGB), RGB, 0),
        ("1", Image.fromarray(bw).convert("1"), _grey_rgb(bw), 0),
        ("I;16", Image.frombytes("I;16", (W, H), g16.astype("<u2").tobytes()), _grey_rgb(GREY), 0),
        ("I;16B", Image.frombytes("I;16B", (W, H), g16.astype(">u2").tobytes()), _grey_rgb(GREY), 0),
        ("I", Image.frombytes("I", (W, H), g16.astype(np.int32).tobytes()), _grey_rgb(GREY), 0),
        ("F", Image.frombytes("F", (W, H), (GREY.astype(np.float32) / 255.0).tobytes()), _grey_rgb(GREY), 0),
        ("P", p, p_twin, 0),
        ("P+transparency", p_t, p_t_twin, 0),
        ("PA", _pa(p, ALPHA),
         _over_white(p_twin, ALPHA), 1),
        ("LA", Image.merge("LA", (Image.fromarray(GREY), Image.fromarray(ALPHA))), _over_white(_grey_rgb(GREY), ALPHA), 1),
        ("RGBA", Image.fromarray(rgba), _over_white(RGB, ALPHA), 1),
        ("RGBa", Image.fromarray(rgba).convert("RGBa"), _over_white(RGB, ALPHA), 2),
        ("L+transparency", _with_info(Image.fromarray(GREY), int(GREY[0, 0])),
         np.where((GREY == GREY[0, 0])[..., None], 255, _grey_rgb(GREY)).astype(np.uint8), 0),
        ("CMYK", Image.fromarray(RGB).convert("CMYK"), RGB, 0),
        ("YCbCr", Image.fromarray(RGB).convert("YCbCr"), RGB, 3),
        # 8-bit HSV and LAB cannot hold every RGB colour exactly: the tolerance is their own rounding.
        ("HSV", Image.fromarray(RGB).convert("HSV"), RGB, 8),
        ("LAB", _lab(RGB), RGB, None),  # None: compared on average (8-bit LAB loses dark saturated colours)
    ]
    return cases


def _lab(rgb):
    from PIL import ImageCms

    t = ImageCms.buildTransform(ImageCms.createProfile("sRGB"), ImageCms.createProfile("LAB"), "RGB", "LAB")
    return ImageCms.applyTransform(Image.fromarray(rgb), t)


def _pa(p, alpha):
    pa = p.convert("PA")
    pa.putalpha(Image.fromarray(alpha))
    return pa


def _with_info(im, t):
    im.info["transparency"] = t
    return im


@pytest.mark.parametrize("name,image,twin,tol", _cases(), ids=[c[0] for c in _cases()])
def test_every_mode_renders_like_its_8bit_rgb_twin(name, image, twin, tol):
    out = to_rgb(image)
    assert out.mode == "RGB" and out.size == (W, H)
    diff = np.abs(np.asarray(out, dtype=np.int16) - twin.astype(np.int16))
    if tol is None:
        assert float(diff.mean()) < 2.0, f"{name}: mean difference {float(diff.mean())}"
        return
    assert int(diff.max()) <= tol, f"{name}: max difference {int(diff.max())}"
    # Pillow's own convert gets the 16-bit, float and transparent modes wrong: the check has teeth.
    if name in ("I;16", "I", "F", "RGBA", "LA", "P+transparency"):
        naive = np.asarray(image.convert("RGB"), dtype=np.int16)
        assert int(np.abs(naive - twin.astype(np.int16)).max()) > 3


@pytest.mark.parametrize("mode,fmt", [("I;16", "PNG"), ("LA", "PNG"), ("RGBA", "PNG"), ("P+transparency", "PNG"),
                                      ("CMYK", "TIFF"), ("F", "TIFF"), ("I", "TIFF"), ("1", "PNG")])
def test_files_replay_through_variant_image(tmp_path, mode, fmt):
    name, image, twin, tol = next(c for c in _cases() if c[0] == mode)
    path = tmp_path / f"shot.{fmt.lower()}"
    image.save(path, format=fmt)
    step = Step(0, str(path), "", True, "No previous action.", "", "Click [1]", "click")
    clean = Variant("i_dom", "clean", -1, None, "", "", None, {})
    for img in (load_rgb(path), clean.image(step)):
        diff = np.abs(np.asarray(img, dtype=np.int16) - twin.astype(np.int16))
        assert int(diff.max()) <= max(tol, 1), f"{mode} via {fmt}"


def test_processor_refusals_are_decided_at_import(tmp_path):
    thin = tmp_path / "thin.png"
    Image.new("RGB", (32, 7000)).save(thin)
    reason = screenshot_problem(thin)
    assert reason.startswith("refused by the image processor (32x7000: absolute aspect ratio must be smaller than 200")
    assert screenshot_problem(thin, limits=None) is None  # text-only backbones read no pixels
    # A long strip that smart_resize cannot bring under max_pixels (its sides never go below one patch).
    strip = tmp_path / "strip.png"
    Image.new("RGB", (5000, 40)).save(strip)
    small = ImageLimits(min_pixels=3136, max_pixels=3136, factor=28)
    assert resized_size(5000, 40, small) == (616, 28)
    assert screenshot_problem(strip, limits=small) == (
        "refused by the image processor (5000x40 resizes to 616x28 = 17248 pixels > max_pixels 3136)")
    assert screenshot_problem(strip) is None
    lfs = tmp_path / "lfs.png"
    lfs.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 84977\n")
    assert screenshot_problem(lfs) == LFS_POINTER_REASON


@pytest.mark.needs_shared
def test_limits_of_the_real_processor():
    from tests.conftest import PROCESSOR

    lim = image_limits_for({"shortest_edge": 3136, "longest_edge": 50176}, PROCESSOR)
    assert lim == ImageLimits(3136, 50176, 28)
    assert image_limits_for(None, PROCESSOR) == ImageLimits(3136, 12845056, 28)
