"""Content hash of a decoded image: the one cache key every image cache of the toolkit uses.

The OCR cache, the caption cache and the pipeline's per-request key all call
:func:`image_content_hash`, so one picture has one key everywhere.
"""

from __future__ import annotations

import hashlib

from PIL import Image

from .errors import InvalidImageError

__all__ = ["image_content_hash"]


def image_content_hash(img: Image.Image) -> str:
    """Return a hex sha256 identifying ``img``'s pixels: its mode, size, palette and raw bytes.

    Two images hash equal exactly when they would decode to the same pixels, independent of the
    file they came from or their metadata, which is what a feature cache key needs.
    """
    if not isinstance(img, Image.Image):
        raise InvalidImageError(f"image_content_hash expects a PIL.Image.Image, got {type(img).__name__}")
    h = hashlib.sha256()
    # Length-delimited header fields so that e.g. mode "L" + size can never collide with another
    # mode/size split of the same bytes.
    h.update(f"{img.mode}\x00{img.size[0]}x{img.size[1]}\x00".encode())
    if img.mode in ("P", "PA"):
        # Palette images store indices; two images with equal indices but different palettes differ.
        palette = img.getpalette() or []
        h.update(bytes(palette))
        h.update(b"\x00")
    h.update(img.tobytes())
    return h.hexdigest()
