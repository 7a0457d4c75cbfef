"""The AsymSpec steering inspector: a Gradio demo that shows, token by token, how the image steers the verifier.

A small Qwen3-VL drafter reads the image; a text-only verifier reads only the compressed view
(caption + OCR). This page shows the compressed view (editable, so you can degrade or fix what the
verifier sees), streams the AsymSpec answer with every token coloured by its source, and puts the
verifier alone (Floor) and the drafter alone beside it.

This module lays the page out and wires it (:func:`build_app`); the rest of the package:

- :mod:`ui.render` - pure HTML and chart rendering (:func:`render_trace_html`, :func:`render_panel`, ...), with
  :mod:`ui.provenance` (the hover box's gate and fusion lines) and :mod:`ui.align` (the token alignment).
- :mod:`ui.examples` - the bundled examples (:func:`load_examples`) and what the tiny pair answers on them.
- :mod:`ui.jobs` - the handlers behind the page (:class:`DemoApp`), with :mod:`ui.input_checks` (the checks of a
  run's inputs); :mod:`ui.outputs` - what the page shows for a run (:data:`RUN_OUTPUTS`), with :mod:`ui.progress`
  (the status while rows are set up, wait or decode); :mod:`ui.trace_files` - the JSON/CSV downloads (one
  temporary folder of the app, removed when it closes).
- :mod:`ui.view_marks` - whose text the caption and OCR fields hold (generated and example text go with their
  image); :mod:`ui.view_fields` - the fields' handlers.
- :mod:`ui.tool_inputs` - the Agent tools inputs and their checks; :mod:`ui.tool_calls` - the answer's tool calls,
  each argument's value as the tokens that produced it (:func:`render_tool_calls_html`).
- :mod:`ui.conversation` - a session's conversation about its image (follow-up questions, their turns' HTML).
- :mod:`ui.views_side` - the per-turn compression field and the conversation's full and compressed views side by side.
- :mod:`ui.page_js` - the scripts that open one hover box at a time, inside the viewport, draw the chart at once and
  show the jump to the answer where it stands below Run.
- :mod:`ui.attributions` - the heat maps of a clicked token and the answer's footprint, on demand (drawn by
  :mod:`ui.heatmap`).
- :mod:`ui.handlers` - the handlers as Gradio calls them (the session put in), the Stop button's looks.
- :mod:`ui.serve` - :func:`launch`, :func:`serve` and the ``asymspec-mm demo`` sub-command (:func:`add_demo_parser`).
- ``ui/style.css`` - the page's stylesheet, read when an app is built.

Their public names are importable from here as well. Neither Gradio nor torch is imported at import
time, so ``asymspec-mm --help`` stays fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asymspec_mm.base.config import BONUS_RULES, DELTAS, DRAFTER_VIEWS, GATES, METHODS, RANGES, AsymSpecConfig
from asymspec_mm.frontend.options import load_pipeline  # noqa: F401 - re-exported
from vision_cache.checks import is_int

from .align import render_alignment_html  # noqa: F401 - re-exported
from .attributions import wire_heatmap_panel
from .examples import EXAMPLE_FIELDS, EXAMPLES_DIR, example_label, example_row, load_agent_examples, load_examples, render_examples_table  # noqa: F401 - re-exported
from .handlers import STOP_IDLE, _session_handlers
from .jobs import (  # noqa: F401 - re-exported
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_NEW_TOKENS,
    MAX_K,
    MAX_NEW_TOKENS_LIMIT,
    MAX_QUESTION_CHARS,
    MAX_VIEW_CHARS,
    RUN_OUTPUTS,
    DemoApp,
    DemoInputError,
    _Job,
    _RunInputs,
    outputs_as_dict,
    pair_reads_images,
)
from .page_js import LAYOUT_JS, TOOLTIP_JS
from .render import (  # noqa: F401 - re-exported
    PANEL_STATES,
    SOURCES,
    STEERED_HELP,
    esc,
    jsd_gamma_chart,
    method_subtitle,
    method_title,
    render_legend,
    render_panel,
    render_stats_html,
    render_token,
    render_trace_html,
    source_counts,
    status_html,
    visible_text,
)
from .sampling_inputs import build_sampling_inputs
from .serve import add_demo_parser, is_loopback, launch, main, serve  # noqa: F401 - re-exported
from .tool_calls import render_tool_calls_html  # noqa: F401 - re-exported
from .tool_inputs import build_tool_inputs
from .views_side import build_compression_input, build_views_panel, views_handler

if TYPE_CHECKING:  # pragma: no cover
    import gradio as gr

    from asymspec_mm.pipeline.facade import AsymSpecPipeline

__all__ = [
    "SOURCES",
    "add_demo_parser",
    "build_app",
    "jsd_gamma_chart",
    "launch",
    "load_examples",
    "render_panel",
    "render_stats_html",
    "render_trace_html",
    "serve",
]

STYLESHEET = Path(__file__).with_name("style.css")
#: Runs handled at once by default, per row of the batch (beyond the batch, rows wait in the scheduler and
#: the page shows their place in line), and at most.
CONCURRENCY_PER_ROW, MAX_DEFAULT_CONCURRENCY = 4, 32


def stylesheet() -> str:
    """The page's CSS (``ui/style.css``)."""
    return STYLESHEET.read_text(encoding="utf-8")


def __getattr__(name: str) -> Any:
    # ``CSS``, the stylesheet's text, read from the file only by code that asks for it.
    if name == "CSS":
        return stylesheet()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def image_label(pipe: AsymSpecPipeline) -> str:
    """The image input's label: what it is for, or, for a text-only drafter, that images need a VL drafter."""
    if pair_reads_images(pipe):
        return "Image"
    return "Image: not read by this pair (its drafter is a text-only model); images need a vision-language drafter, e.g. Qwen/Qwen3-VL-2B-Instruct"


def build_app(
    pipe: AsymSpecPipeline,
    *,
    examples: Sequence[dict] | None = None,
    max_upload_mb: float = 10,
    concurrency_limit: int | None = None,
    max_queue: int = 64,
    default_max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    max_new_tokens_limit: int = MAX_NEW_TOKENS_LIMIT,
    stream_interval: float = 0.1,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    max_stall: float | None = None,
    scheduler: Any = None,
) -> gr.Blocks:
    """The steering inspector for one loaded pipeline.

    ``examples``: dicts with image (path), question, caption, ocr; None loads the bundled
    ``examples.json`` when present, [] shows none. ``max_upload_mb`` is enforced by :func:`launch`
    (Gradio's ``max_file_size``) and again by the handlers. Every run decodes its method and the
    comparisons as rows of one scheduler per app (``pipe.scheduler(max_batch_size=max_batch_size,
    max_stall=max_stall)``, or ``scheduler``; closed with the app), so concurrent runs share decoding steps.
    ``concurrency_limit``: runs handled at once (default ``4 * max_batch_size``, at most 32; rows beyond the
    batch wait in the scheduler, and the page shows each row's place in line and its waiting time), the rest
    wait in Gradio's queue of at most ``max_queue``. Endpoints: ``/run`` (its outputs are named as in
    :data:`RUN_OUTPUTS`) and ``/describe``.
    """
    import gradio as gr

    if examples is None:
        examples = load_examples()
    if concurrency_limit is None:
        concurrency_limit = max(1, min(MAX_DEFAULT_CONCURRENCY, CONCURRENCY_PER_ROW * max_batch_size))
    if not is_int(concurrency_limit, minimum=1):
        raise ValueError(f"concurrency_limit={concurrency_limit!r} must be an integer >= 1")
    state = DemoApp(
        pipe,
        max_upload_mb=max_upload_mb,
        max_new_tokens_limit=max_new_tokens_limit,
        stream_interval=stream_interval,
        max_batch_size=max_batch_size,
        max_stall=max_stall,
        scheduler=scheduler,
        concurrency_limit=concurrency_limit,
    )
    defaults = AsymSpecConfig()
    blank = state.outputs.blank()  # what the outputs show before a run (and again after a new image)

    with gr.Blocks(title="AsymSpec steering inspector", analytics_enabled=False) as demo:
        gr.HTML(
            f"<style>{stylesheet()}</style>"
            '<div class="asym-header"><h1 style="margin:.2rem 0">AsymSpec steering inspector</h1>'
            f'<p style="margin:.2rem 0 .6rem 0">A small vision-language drafter reads the image; a text-only verifier '
            f"reads only the compressed view (caption + OCR). Watch, token by token, how the drafter steers the "
            f"verifier. Models: <code>{esc(_model_label(pipe))}</code>. Hover or tap a token for "
            f"its provenance.</p></div>",
            js_on_load=TOOLTIP_JS + LAYOUT_JS,
            label="header",
        )
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=320):
                image = gr.Image(
                    label=image_label(pipe),
                    type="filepath",
                    image_mode=None,
                    sources=["upload", "clipboard"],
                    height=220,
                    elem_id="asym-image",
                    interactive=pair_reads_images(pipe),  # a text-only drafter reads no image
                )
                question = gr.Textbox(
                    label="Question",
                    lines=2,
                    max_lines=10,
                    max_length=MAX_QUESTION_CHARS,
                    placeholder="e.g. Which bar is the tallest?",
                    elem_id="asym-question",
                )
                # Run and the examples come before the longer settings, so that they are in the first screen; the
                # status right under Run, so that a run's progress shows where it was started (on a phone too).
                with gr.Row():
                    run_btn = gr.Button("Run", variant="primary", elem_id="asym-run", min_width=100)
                    stop_btn = gr.Button("Stop", elem_id="asym-stop", min_width=100, **STOP_IDLE)
                status = gr.HTML(
                    blank["status"],
                    js_on_load=None,
                    elem_id="asym-status",
                    label="status",
                )
                with gr.Row():
                    followup = gr.Checkbox(value=False, label="Follow-up: continue this conversation", elem_id="asym-followup")
                    clear_btn = gr.Button("Clear conversation", size="sm", elem_id="asym-clear", min_width=100)
                with gr.Accordion("Compressed view: what the verifier reads (edit it)", open=True):
                    caption = gr.Textbox(
                        label="Caption",
                        lines=2,
                        max_lines=8,
                        max_length=MAX_VIEW_CHARS,
                        placeholder="empty: the drafter writes one (if auto-fill is on)",
                        elem_id="asym-caption",
                    )
                    ocr = gr.Textbox(
                        label="OCR text",
                        lines=1,
                        max_lines=6,
                        max_length=MAX_VIEW_CHARS,
                        placeholder="empty: OCR engine (if auto-fill is on and one is installed)",
                        elem_id="asym-ocr",
                    )
                    with gr.Row():
                        autofill = gr.Checkbox(value=True, label="Auto-fill empty fields from the image", elem_id="asym-autofill")
                        describe_btn = gr.Button("Describe image", size="sm", elem_id="asym-describe")
                # The examples stand here; they are filled in once the tools inputs (further down) exist, since every
                # example sets every field an example may use (a plain one empties the tools an agent example wrote).
                examples_slot = gr.Column()
                with gr.Accordion("Advanced settings", open=False):
                    method = gr.Dropdown(list(METHODS), value="asymspec", label="Method (main panel)", elem_id="asym-method")
                    k = gr.Slider(*RANGES["k"].bounds(), value=defaults.k, step=1, label="K (draft length)", elem_id="asym-k")
                    beta = gr.Slider(
                        *RANGES["beta"].bounds(), value=defaults.beta, step=0.05, label="beta (fusion strength)", elem_id="asym-beta"
                    )
                    gamma = gr.Slider(
                        *RANGES["gamma"].bounds(),
                        value=defaults.gamma,
                        step=0.01,
                        label="gamma (acceptance threshold)",
                        elem_id="asym-gamma",
                    )
                    gate = gr.Dropdown(list(GATES), value=defaults.gate, label="Gate", elem_id="asym-gate")
                    delta = gr.Dropdown(list(DELTAS), value=defaults.delta, label="Delta source", elem_id="asym-delta")
                    bonus = gr.Dropdown(list(BONUS_RULES), value=defaults.bonus, label="Bonus token", elem_id="asym-bonus")
                    max_new = gr.Slider(
                        1,
                        max_new_tokens_limit,
                        value=min(default_max_new_tokens, max_new_tokens_limit),
                        step=1,
                        label="Max new tokens",
                        elem_id="asym-max-new",
                    )
                    drafter_view = gr.Dropdown(
                        list(DRAFTER_VIEWS), value=defaults.drafter_view, label="Drafter view", elem_id="asym-drafter-view"
                    )
                    compare = gr.Checkbox(value=True, label="Also run Floor (verifier alone) and the drafter alone", elem_id="asym-compare")
                tools, tool_choice = build_tool_inputs()
                example_inputs = dict(image=image, question=question, caption=caption, ocr=ocr, tools=tools, tool_choice=tool_choice)
                example_inputs = [example_inputs[f] for f in EXAMPLE_FIELDS]
                example_sets = []  # their clicks fill the view with an example's text (wired below)
                if examples:
                    with examples_slot:
                        example_sets.append(
                            gr.Examples(
                                examples=[example_row(e) for e in examples],
                                inputs=example_inputs,
                                example_labels=[e.get("label") or example_label(e) for e in examples],
                                label="Bundled examples (MiniVista), with the expected answer",
                                cache_examples=False,
                                examples_per_page=8,
                            )
                        )
                        table = render_examples_table(list(examples))
                        if table:
                            with gr.Accordion("What the shipped tiny pair answers on these examples", open=False):
                                gr.HTML(table, js_on_load=None, elem_id="asym-examples-table")
                agent_examples = load_agent_examples() if examples else []
                if agent_examples:
                    example_sets.append(
                        gr.Examples(
                            examples=[example_row(e) for e in agent_examples],
                            inputs=example_inputs,
                            example_labels=[e["label"] for e in agent_examples],
                            label="Agent examples: a tool call whose arguments only the image holds (see Tool calls)",
                            cache_examples=False,
                        )
                    )
                temperature, top_p, seed = build_sampling_inputs()
                compression = build_compression_input()
            with gr.Column(scale=3, min_width=420):
                answer_html = gr.HTML(
                    blank["answer_html"],
                    js_on_load=None,
                    elem_id="asym-answer",
                    label="answer_html",
                )
                answer_text = gr.Textbox(
                    label="Answer (plain text)",
                    show_label=False,
                    lines=2,
                    interactive=False,
                    elem_id="asym-answer-text",
                    placeholder="The answer as plain text.",
                )
                wire_heatmap_panel(state.attributions, run_btn, image)  # click a token: where in the image (ui.attributions)
                tool_calls_html = gr.HTML(blank["tool_calls_html"], js_on_load=None, elem_id="asym-tool-calls", label="tool_calls_html")
                with gr.Row(equal_height=False):
                    floor_html = gr.HTML(blank["floor_html"], js_on_load=None, elem_id="asym-floor", label="floor_html")
                    drafter_html = gr.HTML(blank["drafter_html"], js_on_load=None, elem_id="asym-drafter", label="drafter_html")
                alignment_html = gr.HTML(blank["alignment_html"], js_on_load=None, elem_id="asym-align", label="alignment_html")
                conversation_html = gr.HTML(
                    blank["conversation_html"], js_on_load=None, elem_id="asym-conversation", label="conversation_html"
                )
                views_html = build_views_panel()
                stats_html = gr.HTML(blank["stats_html"], js_on_load=None, elem_id="asym-stats", label="stats_html")
                chart = gr.Image(
                    label="JSD and gamma_eff per token",
                    show_label=False,
                    type="pil",
                    interactive=False,
                    format="png",
                    elem_id="asym-chart",
                    height=280,
                    buttons=["download"],
                )
                with gr.Row():
                    trace_json = gr.File(label="Trace (JSON)", interactive=False, elem_id="asym-trace-json")
                    trace_csv = gr.File(label="Trace (CSV, one row per token)", interactive=False, elem_id="asym-trace-csv")
                with gr.Accordion("Raw result (JSON: trace, stats, view)", open=False):
                    result_json = gr.JSON(label="Raw result", elem_id="asym-json")

        inputs = [image, question, caption, ocr, autofill, method, k, beta, gamma, gate, delta, bonus, max_new, drafter_view, compare]
        # last, so that API callers that send only the inputs before them keep working
        inputs += [followup, tools, tool_choice, temperature, top_p, seed, compression]
        named = dict(
            status=status,
            answer_html=answer_html,
            answer_text=answer_text,
            floor_html=floor_html,
            drafter_html=drafter_html,
            alignment_html=alignment_html,
            stats_html=stats_html,
            chart=chart,
            caption=caption,
            ocr=ocr,
            trace_json=trace_json,
            trace_csv=trace_csv,
            result_json=result_json,
            conversation_html=conversation_html,
            tool_calls_html=tool_calls_html,
        )
        outputs = [named[name] for name in RUN_OUTPUTS]
        h = _session_handlers(state, gr.Request)
        quiet = dict(api_visibility="private", show_progress="hidden")
        # show_progress="hidden": the status line reports progress and errors, so a refused request does not
        # cover the inputs (caption/OCR are outputs too) with error badges; gr.Error still raises a toast.
        # First, at once, the status says whether the run starts or waits in Gradio's queue (and where), under the
        # request's warning when the models cannot answer it, and Stop turns on; then the run.
        run_event = run_btn.click(h.enqueue, [image, question], [status, stop_btn], queue=False, preprocess=False, **quiet).then(
            h.run,
            inputs,
            outputs,
            api_name="run",
            preprocess=False,
            concurrency_limit=concurrency_limit,
            concurrency_id="runs",
            show_progress="hidden",
        )
        # After a run: the fields that hold the view the app wrote are marked, and Stop turns off. Gradio's page
        # triggers .then only after a run that ended without an error: a refused request settles through .failure.
        settle = dict(fn=h.settle, inputs=[caption, ocr], outputs=[caption, ocr, stop_btn], queue=False, **quiet)
        run_event.then(**settle)
        run_event.then(views_handler(state, gr.Request), None, views_html, queue=False, **quiet)
        run_event.failure(**settle)
        # Gradio closes the session's /run handler; Stop itself cancels its rows and shows every unfinished
        # panel stopped; after a finished run it changes nothing. The same outputs come once more through the
        # queue, after whatever the cancelled handler had sent.
        stop_btn.click(h.stop, None, outputs, cancels=[run_event], queue=False, **quiet).then(
            h.stopped, None, outputs, concurrency_id="stopped", concurrency_limit=None, **quiet
        ).then(**settle)
        # The caption is written by the drafter under the pipeline's lock (decoding steps wait): few at once.
        describe_btn.click(
            h.describe,
            [image, caption, ocr],
            [caption, ocr],
            api_name="describe",
            preprocess=False,
            concurrency_limit=min(2, concurrency_limit),
            concurrency_id="describe",
        ).then(**settle)
        # A click on an example fills the view with the example's text, which belongs to its image, and ends the
        # conversation. A new image (or none) empties the fields that hold the old image's generated text, or an
        # example's text once the image is not the example's, and the old image's answer, and ends the conversation,
        # as Clear does; an upload that is no readable image is refused at once (the box empties, the status says
        # why). Neither changes anything when a run of the session already began on that picture (Run pressed right
        # after the upload or the click can reach the server first). Typing makes a field the user's. The click's own
        # image.change may come before its record: the examples' texts of the new image are never emptied.
        state.add_examples([*examples, *agent_examples])
        for example_set in example_sets:
            example_set.load_input_event.then(
                h.example_loaded, [image, caption, ocr], [caption, ocr, conversation_html], queue=False, preprocess=False, **quiet
            )
        image.change(h.image_changed, [image, caption, ocr, method], [image, *outputs], queue=False, preprocess=False, **quiet)
        clear_btn.click(h.clear, None, [conversation_html], queue=False, **quiet)
        for box in (caption, ocr):
            box.input(h.view_edited, [caption, ocr], [caption, ocr], queue=False, **quiet)
        demo.unload(h.forget)  # the page went away: stop its run

    demo.queue(default_concurrency_limit=concurrency_limit, max_size=max_queue)
    blocks_close = demo.close

    def close(verbose: bool = True) -> None:
        """Close the server, then stop the runs and close the app's scheduler."""
        try:
            blocks_close(verbose)
        finally:
            state.close()

    demo.close = close  # type: ignore[method-assign]
    demo.asymspec = state  # type: ignore[attr-defined]
    demo.asymspec_max_upload_mb = max_upload_mb  # type: ignore[attr-defined]
    demo.asymspec_allowed_paths = sorted({str(Path(e["image"]).resolve().parent) for e in examples})  # type: ignore[attr-defined]
    return demo


def _model_label(pipe: Any) -> str:
    """The pipeline's name with local paths shortened to their last two parts."""
    parts = []
    for part in str(getattr(pipe, "name", "custom")).split(" + "):
        p = Path(part)
        parts.append(str(Path(*p.parts[-2:])) if p.is_absolute() and len(p.parts) > 2 else part)
    return " + ".join(parts)


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(main(prog="python -m ui.app"))
