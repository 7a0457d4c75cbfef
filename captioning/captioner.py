"""The captioner interface, the caption cache and ``compress``: the compressed view of any image.

A captioner turns an image into a caption (the pipeline's default,
:class:`asymspec_mm.request.captioner.DrafterCaptioner`, prompts its own drafter with
:data:`CAPTION_PROMPT`, as MathVista prompted Bard for its captions). :func:`compress` combines the
caption with OCR into the :class:`CompressedView` the verifier reads. Captions and OCR are cached
by image hash.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from vision_cache.store import LRUCache

from .errors import MissingCompressedViewError
from .view import DEFAULT_CAPTION_CHARS, DEFAULT_OCR_CHARS, CompressedView

__all__ = ["CAPTION_PROMPT", "Captioner", "CaptionCache", "compress"]

CAPTION_PROMPT = "Describe the fine-grained content of the image or figure, including scenes, objects, relationships, and any text present."


class Captioner(Protocol):
    """What :func:`compress` needs of a captioner."""

    def caption(self, image: Any, image_hash: str | None = None) -> str:
        """The caption of ``image``; ``image_hash`` is its content hash when the caller has it."""
        ...


class CaptionCache(LRUCache[str, str]):
    """Thread-safe LRU of captions, keyed by image hash and the captioning settings.

    Args:
        max_entries: captions kept before the least recently used is evicted.
    """

    def __init__(self, max_entries: int = 512) -> None:
        super().__init__(max_entries=max_entries)

    @staticmethod
    def key(image_hash: str, prompt: str, max_new_tokens: int) -> str:
        """The key of the caption of one image under one prompt and token budget."""
        return f"{image_hash}|{prompt}|{max_new_tokens}"


def compress(
    image,
    *,
    captioner: Captioner | None = None,
    ocr_engine=None,
    caption: str | None = None,
    ocr: str | bool | None = None,
    max_caption_chars: int = DEFAULT_CAPTION_CHARS,
    max_ocr_chars: int = DEFAULT_OCR_CHARS,
    ocr_layout: str = "plain",
    image_hash: str | None = None,
    timings: dict | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> CompressedView:
    """The compressed view of ``image``.

    ``caption``/``ocr``: ``None`` produce it (with ``captioner`` / ``ocr_engine``), a string is used
    as is, ``ocr=False`` skips OCR (``caption=""`` likewise skips the caption). Texts are truncated on
    a word boundary to the paper harness' budgets. ``ocr_layout`` is the text layout of the engine's items
    (:data:`captioning.ocr.OCR_LAYOUTS`: ``"plain"``, one text line per line; ``"inline"``, all on one
    line, as MiniVista writes it). ``timings`` receives ``caption_s`` and ``ocr_s``.
    ``on_phase("caption")`` / ``on_phase("ocr")`` is called before a caption or OCR text is produced
    (a command line shows what a long set-up is doing).
    """
    from .truncate import truncate_text

    timings = timings if timings is not None else {}
    t0 = time.perf_counter()
    if caption is None:
        if captioner is None:
            raise MissingCompressedViewError(
                "no caption was given and no captioner is configured: pass caption='...' or build the pipeline "
                "with a captioner (the default uses the drafter)"
            )
        if on_phase is not None:
            on_phase("caption")
        caption = captioner.caption(image, image_hash=image_hash)
    timings["caption_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    items: tuple = ()
    if ocr is None:
        if ocr_engine is None:
            raise MissingCompressedViewError(
                "no OCR text was given and no OCR engine is configured: pass ocr='...' (or ocr=False to skip OCR), "
                "or install one: pip install 'asymspec-mm[ocr]'"
            )
        from .ocr import render_text

        if on_phase is not None:
            on_phase("ocr")
        found = ocr_engine.read_cached(image) if hasattr(ocr_engine, "read_cached") else ocr_engine.read(image)
        items = tuple(found)
        ocr_text = render_text(found, ocr_layout)
    elif ocr is False:
        ocr_text = ""
    else:
        ocr_text = str(ocr)
    timings["ocr_s"] = time.perf_counter() - t0
    return CompressedView(
        caption=truncate_text(caption, max_caption_chars),
        ocr_text=truncate_text(ocr_text, max_ocr_chars),
        ocr_items=items,
    )
