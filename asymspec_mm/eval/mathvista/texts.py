"""MathVista's text files (official queries, Bard captions, EasyOCR output) and the compressed view they make.

The Bard caption clean-up is :func:`captioning.static.refine_bard_caption` (the rule of MathVista's
``build_query.py``), re-exported here as :func:`refine_caption`. :func:`refine_ocr` stays here: it
turns malformed OCR into ``""`` like ``build_query.py`` does, where :mod:`captioning.ocr` raises.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from captioning.ocr.static import ocr_literal as _literal
from captioning.ocr.static import refine_mathvista_ocr as refine_ocr
from captioning.static import BARD_NONSENSE_PHRASES as CAPTION_BOILERPLATE  # noqa: F401 - eval's name for the list
from captioning.static import refine_bard_caption as refine_caption

from ...base.errors import DatasetUnavailableError, MissingCompressedViewError, UnknownOptionError
from ...request.mathvista_query import build_query
from .shipped import SHIPPED_DIR

ENV_TEXT_DIR = "ASYMSPEC_MATHVISTA_DIR"
COMPRESSED_MODES: tuple[str, ...] = ("official", "auto", "none")

#: The MathVista text files eval reads, each looked up in a text folder and its ``texts/`` subfolder.
TEXT_FILES: tuple[str, ...] = ("query.json", "captions_bard.json", "ocrs_easyocr.json")

#: The fix every "not found" message of the text data names: the options, the variable, the default.
WHERE = (
    f"pass --text-dir (or --data-dir) the folder that holds them, or set ${ENV_TEXT_DIR} to it; "
    "with neither, eval reads the copy shipped with the package"
)


def default_text_dir() -> Path:
    """``$ASYMSPEC_MATHVISTA_DIR`` when set, else the copy shipped with the package (:data:`.shipped.SHIPPED_DIR`)."""
    env = os.environ.get(ENV_TEXT_DIR)
    return Path(env) if env else SHIPPED_DIR


def text_base(text_dir: str | Path | None) -> Path:
    """``text_dir`` as a path, else :func:`default_text_dir`."""
    return Path(text_dir) if text_dir is not None else default_text_dir()


def find_text_file(base: Path, name: str) -> Path | None:
    """``name`` in ``base``, its ``texts/``, ``data/`` or ``data/texts/`` (MathVista's own layout), or ``None``."""
    for p in (base / name, base / "texts" / name, base / "data" / name, base / "data" / "texts" / name):
        if p.is_file():
            return p
    return None


def text_dir_for(text_dir: str | Path | None, data_dir: str | Path | None) -> Path | None:
    """The text folder of the ``eval mathvista`` options: ``--text-dir`` when given, else ``--data-dir``'s folder (a
    problems JSON's folder) when it holds any of :data:`TEXT_FILES`, else ``None`` (:func:`default_text_dir`)."""
    if text_dir is not None:
        return Path(text_dir)
    if data_dir is None:
        return None
    folder = Path(data_dir) if Path(data_dir).is_dir() else Path(data_dir).parent
    return folder if any(find_text_file(folder, name) for name in TEXT_FILES) else None


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _texts(obj: Any) -> dict[str, str]:
    """``{"texts": {pid: str}}`` (MathVista's caption/OCR files) or a plain ``{pid: str}``."""
    if isinstance(obj, Mapping) and isinstance(obj.get("texts"), Mapping):
        obj = obj["texts"]
    return {str(k): v for k, v in obj.items()} if isinstance(obj, Mapping) else {}


def check_text_dir(base: Path, origin: str = "") -> None:
    """Refuse a text folder that is missing or holds none of :data:`TEXT_FILES`, naming the options and the variable
    (``origin``: where ``base`` came from, e.g. ``" (from $ASYMSPEC_MATHVISTA_DIR)"``)."""
    if not base.is_dir():
        raise DatasetUnavailableError(f"MathVista text folder {base}{origin} not found: {WHERE}")
    if not any(find_text_file(base, name) for name in TEXT_FILES):
        raise DatasetUnavailableError(f"no query.json, captions_bard.json or ocrs_easyocr.json in {base}{origin} (nor its texts/): {WHERE}")


def origin_of(text_dir: str | Path | None) -> str:
    """``" (from $ASYMSPEC_MATHVISTA_DIR)"`` when the text folder comes from the variable, else ``""``."""
    return f" (from ${ENV_TEXT_DIR})" if text_dir is None and os.environ.get(ENV_TEXT_DIR) else ""


@dataclass
class TextData:
    """MathVista's text files: official queries, Bard captions (raw), EasyOCR output (raw literals)."""

    queries: dict[str, str] = field(default_factory=dict)
    captions: dict[str, str] = field(default_factory=dict)
    ocrs: dict[str, str] = field(default_factory=dict)
    source: Path | None = None

    @classmethod
    def load(
        cls,
        text_dir: str | Path | None = None,
        *,
        query_file: str | Path | None = None,
        caption_file: str | Path | None = None,
        ocr_file: str | Path | None = None,
    ) -> TextData:
        """Read whichever of ``query.json``, ``captions_bard.json``, ``ocrs_easyocr.json`` exist.

        Files are looked up in ``text_dir`` (default :func:`default_text_dir`) and its ``texts/`` subfolder
        (MathVista's ``data/`` layout); a folder that is missing or holds none of them is an error naming the fix.
        """
        base = text_base(text_dir)
        explicit = {"query.json": query_file, "captions_bard.json": caption_file, "ocrs_easyocr.json": ocr_file}
        if not all(explicit.values()):
            check_text_dir(base, origin_of(text_dir))

        def find(name: str) -> Path | None:
            given = explicit[name]
            if given is None:
                return find_text_file(base, name)
            if not Path(given).is_file():
                raise DatasetUnavailableError(f"{given} does not exist: give the path of MathVista's {name}")
            return Path(given)

        data = cls(source=base)
        if (p := find("query.json")) is not None:
            data.queries = {str(k): str(v) for k, v in _read_json(p).items()}
        if (p := find("captions_bard.json")) is not None:
            data.captions = _texts(_read_json(p))
        if (p := find("ocrs_easyocr.json")) is not None:
            data.ocrs = _texts(_read_json(p))
        return data

    def caption(self, pid: str) -> str:
        """The refined Bard caption of ``pid`` (``""`` when there is none)."""
        return refine_caption(self.captions.get(str(pid)))

    def ocr(self, pid: str) -> str:
        """The refined EasyOCR text of ``pid`` (``""`` when there is none)."""
        return refine_ocr(self.ocrs.get(str(pid)))


def problem_caption(problem: Mapping[str, Any], text: TextData | None) -> str:
    """The official caption of a problem: its own ``caption`` field, else the Bard caption."""
    if isinstance(problem.get("caption"), str):
        return refine_caption(problem["caption"])
    return text.caption(str(problem["pid"])) if text is not None else ""


def problem_ocr(problem: Mapping[str, Any], text: TextData | None) -> str:
    """The official OCR text of a problem: its own ``ocr`` field, else EasyOCR's."""
    if "ocr" in problem and problem["ocr"] is not None:
        own = problem["ocr"]
        if isinstance(own, str):
            parsed = _literal(own) if own.strip() else []
            # what is not a literal list is free OCR text, kept as written
            return refine_ocr(parsed) if isinstance(parsed, (list, tuple)) else own.strip()
        return refine_ocr(own)
    return text.ocr(str(problem["pid"])) if text is not None else ""


def has_bard_caption(problem: Mapping[str, Any], text: TextData | None) -> bool:
    """True when the problem has a caption: its own ``caption`` field, or an entry in captions_bard.json.

    This is the paper's subset (587 GPS/VQA/FQA testmini problems). The entry counts even when
    MathVista's clean-up empties it: 7 of the 587 are Bard refusals ("I can't process this file.").
    """
    own = problem.get("caption")
    if isinstance(own, str):
        return bool(own.strip())
    if text is None:
        return False
    raw = text.captions.get(str(problem["pid"]))
    return isinstance(raw, str) and bool(raw.strip())


def view_for(
    problem: Mapping[str, Any], compressed: str, text: TextData | None, *, dataset: str = "mathvista"
) -> tuple[str | None, str | bool | None]:
    """``(caption, ocr)`` arguments for ``pipe.generate`` under a compressed-view mode."""
    if compressed == "auto":
        return None, None
    if compressed == "none":
        return "", False
    if compressed != "official":
        raise UnknownOptionError(f"compressed={compressed!r}: expected one of {COMPRESSED_MODES}")
    has_own = isinstance(problem.get("caption"), str) or problem.get("ocr") is not None
    if not has_own and (text is None or (not text.captions and not text.ocrs)):
        raise MissingCompressedViewError(
            f"{dataset} pid {problem.get('pid')}: no official caption/OCR text available "
            "(MathVista: pass --text-dir with captions_bard.json and ocrs_easyocr.json; otherwise use --compressed auto)"
        )
    caption = problem_caption(problem, text)
    ocr = problem_ocr(problem, text)
    return caption, (ocr if ocr else False)


def official_query(problem: Mapping[str, Any], text: TextData | None = None) -> str:
    """The problem's own ``query``, else ``query.json``'s, else :func:`build_query`."""
    q = problem.get("query")
    if isinstance(q, str) and q:
        return q
    if text is not None and str(problem.get("pid")) in text.queries:
        return text.queries[str(problem["pid"])]
    return build_query(problem)
