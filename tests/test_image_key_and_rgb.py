"""One image, one cache key and one RGB conversion, whether it goes to OCR or to the vision drafter."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import captioning.ocr
import vision_cache.image
from captioning.captioner import CaptionCache
from captioning.ocr import NoOCREngine, OCRCache, OCREngine, OCRItem
from vision_cache.hashing import image_content_hash
from vision_cache.image import load_image


class _KeepingEngine(OCREngine):
    """A real (if textless) engine that keeps the image the OCR path hands to engines."""

    name = "keeping"

    def __init__(self) -> None:
        self.seen: list[Image.Image] = []

    def _read_unordered(self, image: Image.Image) -> list[OCRItem]:
        self.seen.append(image)
        return []


def _through_ocr(image: Image.Image) -> np.ndarray:
    engine = _KeepingEngine()
    engine.read(image)
    (seen,) = engine.seen
    assert seen.mode == "RGB"
    return np.asarray(seen)


def _through_vision(image: Image.Image) -> np.ndarray:
    loaded = load_image(image)
    assert loaded.mode == "RGB"
    return np.asarray(loaded)


def _gradient_alpha(size: tuple[int, int] = (16, 8)) -> np.ndarray:
    """Alpha running from fully transparent to opaque, so partial blending is exercised."""
    w, h = size
    return np.tile(np.linspace(0, 255, w, dtype=np.uint8), (h, 1))


def _rgba() -> Image.Image:
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, size=(8, 16, 3), dtype=np.uint8)
    return Image.fromarray(np.dstack([rgb, _gradient_alpha()]), mode="RGBA")


def _la() -> Image.Image:
    grey = np.tile(np.arange(0, 128, 8, dtype=np.uint8), (8, 1))
    return Image.fromarray(np.dstack([grey, _gradient_alpha()]), mode="LA")


def _p_with_transparency() -> Image.Image:
    img = Image.new("P", (6, 4), 0)
    img.putpalette([0, 0, 0, 200, 30, 30, 30, 200, 30] + [0, 0, 0] * 253)
    for x in range(6):
        img.putpixel((x, 1), 1)
        img.putpixel((x, 2), 2)
    img.info["transparency"] = 0  # palette index 0 is transparent
    return img


def test_one_hash_function_everywhere() -> None:
    assert captioning.ocr.image_content_hash is image_content_hash
    assert vision_cache.image.image_content_hash is image_content_hash


@pytest.mark.parametrize("make", [_rgba, _la, _p_with_transparency, lambda: Image.new("RGB", (5, 3), (1, 2, 3))])
def test_ocr_cache_and_vision_path_use_one_key(make) -> None:
    image = make()
    vision_key = vision_cache.image.image_content_hash(image)
    engine_name, ocr_key = OCRCache.key(NoOCREngine(), image)
    assert engine_name == "none" and ocr_key == vision_key
    assert CaptionCache.key(vision_key, "p", 8).startswith(vision_key + "|")
    # The key follows the pixels, not the object.
    assert OCRCache.key(NoOCREngine(), image.copy())[1] == vision_key


@pytest.mark.parametrize("make", [_rgba, _la, _p_with_transparency], ids=["RGBA", "LA", "P-transparency"])
def test_ocr_and_vision_flatten_transparency_identically(make) -> None:
    image = make()
    ocr_pixels, vision_pixels = _through_ocr(image), _through_vision(image)
    assert np.array_equal(ocr_pixels, vision_pixels)
    # Transparent areas become white, not black, on both paths.
    assert tuple(ocr_pixels[0, 0]) == (255, 255, 255)


def test_p_transparency_keeps_opaque_colours() -> None:
    pixels = _through_ocr(_p_with_transparency())
    assert tuple(pixels[0, 0]) == (255, 255, 255)
    assert tuple(pixels[1, 0]) == (200, 30, 30) and tuple(pixels[2, 0]) == (30, 200, 30)


def test_flattening_is_alpha_compositing_on_white() -> None:
    # Every (value, alpha) pair: pasting through the alpha mask (qwen-vl-utils' flattening) gives
    # exactly the pixels of compositing onto opaque white.
    value, alpha = np.meshgrid(np.arange(256, dtype=np.uint8), np.arange(256, dtype=np.uint8))
    rgba = Image.fromarray(np.dstack([value, value, value, alpha]), mode="RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    composited = np.asarray(Image.alpha_composite(white, rgba).convert("RGB"))
    assert np.array_equal(_through_ocr(rgba), composited)
    assert np.array_equal(_through_vision(rgba), composited)
