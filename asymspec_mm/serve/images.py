"""The image of a request: a ``data:`` URL, or a file under the ``--allow-local-images`` folder; nothing else.

Remote URLs are never fetched. A local path (plain, or ``file://``) is resolved with every symlink followed
and must land inside the allowed folder, so ``..`` and links pointing out of it are refused. Every image
then goes through :func:`vision_cache.image.load_image` (format, size and decompression-bomb checks).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from .errors import bad_request

#: What the refusal of an image over the pixel limit tells an HTTP client (the limit is the server's, set when it
#: starts: ``ASYMSPEC_MAX_INPUT_PIXELS``).
OVERSIZE_ADVICE = (
    "downscale it before sending it (the server's operator can raise the limit by starting the server with "
    "ASYMSPEC_MAX_INPUT_PIXELS set to a larger pixel count)"
)
_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,(?P<data>.*)$", re.S)


def decode_data_url(url: str, param: str) -> bytes:
    """The bytes of a base64 ``data:`` URL; a 400 naming what is wrong otherwise."""
    m = _DATA_URL.match(url)
    if m is None or not m.group("b64"):
        raise bad_request(
            "the image data URL is not of the form 'data:image/png;base64,<base64 bytes>' (only base64 data URLs are accepted)",
            param,
            "invalid_image_url",
        )
    mime = (m.group("mime") or "").lower()
    if mime and not mime.startswith("image/") and mime != "application/octet-stream":
        raise bad_request(
            f"the data URL's media type is {mime!r}, not an image; send 'data:image/png;base64,...'", param, "invalid_image_url"
        )
    payload = re.sub(r"\s+", "", m.group("data"))
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_request(f"the image data URL's base64 payload is invalid ({exc}); re-encode the image", param, "invalid_base64") from None
    if not data:
        raise bad_request("the image data URL holds no bytes; re-encode the image", param, "invalid_image_url")
    return data


def local_image_path(ref: str, allowed: Path | None, param: str) -> Path:
    """The resolved path of a local image reference, which must lie inside ``allowed`` (itself resolved)."""
    if allowed is None:
        raise bad_request(
            "local image paths are refused: send the image as a data URL ('data:image/png;base64,...'), "
            "or start the server with --allow-local-images DIR to read files under DIR",
            param,
            "local_images_disabled",
        )
    if ref.startswith("file:"):
        parsed = urlparse(ref)
        if parsed.netloc not in ("", "localhost"):
            raise bad_request(f"file URL with a host ({parsed.netloc!r}) is refused; use file:///path or a plain path", param)
        ref = unquote(parsed.path)
    if "\x00" in ref or not ref.strip():
        raise bad_request("the local image path is empty or contains a NUL byte", param)
    root = allowed.resolve()
    path = Path(ref)
    if not path.is_absolute():
        path = root / path
    try:
        real = Path(os.path.realpath(path))
    except (OSError, ValueError) as exc:
        raise bad_request(f"the local image path cannot be resolved ({exc})", param) from None
    if real != root and root not in real.parents:
        raise bad_request(
            f"the image path {ref!r} is outside the folder this server may read (--allow-local-images); "
            "paths, '..' and symlinks must stay inside it",
            param,
            "path_not_allowed",
        )
    if not real.is_file():
        raise bad_request(f"no image file at {ref!r} under the allowed folder", param, "image_not_found")
    return real


def load_request_image(url: str, allowed: Path | None, param: str):
    """The RGB PIL image an ``image_url`` names (see the module docstring); a 400 ``RequestError`` otherwise."""
    from vision_cache.errors import InvalidImageError
    from vision_cache.image import load_image

    if not isinstance(url, str) or not url.strip():
        raise bad_request("image_url.url must be a non-empty string (a data URL)", param)
    url = url.strip()
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        source: bytes | Path = decode_data_url(url, param)
    elif scheme in ("http", "https", "ftp", "ftps", "s3", "gs"):
        raise bad_request(
            f"remote image URLs are not fetched by this server ({url[:60]}{'...' if len(url) > 60 else ''}); "
            "download the image and send it as a data URL ('data:image/png;base64,...')",
            param,
            "remote_url_refused",
        )
    elif scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        source = local_image_path(url, allowed, param)
    else:
        raise bad_request(f"unsupported image URL scheme {scheme!r}; send the image as a data URL ('data:image/png;base64,...')", param)
    try:
        return load_image(source, oversize_advice=OVERSIZE_ADVICE, limit_option="the server's ASYMSPEC_MAX_INPUT_PIXELS")
    except InvalidImageError as exc:
        raise bad_request(f"bad image: {exc}", param, "invalid_image") from None
