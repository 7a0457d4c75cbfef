"""The handlers of the compressed view's fields (Caption, OCR text) behind the page: the marks of the text the page
filled in (:mod:`ui.view_marks`), the user's edits, and a new image, which empties the text that belonged to the old
one. :class:`ViewFields` is a part of :class:`ui.jobs.DemoApp`; Gradio is imported only inside the handlers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .view_marks import FIELDS, ExampleTexts, GeneratedViews, field_update, image_key

if TYPE_CHECKING:  # pragma: no cover
    from .conversation import Conversations
    from .runs import _Job

__all__ = ["ViewFields"]


class ViewFields:
    """The field handlers of :class:`ui.jobs.DemoApp` (which sets :attr:`views`, :attr:`examples` and
    ``conversations``)."""

    #: The caption and OCR text the page filled into each session's fields (auto-fill, Describe image, an example).
    views: GeneratedViews
    #: The examples' texts, each belonging to its example's image (a new image that is an example's keeps them).
    examples: ExampleTexts
    conversations: Conversations

    def add_examples(self, examples: Iterable[dict]) -> None:
        """The page's examples (dicts with ``image``, ``caption``, ``ocr``): their text goes when another image
        replaces theirs."""
        for example in examples:
            self.examples.add(example)

    def _remember_view(self, job: _Job) -> None:
        """The caption and OCR text a job's answer shows in the page's fields: the app's where it filled them."""
        main = job.snapshot().results.get("main")
        if main is not None:
            self.views.ran(job.session, job.req.caption, job.req.ocr, main.view.caption, main.view.ocr_text)

    def view_marks(self, caption: str, ocr: str, session: str | None = None) -> tuple:
        """Caption and OCR updates after a run or Describe image: the fields that hold the page's text are marked."""
        origins = self.views.origins(session, {"caption": caption, "ocr": ocr})
        return tuple(field_update(f, origins.get(f)) for f in FIELDS)

    def view_edited(self, caption: str, ocr: str, session: str | None = None) -> tuple:
        """The user typed in a field: an edited field that held the page's text becomes theirs (its mark goes); else
        nothing changes."""
        import gradio as gr

        gone = self.views.edited(session, {"caption": caption, "ocr": ocr})
        return tuple(field_update(f, None) if f in gone else gr.skip() for f in FIELDS)

    def example_loaded(self, image: Any, caption: str, ocr: str, session: str | None = None) -> tuple:
        """A click on an example filled the image and the fields: their text is the example's, marked so, until another
        image replaces the example's or the user edits it."""
        values = {"caption": caption, "ocr": ocr}
        self.views.example_loaded(session, image_key(image), values)
        return self.view_marks(caption, ocr, session)

    def image_changed(self, caption: str, ocr: str, session: str | None = None, image: Any = None) -> tuple:
        """A new image, or none (``image``, the page's upload): the fields that still hold the old image's generated
        text, or an example's text while the image is not the example's, are emptied (the next run fills them from the
        new image); text the user typed or edited stays. The session's conversation ends."""
        import gradio as gr

        values = {"caption": caption, "ocr": ocr}
        stale = self.views.image_changed(session, values, image_key(image), self.examples)
        origins = self.views.origins(session, values)
        self.conversations.clear(session)
        return tuple(gr.update(value="", elem_classes=[], info="") if f in stale else field_update(f, origins.get(f)) for f in FIELDS)
