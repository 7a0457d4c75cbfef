"""The checks of the steering inspector's inputs before a run (:class:`InputChecks`, a part of
:class:`ui.jobs.DemoApp`): the upload's size and image, the OCR argument, the settings, and the warning for a request
the loaded pair cannot answer. Gradio is not imported here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .errors import DemoInputError
from .examples import tiny_pair_warning
from .progress import setup_steps
from .runs import _file_path, _RunInputs
from .settings_check import check_settings

__all__ = ["OVERSIZE_ADVICE", "InputChecks", "pair_reads_images", "text_pair_image_refusal"]

#: What the refusal of an upload over the pixel limit advises (the demo's limit is set when it starts).
OVERSIZE_ADVICE = "downscale it before uploading it, or start the demo with ASYMSPEC_MAX_INPUT_PIXELS set to a larger pixel count"


def pair_reads_images(pipe: Any) -> bool:
    """Whether the page's pair reads images (its drafter is a vision-language model); a stand-in without models does."""
    models = getattr(pipe, "models", None)
    return bool(getattr(models, "reads_images", True))


def text_pair_image_refusal(pipe: Any) -> str:
    """The page's refusal of an image sent to a pair whose drafter reads text only (the library's words)."""
    from asymspec_mm.engines.text_processor import image_refusal

    return image_refusal(str(getattr(pipe.drafter, "name_or_path", "") or "a text model"))


class InputChecks:
    """The input checks of :class:`ui.jobs.DemoApp`, which sets :attr:`pipe` and the upload and token limits."""

    pipe: Any
    max_upload_bytes: int
    max_upload_mb: float
    max_new_tokens_limit: int

    def _load_image(self, payload: Any) -> Any:
        """The uploaded image as a PIL image, after the size limit; a :class:`DemoInputError` when there is none."""
        from vision_cache.image import InvalidImageError, load_image

        path = _file_path(payload)
        if not path:
            raise DemoInputError("upload an image first (PNG, JPEG, WebP, ...)")
        try:
            size = os.path.getsize(path)
        except OSError:
            raise DemoInputError("the uploaded image could not be read; upload it again") from None
        if size > self.max_upload_bytes:
            raise DemoInputError(f"the upload is {size / 2**20:.1f} MB; the limit is {self.max_upload_mb:g} MB")
        try:
            return load_image(path, oversize_advice=OVERSIZE_ADVICE, limit_option="ASYMSPEC_MAX_INPUT_PIXELS")
        except InvalidImageError as exc:  # name the user's file, not the server's temp copy
            shown = (payload.get("orig_name") if isinstance(payload, dict) else None) or Path(path).name
            raise InvalidImageError(str(exc).replace(path, shown)) from None

    def _ocr_arg(self, ocr: str, autofill: bool, notes: list[str]) -> str | bool | None:
        """The pipeline's ``ocr`` argument: the typed text, None (run the engine) or False (no OCR, noted)."""
        if ocr and ocr.strip():
            return ocr
        if not autofill:
            return False
        try:
            engine = self.pipe.ocr_engine
        except Exception as exc:  # OCR is optional: skip it and say so
            notes.append(f"OCR skipped ({exc})")
            return False
        if engine is None:
            notes.append("no OCR engine configured: OCR skipped")
            return False
        return None

    def prepare(
        self, image, question, caption, ocr, autofill, method, k, beta, gamma, gate, delta, bonus, max_new_tokens, drafter_view, compare
    ) -> _RunInputs:
        """Check the page's inputs (a :class:`DemoInputError` for the first bad one) and load the image."""
        question, caption, ocr, method, overrides = check_settings(
            question, caption, ocr, method, k, beta, gamma, gate, delta, bonus, max_new_tokens, drafter_view, self.max_new_tokens_limit
        )
        others = tuple(m for m in ("floor", "drafter") if m != method) if compare else ()
        if not pair_reads_images(self.pipe):  # a text-only drafter: the question alone, no image, no caption or OCR
            if _file_path(image):
                raise DemoInputError(text_pair_image_refusal(self.pipe))
            return _RunInputs(None, question, None, None, method, overrides, others, [], None, setup_steps(caption=False, ocr=False))
        img = self._load_image(image)
        notes: list[str] = []
        cap_arg = caption if caption.strip() else (None if autofill else "")
        ocr_arg = self._ocr_arg(ocr, bool(autofill), notes)
        warning = self.warning(question, img.size)
        # the "none" engine reads nothing: no OCR to speak of while the run is set up
        reads = ocr_arg is None and getattr(self.pipe.ocr_engine, "name", None) != "none"
        setup = setup_steps(caption=cap_arg is None, ocr=reads)
        return _RunInputs(img, question, cap_arg, ocr_arg, method, overrides, others, notes, warning, setup)

    def warning(self, question: str, image_size: tuple[int, int] | None) -> str | None:
        """The page's warning for a request the loaded pair cannot answer (the bundled tiny pair outside
        MiniVista), else None."""
        from asymspec_mm.request.domain import request_problems

        if not request_problems(getattr(self.pipe, "name", None), question, [image_size]):  # every path's rule
            return None
        return tiny_pair_warning(question, image_size)

    def early_warning(self, image: Any, question: Any) -> str | None:
        """:meth:`warning` as the page hands the run over, before its image is checked (None when there is no
        question yet; the image's size when its header reads)."""
        if not question or not str(question).strip():
            return None
        size = None
        try:
            from PIL import Image

            path = _file_path(image)
            if path and os.path.getsize(path) <= self.max_upload_bytes:
                with Image.open(path) as im:
                    size = im.size
        except Exception:  # the run itself reports a bad image
            size = None
        return self.warning(str(question), size)
