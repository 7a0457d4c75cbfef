"""Request handling of the steering inspector: the rows of a run in the app's batching scheduler (:class:`_Job`), the
bookkeeping of each session's runs, and the ``/run``, ``/describe`` and Stop handlers (:class:`DemoApp`; its input
checks: :mod:`ui.input_checks`). Gradio is imported only inside the handlers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from vision_cache.checks import is_int, is_number

from .attributions import TokenAttributions
from .conversation import Conversations, Turn
from .errors import DemoInputError, _error_text, _gr_error, _is_user_error
from .input_checks import InputChecks, pair_reads_images  # noqa: F401 - pair_reads_images: ui.app re-exports it
from .outputs import RUN_OUTPUTS, STREAMED, RunOutputs, outputs_as_dict  # noqa: F401 - RUN_OUTPUTS, outputs_as_dict re-exported
from .progress import ordinal
from .render import plural, status_html
from .runs import _Job, _RunInputs, _Snapshot  # noqa: F401 - _Job, _RunInputs: ui.app re-exports them
from .sampling_inputs import check_sampling_inputs
from .settings_check import MAX_K, MAX_QUESTION_CHARS, MAX_VIEW_CHARS
from .tool_inputs import check_tool_inputs
from .view_fields import ViewFields
from .view_marks import ExampleTexts, GeneratedViews, ocr_outcome
from .views_side import SideViews, check_compression_input

if TYPE_CHECKING:  # pragma: no cover
    from asymspec_mm.pipeline.facade import AsymSpecPipeline

log = logging.getLogger("asymspec_mm.ui")

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "DEFAULT_MAX_NEW_TOKENS", "MAX_K", "MAX_NEW_TOKENS_LIMIT", "MAX_QUESTION_CHARS", "MAX_VIEW_CHARS"]
__all__ += ["RUN_OUTPUTS", "DemoApp", "DemoInputError", "outputs_as_dict"]

DEFAULT_MAX_NEW_TOKENS = 64
MAX_NEW_TOKENS_LIMIT = 1024
#: Rows the app's scheduler decodes in shared steps (``asymspec-mm demo --max-batch-size``).
DEFAULT_MAX_BATCH_SIZE = 8
#: A running handler yields at least this often (Gradio can close a stopped handler only between two yields).
HEARTBEAT_S = 0.5


class DemoApp(InputChecks, ViewFields):
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
        max_stall: float | None = None,
        scheduler: Any = None,
        concurrency_limit: int | None = None,
    ) -> None:
        if not is_int(max_batch_size, minimum=1):
            raise ValueError(f"max_batch_size={max_batch_size!r} must be an integer >= 1")
        # checked here, not when the scheduler is made at the first run: a bad bound stops the demo from starting
        if max_stall is not None and not (is_number(max_stall) and max_stall >= 1):
            raise ValueError(f"max_stall={max_stall!r} must be a number >= 1 (a turn's cost over its decode step's) or None (no bound)")
        if max_stall is not None and scheduler is not None:
            raise ValueError("max_stall sets the scheduler the app makes: give it to pipe.scheduler(max_stall=...) instead")
        self.pipe = pipe
        #: Each session's conversation about its current image (follow-up questions continue it).
        self.conversations = Conversations()
        self.outputs = RunOutputs(getattr(pipe, "tokenizer", None), self.conversations)
        self.max_upload_bytes = int(max_upload_mb * 2**20)
        self.max_upload_mb = max_upload_mb
        self.max_new_tokens_limit = max_new_tokens_limit
        self.stream_interval = stream_interval
        self.max_batch_size = max_batch_size
        self.max_stall = max_stall  # the stall bound of the scheduler the app makes (None: off)
        self._scheduler = scheduler
        self._own_scheduler = scheduler is None
        self._lock = threading.Lock()
        self._live: set[_Job] = set()  # jobs whose handler is running
        self._sessions: dict[str, list[_Job]] = {}  # each session's unfinished jobs, oldest first (for Stop)
        self._starting: dict[str, threading.Event] = {}  # sessions whose run is submitting its rows
        self._stopped: dict[str, _Job] = {}  # the job each session's last Stop stopped (shown again after it)
        #: Runs the page has handed to Gradio's queue whose handler has not started, in queue order (by session).
        self._queued: list[str] = []
        self.views = GeneratedViews()
        self.side_views = SideViews()  # each session's last conversation, as the drafter and the verifier read it
        self.examples = ExampleTexts()  # the page's examples (build_app adds them)
        self.concurrency_limit = concurrency_limit  # runs Gradio handles at once (for the queued status); None: unknown
        self.attributions = TokenAttributions(pipe)  # the heat maps of each session's last answer, on demand

    @property
    def scheduler(self) -> Any:
        """The app's scheduler (``pipe.scheduler(max_batch_size=..., max_stall=...)``, created on first use)."""
        with self._lock:
            if self._scheduler is None:
                bound = {} if self.max_stall is None else {"max_stall": self.max_stall}
                self._scheduler = self.pipe.scheduler(max_batch_size=self.max_batch_size, **bound)
                self._own_scheduler = True
            return self._scheduler

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop every job and close the scheduler this app created (a later run creates a new one)."""
        with self._lock:
            jobs = self._live.union(*self._sessions.values())
            self._live.clear()
            self._sessions.clear()
            self._stopped.clear()
            sched, own = self._scheduler, self._own_scheduler
            if own:
                self._scheduler = None
        for job in jobs:
            job.stop()
        if sched is not None and own:
            sched.close(timeout)
        self.outputs.close()  # the runs' trace files

    def forget(self, session: str | None) -> None:
        """The session's page went away: stop its job, drop its conversation."""
        with self._lock:
            jobs = self._sessions.pop(session, []) if session else []
            self._stopped.pop(session or "", None)
            self._queued = [q for q in self._queued if q != session]
        self.views.forget(session)
        self.side_views.forget(session)
        self.conversations.clear(session)
        self.attributions.forget(session)
        for job in jobs:
            job.stop()

    def busy(self, session: str | None) -> bool:
        """Whether the session has a run in Gradio's queue, starting, or not finished (Stop has something to stop)."""
        if not session:
            return False
        with self._lock:
            return (
                session in self._queued
                or session in self._starting
                or any(not j.final_shown and j.ended_at is None for j in self._sessions.get(session, []))
            )

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

    def _record_turn(self, job: _Job) -> None:
        """A finished run is its session's next turn (the main panel's answer)."""
        main = job.snapshot().results.get("main")
        if main is not None and job.req.conversation is not None:
            self.conversations.record(job.req.conversation, Turn.of(job.req.question, main))

    # ---------------------------------------------------------------- handlers
    def enqueue(self, session: str | None, image: Any = None, question: Any = None) -> str:
        """The status as the page hands a run to Gradio's queue: its place in line when the server already
        handles :attr:`concurrency_limit` runs (the run's own handler then replaces it as it starts), under the
        request's warning when the loaded pair cannot answer it (shown before the run, as the CLI does)."""
        warning = self.early_warning(image, question)
        with self._lock:
            ahead = len(self._queued)
            if session:
                self._queued.append(session)
            running = len(self._live)
        limit = self.concurrency_limit
        if limit is None or running + ahead < limit:
            return status_html("run", "Starting the run...", warning=warning)
        since = time.strftime("%H:%M:%S UTC", time.gmtime())
        return status_html(
            "run",
            f"Queued: {ordinal(ahead + 1)} in line for the server, which handles {plural(limit, 'run')} at once "
            f"({ahead} queued ahead of this one); waiting since {since}.",
            warning=warning,
        )

    def describe(self, image: Any, caption: str, ocr: str, session: str | None = None) -> tuple[str, str]:
        """Fill the compressed view from the image (drafter caption, written as a row of the app's scheduler beside the
        runs' rows; OCR when an engine is available); both are then the app's text (:attr:`views`), which a new image
        replaces."""
        try:
            img = self._load_image(image)
            notes: list[str] = []
            ocr_arg = self._ocr_arg("", True, notes)
            from asymspec_mm.engines.model_calls import using_loop  # here: the page's parser imports no torch

            with using_loop(self.scheduler):  # the caption is a row of the app's batch: no forward on Gradio's thread
                view = self.pipe.compressed_view(img, caption=None, ocr=ocr_arg)
        except Exception as exc:
            raise _gr_error(exc, "Cannot describe this image") from None
        self.views.wrote(session, caption=view.caption, ocr=view.ocr_text if ocr_arg is None else None)
        self.views.set_ocr_placeholder(
            session, ocr_outcome(getattr(self.pipe.ocr_engine, "name", None) if ocr_arg is None else "off", notes)
        )
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
            was_queued = session in self._queued
            self._queued = [q for q in self._queued if q != session]  # Gradio drops its queued runs
        if starting is not None:  # a run of this session is submitting its rows
            starting.wait(self.stop_wait_s)
        with self._lock:
            jobs = [j for j in self._sessions.get(session, []) if not j.final_shown]
        if not jobs:
            if was_queued:  # the run had not started: the status said queued
                return (status_html("idle", "Stopped before the run started."),) + (gr.skip(),) * (len(RUN_OUTPUTS) - 1)
            return (gr.skip(),) * len(RUN_OUTPUTS)
        for job in jobs:  # Gradio cancels every /run of the session, too
            job.stop()
        deadline = time.monotonic() + self.stop_wait_s
        for job in jobs:
            # Gradio closes the handler (or it sees the stop): its last outputs are then sent before these.
            job.ended.wait(max(0.0, deadline - time.monotonic()))
            self._unregister(job)
        with self._lock:
            self._stopped[session] = jobs[-1]
        self._remember_view(jobs[-1])
        return self.outputs.final(jobs[-1])

    def stopped(self, session: str | None) -> tuple:
        """The outputs of the job that the session's last Stop stopped, once more (all skipped when there is
        none). The page asks for them through the queue after Stop, so that they come after any update the
        cancelled handler had sent: every panel then says stopped."""
        import gradio as gr

        with self._lock:
            job = self._stopped.pop(session, None) if session else None
        return self.outputs.final(job) if job is not None else (gr.skip(),) * len(RUN_OUTPUTS)

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
        followup=False,
        tools="",
        tool_choice="auto",
        temperature=0.0,
        top_p=1.0,
        seed=None,
        compression="",
        *,
        session: str | None = None,
    ) -> Iterator[tuple]:
        """The ``/run`` endpoint: a generator of :data:`RUN_OUTPUTS` tuples (streams as tokens commit).

        The main method and the comparisons are rows of the app's scheduler, decoded at once (and with other
        sessions' rows). ``session`` (Gradio's session hash) lets :meth:`stop` find this run. ``followup``: the question
        is the next turn of the session's conversation about this image, if it has one (a finished run records its turn).
        ``tools`` (a JSON list of OpenAI function tools; empty: none) and ``tool_choice`` (auto, required, none or a
        tool's name) are offered to every row; the last output shows the main answer's calls with their provenance.
        ``temperature`` (0: greedy), ``top_p`` and ``seed`` (None: a fresh one per row, named in the status) make every
        row sample (:mod:`ui.sampling_inputs`). ``compression`` (a spec; empty: off) compresses the conversation's
        older messages for the verifier (:mod:`ui.views_side` shows both views after the run).
        """
        import gradio as gr

        skip = gr.skip()

        def error_update(text: str) -> tuple:
            # gr.skip() keeps the other outputs as they were: a failed request does not blank the last answer.
            return (status_html("error", text),) + (skip,) * (len(RUN_OUTPUTS) - 1)

        with self._lock:
            if session in self._queued:  # out of Gradio's queue
                self._queued.remove(session)
        starting = self._starting_run(session)
        try:
            req = self.prepare(
                image, question, caption, ocr, autofill, method, k, beta, gamma, gate, delta, bonus, max_new_tokens, drafter_view, compare
            )
            req.tools, req.tool_choice = check_tool_inputs(tools, tool_choice)
            req.overrides.update(check_sampling_inputs(temperature, top_p, seed))
            req.overrides.update(check_compression_input(compression))
            req.conversation = self.conversations.begin(session, req.image, bool(followup))
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
                yield self.outputs.progress(job, first=True)
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
                    yield self.outputs.error(job, f"Error: {_error_text(exc)}")
                    raise _gr_error(exc, "The request failed")
                if job.settled():
                    break
                now = time.perf_counter()
                n = sum(len(t) for t in job.traces.values())
                if item is None:
                    # A heartbeat (Gradio closes a stopped handler only between two yields): the status may
                    # show the scheduler's queue; nothing is sent when nothing changed.
                    progress = self.outputs.progress(job)
                    yield progress if progress[:STREAMED] != shown else (skip,) * len(RUN_OUTPUTS)
                    shown = progress[:STREAMED]
                elif item[1] != "events" or now - last_yield >= self.stream_interval + n / 2000.0:
                    last_yield = now
                    progress = self.outputs.progress(job)
                    shown = progress[:STREAMED]
                    yield progress
            if job.settled():
                with job.lock:
                    job.t_end = job.t_end or time.perf_counter()
            if not job.cancel.is_set():
                self._record_turn(job)
                self.side_views.record(job)
                self.attributions.finished(session, job.snapshot().results.get("main"))
            out = self.outputs.final(job)
            if not job.cancel.is_set():
                self._finished(job)
            self._remember_view(job)
            yield out
        finally:
            self._ended(job)
