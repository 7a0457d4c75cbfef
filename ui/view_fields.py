"""The handlers of the compressed view's fields (Caption, OCR text) behind the page: the marks of the text the page
filled in (:mod:`ui.view_marks`), the user's edits, and a new image, which empties the text that belonged to the old
one. :class:`ViewFields` is a part of :class:`ui.jobs.DemoApp`; Gradio is imported only inside the handlers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .conversation import render_conversation_html
from .errors import _error_text
from .outputs import RUN_OUTPUTS
from .render import status_html
from .view_marks import FIELDS, OCR_PLACEHOLDER, ExampleTexts, GeneratedViews, field_update, image_key, ocr_outcome

if TYPE_CHECKING:  # pragma: no cover
    from .conversation import Conversations
    from .outputs import RunOutputs
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
    outputs: RunOutputs

    def busy(self, session: str | None) -> bool:  # pragma: no cover - DemoApp's
        raise NotImplementedError

    def _load_image(self, payload: Any) -> Any:  # pragma: no cover - DemoApp's
        raise NotImplementedError

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
            self.views.set_ocr_placeholder(job.session, ocr_outcome(main.stats.get("ocr_engine"), job.req.notes))

    def view_marks(self, caption: str, ocr: str, session: str | None = None) -> tuple:
        """Caption and OCR updates after a run or Describe image: the fields that hold the page's text are marked."""
        origins = self.views.origins(session, {"caption": caption, "ocr": ocr})
        # an empty OCR field says what happened to the image's text (the engine found none, no engine, auto-fill off)
        more = {"ocr": {"placeholder": self.views.ocr_placeholder(session)}}
        return tuple(field_update(f, origins.get(f), **more.get(f, {})) for f in FIELDS)

    def view_edited(self, caption: str, ocr: str, session: str | None = None) -> tuple:
        """The user typed in a field: an edited field that held the page's text becomes theirs (its mark goes); else
        nothing changes."""
        import gradio as gr

        gone = self.views.edited(session, {"caption": caption, "ocr": ocr})
        return tuple(field_update(f, None) if f in gone else gr.skip() for f in FIELDS)

    def clear_conversation(self, session: str | None = None) -> str:
        """The Clear conversation button: the session's turns are forgotten; returns the empty conversation."""
        self.conversations.clear(session)
        return render_conversation_html((), self.outputs.tok)

    def example_chosen(self, image: Any, caption: str, ocr: str, session: str | None = None) -> tuple:
        """A click on an example (after its image and fields are in the page): the caption and OCR updates of
        :meth:`example_loaded`, then the conversation's: ended (as Clear does), unless a live run of the session
        already began on the example's picture (Run pressed right after the click can reach the server first). A
        finished run's conversation ends: the same example clicked again starts a new one."""
        import gradio as gr

        marks = self.example_loaded(image, caption, ocr, session)
        try:
            picture = self._load_image(image)
        except Exception:  # an example's picture that cannot be read: the run says why
            picture = None
        kept = self.busy(session) and self.conversations.about(session, picture)
        return (*marks, gr.skip() if kept else self.clear_conversation(session))

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

        values, key = {"caption": caption, "ocr": ocr}, image_key(image)
        stale = self.views.image_changed(session, values, key, self.examples)
        origins = self.views.origins(session, values)
        self.conversations.clear(session)
        self.views.set_ocr_placeholder(session, None)  # nothing has read the new image yet
        more = {"ocr": {"placeholder": OCR_PLACEHOLDER}}

        def update(f: str) -> Any:
            if f in stale:
                return gr.update(value="", elem_classes=[], info="", **more.get(f, {}))
            if f not in origins and self.examples.belongs(f, values[f], key):
                # an example's own text before the click's record (example_loaded marks it): left alone, so that
                # whichever of the two answers reaches the page last, the field ends marked as the example's
                return gr.skip()
            return field_update(f, origins.get(f), **more.get(f, {}))

        return tuple(update(f) for f in FIELDS)

    def new_image(self, image: Any, caption: str, ocr: str, session: str | None = None, method: str = "asymspec") -> tuple:
        """The page's image.change: the image box's update (emptied when the upload is not an image the app can read),
        then the :data:`RUN_OUTPUTS` updates. An unreadable upload is refused at once, with the run's one-line error in
        the status. The fields change as :meth:`image_changed` says; the old image's answer, stats, chart, downloads and
        conversation go (left alone while a run of the session goes: its own updates follow). Nothing changes when the
        session's conversation is already about this picture (a run begun right after the upload)."""
        import gradio as gr

        refused, picture = None, None
        if image is not None:
            try:
                picture = self._load_image(image)
            except Exception as exc:  # the same one-line error a run would give
                refused = f"Error: {_error_text(exc)}"
        if self.conversations.about(session, picture):
            # The picture the session's conversation is already about: Run pressed right after the upload can begin,
            # and with the tiny pair even finish, its run before this event reaches the server; that run's turn,
            # fields and panels stay (the same picture uploaded again changes nothing either).
            return (gr.skip(),) * (1 + len(RUN_OUTPUTS))
        fields = dict(zip(FIELDS, self.image_changed(caption, ocr, session, None if refused else image)))
        if self.busy(session):
            shown: dict[str, Any] = {"conversation_html": self.outputs.blank()["conversation_html"]}
        else:
            shown = self.outputs.blank(method)
        # The status changes only to refuse an upload: this answer may reach the page after a run's status when Run is
        # pressed right after the upload (the run's own lines, its error included, must stay).
        shown["status"] = status_html("error", refused) if refused is not None else gr.skip()
        shown.update(fields)
        return (None if refused is not None else gr.skip(), *(shown.get(name, gr.skip()) for name in RUN_OUTPUTS))
