"""Request handling of the steering inspector: input checks, the rows of a run in the app's batching scheduler
(:class:`_Job`), and the ``/run``, ``/describe`` and Stop handlers (:class:`DemoApp`). Gradio is imported only
inside the handlers.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asymspec_mm.config import METHODS

from .errors import DemoInputError, _error_text, _gr_error, _is_user_error
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
from .runs import _file_path, _Job, _Request, _Snapshot  # noqa: F401 - _Job, _Request: ui.app re-exports them

if TYPE_CHECKING:  # pragma: no cover
    from asymspec_mm.pipeline import AsymSpecPipeline

log = logging.getLogger("asymspec_mm.ui")

__all__ = [
    "DEFAULT_MAX_BATCH_SIZE",
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
#: Rows the app's scheduler decodes in shared steps (``asymspec-mm demo --max-batch-size``).
DEFAULT_MAX_BATCH_SIZE = 8
#: A running handler yields at least this often (Gradio can close a stopped handler only between two yields).
HEARTBEAT_S = 0.5

#: Output order of the ``/run`` endpoint (also the keys of :func:`outputs_as_dict`).
RUN_OUTPUTS = ("status", "answer_html", "answer_text", "floor_html", "drafter_html", "stats_html", "chart", "caption", "ocr", "result_json")


def outputs_as_dict(outputs: Sequence[Any]) -> dict[str, Any]:
    """Name the ``/run`` endpoint's outputs (e.g. a gradio_client result tuple)."""
    return dict(zip(RUN_OUTPUTS, outputs))


class DemoApp:
    """State and handlers behind the Blocks: one loaded pipeline and one batching scheduler, shared by all
    sessions (every run's rows decode in the scheduler's shared steps)."""

    #: A stopped job is kept this long after its handler ended, for the Stop button to show it.
    keep_stopped_s = 600.0
    #: Stop waits at most this long for a starting run to submit its rows, then for its handler to end.
    stop_wait_s = 5.0

    def __init__(
        self,
        pipe: AsymSpecPipeline,
        *,
        max_upload_mb: float = 10,
        max_new_tokens_limit: int = MAX_NEW_TOKENS_LIMIT,
        stream_interval: float = 0.1,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        scheduler: Any = None,
    ) -> None:
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size!r} must be an integer >= 1")
        self.pipe = pipe
        self.max_upload_bytes = int(max_upload_mb * 2**20)
        self.max_upload_mb = max_upload_mb
        self.max_new_tokens_limit = max_new_tokens_limit
        self.stream_interval = stream_interval
        self.max_batch_size = max_batch_size
        self._scheduler = scheduler
        self._own_scheduler = scheduler is None
        self._lock = threading.Lock()
        self._live: set[_Job] = set()  # jobs whose handler is running
        self._sessions: dict[str, list[_Job]] = {}  # each session's unfinished jobs, oldest first (for Stop)
        self._starting: dict[str, threading.Event] = {}  # sessions whose run is submitting its rows

    @property
    def scheduler(self) -> Any:
        """The app's scheduler (``pipe.scheduler(max_batch_size=...)``, created on first use)."""
        with self._lock:
            if self._scheduler is None:
                self._scheduler = self.pipe.scheduler(max_batch_size=self.max_batch_size)
                self._own_scheduler = True
            return self._scheduler

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop every job and close the scheduler this app created (a later run creates a new one)."""
        with self._lock:
            jobs = self._live.union(*self._sessions.values())
            self._live.clear()
            self._sessions.clear()
            sched, own = self._scheduler, self._own_scheduler
            if own:
                self._scheduler = None
        for job in jobs:
            job.stop()
        if sched is not None and own:
            sched.close(timeout)

    def forget(self, session: str | None) -> None:
        """The session's page went away: stop its job."""
        with self._lock:
            jobs = self._sessions.pop(session, []) if session else []
        for job in jobs:
            job.stop()

    def _starting_run(self, session: str | None) -> threading.Event | None:
        """A run of ``session`` begins (Stop waits for it to submit its rows)."""
        if not session:
            return None
        event = threading.Event()
        with self._lock:
            self._starting[session] = event
        return event

    def _started(self, session: str | None, event: threading.Event | None) -> None:
        if event is None:
            return
        with self._lock:
            if self._starting.get(session) is event:
                del self._starting[session]
        event.set()

    def _register(self, job: _Job) -> None:
        now = time.monotonic()
        with self._lock:
            self._live.add(job)
            for session, jobs in list(self._sessions.items()):  # stopped jobs no Stop came for
                jobs[:] = [j for j in jobs if j.ended_at is None or now - j.ended_at <= self.keep_stopped_s]
                if not jobs:
                    del self._sessions[session]
            if job.session:
                self._sessions.setdefault(job.session, []).append(job)

    def _unregister(self, job: _Job) -> None:
        with self._lock:
            jobs = self._sessions.get(job.session or "", [])
            if job in jobs:
                jobs.remove(job)
                if not jobs:
                    del self._sessions[job.session]

    def _finished(self, job: _Job) -> None:
        """The handler showed the job's final answer or error."""
        job.final_shown = True
        self._unregister(job)

    def _ended(self, job: _Job) -> None:
        """The handler ended (finished, failed, stopped, or closed by Gradio)."""
        if not job.final_shown:
            job.stop()
        job.ended_at = time.monotonic()
        with self._lock:
            self._live.discard(job)
        job.ended.set()

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

    def stop(self, session: str | None) -> tuple:
        """The Stop button of a session: cancel its running job's rows and show what each panel had decoded,
        marked stopped (the same outputs the job's own handler ends with). All :data:`RUN_OUTPUTS` as they
        were when the session has no unfinished job (a Stop after a finished run keeps its answer)."""
        import gradio as gr

        if not session:
            return (gr.skip(),) * len(RUN_OUTPUTS)
        with self._lock:
            starting = self._starting.get(session)
        if starting is not None:  # a run of this session is submitting its rows
            starting.wait(self.stop_wait_s)
        with self._lock:
            jobs = [j for j in self._sessions.get(session, []) if not j.final_shown]
        if not jobs:
            return (gr.skip(),) * len(RUN_OUTPUTS)
        for job in jobs:  # Gradio cancels every /run of the session, too
            job.stop()
        deadline = time.monotonic() + self.stop_wait_s
        for job in jobs:
            # Gradio closes the handler (or it sees the stop): its last outputs are then sent before these.
            job.ended.wait(max(0.0, deadline - time.monotonic()))
            self._unregister(job)
        return self._final_outputs(jobs[-1])

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
        *,
        session: str | None = None,
    ) -> Iterator[tuple]:
        """The ``/run`` endpoint: a generator of :data:`RUN_OUTPUTS` tuples (streams as tokens commit).

        The main method and the comparisons are rows of the app's scheduler, decoded at once (and with other
        sessions' rows). ``session`` (Gradio's session hash) lets :meth:`stop` find this run.
        """
        import gradio as gr

        skip = gr.skip()

        def error_update(text: str) -> tuple:
            # gr.skip() keeps the other outputs as they were: a failed request does not blank the last answer.
            return (status_html("error", text),) + (skip,) * (len(RUN_OUTPUTS) - 1)

        starting = self._starting_run(session)
        try:
            req = self.prepare(
                image, question, caption, ocr, autofill, method, k, beta, gamma, gate, delta, bonus, max_new_tokens, drafter_view, compare
            )
            job = _Job(self.scheduler, req, session)
            job.start()
        except Exception as exc:
            self._started(session, starting)
            yield error_update(f"Error: {_error_text(exc)}")
            raise _gr_error(exc, "Cannot run this request") from None

        self._register(job)
        self._started(session, starting)
        try:
            if not job.cancel.is_set():
                yield self._progress_outputs(job, first=True)
            last_yield, shown = time.perf_counter(), None
            while not job.cancel.is_set():
                item = job.get(timeout=HEARTBEAT_S)
                if job.cancel.is_set():
                    break
                if "main" in job.errors:
                    job.stop()  # the comparisons go too
                    exc = job.errors["main"]
                    if not _is_user_error(exc):
                        log.error("request failed", exc_info=exc)
                    self._finished(job)
                    yield self._error_outputs(job, f"Error: {_error_text(exc)}")
                    raise _gr_error(exc, "The request failed")
                if job.settled():
                    break
                now = time.perf_counter()
                n = sum(len(t) for t in job.traces.values())
                if item is None:
                    # A heartbeat (Gradio closes a stopped handler only between two yields): the status may
                    # show the scheduler's queue; nothing is sent when nothing changed.
                    progress = self._progress_outputs(job)
                    yield progress if progress[:5] != shown else (skip,) * len(RUN_OUTPUTS)
                    shown = progress[:5]
                elif item[1] != "events" or now - last_yield >= self.stream_interval + n / 2000.0:
                    last_yield = now
                    progress = self._progress_outputs(job)
                    shown = progress[:5]
                    yield progress
            if job.settled():
                with job.lock:
                    job.t_end = job.t_end or time.perf_counter()
            out = self._final_outputs(job)
            if not job.cancel.is_set():
                self._finished(job)
            yield out
        finally:
            self._ended(job)

    # ---------------------------------------------------------------- outputs
    def _panel(self, job: _Job, snap: _Snapshot, key: str) -> str:
        """One panel: its tokens and state (running, done, stopped, failed, or comparison off)."""
        req, tok = job.req, self.pipe.tokenizer
        method = req.method if key == "main" else key
        title, subtitle = method_title(method), method_subtitle(method)
        row = key if key in job.keys else "main" if key == req.method else None  # the main panel runs this method
        if row is None:
            return render_panel(title, [], tok, subtitle=subtitle, empty="(comparison off)", state="off")
        state = snap.state(row, job.cancel.is_set())
        legend = key == "main"
        if state == "done":
            res = snap.results[row]
            return render_panel(title, res.trace, tok, subtitle=subtitle, stats=res.stats, legend=legend, empty="(no tokens)")
        if state == "error":
            text = f"failed: {_error_text(snap.errors[row])}"
            return render_panel(title, snap.traces[row], tok, subtitle=subtitle, legend=legend, state="error", empty=text)
        if state == "stopped":
            return render_panel(
                title, snap.traces[row], tok, subtitle=subtitle, legend=legend, state="stopped", empty="stopped before its first token"
            )
        return render_panel(title, snap.traces[row], tok, subtitle=subtitle, done=False, legend=legend, empty="waiting for the models...")

    def _panels(self, job: _Job, snap: _Snapshot) -> tuple[str, str, str]:
        return self._panel(job, snap, "main"), self._panel(job, snap, "floor"), self._panel(job, snap, "drafter")

    def _progress_text(self, job: _Job, snap: _Snapshot) -> str:
        names = {"main": method_title(job.req.method), "floor": "Floor", "drafter": "the drafter alone"}
        if not any(snap.traces[k] for k in job.keys):
            waiting = getattr(job.scheduler, "waiting", 0)
            queued = f" ({waiting} decode{'s' if waiting != 1 else ''} queued for a place in the batch)" if waiting else ""
            return f"Running {_join(names[k] for k in job.keys)}: waiting for the models{queued}..."
        parts = []
        for k in job.keys:
            n, state = len(snap.traces[k]), snap.state(k, False)
            parts.append(f"{names[k]} {n} token{'s' if n != 1 else ''}" + ("" if state == "running" else f" ({state})"))
        return "Running " + ", ".join(parts) + "..."

    def _progress_outputs(self, job: _Job, first: bool = False) -> tuple:
        """A streamed update: the status and the three panels (the first one also clears the last run's results)."""
        import gradio as gr

        skip = gr.skip()
        snap = job.snapshot()
        main, floor, drafter = self._panels(job, snap)
        text = "".join(ev.text for ev in snap.traces["main"])
        head = (status_html("run", self._progress_text(job, snap)), main, text, floor, drafter)
        if first:
            return head + (render_stats_html(None), None, skip, skip, None)
        return head + (skip,) * 5

    def _error_outputs(self, job: _Job, text: str) -> tuple:
        """The main row failed: the error in the status and the main panel, the comparisons stopped."""
        import gradio as gr

        skip = gr.skip()
        main, floor, drafter = self._panels(job, job.snapshot())
        return (status_html("error", text), main, skip, floor, drafter) + (skip,) * 5

    def _final_outputs(self, job: _Job) -> tuple:
        """The job's last outputs: the answer ("Done") when every row finished, else what each panel had
        decoded with the unfinished ones marked stopped ("Stopped.")."""
        import gradio as gr

        skip = gr.skip()
        snap = job.snapshot()
        req = job.req
        main = snap.results.get("main")
        panels = self._panels(job, snap)
        unfinished = [k for k in job.keys if k not in snap.results and k not in snap.errors]
        notes = list(req.notes)
        for k in job.keys:
            if k != "main" and k in snap.errors:
                notes.append(f"{method_title(k)} failed: {_error_text(snap.errors[k])}")
            elif main is not None and k in snap.results and snap.results[k].view.render() != main.view.render():
                notes.append(f"{method_title(k)} read a different compressed view")
        if "main" in snap.errors:
            status = status_html("error", f"Error: {_error_text(snap.errors['main'])}")
        elif unfinished or main is None:
            status = "Stopped." + (f" {method_title(req.method)} had finished: {len(main.trace)} tokens." if main is not None else "")
            status = status_html("idle", status)
        else:
            counts = source_counts(main.trace)
            summary = (
                f"Done in {job.elapsed():.1f} s: {len(main.trace)} tokens"
                + ("".join(f", {counts[s]} {s}" for s in SPECULATIVE_SOURCES if counts.get(s)))
                + (f"; {counts['steered']} differ from the verifier alone" if req.method == "asymspec" else "")
            )
            if notes:
                summary += " (" + "; ".join(notes) + ")"
            status = status_html("ok", summary)
        if main is None:
            text = "".join(ev.text for ev in snap.traces["main"])
            return (status, panels[0], text, panels[1], panels[2], render_stats_html(None), None, skip, skip, None)
        payload = {"main": main.as_dict()}
        for m in ("floor", "drafter"):
            if m in snap.results:
                payload[m] = snap.results[m].as_dict()
        return (
            status,
            panels[0],
            main.text,
            panels[1],
            panels[2],
            render_stats_html(main.stats, req.method),
            jsd_gamma_chart(main.trace),
            main.view.caption,
            main.view.ocr_text,
            payload,
        )


def _join(items: Iterable[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(items)
    return items[0] if len(items) < 2 else ", ".join(items[:-1]) + " and " + items[-1]
