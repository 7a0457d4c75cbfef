"""Whose text the compressed view's fields hold: the app's (the drafter's caption or the OCR engine's text, written
by auto-fill or Describe image) or the user's own.

The page writes the view it generated into the Caption and OCR fields, so that the user can read and edit what the
verifier read. Generated text belongs to the image it was made from: a new image (or clearing it) empties the
fields that still hold it, while text the user typed or edited stays. Generated fields are marked on the page
(:data:`MARK_CLASS` and a line under the field) until the user edits them.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["FIELDS", "MARK_CLASS", "MARK_INFO", "GeneratedViews", "field_update", "generated_fields"]

#: The fields of the compressed view, as the page's inputs name them.
FIELDS = ("caption", "ocr")
#: The class a generated field's block carries (``ui/style.css`` tints it).
MARK_CLASS = "asym-generated"
#: The line under a generated field.
MARK_INFO = {
    "caption": "Written by the drafter from this image: a new image replaces it. Edit it to make it yours.",
    "ocr": "Read from this image by the OCR engine: a new image replaces it. Edit it to make it yours.",
}


def generated_fields(record: dict[str, str], values: dict[str, str | None]) -> set[str]:
    """The fields whose current ``values`` are still the text the app wrote (``record``); an empty field is nobody's."""
    return {f for f in FIELDS if values.get(f) and record.get(f) == values.get(f)}


def field_update(field: str, generated: bool) -> Any:
    """The Gradio update that marks (or unmarks) one field, its value untouched."""
    import gradio as gr

    return gr.update(elem_classes=[MARK_CLASS] if generated else [], info=MARK_INFO[field] if generated else None)


class GeneratedViews:
    """Per page session, the caption and OCR text the app wrote into the fields (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_session: dict[str, dict[str, str]] = {}

    def get(self, session: str | None) -> dict[str, str]:
        with self._lock:
            return dict(self._by_session.get(session or "", {}))

    def _set(self, session: str | None, record: dict[str, str]) -> None:
        if not session:
            return
        with self._lock:
            if record:
                self._by_session[session] = record
            else:
                self._by_session.pop(session, None)

    def forget(self, session: str | None) -> None:
        self._set(session, {})

    def wrote(self, session: str | None, *, caption: str | None = None, ocr: str | None = None) -> None:
        """The app wrote these texts into the fields (None: that field was not written)."""
        record = self.get(session)
        for field, text in (("caption", caption), ("ocr", ocr)):
            if text is not None:
                record.pop(field, None)
                if text:
                    record[field] = text
        self._set(session, record)

    def ran(self, session: str | None, sent_caption: Any, sent_ocr: Any, caption: str, ocr: str) -> None:
        """A run's answer shows ``caption`` and ``ocr`` in the fields; the request sent ``sent_caption`` and
        ``sent_ocr`` (None: the app made it). A field is the app's when the app made it, or when the user sent it
        back unchanged; else it is the user's."""
        before = self.get(session)
        record = {}
        for field, sent, shown in (("caption", sent_caption, caption), ("ocr", sent_ocr, ocr)):
            if shown and (sent is None or (isinstance(sent, str) and sent == before.get(field))):
                record[field] = shown
        self._set(session, record)

    def edited(self, session: str | None, values: dict[str, str | None]) -> set[str]:
        """The user typed in the fields: the ones they changed are theirs from now on. Returns the fields that
        stopped being generated (their mark goes)."""
        record = self.get(session)
        gone = {f for f in record if record[f] != values.get(f)}
        self._set(session, {f: t for f, t in record.items() if f not in gone})
        return gone

    def image_changed(self, session: str | None, values: dict[str, str | None]) -> set[str]:
        """A new image (or none): returns the fields that still hold the app's text of the old image (to empty);
        the session then holds no generated text."""
        stale = generated_fields(self.get(session), values)
        self.forget(session)
        return stale
