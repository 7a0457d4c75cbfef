"""What the page shows for one run: the ``/run`` endpoint's outputs (:data:`RUN_OUTPUTS`) while the job's rows
wait, stream, fail, stop or finish (:class:`RunOutputs`). Gradio is imported only to build updates."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .align import render_alignment_html
from .errors import _error_text
from .render import (
    SPECULATIVE_SOURCES,
    jsd_gamma_chart,
    method_subtitle,
    method_title,
    plain_text,
    render_panel,
    render_stats_html,
    source_counts,
    status_html,
)
from .runs import _Job, _Snapshot
from .trace_files import write_trace_files

__all__ = ["RUN_OUTPUTS", "STREAMED", "RunOutputs", "outputs_as_dict", "queue_text"]

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
)
#: How many leading outputs a streamed update sets (the rest are kept as they are).
STREAMED = 6
#: Panel names in the status line.
ROW_NAMES = {"floor": "Floor", "drafter": "the drafter alone"}


def outputs_as_dict(outputs: Sequence[Any]) -> dict[str, Any]:
    """Name the ``/run`` endpoint's outputs (e.g. a gradio_client result tuple)."""
    return dict(zip(RUN_OUTPUTS, outputs))


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _join(items: Iterable[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(items)
    return items[0] if len(items) < 2 else ", ".join(items[:-1]) + " and " + items[-1]


def queue_text(names: dict[str, str], handles: dict[str, Any], waiting_total: int) -> str | None:
    """The status while rows wait for a place in the batch, e.g. ``Queued for a place in the batch: AsymSpec
    3rd in line, Floor 4th (2 requests ahead, 5 waiting); waiting 2.1 s.`` None when no row waits (or the
    scheduler does not say where its requests stand)."""
    places = {k: getattr(h, "position", None) for k, h in handles.items()}
    places = {k: p for k, p in places.items() if isinstance(p, int)}
    if not places:
        return None
    first = min(places.values())
    waited = max((h.waited() for k, h in handles.items() if k in places and callable(getattr(h, "waited", None))), default=None)
    parts = [f"{names[k]} {_ordinal(p + 1)} in line" for k, p in places.items()]
    ahead = f"{first} request{'s' if first != 1 else ''} ahead" if first else "next in line"
    text = f"Queued for a place in the batch: {', '.join(parts)} ({ahead}, {waiting_total} waiting)"
    if waited is not None:
        text += f"; waiting {waited:.1f} s"
    return text + "."


def warned(text: str, req) -> str:
    """The status text followed by the request's warning (e.g. a question the tiny pair never learned)."""
    return f"{text} Warning: {req.warning}" if getattr(req, "warning", None) else text


class RunOutputs:
    """The outputs of a job, rendered with the pipeline's tokenizer (see :data:`RUN_OUTPUTS`)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.special_ids = frozenset(getattr(tokenizer, "all_special_ids", None) or ())

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
        position = getattr(job.handles.get(key), "position", None)
        empty = (
            f"queued: {_ordinal(position + 1)} in line for a place in the batch"
            if isinstance(position, int)
            else "waiting for the models..."
        )
        return render_panel(title, snap.traces[key], tok, subtitle=subtitle, done=False, legend=legend, empty=empty)

    def panels(self, job: _Job, snap: _Snapshot) -> tuple[str, str, str]:
        return self.panel(job, snap, "main"), self.panel(job, snap, "floor"), self.panel(job, snap, "drafter")

    def alignment(self, job: _Job, snap: _Snapshot) -> str:
        """The run's outputs aligned token by token (the main method first)."""
        rows = []
        for key in job.keys:
            res = snap.results.get(key)
            rows.append((method_title(job.methods[key]), res.trace if res is not None else snap.traces[key]))
        return render_alignment_html(rows)

    # ---------------------------------------------------------------- status
    def progress_text(self, job: _Job, snap: _Snapshot) -> str:
        names = {"main": method_title(job.req.method), **ROW_NAMES}
        waiting = [k for k in job.keys if not snap.traces[k] and snap.state(k, False) == "running"]
        total = getattr(job.scheduler, "waiting", 0)
        queued = queue_text(names, {k: job.handles[k] for k in waiting if k in job.handles}, total)
        if not any(snap.traces[k] for k in job.keys):
            if queued:
                return queued
            more = f" ({total} decode{'s' if total != 1 else ''} queued for a place in the batch)" if total else ""
            return f"Running {_join(names[k] for k in job.keys)}: waiting for the models{more}..."
        parts = []
        for k in job.keys:
            n, state = len(snap.traces[k]), snap.state(k, False)
            parts.append(f"{names[k]} {n} token{'s' if n != 1 else ''}" + ("" if state == "running" else f" ({state})"))
        return "Running " + ", ".join(parts) + "..." + (f" {queued}" if queued else "")

    # ---------------------------------------------------------------- updates
    def progress(self, job: _Job, first: bool = False) -> tuple:
        """A streamed update: the status, the three panels, the plain answer so far (no special tokens) and the
        alignment; the first one also clears the last run's results."""
        import gradio as gr

        skip = gr.skip()
        snap = job.snapshot()
        main, floor, drafter = self.panels(job, snap)
        text = plain_text(snap.traces["main"], self.special_ids)
        status = status_html("run", warned(self.progress_text(job, snap), job.req))
        head = (status, main, text, floor, drafter, self.alignment(job, snap))
        if first:
            return head + (render_stats_html(None), None, skip, skip, None, None, None)
        return head + (skip,) * (len(RUN_OUTPUTS) - STREAMED)

    def error(self, job: _Job, text: str) -> tuple:
        """The main row failed: the error in the status and the main panel, the comparisons stopped."""
        import gradio as gr

        skip = gr.skip()
        snap = job.snapshot()
        main, floor, drafter = self.panels(job, snap)
        return (status_html("error", text), main, skip, floor, drafter, self.alignment(job, snap)) + (skip,) * (len(RUN_OUTPUTS) - STREAMED)

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
            status = status_html("ok", warned(summary, req))
        if main is None:
            text = plain_text(snap.traces["main"], self.special_ids)
            return (status, panels[0], text, panels[1], panels[2], align, render_stats_html(None), None, skip, skip, None, None, None)
        results = {job.methods[k]: snap.results[k] for k in job.keys if k in snap.results}
        json_path, csv_path = write_trace_files(results, self.tok, question=req.question, settings=req.overrides)
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
        )
