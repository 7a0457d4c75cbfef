"""Flattening of any Pillow mode to 8-bit RGB, shared by image intake and OCR.

Both the vision drafter (through :func:`vision_cache.image.load_image`) and the OCR engines
convert with :func:`to_rgb`, so a transparent or high-bit-depth picture gives the same pixels to
the drafter and to OCR.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from .errors import InvalidImageError

__all__ = ["to_rgb", "high_bit_to_l"]

_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
_HIGH_BIT_MODES = frozenset({"I", "F", "I;16", "I;16L", "I;16B", "I;16N"})


def to_rgb(img: Image.Image, label: str = "the image") -> Image.Image:
    """Flatten any Pillow mode to 8-bit RGB; transparency is composited on a white background.

    Always returns a new image. A plain ``convert("RGB")`` would turn transparent pixels black;
    diagrams and plots saved with a transparent background usually have black text, which
    would then vanish.

    Args:
        img: the image to convert.
        label: how error messages name the image.

    Raises:
        TypeError: ``img`` is not a PIL image.
        InvalidImageError: Pillow cannot convert its mode to RGB.
    """
    if not isinstance(img, Image.Image):
        raise TypeError(f"RGB conversion needs a PIL.Image.Image, got {type(img).__name__}")
    mode = img.mode
    if mode in _HIGH_BIT_MODES:
        img = high_bit_to_l(img)
        mode = img.mode
    has_alpha = mode in _ALPHA_MODES or (mode in ("P", "L", "RGB") and "transparency" in img.info)
    try:
        if has_alpha:
            rgba = img.convert("RGBA")
            # Same flattening as qwen-vl-utils' to_rgb (paste through the alpha mask), so RGBA
            # inputs give identical pixels whichever loader was used.
            background = Image.new("RGB", rgba.size, (255, 255, 255))
            background.paste(rgba, mask=rgba.getchannel("A"))
            return background
        if mode == "RGB":
            return img.copy()
        return img.convert("RGB")
    except Exception as exc:  # e.g. a mode Pillow cannot convert to RGB (LAB without a profile)
        raise InvalidImageError(f"{label} has pixel mode {mode!r}, which cannot be converted to RGB ({exc}); save it as RGB first") from exc


def high_bit_to_l(img: Image.Image) -> Image.Image:
    """Scale 16-bit, 32-bit integer or float single-channel data to 8-bit grayscale.

    Pillow's own ``convert("L")`` clips these modes at 255, turning most 16-bit images white,
    so scale explicitly:
      * I;16*: fixed 16-bit range (/257), like the uint16 array path.
      * I:     values in [0, 255] are taken as 8-bit; in [0, 65535] as 16-bit (the usual source of
               mode I is a 16-bit PNG/TIFF); anything else is min-max normalised.
      * F:     values in [0, 1] are scaled by 255; in [0, 255] taken as is; else min-max normalised.
    """
    arr = np.asarray(img)
    if img.mode.startswith("I;16"):
        arr16 = arr.astype(np.float64)
        out = np.round(arr16 / 257.0)
    else:
        values = arr.astype(np.float64)
        finite = np.isfinite(values)
        if not finite.all():
            values = np.where(finite, values, 0.0)
        lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
        if img.mode == "F" and lo >= 0.0 and hi <= 1.0:
            out = np.round(values * 255.0)
        elif lo >= 0.0 and hi <= 255.0:
            out = np.round(values)
        elif img.mode == "I" and lo >= 0.0 and hi <= 65535.0:
            out = np.round(values / 257.0)
        elif hi > lo:
            out = np.round((values - lo) * (255.0 / (hi - lo)))
        else:
            out = np.zeros_like(values)
    return Image.fromarray(np.clip(out, 0, 255).astype(np.uint8))
