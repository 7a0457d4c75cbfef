"""Image intake for the vision drafter: load anything image-like as a safe, detached RGB image.

:func:`load_image` is the single gate every user-supplied picture passes before it reaches the
Qwen3-VL processor. It accepts PIL images, paths, raw bytes, numpy arrays and file-like objects;
applies the EXIF orientation; flattens every Pillow mode to 8-bit RGB (alpha is composited on
white, high-bit-depth data is scaled down, see :mod:`vision_cache.rgb`); and rejects bad input
with an :class:`InvalidImageError` whose message says what is wrong and what to do about it.

Size limits are enforced from the file header *before* any pixel data is decoded, so a
"decompression bomb" (a tiny file that claims a gigantic canvas) is refused without Pillow ever
allocating the canvas.

This module also re-exports the image helpers that live next to it:
:func:`resize_like_qwen` / :func:`qwen_target_size` (:mod:`vision_cache.qwen_sizing`), which
reproduce the sizing of ``qwen_vl_utils.fetch_image``, and :func:`image_content_hash`
(:mod:`vision_cache.hashing`), the stable cache key for a decoded image.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Union

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from .errors import InvalidImageError

# Re-exported: callers import these helpers from here.
from .hashing import image_content_hash
from .qwen_sizing import (
    QWEN3_VL_FACTOR,
    QWEN_MAX_TOKENS,
    QWEN_MIN_TOKENS,
    _smart_resize_fallback,  # noqa: F401 - the tests check it against qwen-vl-utils here
    qwen_target_size,
    resize_like_qwen,
)
from .rgb import to_rgb

__all__ = [
    "DEFAULT_MAX_INPUT_PIXELS",
    "DEFAULT_MAX_ASPECT_RATIO",
    "QWEN3_VL_FACTOR",
    "QWEN_MIN_TOKENS",
    "QWEN_MAX_TOKENS",
    "ImageInput",
    "InvalidImageError",
    "load_image",
    "image_content_hash",
    "qwen_target_size",
    "resize_like_qwen",
]

#: Largest input canvas accepted by default (64 megapixels, e.g. 8192x8192). Bigger inputs are
#: refused from the header. Override per call with ``max_pixels_in`` or process-wide with the
#: environment variable ``ASYMSPEC_MAX_INPUT_PIXELS``.
DEFAULT_MAX_INPUT_PIXELS: int = int(float(os.environ.get("ASYMSPEC_MAX_INPUT_PIXELS", 64 * 1024 * 1024)))

#: What an over-the-limit refusal advises by default (the Python API's wording; each front end passes its own
#: ``oversize_advice`` naming the option it has: the CLI and the server name ``ASYMSPEC_MAX_INPUT_PIXELS``).
OVERSIZE_ADVICE = "downscale it before passing it in, or raise max_pixels_in if you trust the source"

#: The pixel count in the message of Pillow's decompression-bomb guard (the only place it states the size).
_BOMB_PIXELS = re.compile(r"Image size \((\d+) pixels\)")

#: Longest/shortest side ratio accepted; qwen-vl-utils' ``smart_resize`` refuses anything above 200.
DEFAULT_MAX_ASPECT_RATIO: float = 200.0

#: Everything :func:`load_image` understands.
ImageInput = Union[Image.Image, str, "os.PathLike[str]", bytes, bytearray, memoryview, np.ndarray, IO[bytes]]

# Formats whose decoding shells out to an external interpreter (Ghostscript for EPS). Feeding
# untrusted files to it is a known attack surface and it is never a photo/screenshot anyway.
_REFUSED_FORMATS = frozenset({"EPS"})

# Pillow's truncation switch is a module global; we only flip it (under this lock) in the rare
# case another library already turned it on, so our strict decode cannot be silently relaxed.
_TRUNCATION_LOCK = threading.Lock()


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------


def load_image(
    x: ImageInput,
    *,
    max_pixels_in: int | None = DEFAULT_MAX_INPUT_PIXELS,
    max_aspect_ratio: float = DEFAULT_MAX_ASPECT_RATIO,
    oversize_advice: str = OVERSIZE_ADVICE,
    limit_option: str = "max_pixels_in",
) -> Image.Image:
    """Load ``x`` as a fully decoded, detached 8-bit RGB :class:`PIL.Image.Image`.

    Args:
        x: A PIL image; a path (``str`` or ``os.PathLike``; ``file://`` and ``data:image/...;
            base64,`` strings are understood too); encoded bytes (``bytes``, ``bytearray``,
            ``memoryview``); a numpy array shaped HxW, HxWx1, HxWx2, HxWx3 or HxWx4 of dtype
            uint8, uint16, bool, or float with values in [0, 1]; or a binary file-like object.
            For a PIL image the frame it is currently at is used; for files, the first frame.
        max_pixels_in: Refuse inputs whose width*height exceeds this (checked from the header
            before decoding). ``None`` disables this check (Pillow's own bomb guard still holds).
        max_aspect_ratio: Refuse inputs whose long side / short side exceeds this.
        oversize_advice: What the refusal of an input over ``max_pixels_in`` tells the user to do (the end of
            its message): each front end names the option it has (:data:`OVERSIZE_ADVICE`: this function's).
        limit_option: How the caller's front end spells the pixel limit, named when an image under the limit still
            does not fit in memory (the fix is a lower limit, so that such images are refused before decoding).

    Returns:
        A new RGB image holding its own pixel buffer (no open file behind it). EXIF orientation
        is applied; transparency is composited on white; 16-bit/32-bit/float data is scaled to
        8 bit.

    Raises:
        InvalidImageError: The input is missing, unreadable, truncated, not an image, empty,
            larger than ``max_pixels_in``, too elongated, or of an unsupported type.
    """
    if max_pixels_in is not None and max_pixels_in <= 0:
        raise InvalidImageError(f"max_pixels_in must be a positive pixel count or None, got {max_pixels_in!r}")
    if not max_aspect_ratio >= 1.0:
        raise InvalidImageError(f"max_aspect_ratio must be >= 1, got {max_aspect_ratio!r}")

    check = _Limits(max_pixels_in, max_aspect_ratio, oversize_advice, limit_option)

    if isinstance(x, Image.Image):
        # A caller-made image may still be lazy (Image.open without load): check its header size
        # before touching the pixels, exactly as for a file.
        check(x.size, "the PIL image")
        _strict_load(x, "the PIL image", check)
        return _finish(x, "the PIL image")
    if isinstance(x, np.ndarray):
        return _from_array(x, check)
    if isinstance(x, (bytes, bytearray, memoryview)):
        data = bytes(x)
        if not data:
            raise InvalidImageError("the image bytes are empty; pass the encoded file content (PNG, JPEG, ...)")
        return _open_and_decode(lambda: io.BytesIO(data), f"the {len(data)}-byte image buffer", check)
    if isinstance(x, (str, os.PathLike)):
        return _from_path_like(x, check)
    if hasattr(x, "read"):
        return _open_and_decode(lambda: x, "the file-like object", check, close=False)  # type: ignore[arg-type,return-value]
    raise InvalidImageError(
        f"unsupported image input of type {type(x).__name__}; pass a PIL.Image.Image, a file path, "
        "encoded image bytes, a numpy HxW/HxWxC array, or a binary file object"
    )


@dataclass(frozen=True)
class _Limits:
    """The size limits of one :func:`load_image` call: called with ``(size, label)`` it refuses a canvas over them;
    :meth:`bomb` words Pillow's own guard firing (a canvas too large for Pillow to open) as the same refusal."""

    max_pixels_in: int | None
    max_aspect_ratio: float
    oversize_advice: str
    limit_option: str = "max_pixels_in"

    def __call__(self, size: tuple[int, int], label: str) -> None:
        _check_geometry(size, label, self.max_pixels_in, self.max_aspect_ratio, self.oversize_advice)

    def bomb(self, label: str, exc: Exception) -> InvalidImageError:
        """The refusal of an image Pillow would not open as a possible decompression bomb: over our limit (the
        usual case: Pillow's is larger), it is our over-the-limit message; else Pillow's limit is named."""
        found = _BOMB_PIXELS.search(str(exc))
        pixels = int(found.group(1)) if found else None
        if self.max_pixels_in is not None and (pixels is None or pixels > self.max_pixels_in):
            size = f"{pixels:,} pixels" if pixels is not None else "larger than Pillow opens"
            return InvalidImageError(f"{label} is {size}, over the limit of {self.max_pixels_in:,} pixels; {self.oversize_advice}")
        if pixels is None:
            return InvalidImageError(f"{label} was refused by Pillow as a possible decompression bomb ({exc}); downscale it first")
        # the Warning fires above Image.MAX_IMAGE_PIXELS (when warnings are errors), the Error above twice that
        allowed = (Image.MAX_IMAGE_PIXELS or 0) * (1 if isinstance(exc, Image.DecompressionBombWarning) else 2)
        return InvalidImageError(
            f"{label} is {pixels:,} pixels, over the {allowed:,} pixels Pillow's decompression bomb guard allows "
            "(PIL.Image.MAX_IMAGE_PIXELS); downscale it first"
        )


# --------------------------------------------------------------------------------------------
# input kinds
# --------------------------------------------------------------------------------------------


def _short(text: str, limit: int = 120) -> str:
    """Shorten user text (e.g. a huge base64 string mistaken for a path) for error messages."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _from_path_like(x: str | os.PathLike[str], check: _Limits) -> Image.Image:
    """Handle paths and the string conventions qwen-vl-utils accepts (file://, data: URIs)."""
    if isinstance(x, str):
        stripped = x.strip()
        if not stripped:
            raise InvalidImageError("the image path is an empty string; pass a file path, bytes or a PIL image")
        if stripped.startswith("data:"):
            head, sep, payload = stripped.partition(",")
            if not sep or ";base64" not in head:
                raise InvalidImageError("unsupported data URI; only base64 data URIs like 'data:image/png;base64,...' are accepted")
            try:
                data = base64.b64decode(payload, validate=False)
            except (binascii.Error, ValueError) as exc:
                raise InvalidImageError(f"the data URI's base64 payload is invalid ({exc}); re-encode the image") from exc
            if not data:
                raise InvalidImageError("the data URI holds no bytes; re-encode the image")
            return _open_and_decode(lambda: io.BytesIO(data), "the data-URI image", check)
        if stripped.startswith(("http://", "https://")):
            raise InvalidImageError(f"image URLs are not fetched ({_short(stripped)}); download the file and pass its path or bytes")
        if stripped.startswith("file://"):
            x = stripped[len("file://") :]
    path = os.fspath(x)
    if isinstance(path, bytes):  # os.PathLike[bytes]
        path = os.fsdecode(path)
    try:
        exists = os.path.exists(path)
    except (OSError, ValueError):  # embedded NUL, name too long, ...
        exists = False
    if not exists:
        raise InvalidImageError(
            f"image file not found: {_short(path)!r}; check the path (relative paths use the current directory {os.getcwd()!r})"
        )
    if os.path.isdir(path):
        raise InvalidImageError(f"image path {_short(path)!r} is a directory; pass the path of an image file inside it")
    label = f"image file {_short(path)!r}"

    def opener() -> IO[bytes]:
        try:
            return open(path, "rb")
        except OSError as exc:
            raise InvalidImageError(f"cannot read {label}: {exc.strerror or exc}; check its permissions") from exc

    return _open_and_decode(opener, label, check)


def _open_and_decode(
    opener: Callable[[], IO[bytes]],
    label: str,
    check: _Limits,
    *,
    close: bool = True,
) -> Image.Image:
    """Open encoded data, validate its header geometry, then decode strictly and convert.

    ``Image.open`` only parses the header, so ``check`` runs before a single pixel buffer exists.
    """
    fp = opener()
    try:
        try:
            img = Image.open(fp)
        except UnidentifiedImageError as exc:
            raise InvalidImageError(
                f"{label} is not a recognised image (no supported format matched its bytes); pass a PNG, JPEG, GIF, WebP, BMP or TIFF file"
            ) from exc
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            # Pillow's own guard (Image.MAX_IMAGE_PIXELS) fired while parsing the header, before our check could
            # see the size; the Warning arrives as an exception only when the warning filters say "error".
            raise check.bomb(label, exc) from exc
        except InvalidImageError:
            raise
        except Exception as exc:  # Pillow raises many types on malformed headers
            raise InvalidImageError(
                f"{label} could not be read as an image ({type(exc).__name__}: {exc}); "
                "the file is truncated or corrupt; re-export or re-download it"
            ) from exc
        # The context manager drops Pillow's reference to the stream without closing a caller's
        # file object (Image.close() would close it).
        with img:
            if img.format in _REFUSED_FORMATS:
                raise InvalidImageError(
                    f"{label} is {img.format}, which is refused because decoding it runs an external interpreter; convert it to PNG first"
                )
            check(img.size, label)
            _strict_load(img, label, check)
            return _finish(img, label)
    finally:
        if close:
            fp.close()


def _strict_load(img: Image.Image, label: str, check: _Limits) -> None:
    """Decode all pixel data, turning truncation and corruption into :class:`InvalidImageError` (running out of
    memory names ``check``'s limit option)."""
    try:
        if ImageFile.LOAD_TRUNCATED_IMAGES:
            with _TRUNCATION_LOCK:
                previous = ImageFile.LOAD_TRUNCATED_IMAGES
                ImageFile.LOAD_TRUNCATED_IMAGES = False
                try:
                    img.load()
                finally:
                    ImageFile.LOAD_TRUNCATED_IMAGES = previous
        else:
            img.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise InvalidImageError(f"{label} was refused as a possible decompression bomb ({exc}); downscale it first") from exc
    except MemoryError as exc:
        raise InvalidImageError(f"not enough memory to decode {label}; downscale it or lower {check.limit_option}") from exc
    except Exception as exc:  # OSError (truncated), SyntaxError, zlib.error, struct.error, EOFError, ...
        reason = str(exc) or type(exc).__name__
        hint = "the file is truncated or corrupt; re-export or re-download it"
        raise InvalidImageError(f"{label} could not be decoded ({reason}); {hint}") from exc


def _check_geometry(
    size: tuple[int, int], label: str, max_pixels_in: int | None, max_aspect_ratio: float, oversize_advice: str = OVERSIZE_ADVICE
) -> None:
    """Refuse empty, oversized and absurdly elongated canvases, from their size alone."""
    width, height = size
    if width <= 0 or height <= 0:
        raise InvalidImageError(f"{label} is empty ({width}x{height} pixels); pass an image with at least one pixel")
    pixels = width * height
    if max_pixels_in is not None and pixels > max_pixels_in:
        raise InvalidImageError(
            f"{label} is {width}x{height} = {pixels:,} pixels, over the limit of {max_pixels_in:,} pixels; {oversize_advice}"
        )
    ratio = max(width, height) / min(width, height)
    if ratio > max_aspect_ratio:
        raise InvalidImageError(
            f"{label} is {width}x{height}: aspect ratio {ratio:.1f} exceeds the limit of {max_aspect_ratio:g} "
            "(the vision encoder cannot tile such a strip); crop or pad it to a less elongated shape"
        )


# --------------------------------------------------------------------------------------------
# numpy arrays
# --------------------------------------------------------------------------------------------


def _array_to_uint8(arr: np.ndarray, label: str) -> np.ndarray:
    """Scale a supported numpy dtype to uint8 (uint16 by /257, float [0,1] by *255, bool to 0/255)."""
    # Compare kind/itemsize rather than dtype equality so big-endian arrays (e.g. '>u2' read
    # from FITS/TIFF tools) are accepted too.
    kind, itemsize = arr.dtype.kind, arr.dtype.itemsize
    if kind == "u" and itemsize == 1:
        return arr.astype(np.uint8, copy=False)
    if kind == "b":
        return arr.astype(np.uint8) * 255
    if kind == "u" and itemsize == 2:
        # 65535 / 257 == 255 exactly, so the full 16-bit range maps onto the full 8-bit range.
        return np.round(arr.astype(np.float32) / 257.0).astype(np.uint8)
    if kind == "f":
        if not np.all(np.isfinite(arr)):
            raise InvalidImageError(f"{label} contains NaN or infinite values; clean the array first")
        lo, hi = float(arr.min()), float(arr.max())
        if lo < 0.0 or hi > 1.0:
            raise InvalidImageError(
                f"{label} is float with values in [{lo:g}, {hi:g}]; float images must lie in [0, 1] (divide by 255 or convert to uint8)"
            )
        return np.round(arr.astype(np.float64) * 255.0).astype(np.uint8)
    raise InvalidImageError(f"{label} has unsupported dtype {arr.dtype}; use uint8, uint16, bool, or float in [0, 1]")


def _from_array(arr: np.ndarray, check: Callable[[tuple[int, int], str], None]) -> Image.Image:
    """Convert an HxW[xC] array to RGB; C=1 gray, 2 gray+alpha, 3 RGB, 4 RGBA."""
    label = f"the numpy array of shape {arr.shape}"
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (2, 3, 4)):
        hint = " (channels-first? transpose to HxWxC)" if arr.ndim == 3 and arr.shape[0] in (1, 3, 4) else ""
        raise InvalidImageError(f"{label} is not an image layout{hint}; pass HxW, HxWx1, HxWx3 or HxWx4")
    height, width = int(arr.shape[0]), int(arr.shape[1])
    check((width, height), label)
    data = np.ascontiguousarray(_array_to_uint8(arr, label))
    # Mode follows from the shape for uint8 (Pillow deprecated passing mode to fromarray).
    img = Image.fromarray(data)
    return _finish(img, label)


# --------------------------------------------------------------------------------------------
# orientation and RGB flattening
# --------------------------------------------------------------------------------------------


def _finish(img: Image.Image, label: str) -> Image.Image:
    """Apply EXIF orientation and convert to RGB, always returning a new, detached image."""
    try:
        oriented = ImageOps.exif_transpose(img)
    except Exception:
        # Corrupt EXIF metadata should not reject pixels that decoded fine; keep the stored
        # orientation instead.
        oriented = img.copy()
    out = to_rgb(oriented, label)
    if out is img:  # never hand back the caller's own object
        out = img.copy()
    # Drop metadata that no longer describes the pixels (orientation handled, alpha flattened).
    out.info = {}
    return out
