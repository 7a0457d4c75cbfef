"""Tests of vision_cache.image: every accepted input kind, mode flattening, and refusals.

All images are real: built with Pillow/numpy and, where the path matters, written to disk.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import struct
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest
from PIL import ExifTags, Image, ImageFile, features

from asymspec_mm.base.errors import AsymSpecError
from vision_cache.image import (
    DEFAULT_MAX_INPUT_PIXELS,
    InvalidImageError,
    image_content_hash,
    load_image,
    qwen_target_size,
    resize_like_qwen,
)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
WHITE = (255, 255, 255)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _noise(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _encode(img: Image.Image, fmt: str, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _zero_png(width: int, height: int, *, full_data: bool = True, value: int = 0x80) -> bytes:
    """A real 8-bit RGB PNG of uniform grey pixels; the constant stream compresses ~1000:1.

    Grey rather than black: a decoded all-zero buffer can stay in untouched zero pages that peak
    RSS never counts, which would make the allocation invisible to the measurement.

    With ``full_data=False`` only a few rows are written: a header-only "bomb" whose IHDR claims
    the full canvas (decoding would fail as truncated, but it must be refused before that).
    """
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    row = b"\x00" + bytes([value]) * (3 * width)  # filter byte 0 + grey pixels
    comp = zlib.compressobj(9)
    parts = [comp.compress(row) for _ in range(height if full_data else min(height, 4))]
    parts.append(comp.flush())
    idat = b"".join(parts)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def _assert_rgb_detached(out: Image.Image) -> None:
    assert isinstance(out, Image.Image)
    assert out.mode == "RGB"
    assert getattr(out, "fp", None) is None
    out.getpixel((0, 0))  # pixels are accessible without any file


# ---------------------------------------------------------------------------------------------
# accepted input kinds
# ---------------------------------------------------------------------------------------------


def test_error_type_is_project_error() -> None:
    assert issubclass(InvalidImageError, AsymSpecError)
    assert issubclass(InvalidImageError, ValueError)
    assert DEFAULT_MAX_INPUT_PIXELS >= 8192 * 8192 // 2


def test_all_source_kinds_give_the_same_pixels(tmp_path: pathlib.Path) -> None:
    src = _noise(37, 23)
    png = _encode(src, "PNG")
    path = tmp_path / "noise.png"
    path.write_bytes(png)
    import base64

    inputs = {
        "pil": src,
        "str": str(path),
        "pathlib": path,
        "file_uri": "file://" + str(path),
        "bytes": png,
        "bytearray": bytearray(png),
        "memoryview": memoryview(png),
        "bytesio": io.BytesIO(png),
        "data_uri": "data:image/png;base64," + base64.b64encode(png).decode(),
        "ndarray": np.asarray(src),
    }
    expected = np.asarray(src)
    for name, value in inputs.items():
        out = load_image(value)
        _assert_rgb_detached(out)
        assert out.size == (37, 23), name
        assert np.array_equal(np.asarray(out), expected), name

    with open(path, "rb") as fh:  # a real file object, left open for the caller
        out = load_image(fh)
        assert not fh.closed
    assert np.array_equal(np.asarray(out), expected)


def test_result_is_detached_from_file_and_input(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "a.png"
    _noise(16, 16).save(path)
    out = load_image(path)
    os.remove(path)  # the returned image must not need the file any more
    out2 = out.copy()
    assert out2.tobytes() == out.tobytes()

    src = Image.new("RGB", (4, 4), (1, 2, 3))
    res = load_image(src)
    assert res is not src
    res.putpixel((0, 0), (9, 9, 9))
    assert src.getpixel((0, 0)) == (1, 2, 3)


def test_lazy_pil_image_is_loaded() -> None:
    lazy = Image.open(io.BytesIO(_encode(_noise(20, 10), "PNG")))
    out = load_image(lazy)
    _assert_rgb_detached(out)
    assert np.array_equal(np.asarray(out), np.asarray(_noise(20, 10)))


# ---------------------------------------------------------------------------------------------
# mode conversions
# ---------------------------------------------------------------------------------------------


def test_rgba_composited_on_white(tmp_path: pathlib.Path) -> None:
    img = Image.new("RGBA", (3, 1))
    img.putpixel((0, 0), (10, 20, 30, 0))  # fully transparent -> white
    img.putpixel((1, 0), (10, 20, 30, 255))  # opaque -> unchanged
    img.putpixel((2, 0), (0, 0, 0, 128))  # half transparent black -> mid grey
    for source in (img, tmp_path / "rgba.png"):
        if isinstance(source, pathlib.Path):
            img.save(source)
        out = load_image(source)
        _assert_rgb_detached(out)
        assert out.getpixel((0, 0)) == WHITE
        assert out.getpixel((1, 0)) == (10, 20, 30)
        grey = out.getpixel((2, 0))
        assert all(abs(c - 127) <= 1 for c in grey)


def test_la_and_palette_with_transparency(tmp_path: pathlib.Path) -> None:
    la = Image.new("LA", (2, 1))
    la.putpixel((0, 0), (100, 0))
    la.putpixel((1, 0), (100, 255))
    out = load_image(la)
    assert out.getpixel((0, 0)) == WHITE
    assert out.getpixel((1, 0)) == (100, 100, 100)

    pal = Image.new("P", (2, 1))
    pal.putpalette([0, 0, 0, 200, 10, 10] + [0] * (256 * 3 - 6))
    pal.putpixel((0, 0), 0)
    pal.putpixel((1, 0), 1)
    pal.info["transparency"] = 0  # palette index 0 is transparent
    path = tmp_path / "pal.png"
    pal.save(path, transparency=0)
    assert Image.open(path).mode == "P"
    for source in (pal, path, path.read_bytes()):
        out = load_image(source)
        assert out.getpixel((0, 0)) == WHITE
        assert out.getpixel((1, 0)) == (200, 10, 10)

    pa = pal.convert("PA")
    assert pa.mode == "PA"
    out = load_image(pa)
    assert out.getpixel((0, 0)) == WHITE and out.getpixel((1, 0)) == (200, 10, 10)

    # Palette image without transparency: plain lookup.
    pal.info.pop("transparency")
    assert load_image(pal).getpixel((0, 0)) == (0, 0, 0)


def test_rgb_png_with_trns_colour_key(tmp_path: pathlib.Path) -> None:
    img = Image.new("RGB", (2, 1), (5, 6, 7))
    img.putpixel((1, 0), (50, 60, 70))
    path = tmp_path / "trns.png"
    img.save(path, transparency=(5, 6, 7))
    out = load_image(path)
    assert out.getpixel((0, 0)) == WHITE
    assert out.getpixel((1, 0)) == (50, 60, 70)


def test_cmyk(tmp_path: pathlib.Path) -> None:
    img = Image.new("CMYK", (8, 8), (0, 255, 255, 0))  # pure red in CMYK
    out = load_image(img)
    assert out.getpixel((0, 0)) == (255, 0, 0)
    path = tmp_path / "cmyk.jpg"
    img.save(path, quality=95)
    assert Image.open(path).mode == "CMYK"
    r, g, b = load_image(path).getpixel((4, 4))
    assert r > 230 and g < 25 and b < 25


def test_sixteen_bit_and_wide_modes(tmp_path: pathlib.Path) -> None:
    arr16 = np.array([[0, 65535, 257 * 100, 257 * 200]], dtype=np.uint16)
    img16 = Image.fromarray(arr16)
    assert img16.mode == "I;16"
    expected = [(0,) * 3, (255,) * 3, (100,) * 3, (200,) * 3]
    out = load_image(img16)
    assert [out.getpixel((i, 0)) for i in range(4)] == expected

    path = tmp_path / "gray16.png"
    img16.save(path)
    assert Image.open(path).mode.startswith("I")
    out = load_image(path)
    assert [out.getpixel((i, 0)) for i in range(4)] == expected

    # Mode I holding 16-bit data (what older Pillow returned for 16-bit PNGs).
    img_i = Image.fromarray(arr16.astype(np.int32))
    assert img_i.mode == "I"
    out = load_image(img_i)
    assert [out.getpixel((i, 0)) for i in range(4)] == expected

    # Mode I holding 8-bit range data stays as is.
    out = load_image(Image.fromarray(np.array([[0, 50, 255]], dtype=np.int32)))
    assert [out.getpixel((i, 0))[0] for i in range(3)] == [0, 50, 255]

    # Float mode F in [0, 1] scales by 255; other ranges are min-max normalised.
    out = load_image(Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32)))
    assert [out.getpixel((i, 0))[0] for i in range(3)] == [0, 128, 255]
    out = load_image(Image.fromarray(np.array([[-10.0, 0.0, 10.0]], dtype=np.float32)))
    assert [out.getpixel((i, 0))[0] for i in range(3)] == [0, 128, 255]


def test_bilevel_gray_and_ycbcr() -> None:
    one = Image.new("1", (2, 1), 0)
    one.putpixel((1, 0), 1)
    out = load_image(one)
    assert out.getpixel((0, 0)) == (0, 0, 0) and out.getpixel((1, 0)) == WHITE

    gray = Image.new("L", (1, 1), 77)
    assert load_image(gray).getpixel((0, 0)) == (77, 77, 77)

    src = _noise(12, 12, seed=3)
    out = load_image(src.convert("YCbCr"))
    diff = np.abs(np.asarray(out, dtype=int) - np.asarray(src, dtype=int))
    assert diff.max() <= 3


def _frames() -> list[Image.Image]:
    return [Image.new("RGB", (10, 8), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]


def test_animated_gif_first_frame(tmp_path: pathlib.Path) -> None:
    frames = _frames()
    path = tmp_path / "anim.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=50, loop=0)
    assert Image.open(path).n_frames == 3
    out = load_image(path)
    _assert_rgb_detached(out)
    assert out.getpixel((5, 4)) == (255, 0, 0)


def test_animated_png_first_frame(tmp_path: pathlib.Path) -> None:
    frames = _frames()
    path = tmp_path / "anim.png"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=50)
    assert Image.open(path).n_frames == 3
    assert load_image(path).getpixel((5, 4)) == (255, 0, 0)


@pytest.mark.skipif(not features.check("webp"), reason="Pillow built without WebP")
def test_animated_webp_first_frame(tmp_path: pathlib.Path) -> None:
    frames = _frames()
    path = tmp_path / "anim.webp"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=50, lossless=True)
    assert Image.open(path).n_frames == 3
    r, g, b = load_image(path).getpixel((5, 4))
    assert r > 240 and g < 15 and b < 15


def test_exif_orientation_applied(tmp_path: pathlib.Path) -> None:
    # 60 wide x 30 high: left half red, right half blue.
    img = Image.new("RGB", (60, 30), (255, 0, 0))
    img.paste((0, 0, 255), (30, 0, 60, 30))
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = 6  # "rotate 90 CW to display"
    path = tmp_path / "rotated.jpg"
    img.save(path, exif=exif.tobytes(), quality=95)
    assert Image.open(path).size == (60, 30)

    out = load_image(path)
    assert out.size == (30, 60)  # width and height swapped
    top = out.getpixel((15, 5))
    bottom = out.getpixel((15, 55))
    assert top[0] > 200 and top[2] < 60  # the left (red) half is now on top
    assert bottom[2] > 200 and bottom[0] < 60
    assert out.getexif().get(ExifTags.Base.Orientation) is None

    # Same via bytes and via an already opened PIL image.
    assert load_image(path.read_bytes()).size == (30, 60)
    assert load_image(Image.open(path)).size == (30, 60)


# ---------------------------------------------------------------------------------------------
# numpy arrays
# ---------------------------------------------------------------------------------------------


def test_numpy_layouts_and_dtypes() -> None:
    gray = np.full((4, 6), 90, dtype=np.uint8)
    assert load_image(gray).getpixel((0, 0)) == (90, 90, 90)
    assert load_image(gray[:, :, None]).size == (6, 4)

    rgb = np.zeros((4, 6, 3), dtype=np.uint8)
    rgb[..., 1] = 200
    assert load_image(rgb).getpixel((5, 3)) == (0, 200, 0)

    rgba = np.zeros((2, 2, 4), dtype=np.uint8)
    rgba[0, 0] = (1, 2, 3, 255)
    rgba[1, 1] = (1, 2, 3, 0)
    out = load_image(rgba)
    assert out.getpixel((0, 0)) == (1, 2, 3) and out.getpixel((1, 1)) == WHITE

    gray_alpha = np.zeros((1, 2, 2), dtype=np.uint8)
    gray_alpha[0, 0] = (100, 255)
    out = load_image(gray_alpha)
    assert out.getpixel((0, 0)) == (100, 100, 100) and out.getpixel((1, 0)) == WHITE

    floats = np.array([[0.0, 0.5, 1.0]], dtype=np.float64)
    assert [load_image(floats).getpixel((i, 0))[0] for i in range(3)] == [0, 128, 255]
    assert load_image(np.ones((2, 2, 3), dtype=np.float32)).getpixel((1, 1)) == WHITE

    u16 = np.array([[0, 65535, 257 * 10]], dtype=np.uint16)
    assert [load_image(u16).getpixel((i, 0))[0] for i in range(3)] == [0, 255, 10]

    big_endian = np.array([[0, 65535, 257 * 10]], dtype=">u2")
    assert [load_image(big_endian).getpixel((i, 0))[0] for i in range(3)] == [0, 255, 10]

    mask = np.array([[True, False]])
    assert load_image(mask).getpixel((0, 0)) == WHITE

    # Non-contiguous views are fine.
    wide = np.arange(4 * 12 * 3, dtype=np.uint8).reshape(4, 12, 3)
    view = wide[:, ::2]
    assert np.array_equal(np.asarray(load_image(view)), view)


@pytest.mark.parametrize(
    ("array", "needle"),
    [
        (np.zeros((0, 10, 3), dtype=np.uint8), "empty"),
        (np.zeros((10, 0), dtype=np.uint8), "empty"),
        (np.zeros((3, 20, 30), dtype=np.uint8), "transpose"),
        (np.zeros((2, 3, 4, 5), dtype=np.uint8), "HxW"),
        (np.zeros((5,), dtype=np.uint8), "HxW"),
        (np.full((2, 2), 2.0), "[0, 1]"),
        (np.full((2, 2), np.nan), "NaN"),
        (np.zeros((2, 2), dtype=np.int64), "dtype"),
    ],
)
def test_numpy_refusals(array: np.ndarray, needle: str) -> None:
    with pytest.raises(InvalidImageError, match=None) as info:
        load_image(array)
    assert needle in str(info.value)


# ---------------------------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------------------------


def test_missing_path_and_directory(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidImageError, match="not found") as info:
        load_image(tmp_path / "nope.png")
    assert "check the path" in str(info.value)
    with pytest.raises(InvalidImageError, match="not found"):
        load_image(str(tmp_path / "nope.png"))
    with pytest.raises(InvalidImageError, match="directory"):
        load_image(tmp_path)
    with pytest.raises(InvalidImageError, match="empty string"):
        load_image("")
    with pytest.raises(InvalidImageError, match="not fetched"):
        load_image("https://example.com/cat.png")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
@pytest.mark.parametrize("fraction", [0.3, 0.7, 0.95])
def test_truncated_files(tmp_path: pathlib.Path, fmt: str, fraction: float) -> None:
    data = _encode(_noise(160, 120, seed=1), fmt)
    path = tmp_path / f"cut.{fmt.lower()}"
    path.write_bytes(data[: int(len(data) * fraction)])
    Image.open(path)  # the header alone is still fine ...
    with pytest.raises(InvalidImageError, match="truncated") as info:  # ... the full decode is not
        load_image(path)
    assert "re-export or re-download" in str(info.value)
    with pytest.raises(InvalidImageError, match="truncated"):
        load_image(path.read_bytes())


def test_truncated_refused_even_if_pillow_lenient(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    data = _encode(_noise(160, 120, seed=2), "PNG")
    with pytest.raises(InvalidImageError, match="truncated"):
        load_image(data[: len(data) // 2])
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True  # the caller's setting is restored


def test_non_image_bytes(tmp_path: pathlib.Path) -> None:
    junk = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    with pytest.raises(InvalidImageError, match="not a recognised image"):
        load_image(junk)
    path = tmp_path / "notes.png"  # a misleading extension does not help
    path.write_text("hello, I am not a picture\n")
    with pytest.raises(InvalidImageError, match="not a recognised image"):
        load_image(path)
    with pytest.raises(InvalidImageError, match="empty"):
        load_image(b"")
    with pytest.raises(InvalidImageError, match="base64"):
        load_image("data:image/png,raw")


def test_zero_size_pil_image() -> None:
    with pytest.raises(InvalidImageError, match="empty"):
        load_image(Image.new("RGB", (0, 5)))
    with pytest.raises(InvalidImageError, match="empty"):
        load_image(Image.new("RGB", (7, 0)))


@pytest.mark.parametrize("value", [42, 3.5, None, ["a.png"], {"image": "a.png"}, object()])
def test_wrong_type(value: object) -> None:
    with pytest.raises(InvalidImageError, match="unsupported image input of type") as info:
        load_image(value)  # type: ignore[arg-type]
    assert "PIL.Image.Image" in str(info.value)


def test_aspect_ratio(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidImageError, match="aspect ratio 1000.0") as info:
        load_image(Image.new("RGB", (1000, 1)))
    assert "crop or pad" in str(info.value)
    path = tmp_path / "strip.png"
    Image.new("RGB", (10, 5000)).save(path)
    with pytest.raises(InvalidImageError, match="aspect ratio 500.0"):
        load_image(path)
    with pytest.raises(InvalidImageError, match="aspect ratio"):
        load_image(np.zeros((1, 300), dtype=np.uint8))
    # Exactly 200 is still allowed (smart_resize refuses only above 200); the limit is tunable.
    assert load_image(Image.new("RGB", (2000, 10))).size == (2000, 10)
    with pytest.raises(InvalidImageError, match="aspect ratio"):
        load_image(Image.new("RGB", (40, 10)), max_aspect_ratio=3)


def test_pixel_limit_from_header() -> None:
    small = _encode(Image.new("RGB", (200, 100)), "PNG")
    assert load_image(small, max_pixels_in=20_000).size == (200, 100)
    with pytest.raises(InvalidImageError, match="over the limit of 19,999 pixels") as info:
        load_image(small, max_pixels_in=19_999)
    assert "downscale" in str(info.value) and "max_pixels_in" in str(info.value)
    with pytest.raises(InvalidImageError, match="over the limit"):
        load_image(np.zeros((100, 200, 3), dtype=np.uint8), max_pixels_in=10_000)
    with pytest.raises(InvalidImageError, match="over the limit"):
        load_image(Image.new("RGB", (200, 100)), max_pixels_in=10_000)
    with pytest.raises(InvalidImageError, match="max_pixels_in"):
        load_image(small, max_pixels_in=0)


def test_zero_png_generator_makes_valid_images() -> None:
    # Control for the bomb tests: the crafted PNG format is a real, decodable image.
    out = load_image(_zero_png(300, 200))
    assert out.size == (300, 200)
    assert out.getextrema() == ((0x80, 0x80), (0x80, 0x80), (0x80, 0x80))


_MEASURE = textwrap.dedent(
    """
    import json, resource, sys
    from PIL import Image
    from vision_cache.image import InvalidImageError, load_image
    path, pillow_guard, limit = sys.argv[1], sys.argv[2], sys.argv[3]
    if pillow_guard == "off":
        Image.MAX_IMAGE_PIXELS = None  # only our own header check stands between us and the bomb
    kwargs = {} if limit == "default" else {"max_pixels_in": None if limit == "none" else int(limit)}
    def peak_kb():
        # VmHWM belongs to this exec's address space; ru_maxrss would carry the (large) peak of the
        # pytest process this child was forked from and hide the decode.
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    before = peak_kb()
    try:
        img = load_image(path, **kwargs)
        outcome, message = "accepted", repr(img.size)
    except InvalidImageError as exc:
        outcome, message = "refused", str(exc)
    after = peak_kb()
    print(json.dumps({"outcome": outcome, "message": message, "delta_mb": (after - before) / 1024}))
    """
)


def _measure(path: pathlib.Path, pillow_guard: str, limit: str) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path), pillow_guard, limit],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def bomb_8500(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A valid 8500x8500 black PNG (72 Mpx, ~217 MB decoded as RGB) in a ~200 KB file."""
    path = tmp_path_factory.mktemp("bomb") / "bomb8500.png"
    path.write_bytes(_zero_png(8500, 8500))
    assert path.stat().st_size < 1_000_000
    return path


def test_pixel_bomb_refused_without_allocation(bomb_8500: pathlib.Path) -> None:
    # 72 Mpx: above our 64 Mpx default but below Pillow's own 89 Mpx guard, so it is our check
    # alone that refuses it, with Pillow's guard both on and off.
    assert 8500 * 8500 > DEFAULT_MAX_INPUT_PIXELS
    for guard in ("on", "off"):
        result = _measure(bomb_8500, guard, "default")
        assert result["outcome"] == "refused", result
        assert "8500x8500" in str(result["message"]) and "over the limit" in str(result["message"])
        assert float(result["delta_mb"]) < 100, result  # decoding would need > 200 MB


def test_pixel_bomb_measurement_detects_real_decode(bomb_8500: pathlib.Path) -> None:
    # Control: with the limit lifted the same file really decodes and the peak RSS jumps, which
    # shows the measurement above would have caught an allocation.
    result = _measure(bomb_8500, "on", "none")
    assert result["outcome"] == "accepted", result
    assert float(result["delta_mb"]) > 150, result


def test_gigantic_header_refused_without_allocation(tmp_path: pathlib.Path) -> None:
    # IHDR claims 100000x100000 (30 GB as RGB) in a file of a few hundred bytes.
    path = tmp_path / "huge.png"
    path.write_bytes(_zero_png(100_000, 100_000, full_data=False))
    assert path.stat().st_size < 10_000
    for guard in ("on", "off"):
        result = _measure(path, guard, "default")
        assert result["outcome"] == "refused", result
        assert "downscale" in str(result["message"])
        assert float(result["delta_mb"]) < 100, result
    # Even with our limit disabled, Pillow's own bomb error surfaces as InvalidImageError.
    result = _measure(path, "on", "none")
    assert result["outcome"] == "refused" and "decompression bomb" in str(result["message"]), result


def test_pillow_bomb_warning_as_error_is_refused(bomb_8500: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # When Pillow's guard is lower than our limit and warnings are errors, the warning is refused
    # as a bomb instead of leaking a non-project exception.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 50_000_000)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with pytest.raises(InvalidImageError, match="decompression bomb"):
            load_image(bomb_8500, max_pixels_in=None)


# ---------------------------------------------------------------------------------------------
# hashing
# ---------------------------------------------------------------------------------------------


def test_image_content_hash(tmp_path: pathlib.Path) -> None:
    src = _noise(30, 20, seed=5)
    png_path, bmp_path = tmp_path / "a.png", tmp_path / "a.bmp"
    src.save(png_path)
    src.save(bmp_path)
    h_png = image_content_hash(load_image(png_path))
    assert h_png == image_content_hash(load_image(bmp_path)) == image_content_hash(src)
    assert len(h_png) == 64 and int(h_png, 16) >= 0

    changed = src.copy()
    changed.putpixel((0, 0), (0, 0, 0) if src.getpixel((0, 0)) != (0, 0, 0) else (1, 1, 1))
    assert image_content_hash(changed) != h_png

    # Same raw bytes, different geometry or mode -> different hash.
    a = Image.new("L", (2, 3), 7)
    b = Image.new("L", (3, 2), 7)
    c = Image.new("P", (2, 3), 7)
    assert len({image_content_hash(a), image_content_hash(b), image_content_hash(c)}) == 3

    # Palette images: same indices, different palette -> different hash.
    p1, p2 = Image.new("P", (2, 2), 0), Image.new("P", (2, 2), 0)
    p1.putpalette([255, 0, 0] * 256)
    p2.putpalette([0, 255, 0] * 256)
    assert image_content_hash(p1) != image_content_hash(p2)

    with pytest.raises(InvalidImageError):
        image_content_hash(b"not an image")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Qwen sizing
# ---------------------------------------------------------------------------------------------

_SIZES = [(50, 40), (640, 480), (1920, 1080), (1000, 33), (4000, 3000), (224, 224), (7, 1300), (2048, 11)]
_BOUNDS = [
    (None, None),
    (256 * 32 * 32, 1280 * 32 * 32),
    (4 * 32 * 32, 64 * 32 * 32),
    (100_000, 200_000),
]


@pytest.mark.parametrize(("width", "height"), _SIZES)
@pytest.mark.parametrize(("min_pixels", "max_pixels"), _BOUNDS)
def test_resize_like_qwen_matches_fetch_image(width: int, height: int, min_pixels: int | None, max_pixels: int | None) -> None:
    from qwen_vl_utils import vision_process as vp

    img = _noise(width, height, seed=width + height)
    ele: dict[str, object] = {"image": img}
    if min_pixels is not None:
        ele["min_pixels"] = min_pixels
    if max_pixels is not None:
        ele["max_pixels"] = max_pixels
    ref = vp.fetch_image(ele, image_patch_size=16)  # Qwen3-VL: patch 16, merge 2 -> factor 32

    out, (h, w) = resize_like_qwen(load_image(img), min_pixels, max_pixels, 32)
    assert out.size == ref.size == (w, h)
    assert h % 32 == 0 and w % 32 == 0
    assert np.array_equal(np.asarray(out), np.asarray(ref))


def test_resize_like_qwen_from_file_and_rgba(tmp_path: pathlib.Path) -> None:
    from qwen_vl_utils import vision_process as vp

    rgba = np.random.default_rng(7).integers(0, 256, (90, 130, 4), dtype=np.uint8)
    path = tmp_path / "rgba.png"
    Image.fromarray(rgba).save(path)
    ref = vp.fetch_image({"image": str(path), "max_pixels": 64 * 32 * 32}, image_patch_size=16)
    out, (h, w) = resize_like_qwen(load_image(path), max_pixels=64 * 32 * 32)
    assert (w, h) == ref.size
    assert np.array_equal(np.asarray(out), np.asarray(ref))

    # Qwen2.5-VL style factor 28 (patch 14) matches too.
    ref28 = vp.fetch_image({"image": str(path)}, image_patch_size=14)
    out28, _ = resize_like_qwen(load_image(path), factor=28)
    assert np.array_equal(np.asarray(out28), np.asarray(ref28))


def test_qwen_target_size_fallback_matches_upstream() -> None:
    from qwen_vl_utils.vision_process import smart_resize

    from vision_cache.image import _smart_resize_fallback

    for height in (1, 5, 31, 32, 33, 100, 479, 1080, 3001, 9000):
        for width in (1, 17, 64, 640, 1919, 5000):
            if max(height, width) / min(height, width) > 200:
                with pytest.raises(InvalidImageError, match="aspect ratio"):
                    qwen_target_size(height, width)
                continue
            for lo, hi in ((None, None), (3136, 12845056), (65536, 262144)):
                expected = smart_resize(height, width, factor=32, min_pixels=lo, max_pixels=hi)
                assert qwen_target_size(height, width, lo, hi, 32) == expected
                lo_v = 4 * 32 * 32 if lo is None else lo
                hi_v = 16384 * 32 * 32 if hi is None else hi
                assert _smart_resize_fallback(height, width, 32, lo_v, hi_v) == expected


def test_resize_like_qwen_refusals() -> None:
    with pytest.raises(InvalidImageError, match="aspect ratio"):
        resize_like_qwen(Image.new("RGB", (3000, 10)))
    with pytest.raises(InvalidImageError, match="min_pixels"):
        resize_like_qwen(Image.new("RGB", (30, 10)), min_pixels=1000, max_pixels=10)
    with pytest.raises(InvalidImageError, match="positive"):
        resize_like_qwen(Image.new("RGB", (0, 10)))
    with pytest.raises(InvalidImageError, match="PIL"):
        resize_like_qwen(np.zeros((4, 4, 3), dtype=np.uint8))  # type: ignore[arg-type]


_OOM_SCRIPT = """
import resource, sys
{imports}
big = sys.argv[1]
sys.argv[1] = sys.argv[2]
{call}  # a small image first: what the call imports lazily is loaded before the address space is capped
sys.argv[1] = big
vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + 64 * 2**20, resource.RLIM_INFINITY))  # 49 MP of RGB needs 147 MB
try:
    {call}
except Exception as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.parametrize(
    ("imports", "call", "option"),
    [
        ("from vision_cache.image import load_image", "load_image(sys.argv[1])", "lower max_pixels_in"),
        (
            "from pathlib import Path\nfrom asymspec_mm.serve.images import load_request_image",
            "load_request_image(sys.argv[1], Path(sys.argv[1]).parent, 'messages[0].content[1].image_url')",
            "lower the server's ASYMSPEC_MAX_INPUT_PIXELS",
        ),
        ("from asymspec_mm.cli.main import read_image", "read_image(sys.argv[1])", "lower ASYMSPEC_MAX_INPUT_PIXELS"),
    ],
    ids=["api", "server", "cli"],
)
def test_an_image_that_does_not_fit_in_memory_names_the_front_ends_limit(tmp_path, imports, call, option):
    """An image under the pixel limit that still cannot be decoded in the memory left is refused in one line that
    names the limit as the caller's front end spells it (the server's operator sets an environment variable; only
    the Python API has ``max_pixels_in``). Memory is really exhausted: the child process caps its address space."""
    path = tmp_path / "big.png"
    Image.new("RGB", (7000, 7000), "red").save(path)
    Image.new("RGB", (70, 70), "red").save(tmp_path / "small.png")
    script = _OOM_SCRIPT.format(imports=imports, call=call)
    argv = [sys.executable, "-c", script, str(path), str(tmp_path / "small.png")]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    line = out.stdout.strip()
    assert "not enough memory to decode" in line and option in line, (line, out.stderr[-2000:])
