"""Model captioner and ``compress``: produce the compressed view for any image.

By default the caption comes from the pipeline's own drafter (no extra model), prompted as
MathVista prompted Bard for its captions, decoded greedily, and reusing the vision features the
drafter's full stream needs anyway (no second tower pass). Captions and OCR are cached by image hash.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

import torch

from .view import DEFAULT_CAPTION_CHARS, DEFAULT_OCR_CHARS, CompressedView

CAPTION_PROMPT = (
    "Describe the fine-grained content of the image or figure, including scenes, objects, relationships, "
    "and any text present."
)


class _LRU:
    """A small thread-safe LRU of strings/objects keyed by image hash."""

    def __init__(self, max_entries: int = 512):
        self.max_entries = max_entries
        self._data: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> Any | None:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                self.hits += 1
                return self._data[key]
            self.misses += 1
            return None

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)


class DrafterCaptioner:
    """Captions an image with a Qwen3-VL model (the pipeline's drafter by default).

    ``encoder`` is the pipeline's :class:`vision_cache.VisionEncoder`, so the tower runs at most once
    per image across captioning and decoding.
    """

    def __init__(self, model, processor, encoder, prompt: str = CAPTION_PROMPT, max_new_tokens: int = 256):
        self.model = model
        self.processor = processor
        self.encoder = encoder
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.cache = _LRU()
        self.name = "drafter"

    @torch.no_grad()
    def caption(self, image, image_hash: str | None = None) -> str:
        from asymspec_mm.decode import AsymSpecConfig, greedy_steps
        from asymspec_mm.engines import VLEngine
        from vision_cache.image import image_content_hash

        key = (image_hash or image_content_hash(image)) + f"|{self.prompt}|{self.max_new_tokens}"
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": self.prompt}]}]
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        enc = self.processor(text=[text], images=[image], return_tensors="pt")
        features, _ = self.encoder.encode(enc["pixel_values"], enc["image_grid_thw"])
        engine = VLEngine(self.model, name="captioner")
        ids, types = enc["input_ids"][0], enc["mm_token_type_ids"][0]
        engine.prefill(ids[:-1], types[:-1], features)
        eos = {self.processor.tokenizer.convert_tokens_to_ids("<|im_end|>"), self.processor.tokenizer.eos_token_id}
        tokens: list[int] = []
        cfg = AsymSpecConfig(max_new_tokens=self.max_new_tokens, trace_top=0)
        for events in greedy_steps(engine, ids[-1:].to(engine.device), cfg, {e for e in eos if e is not None}, is_verifier=False):
            tokens.extend(ev.token_id for ev in events)
        caption = self.processor.tokenizer.decode(tokens, skip_special_tokens=True).strip()
        self.cache.put(key, caption)
        return caption


def compress(
    image,
    *,
    captioner=None,
    ocr_engine=None,
    caption: str | None = None,
    ocr: str | bool | None = None,
    max_caption_chars: int = DEFAULT_CAPTION_CHARS,
    max_ocr_chars: int = DEFAULT_OCR_CHARS,
    image_hash: str | None = None,
    timings: dict | None = None,
) -> CompressedView:
    """The compressed view of ``image``.

    ``caption``/``ocr``: ``None`` produce it (with ``captioner`` / ``ocr_engine``), a string is used
    as is, ``ocr=False`` skips OCR (``caption=""`` likewise skips the caption). Texts are truncated on
    a word boundary to the paper harness' budgets. ``timings`` receives ``caption_s`` and ``ocr_s``.
    """
    from asymspec_mm.errors import MissingCompressedViewError

    from .truncate import truncate_text

    timings = timings if timings is not None else {}
    t0 = time.perf_counter()
    if caption is None:
        if captioner is None:
            raise MissingCompressedViewError(
                "no caption was given and no captioner is configured: pass caption='...' or build the pipeline "
                "with a captioner (the default uses the drafter)"
            )
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
        from .ocr import render_plain

        found = ocr_engine.read_cached(image) if hasattr(ocr_engine, "read_cached") else ocr_engine.read(image)
        items = tuple(found)
        ocr_text = render_plain(found)
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
