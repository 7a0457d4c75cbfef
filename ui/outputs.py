"""What the page shows for one run: the ``/run`` endpoint's outputs (:data:`RUN_OUTPUTS`) while the job's rows
wait, stream, fail, stop or finish (:class:`RunOutputs`). Gradio is imported only to build updates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .align import render_alignment_html
from .conversation import Conversations, render_conversation_html
from .errors import _error_text
from .progress import Row, panel_wait_text, progress_text
from .render import (
    SPECULATIVE_SOURCES,
    jsd_gamma_chart,
    method_subtitle,
    method_title,
    plain_text,
    plural,
    render_panel,
    render_stats_html,
    source_counts,
    special_ids,
    status_html,
)
from .runs import _Job, _Snapshot
from .sampling_inputs import sampling_note
from .tool_calls import render_tool_calls_html
from .trace_files import TraceFolders

__all__ = ["IDLE_STATUS", "RUN_OUTPUTS", "STREAMED", "RunOutputs", "done_summary", "outputs_as_dict"]

#: Output order of the ``/run`` endpoint (also the keys of :func:`outputs_as_dict` and the API's output names).
RUN_OUTPUTS = (
    "status",
    "answer_html",
    "answer_text",
    "floor_html",
    "drafter_html",
    "alignment_html",
    "stats_html",
    "chart",
    "caption",
    "ocr",
    "trace_json",
    "trace_csv",
    "result_json",
    "conversation_html",
    "tool_calls_html",
)
#: How many leading outputs a streamed update sets (the rest are kept as they are).
STREAMED = 6
#: The tool-call panel's text before a run's answer is done, and for a run that offers no tools.
TOOLS_PENDING = "The answer's tool calls appear here when it is done."
NO_TOOLS = "No tools offered: add some under Agent tools to see a call's arguments with their provenance."
TOOLS_OFF = "Tool choice none: the answer is not read for tool calls."
#: The status of a page that has not run yet.
IDLE_STATUS = "Upload an image, ask a question, press Run."
#: What the status's count of steered tokens counts (the alignment counts differing positions, a wider thing).
STEERED_MEANING = "where the verifier alone would have picked another token after the same text"
#: Panel names in the status line.
ROW_NAMES = {"floor": "Floor", "drafter": "the drafter alone"}


def outputs_as_dict(outputs: Sequence[Any]) -> dict[str, Any]:
    """Name the ``/run`` endpoint's outputs (e.g. a gradio_client result tuple)."""
    return dict(zip(RUN_OUTPUTS, outputs))


def done_summary(seconds: float, trace: Sequence[Any], method: str, notes: Sequence[str] = ()) -> str:
    """The status of a finished run, e.g. ``Done in 1.2 s: 7 tokens, 4 accepted, 3 fused; 1 token steered (...)`` (the
    last part for AsymSpec only: the tokens the verifier alone would not have picked after the same text, which the
    alignment's count of differing positions exceeds once the outputs part), then the run's ``notes`` in
    parentheses."""
    counts = source_counts(trace)
    text = f"Done in {seconds:.1f} s: {plural(len(trace), 'token')}" + "".join(
        f", {counts[s]} {s}" for s in SPECULATIVE_SOURCES if counts.get(s)
    )
    if method == "asymspec":
        n = counts["steered"]
        text += f"; {plural(n, 'token')} steered ({STEERED_MEANING})"
    return text + (" (" + "; ".join(notes) + ")" if notes else "")


class RunOutputs:
    """The outputs of a job, rendered with the pipeline's tokenizer (see :data:`RUN_OUTPUTS`); the conversation
    shown is the job's session's in ``conversations``."""

    def __init__(self, tokenizer: Any, conversations: Conversations | None = None) -> None:
        self.tok = tokenizer
        self.special_ids = special_ids(tokenizer)
        self.conversations = conversations if conversations is not None else Conversations()
        self.trace_folders = TraceFolders()  # the download files' folder, removed by close()

    def close(self) -> None:
        """Remove the runs' trace files (a later run writes new ones)."""
        self.trace_folders.close()

    def conversation(self, job: _Job) -> str:
        """The job's session's conversation as it stands (the turns this run follows, or all of them once it recorded
        its own)."""
        return render_conversation_html(self.conversations.turns(job.session), self.tok)

    def blank(self, method: str = "asymspec", status: str = IDLE_STATUS) -> dict[str, Any]:
        """What the page shows before any run, by output name (:data:`RUN_OUTPUTS` but the caption and OCR fields,
        which are the user's): the page's first state, and after a new image (but its status), whose old answer no
        longer holds."""
        tok = self.tok

        def empty_panel(m: str, **kw: Any) -> str:
            return render_panel(method_title(m), [], tok, subtitle=method_subtitle(m), **kw)

        return {
            "status": status_html("idle", status),
            "answer_html": empty_panel(method, legend=True, empty="The answer appears here, token by token."),
            "answer_text": "",
            "floor_html": empty_panel("floor"),
            "drafter_html": empty_panel("drafter"),
            "alignment_html": render_alignment_html([("AsymSpec", []), ("Floor", [])]),
            "stats_html": render_stats_html(None),
            "chart": None,
            "trace_json": None,
            "trace_csv": None,
            "result_json": None,
            "conversation_html": render_conversation_html((), tok),
            "tool_calls_html": render_tool_calls_html([], tok, empty=NO_TOOLS),
        }

    # ---------------------------------------------------------------- panels
    def panel(self, job: _Job, snap: _Snapshot, key: str) -> str:
        """One panel: its tokens and state (running, done, stopped, failed, comparison off, or shown above)."""
        req, tok = job.req, self.tok
        method = req.method if key == "main" else key
        title, subtitle = method_title(method), method_subtitle(method)
        if key != "main" and key == req.method:  # this method runs in the main panel: not twice
            return render_panel(title, [], tok, subtitle=subtitle, empty="the main method: shown in the panel above", state="off")
        if key not in job.keys:
            return render_panel(title, [], tok, subtitle=subtitle, empty="(comparison off)", state="off")
        state = snap.state(key, job.cancel.is_set())
        legend = key == "main"
        if state == "done":
            res = snap.results[key]
            return render_panel(title, res.trace, tok, subtitle=subtitle, stats=res.stats, legend=legend, empty="(no tokens)")
        if state == "error":
            text = f"failed: {_error_text(snap.errors[key])}"
            return render_panel(title, snap.traces[key], tok, subtitle=subtitle, legend=legend, state="error", empty=text)
        if state == "stopped":
            return render_panel(
                title, snap.traces[key], tok, subtitle=subtitle, legend=legend, state="stopped", empty="stopped before its first token"
            )
        rows = self.rows(job, snap)
        empty = panel_wait_text(rows[job.keys.index(key)], rows)
        return render_panel(title, snap.traces[key], tok, subtitle=subtitle, done=False, legend=legend, empty=empty)

    def panels(self, job: _Job, snap: _Snapshot) -> tuple[str, str, str]:
        return self.panel(job, snap, "main"), self.panel(job, snap, "floor"), self.panel(job, snap, "drafter")

    def alignment(self, job: _Job, snap: _Snapshot) -> str:
        """The run's outputs aligned token by token (the main method first)."""
        rows = []
        for key in job.keys:
            res = snap.results.get(key)
            rows.append((method_title(job.methods[key]), res.trace if res is not None else snap.traces[key]))
        return render_alignment_html(rows, special_ids=self.special_ids)

    def tool_calls(self, job: _Job, snap: _Snapshot | None) -> str:
        """The main answer's tool calls with their provenance (``snap`` None: the answer is not done yet; a stopped
        or failed one shows what it had decoded)."""
        req = job.req
        if not req.tools or req.tool_choice == "none":  # the answer is not read for calls
            return render_tool_calls_html([], self.tok, empty=NO_TOOLS if not req.tools else TOOLS_OFF)
        if snap is None:
            return render_tool_calls_html([], self.tok, empty=TOOLS_PENDING)
        main = snap.results.get("main")
        if main is None:  # still decoding, stopped or failed: no end the model wrote
            return render_tool_calls_html(snap.traces["main"], self.tok)
        return render_tool_calls_html(main.trace, self.tok, finished=not main.cut_by_budget)

    # ---------------------------------------------------------------- status
    def rows(self, job: _Job, snap: _Snapshot) -> list[Row]:
        """The job's rows as the status reads them (:class:`~ui.progress.Row`), in :attr:`_Job.keys` order."""
        names = {"main": method_title(job.req.method), **ROW_NAMES}
        out = []
        for k in job.keys:
            handle = job.handles.get(k)
            waited = getattr(handle, "waited", None)
            out.append(
                Row(
                    name=names[k],
                    tokens=len(snap.traces[k]),
                    state=snap.state(k, False),
                    position=getattr(handle, "position", None),
                    known=hasattr(handle, "position"),
                    waited=waited() if callable(waited) else None,
                    stage=getattr(handle, "stage", None),
                    # the view is made once per image (then cached): only the first row writes the caption
                    setup=job.req.setup if k == "main" else "prefill",
                )
            )
        return out

    def progress_text(self, job: _Job, snap: _Snapshot) -> str:
        sched = job.scheduler
        return progress_text(
            self.rows(job, snap),
            waiting_total=getattr(sched, "waiting", 0),
            live_rows=getattr(sched, "live_rows", 0),
            max_batch_size=getattr(sched, "max_batch_size", None),
        )

    # ---------------------------------------------------------------- updates
    def progress(self, job: _Job, first: bool = False) -> tuple:
        """A streamed update: the status, the three panels, the plain answer so far (no special tokens) and the
        alignment; the first one also clears the last run's results and shows the conversation this run follows."""
        import gradio as gr

        skip = gr.skip()
        snap = job.snapshot()
        main, floor, drafter = self.panels(job, snap)
        text = plain_text(snap.traces["main"], self.special_ids)
        status = status_html("run", self.progress_text(job, snap), warning=job.req.warning)
        head = (status, main, text, floor, drafter, self.alignment(job, snap))
        if first:
            tools = self.tool_calls(job, None)
            return head + (render_stats_html(None), None, skip, skip, None, None, None, self.conversation(job), tools)
        return head + (skip,) * (len(RUN_OUTPUTS) - STREAMED)

    def error(self, job: _Job, text: str) -> tuple:
        """The main row failed: the error in the status and the main panel, the comparisons stopped."""
        import gradio as gr

        skip = gr.skip()
        snap = job.snapshot()
        main, floor, drafter = self.panels(job, snap)
        head = (status_html("error", text, warning=job.req.warning), main, skip, floor, drafter, self.alignment(job, snap))
        return head + (skip,) * (len(RUN_OUTPUTS) - STREAMED - 1) + (self.tool_calls(job, snap),)

    def final(self, job: _Job) -> tuple:
        """The job's last outputs: the answer ("Done") when every row finished, else what each panel had
        decoded with the unfinished ones marked stopped ("Stopped.")."""
        import gradio as gr

        skip = gr.skip()
        snap = job.snapshot()
        req = job.req
        main = snap.results.get("main")
        panels = self.panels(job, snap)
        align = self.alignment(job, snap)
        unfinished = [k for k in job.keys if k not in snap.results and k not in snap.errors]
        notes = list(req.notes)
        if main is not None and (note := sampling_note(main)) is not None:
            notes.append(note)
        for k in job.keys:
            if k != "main" and k in snap.errors:
                notes.append(f"{method_title(k)} failed: {_error_text(snap.errors[k])}")
            elif main is not None and k in snap.results and snap.results[k].view.render() != main.view.render():
                notes.append(f"{method_title(k)} read a different compressed view")
        if "main" in snap.errors:
            status = status_html("error", f"Error: {_error_text(snap.errors['main'])}", warning=req.warning)
        elif unfinished or main is None:
            status = "Stopped." + (
                f" {method_title(req.method)} had finished: {plural(len(main.trace), 'token')}." if main is not None else ""
            )
            status = status_html("idle", status, warning=req.warning)
        else:
            status = status_html("ok", done_summary(job.elapsed(), main.trace, req.method, notes), warning=req.warning)
        if main is None:
            text = plain_text(snap.traces["main"], self.special_ids)
            stats = render_stats_html(None)
            return (
                *(status, panels[0], text, panels[1], panels[2], align, stats, None, skip, skip, None, None, None),
                *(self.conversation(job), self.tool_calls(job, snap)),
            )
        results = {job.methods[k]: snap.results[k] for k in job.keys if k in snap.results}
        json_path, csv_path = self.trace_folders.write(results, self.tok, question=req.question, settings=req.overrides)
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
            align,
            render_stats_html(main.stats, req.method),
            jsd_gamma_chart(main.trace),  # None (and hidden by the page's CSS) for Floor and the drafter
            main.view.caption,
            main.view.ocr_text,
            json_path,
            csv_path,
            payload,
            self.conversation(job),
            self.tool_calls(job, snap),
        )
