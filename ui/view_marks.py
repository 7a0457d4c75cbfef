"""Whose text the compressed view's fields hold: the app's (the drafter's caption or the OCR engine's text, written
by auto-fill or Describe image), an example's (filled in with its image by a click on an example), or the user's own.

The page writes the view it generated into the Caption and OCR fields, so that the user can read and edit what the
verifier read. Generated text belongs to the image it was made from, and an example's text to the example's image: a
new image (or clearing it) empties the fields that still hold either, while text the user typed or edited stays.
Such fields are marked on the page (:data:`MARK_CLASS` and a line under the field) until the user edits them.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field as _default
from typing import Any

__all__ = [
    "APP",
    "EXAMPLE",
    "FIELDS",
    "MARK_CLASS",
    "MARK_INFO",
    "OCR_PLACEHOLDER",
    "ExampleTexts",
    "GeneratedViews",
    "field_update",
    "generated_fields",
    "image_key",
    "ocr_outcome",
]

#: The fields of the compressed view, as the page's inputs name them.
FIELDS = ("caption", "ocr")
#: Where a marked field's text came from: the app wrote it, or an example filled it in.
APP, EXAMPLE = "app", "example"
#: The class a marked field's block carries (``ui/style.css`` tints it).
MARK_CLASS = "asym-generated"
#: The line under a marked field, by field and origin.
MARK_INFO = {
    ("caption", APP): "Written by the drafter from this image: a new image replaces it. Edit it to make it yours.",
    ("ocr", APP): "Read from this image by the OCR engine: a new image replaces it. Edit it to make it yours.",
    ("caption", EXAMPLE): "The example's caption of its image: another image empties it. Edit it to make it yours.",
    ("ocr", EXAMPLE): "The example's OCR text of its image: another image empties it. Edit it to make it yours.",
}

#: The OCR field's placeholder before a run has read the image.
OCR_PLACEHOLDER = "empty: OCR engine (if auto-fill is on and one is installed)"


def ocr_outcome(ocr_stat: str | None, notes: Iterable[str] = ()) -> str:
    """The OCR field's placeholder once a run (or Describe image) left it empty: what happened to the image's text.
    ``ocr_stat`` is the result's ``stats["ocr_engine"]`` (the engine that read the image, ``"given"`` or ``"off"``; None:
    unknown) and ``notes`` the run's notes (``OCR skipped (...)`` says why an engine did not run)."""
    if ocr_stat == "none":
        return "empty: this demo runs without an OCR engine (OCR engine none), so the verifier read no OCR text"
    if ocr_stat == "off":
        skipped = next((n for n in notes if "OCR skipped" in n), None)
        if skipped is not None:
            return f"empty: {skipped}; the verifier read no OCR text"
        return "empty: auto-fill is off, so the verifier read no OCR text (type some here)"
    if ocr_stat and ocr_stat != "given":
        return f"empty: the OCR engine ({ocr_stat}) found no text in this image"
    return OCR_PLACEHOLDER


def generated_fields(record: dict[str, str], values: dict[str, str | None]) -> set[str]:
    """The fields whose current ``values`` are still the text the page filled in (``record``); an empty field is
    nobody's."""
    return {f for f in FIELDS if values.get(f) and record.get(f) == values.get(f)}


def field_update(field: str, origin: str | bool | None, **more: Any) -> Any:
    """The Gradio update that marks one field as holding text of ``origin`` (:data:`APP` or :data:`EXAMPLE`; True is
    :data:`APP`), or unmarks it (None or False), its value untouched; ``more``: other properties to set (a
    placeholder)."""
    import gradio as gr

    if origin is True:
        origin = APP
    if not origin:  # an empty line: Gradio's page keeps the last line for info=None
        return gr.update(elem_classes=[], info="", **more)
    return gr.update(elem_classes=[MARK_CLASS], info=MARK_INFO[(field, origin)], **more)


def image_key(image: Any) -> str | None:
    """A key of an image file's content (an upload's FileData dict, a path, or None): the same picture gives the same
    key wherever Gradio copied it. None when there is no readable file."""
    path = image.get("path") if isinstance(image, dict) else getattr(image, "path", image)
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        return None
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


class ExampleTexts:
    """The caption and OCR text of the page's examples, each belonging to its example's image (by content): a new
    image that is an example's keeps that example's text (the page's image.change of a click on an example may come
    before the click's own record, :meth:`GeneratedViews.example_loaded`)."""

    def __init__(self, examples: Iterable[dict] = ()) -> None:
        self._by_image: dict[str, dict[str, set[str]]] = {}
        self._texts: dict[str, set[str]] = {f: set() for f in FIELDS}
        for example in examples:
            self.add(example)

    def add(self, example: dict) -> None:
        """One example (a dict with its image's path and its ``caption`` and ``ocr``)."""
        key = image_key(example.get("image"))
        if key is None:
            return
        for field in FIELDS:
            text = example.get(field) or ""
            if text:
                self._by_image.setdefault(key, {}).setdefault(field, set()).add(text)
                self._texts[field].add(text)

    def belongs(self, field: str, text: str | None, key: str | None) -> bool:
        """Whether ``text`` is an example's ``field`` of the image ``key``."""
        return bool(text) and text in self._by_image.get(key or "", {}).get(field, set())

    def elsewhere(self, field: str, text: str | None, key: str | None) -> bool:
        """Whether ``text`` is an example's ``field``, but of none of the examples whose image is ``key``."""
        return bool(text) and text in self._texts[field] and not self.belongs(field, text, key)


@dataclass
class _Fields:
    """One session's fields as the page filled them."""

    app: dict[str, str] = _default(default_factory=dict)  # the app's text (auto-fill, Describe image)
    example: dict[str, str] = _default(default_factory=dict)  # the text a click on an example filled in
    example_image: str | None = None  # that example's image (:func:`image_key`)


class GeneratedViews:
    """Per page session, the text the page filled into the fields: the app's, and an example's with its image
    (thread-safe). Text the user typed is neither: nothing here empties it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_session: dict[str, _Fields] = {}
        self._ocr_placeholders: dict[str, str] = {}  # what the last run did to an empty OCR field (ocr_outcome)

    def _get(self, session: str | None) -> _Fields:
        with self._lock:
            got = self._by_session.get(session or "")
            return _Fields(dict(got.app), dict(got.example), got.example_image) if got else _Fields()

    def _put(self, session: str | None, fields: _Fields) -> None:
        if not session:
            return
        with self._lock:
            if fields.app or fields.example:
                self._by_session[session] = fields
            else:
                self._by_session.pop(session, None)

    def get(self, session: str | None) -> dict[str, str]:
        """The app's text in the session's fields."""
        return self._get(session).app

    def example(self, session: str | None) -> dict[str, str]:
        """The text a click on an example filled into the session's fields (and that they still hold)."""
        return self._get(session).example

    def _set(self, session: str | None, record: dict[str, str]) -> None:
        fields = self._get(session)
        fields.app = record
        self._put(session, fields)

    def forget(self, session: str | None) -> None:
        """The session's page went away."""
        self._put(session, _Fields())
        self.set_ocr_placeholder(session, None)

    def set_ocr_placeholder(self, session: str | None, text: str | None) -> None:
        """The OCR field's placeholder from now on (:func:`ocr_outcome` of a run; None: :data:`OCR_PLACEHOLDER`, as for
        an image nothing has read yet)."""
        if not session:
            return
        with self._lock:
            if text is None:
                self._ocr_placeholders.pop(session, None)
            else:
                self._ocr_placeholders[session] = text

    def ocr_placeholder(self, session: str | None) -> str:
        """The OCR field's placeholder for the session's image."""
        with self._lock:
            return self._ocr_placeholders.get(session or "", OCR_PLACEHOLDER)

    def wrote(self, session: str | None, *, caption: str | None = None, ocr: str | None = None) -> None:
        """The app wrote these texts into the fields (None: that field was not written)."""
        fields = self._get(session)
        for name, text in (("caption", caption), ("ocr", ocr)):
            if text is not None:
                fields.app.pop(name, None)
                fields.example.pop(name, None)
                if text:
                    fields.app[name] = text
        self._put(session, fields)

    def ran(self, session: str | None, sent_caption: Any, sent_ocr: Any, caption: str, ocr: str) -> None:
        """A run's answer shows ``caption`` and ``ocr`` in the fields; the request sent ``sent_caption`` and
        ``sent_ocr`` (None: the app made it). A field is the app's when the app made it, or when the user sent it
        back unchanged; else it is the user's (or still the example's)."""
        before = self.get(session)
        record = {}
        for name, sent, shown in (("caption", sent_caption, caption), ("ocr", sent_ocr, ocr)):
            if shown and (sent is None or (isinstance(sent, str) and sent == before.get(name))):
                record[name] = shown
        self._set(session, record)

    def example_loaded(self, session: str | None, image: str | None, values: dict[str, str | None]) -> None:
        """A click on an example filled the fields with ``values``, the text of its image (``image``, its key)."""
        fields = self._get(session)
        fields.example = {f: str(values[f]) for f in FIELDS if values.get(f)}
        fields.example_image = image
        fields.app = {f: t for f, t in fields.app.items() if f not in fields.example}
        self._put(session, fields)

    def origins(self, session: str | None, values: dict[str, str | None]) -> dict[str, str]:
        """The fields whose current ``values`` the page filled in, each with its origin (:data:`APP`,
        :data:`EXAMPLE`)."""
        fields = self._get(session)
        out = dict.fromkeys(generated_fields(fields.example, values), EXAMPLE)
        out.update(dict.fromkeys(generated_fields(fields.app, values), APP))
        return out

    def edited(self, session: str | None, values: dict[str, str | None]) -> set[str]:
        """The user typed in the fields: the ones they changed are theirs from now on. Returns the fields that
        stopped holding the page's text (their mark goes)."""
        fields = self._get(session)
        gone = set()
        for record in (fields.app, fields.example):
            changed = {f for f in record if record[f] != values.get(f)}
            for f in changed:
                del record[f]
            gone |= changed
        self._put(session, fields)
        return gone

    def image_changed(
        self, session: str | None, values: dict[str, str | None], image: str | None = None, examples: ExampleTexts | None = None
    ) -> set[str]:
        """A new image (or none; ``image``, its :func:`image_key`): returns the fields to empty, those that still hold
        the app's text of the old image or an example's text when the image is not that example's. Never the text of
        an example of this very image (``examples``): a click on an example changes the image with its text."""
        fields = self._get(session)
        stale = generated_fields(fields.app, values)
        fields.app = {}
        if image is None or image != fields.example_image:
            stale |= generated_fields(fields.example, values)
            fields.example, fields.example_image = {}, None
        if examples is not None:
            stale = {f for f in stale if not examples.belongs(f, values.get(f), image)}
        self._put(session, fields)
        return stale
