"""Request handling of the steering inspector: input checks, the decoding worker, and the ``/run`` and
``/describe`` handlers (:class:`DemoApp`). Gradio is imported only inside the handlers.
"""

from __future__ import annotations

import html
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asymspec_mm.config import METHODS

from .render import (
    SPECULATIVE_SOURCES,
    jsd_gamma_chart,
    method_subtitle,
    method_title,
    render_panel,
    render_stats_html,
    source_counts,
    status_html,
)

if TYPE_CHECKING:  # pragma: no cover
    from asymspec_mm.pipeline import AsymSpecPipeline

log = logging.getLogger("asymspec_mm.ui")

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "MAX_K",
    "MAX_NEW_TOKENS_LIMIT",
    "MAX_QUESTION_CHARS",
    "MAX_VIEW_CHARS",
    "RUN_OUTPUTS",
    "DemoApp",
    "DemoInputError",
    "outputs_as_dict",
]

MAX_QUESTION_CHARS = 4000
MAX_VIEW_CHARS = 8000
DEFAULT_MAX_NEW_TOKENS = 64
MAX_NEW_TOKENS_LIMIT = 1024
#: Largest draft length K the page offers and accepts.
MAX_K = 16

#: Output order of the ``/run`` endpoint (also the keys of :func:`outputs_as_dict`).
RUN_OUTPUTS = ("status", "answer_html", "answer_text", "floor_html", "drafter_html", "stats_html", "chart", "caption", "ocr", "result_json")


def outputs_as_dict(outputs: Sequence[Any]) -> dict[str, Any]:
    """Name the ``/run`` endpoint's outputs (e.g. a gradio_client result tuple)."""
    return dict(zip(RUN_OUTPUTS, outputs))


class DemoInputError(Exception):
    """A request the page refuses before it reaches the models (message is shown to the user)."""


@dataclass
class _Request:
    """A checked request: the loaded image, the view arguments for ``pipe.stream`` and the comparison runs."""

    image: Any
    question: str
    caption: str | None
    ocr: str | bool | None
    method: str
    overrides: dict
    compare: tuple[str, ...]
    notes: list[str] = field(default_factory=list)


def _file_path(payload: Any) -> str | None:
    """The server-side path of an uploaded file payload (Gradio FileData dict) or None."""
    if payload is None:
        return None
    if isinstance(payload, dict):
        return payload.get("path")
    if isinstance(payload, (str, os.PathLike)):
        return str(payload)
    path = getattr(payload, "path", None)
    if path:
        return str(path)
    raise DemoInputError("the image input is not a file upload")


class _Job:
    """Runs the requested decodes in one worker thread (the pipeline's lock must be taken and released by the
    same thread, and Gradio may resume a generator on any thread) and hands events over a queue."""

    #: Stop decoding when the page has not collected committed tokens for this long (the client went away
    #: without Gradio closing the handler), so an abandoned request does not hold the models.
    abandon_after_s = 30.0

    def __init__(self, pipe: AsymSpecPipeline, req: _Request) -> None:
        self.pipe = pipe
        self.req = req
        self.q: queue.Queue = queue.Queue()
        self.cancel = threading.Event()
        self.last_read = time.monotonic()
        self.reader_waiting = False
        self.thread = threading.Thread(target=self._run, name="asymspec-ui-job", daemon=True)

    def start(self) -> _Job:
        """Start the worker thread; returns self."""
        self.thread.start()
        return self

    def _decode(self, key: str, method: str, caption: str | None, ocr: str | bool | None) -> Any:
        """Stream one decode onto the queue under ``key``; its result, or None when cancelled or abandoned."""
        # Checked before each step is decoded (and before the view is prepared), so a stop costs no further work.
        if self.cancel.is_set() or self._abandoned():
            return None
        r = self.req
        stream = self.pipe.stream(r.image, r.question, caption=caption, ocr=ocr, method=method, **r.overrides)
        try:
            for events in stream:
                self.q.put((key, "events", events))
                if self.cancel.is_set() or self._abandoned():
                    return None
            result = stream.result
            self.q.put((key, "done", result))
            return result
        finally:
            stream.close()

    def _abandoned(self) -> bool:
        """Whether to stop: cancelled, or the reader has left items unread for :attr:`abandon_after_s`."""
        idle = time.monotonic() - self.last_read
        if not self.reader_waiting and not self.q.empty() and idle > self.abandon_after_s:
            log.warning("the client stopped reading; abandoning the request")
            self.cancel.set()
        return self.cancel.is_set()

    def get(self) -> tuple[str | None, str, Any]:
        """The next (key, kind, payload) item, for the handler (the reader)."""
        self.reader_waiting = True
        try:
            return self.q.get()
        finally:
            self.reader_waiting = False
            self.last_read = time.monotonic()

    def _run(self) -> None:
        """The worker: the main decode, then the comparisons on the view the main one used."""
        try:
            r = self.req
            main = self._decode("main", r.method, r.caption, r.ocr)
            if main is not None:
                caption, ocr = main.view.caption, (main.view.ocr_text or False)
                for m in r.compare:
                    if self.cancel.is_set() or self._decode(m, m, caption, ocr) is None:
                        break
        except BaseException as exc:  # reported to the page; the server keeps serving
            self.q.put((None, "error", exc))
        finally:
            self.q.put((None, "end", None))


class DemoApp:
    """State and handlers behind the Blocks (one loaded pipeline, shared by all sessions)."""

    def __init__(
        self,
        pipe: AsymSpecPipeline,
        *,
        max_upload_mb: float = 10,
        max_new_tokens_limit: int = MAX_NEW_TOKENS_LIMIT,
        stream_interval: float = 0.1,
    ) -> None:
        self.pipe = pipe
        self.max_upload_bytes = int(max_upload_mb * 2**20)
        self.max_upload_mb = max_upload_mb
        self.max_new_tokens_limit = max_new_tokens_limit
        self.stream_interval = stream_interval

    # ---------------------------------------------------------------- inputs
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
            return load_image(path)
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
    ) -> _Request:
        """Check the page's inputs (a :class:`DemoInputError` for the first bad one) and load the image."""
        question = "" if question is None else str(question)
        caption = "" if caption is None else str(caption)
        ocr = "" if ocr is None else str(ocr)
        if len(question) > MAX_QUESTION_CHARS:
            raise DemoInputError(f"the question is {len(question)} characters; the limit is {MAX_QUESTION_CHARS}")
        for name, text in (("caption", caption), ("OCR text", ocr)):
            if len(text) > MAX_VIEW_CHARS:
                raise DemoInputError(f"the {name} is {len(text)} characters; the limit is {MAX_VIEW_CHARS}")
        if not question.strip():
            raise DemoInputError("the question is empty: ask something about the image, e.g. 'Which bar is the tallest?'")
        method = str(method or "asymspec")
        if method not in METHODS:
            raise DemoInputError(f"method={method!r} is not valid; choose one of {', '.join(METHODS)}")
        try:
            max_new = int(max_new_tokens)
            k_int = int(k)
            overrides = dict(
                k=k_int,
                beta=float(beta),
                gamma=float(gamma),
                gate=str(gate),
                delta=str(delta),
                bonus=str(bonus),
                max_new_tokens=max_new,
                drafter_view=str(drafter_view),
            )
        except (TypeError, ValueError) as exc:
            raise DemoInputError(f"bad setting: {exc}") from None
        if not 1 <= max_new <= self.max_new_tokens_limit:
            raise DemoInputError(f"max new tokens must be between 1 and {self.max_new_tokens_limit}")
        if not 1 <= k_int <= MAX_K:
            raise DemoInputError(f"K must be between 1 and {MAX_K}")
        img = self._load_image(image)
        notes: list[str] = []
        cap_arg = caption if caption.strip() else (None if autofill else "")
        ocr_arg = self._ocr_arg(ocr, bool(autofill), notes)
        others = tuple(m for m in ("floor", "drafter") if m != method) if compare else ()
        return _Request(img, question, cap_arg, ocr_arg, method, overrides, others, notes)

    # ---------------------------------------------------------------- handlers
    def describe(self, image: Any, caption: str, ocr: str) -> tuple[str, str]:
        """Fill the compressed view from the image (drafter caption; OCR when an engine is available)."""
        try:
            img = self._load_image(image)
            notes: list[str] = []
            ocr_arg = self._ocr_arg("", True, notes)
            view = self.pipe.compressed_view(img, caption=None, ocr=ocr_arg)
        except Exception as exc:
            raise _gr_error(exc, "Cannot describe this image") from None
        return view.caption, view.ocr_text

    def run(
        self,
        image,
        question,
        caption,
        ocr,
        autofill=False,
        method="asymspec",
        k=4,
        beta=1.0,
        gamma=0.5,
        gate="cda",
        delta="contrast",
        bonus="verifier",
        max_new_tokens=DEFAULT_MAX_NEW_TOKENS,
        drafter_view="image+text",
        compare=True,
    ) -> Iterator[tuple]:
        """The ``/run`` endpoint: a generator of :data:`RUN_OUTPUTS` tuples (streams as tokens commit)."""
        import gradio as gr

        skip = gr.skip()

        def error_update(text: str) -> tuple:
            # gr.skip() keeps the other outputs as they were: a failed request does not blank the last answer.
            return (status_html("error", text),) + (skip,) * (len(RUN_OUTPUTS) - 1)

        t0 = time.perf_counter()
        try:
            req = self.prepare(
                image, question, caption, ocr, autofill, method, k, beta, gamma, gate, delta, bonus, max_new_tokens, drafter_view, compare
            )
        except Exception as exc:
            yield error_update(f"Error: {_error_text(exc)}")
            raise _gr_error(exc, "Cannot run this request") from None

        tok = self.pipe.tokenizer
        traces: dict[str, list] = {"main": [], "floor": [], "drafter": []}
        results: dict[str, Any] = {}
        panel_methods = {"main": req.method, "floor": "floor", "drafter": "drafter"}
        titles = {key: method_title(m) for key, m in panel_methods.items()}
        subtitles = {key: method_subtitle(m) for key, m in panel_methods.items()}

        def panel(key: str) -> str:
            if key != "main" and key not in req.compare:
                if key == req.method and "main" in results:
                    return render_panel(titles[key], traces["main"], tok, subtitle=subtitles[key], stats=results["main"].stats)
                return render_panel(titles[key], [], tok, subtitle=subtitles[key], empty="(comparison off)")
            done = key in results
            running = current[0] == key
            return render_panel(
                titles[key],
                traces[key],
                tok,
                subtitle=subtitles[key],
                done=not running,
                stats=results[key].stats if done else None,
                legend=(key == "main"),
                empty="waiting for the models..." if not done else "(no tokens)",
            )

        current = ["main"]
        job = _Job(self.pipe, req).start()
        last_yield = time.perf_counter()
        try:
            yield (
                status_html("run", f"Running {titles['main']}..."),
                panel("main"),
                "",
                panel("floor"),
                panel("drafter"),
                render_stats_html(None),
                None,
            ) + (skip,) * 3
            while True:
                key, kind, payload = job.get()
                if kind == "events":
                    traces[key].extend(payload)
                elif kind == "done":
                    results[key] = payload
                    if key == "main":
                        current[0] = req.compare[0] if req.compare else ""
                    else:
                        i = req.compare.index(key)
                        current[0] = req.compare[i + 1] if i + 1 < len(req.compare) else ""
                elif kind == "error":
                    msg = _error_text(payload)
                    if not isinstance(payload, Exception) or not _is_user_error(payload):
                        log.error("request failed", exc_info=payload)
                    yield error_update(f"Error: {msg}")
                    raise _gr_error(payload, "The request failed")
                elif kind == "end":
                    break
                now = time.perf_counter()
                n_main = len(traces["main"])
                interval = self.stream_interval + n_main / 2000.0
                if kind == "done" or now - last_yield >= interval:
                    last_yield = now
                    cur = current[0]
                    where = {"main": titles["main"], "floor": "Floor", "drafter": "the drafter alone"}.get(cur, "")
                    text = "".join(ev.text for ev in traces["main"])
                    status = status_html("run", f"Running {where}... {len(traces[cur])} tokens so far" if where else "Finishing...")
                    yield (status, panel("main"), text, panel("floor"), panel("drafter")) + (skip,) * 5
        finally:
            job.cancel.set()

        if "main" not in results:
            yield error_update("Stopped.")
            raise _gr_error("the request was stopped before it finished", "Stopped")
        main = results["main"]
        counts = source_counts(main.trace)
        summary = (
            f"Done in {time.perf_counter() - t0:.1f} s: {len(main.trace)} tokens"
            + ("".join(f", {counts[s]} {s}" for s in SPECULATIVE_SOURCES if counts.get(s)))
            + (f"; {counts['steered']} differ from the verifier alone" if req.method == "asymspec" else "")
        )
        if req.notes:
            summary += " (" + "; ".join(req.notes) + ")"
        payload = {"main": main.as_dict()}
        for m in ("floor", "drafter"):
            if m in results:
                payload[m] = results[m].as_dict()
        current[0] = ""
        chart = jsd_gamma_chart(main.trace)
        yield (
            status_html("ok", summary),
            panel("main"),
            main.text,
            panel("floor"),
            panel("drafter"),
            render_stats_html(main.stats, req.method),
            chart,
            main.view.caption,
            main.view.ocr_text,
            payload,
        )


def _is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the user's to fix (a bad input or option), not a failure of the app."""
    from asymspec_mm.errors import AsymSpecError

    return isinstance(exc, (AsymSpecError, DemoInputError))


def _gr_error(exc_or_msg: BaseException | str, title: str) -> Exception:
    """A ``gr.Error`` for the page (its message is rendered as HTML, so it is escaped)."""
    import gradio as gr

    msg = exc_or_msg if isinstance(exc_or_msg, str) else _error_text(exc_or_msg)
    user = isinstance(exc_or_msg, str) or _is_user_error(exc_or_msg)
    return gr.Error(html.escape(msg, quote=False), title=title, print_exception=not user)


def _error_text(exc: BaseException) -> str:
    """The message shown for an error: a user error's own text, anything else with its type."""
    if _is_user_error(exc):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
