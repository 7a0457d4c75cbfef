"""Image sizing of the Qwen3-VL preprocessing (a mirror of ``qwen_vl_utils.fetch_image``).

:func:`resize_like_qwen` reproduces the sizing of ``qwen_vl_utils.fetch_image`` so that cached
features computed here match what the reference preprocessing would feed the model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from PIL import Image

from .errors import InvalidImageError
from .rgb import to_rgb

__all__ = [
    "QWEN3_VL_FACTOR",
    "QWEN_MIN_TOKENS",
    "QWEN_MAX_TOKENS",
    "qwen_target_size",
    "resize_like_qwen",
    "image_token_count",
]

#: Qwen3-VL resizes to multiples of patch_size (16) * spatial merge size (2).
QWEN3_VL_FACTOR: int = 32
#: Token-count bounds qwen-vl-utils uses by default (pixels = tokens * factor**2).
QWEN_MIN_TOKENS: int = 4
QWEN_MAX_TOKENS: int = 16384


def qwen_target_size(
    height: int,
    width: int,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    factor: int = QWEN3_VL_FACTOR,
) -> tuple[int, int]:
    """Return the ``(height, width)`` that qwen-vl-utils' ``smart_resize`` picks for an image.

    Defaults follow qwen-vl-utils: ``min_pixels = 4 * factor**2`` and
    ``max_pixels = 16384 * factor**2``. Uses the installed ``qwen_vl_utils`` implementation when
    importable (so we track upstream exactly) and a faithful copy of it otherwise.

    Raises:
        InvalidImageError: Non-positive sizes, ``min_pixels > max_pixels``, or an aspect ratio
            over 200 (which the Qwen preprocessing refuses too).
    """
    if height <= 0 or width <= 0:
        raise InvalidImageError(f"cannot resize a {width}x{height} image: both sides must be positive")
    if factor <= 0:
        raise InvalidImageError(f"factor must be positive, got {factor}")
    min_pixels = QWEN_MIN_TOKENS * factor**2 if min_pixels is None else int(min_pixels)
    max_pixels = QWEN_MAX_TOKENS * factor**2 if max_pixels is None else int(max_pixels)
    if max_pixels < min_pixels:
        raise InvalidImageError(f"max_pixels ({max_pixels}) must be >= min_pixels ({min_pixels})")
    ratio = max(height, width) / min(height, width)
    if ratio > _QWEN_MAX_RATIO:
        raise InvalidImageError(
            f"image is {width}x{height} (aspect ratio {ratio:.1f}); the Qwen vision preprocessing refuses "
            f"ratios above {_QWEN_MAX_RATIO}; crop or pad it to a less elongated shape"
        )
    return _smart_resize_impl()(height, width, factor, min_pixels, max_pixels)


def resize_like_qwen(
    img: Image.Image,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    factor: int = QWEN3_VL_FACTOR,
) -> tuple[Image.Image, tuple[int, int]]:
    """Resize ``img`` exactly as ``qwen_vl_utils.fetch_image`` would.

    The target size comes from :func:`qwen_target_size`; the image is converted to RGB (via the
    same alpha-on-white flattening as :func:`load_image`) and resized with bicubic resampling,
    Pillow's ``resize`` default that ``fetch_image`` relies on. For Qwen3-VL use ``factor=32``
    (the default), which corresponds to ``fetch_image(..., image_patch_size=16)``.

    Returns:
        ``(resized_image, (height, width))``.
    """
    if not isinstance(img, Image.Image):
        raise InvalidImageError(f"resize_like_qwen expects a PIL.Image.Image, got {type(img).__name__}")
    width, height = img.size
    target_h, target_w = qwen_target_size(height, width, min_pixels, max_pixels, factor)
    rgb = img if img.mode == "RGB" else to_rgb(img, "the image")
    # Resize even when the size is unchanged: Pillow then returns a copy, as fetch_image does.
    out = rgb.resize((target_w, target_h), resample=Image.Resampling.BICUBIC)
    return out, (target_h, target_w)


def image_token_count(height: int, width: int, preprocessor: Mapping[str, Any]) -> int:
    """How many ``<|image_pad|>`` tokens a Qwen3-VL processor gives a ``height x width`` image, from its
    ``preprocessor_config.json`` alone (no pixels): the size :func:`qwen_target_size` picks between
    ``size.shortest_edge`` and ``size.longest_edge`` (pixel counts, as Qwen's processors read them; or
    ``min_pixels``/``max_pixels``), in ``patch_size`` patches of which ``merge_size**2`` become one token."""
    patch, merge = int(preprocessor["patch_size"]), int(preprocessor["merge_size"])
    size = preprocessor.get("size") or {}
    lo = size.get("shortest_edge", preprocessor.get("min_pixels"))
    hi = size.get("longest_edge", preprocessor.get("max_pixels"))
    h, w = qwen_target_size(height, width, lo, hi, factor=patch * merge)
    return (h // patch) * (w // patch) // (merge * merge)


# --------------------------------------------------------------------------------------------
# sizing (mirror of qwen_vl_utils.vision_process.smart_resize)
# --------------------------------------------------------------------------------------------

_QWEN_MAX_RATIO = 200
_SmartResize = Callable[[int, int, int, int, int], tuple[int, int]]
_smart_resize_cache: list[_SmartResize] = []


def _smart_resize_fallback(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Line-by-line copy of qwen-vl-utils 0.0.14 ``smart_resize`` (used if it is not importable)."""
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _smart_resize_impl() -> _SmartResize:
    """The upstream ``smart_resize`` if importable, else our copy; resolved lazily and once.

    Lazy because importing qwen_vl_utils pulls in torch and torchvision, which plain image loading
    must not pay for.
    """
    if not _smart_resize_cache:
        try:
            from qwen_vl_utils.vision_process import smart_resize as upstream

            def impl(h: int, w: int, factor: int, lo: int, hi: int) -> tuple[int, int]:
                return tuple(upstream(h, w, factor=factor, min_pixels=lo, max_pixels=hi))  # type: ignore[return-value]

            _smart_resize_cache.append(impl)
        except Exception:  # ImportError, or a broken optional dependency chain (torchvision)
            _smart_resize_cache.append(_smart_resize_fallback)
    return _smart_resize_cache[0]
