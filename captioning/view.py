"""The compressed view: everything the text-only verifier learns about the image."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CAPTION_LABEL = "Image description:"
OCR_LABEL = "Image detected text:"
DEFAULT_CAPTION_CHARS = 1600
DEFAULT_OCR_CHARS = 800


@dataclass(frozen=True)
class CompressedView:
    """Caption + OCR text of one image.

    ``ocr_items`` keeps the structured OCR result (box, text, confidence) when an engine produced it;
    ``ocr_text`` is what the prompt shows.
    """

    caption: str = ""
    ocr_text: str = ""
    ocr_items: tuple[Any, ...] = field(default_factory=tuple)

    def render(self) -> str:
        """The exact text the verifier prompt carries before the question (may be empty)."""
        lines = []
        if self.caption.strip():
            lines.append(f"{CAPTION_LABEL} {self.caption.strip()}")
        if self.ocr_text.strip():
            lines.append(f"{OCR_LABEL} {self.ocr_text.strip()}")
        return "\n".join(lines)
