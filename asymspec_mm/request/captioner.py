"""The drafter as captioner: caption an image with the pipeline's own Qwen3-VL model.

No extra model: the caption comes from the drafter, prompted with
:data:`captioning.captioner.CAPTION_PROMPT`, decoded greedily, and reusing the vision features
the drafter's full stream needs anyway (no second tower pass). Served by an engine loop
(:func:`asymspec_mm.engines.model_calls.using_loop`, the scheduler's), the caption is a drafter row the loop decodes beside
the other rows and the tower runs in the loop: the set-up thread runs no model. It lives in :mod:`asymspec_mm`
because it runs the decoding engines; :mod:`captioning` keeps the captioner interface, the
caption cache and :func:`captioning.captioner.compress`.
"""

from __future__ import annotations

import threading

import torch

from captioning.captioner import CAPTION_PROMPT, CaptionCache
from vision_cache.hashing import image_content_hash

from ..decode import AsymSpecConfig, greedy_steps
from ..engines import PromptImages, VLEngine
from ..engines.loading import eos_ids
from ..engines.model_calls import HomeLoop, ModelLoop, TokenRequest, loop_for, model_runner, stepped_tokens
from ..engines.pieces import image_prompt

__all__ = ["DrafterCaptioner"]


class DrafterCaptioner:
    """Captions an image with a Qwen3-VL model (the pipeline's drafter by default).

    ``encoder`` is the pipeline's :class:`vision_cache.VisionEncoder`, so the tower runs at most once
    per image across captioning and decoding. The caption is a drafter row of the loop serving the set-up that
    asks for it, else of ``home_loop()`` (a pipeline's: the loop its calls made outside any loop run in), so the
    rows decoding there step beside it; with neither (a captioner of one's own model) it is decoded here.
    """

    def __init__(
        self, model, processor, encoder, prompt: str = CAPTION_PROMPT, max_new_tokens: int = 256, home_loop: HomeLoop | None = None
    ):
        self.home_loop = home_loop
        self.model = model
        self.processor = processor
        self.encoder = encoder
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.cache = CaptionCache()
        self.name = "drafter"
        # captions being written, by cache key: a set-up asking for one waits for it rather than writing it twice
        # (several requests about one new image are set up at once)
        self._writing: dict[str, threading.Event] = {}
        self._writing_lock = threading.Lock()

    def caption(self, image, image_hash: str | None = None) -> str:
        """The caption of ``image``: from the cache, or written once however many threads ask for it at once (the
        others wait for it; should its writer fail, the next of them writes it)."""
        key = CaptionCache.key(image_hash or image_content_hash(image), self.prompt, self.max_new_tokens)
        while True:
            cached = self.cache.get(key)
            if cached is not None:
                return cached
            with self._writing_lock:
                writing = self._writing.get(key)
                if writing is None:
                    writing = self._writing[key] = threading.Event()
                    break
            writing.wait()
        try:
            caption = self._write(image)
            self.cache.put(key, caption)
            return caption
        finally:
            with self._writing_lock:
                del self._writing[key]
            writing.set()

    @torch.no_grad()
    def _write(self, image) -> str:
        """Write ``image``'s caption (in the serving loop when there is one)."""
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": self.prompt}]}]
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        enc = self.processor(text=[text], images=[image], return_tensors="pt")
        loop = loop_for(self.home_loop) if isinstance(self.model, torch.nn.Module) else None  # a loop batches transformers rows
        tokens = self._in_loop(loop, enc) if loop is not None else self._here(image, enc)
        return self.processor.tokenizer.decode(tokens, skip_special_tokens=True).strip()

    def _config(self) -> AsymSpecConfig:
        return AsymSpecConfig(max_new_tokens=self.max_new_tokens, trace_top=0)

    def _in_loop(self, loop: ModelLoop, enc: dict) -> list[int]:
        """The caption's tokens as a drafter row of ``loop`` (the tower's call in the loop too)."""
        features, _ = self.encoder.encode(enc["pixel_values"], enc["image_grid_thw"], run=loop.run)
        ids = enc["input_ids"][0]
        merge = self.model.config.vision_config.spatial_merge_size
        prompt = image_prompt(ids[:-1], enc["mm_token_type_ids"][0], features, merge, reuse=False)
        request = TokenRequest(
            "drafter",
            self._config(),
            {"drafter_full": prompt},
            {"drafter_full": ids[-1:]},
            eos_ids([self.processor.tokenizer]),
            model=self.model,
        )
        return loop.decode_row(request).token_ids

    def _here(self, image, enc: dict) -> list[int]:
        """The caption's tokens decoded on this thread, each model call in :meth:`_write`'s loop when there is one
        (a served model's), else here."""
        engine = VLEngine(self.model, name="captioner", encoder=self.encoder)
        ids = enc["input_ids"][0]
        run = model_runner(self.home_loop)
        # the features first, their tower pass a call of its own: a set-up served by a loop may own this image's
        # cache slot while its tower pass waits for that loop
        features, _ = self.encoder.encode(enc["pixel_values"], enc["image_grid_thw"], run=run)
        images = PromptImages([image], enc["pixel_values"], enc["image_grid_thw"], enc["mm_token_type_ids"][0], features=features)
        run(lambda: engine.prefill(ids[:-1], images))
        steps = greedy_steps(engine, ids[-1:].to(engine.device), self._config(), eos_ids([self.processor.tokenizer]), is_verifier=False)
        return stepped_tokens(steps, run)
