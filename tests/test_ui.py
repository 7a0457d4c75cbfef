"""The Gradio steering inspector: pure rendering, the CLI hook, and the launched app through gradio_client."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import threading
from html.parser import HTMLParser
from pathlib import Path

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from conftest import deliver_in_thread, held_forwards, make_case, make_image  # noqa: E402

from asymspec_mm.decode import TokenEvent  # noqa: E402
from ui import app as ui_app  # noqa: E402
from ui.app import (  # noqa: E402
    MAX_QUESTION_CHARS,
    RUN_OUTPUTS,
    add_demo_parser,
    is_loopback,
    jsd_gamma_chart,
    load_examples,
    outputs_as_dict,
    render_panel,
    render_stats_html,
    render_trace_html,
)

SOURCES = {"accepted", "fused", "bonus", "greedy"}
pytestmark = pytest.mark.filterwarnings("ignore:.*(no_silent_downcasting|copy keyword).*")  # inside gradio


# ------------------------------------------------------------------------------------------ helpers


class TraceParser(HTMLParser):
    """Collects the token spans of rendered HTML: their classes, data-* attributes, text and tooltip."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tokens: list[dict] = []
        self.traces: list[dict] = []
        self._stack: list[str | None] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        role = None
        if tag == "div" and "asym-trace" in classes:
            self.traces.append(a)
        if tag == "span" and ("tok" in classes or "tok-end" in classes) and "data-token-id" in a:
            # a special token is drawn as the answer's end mark (span.tok-end), not as a token
            self.tokens.append({"classes": set(classes), "attrs": a, "text": "", "tip": "", "end": "tok-end" in classes})
            role = "tok"
        elif tag == "span" and "tok-text" in classes:
            role = "text"
        elif tag == "span" and "tok-tip" in classes:
            role = "tip"
        self._stack.append(role)

    def handle_endtag(self, tag):
        if self._stack:
            self._stack.pop()

    def handle_data(self, data):
        if not self._stack or not self.tokens:
            return
        role = self._stack[-1]
        if role == "text":
            self.tokens[-1]["text"] += data
        elif role == "tip":
            self.tokens[-1]["tip"] += data


def parse(html_text: str) -> TraceParser:
    p = TraceParser()
    p.feed(html_text)
    p.close()
    return p


class FakeTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join("<b>" if i == 7 else f"t{i}" for i in ids)


def sample_trace() -> list[TokenEvent]:
    return [
        TokenEvent(
            index=0,
            token_id=5,
            text="<script>alert(1)</script>",
            source="accepted",
            step=1,
            position=1,
            p_verifier=0.25,
            p_base=0.125,
            gamma_eff=0.4375,
            jsd=0.0123456789,
            verifier_argmax=5,
            steered=False,
            top_verifier=[(5, 0.25), (7, 0.2)],
            top_fused=[(5, 0.3), (9, 0.1)],
        ),
        TokenEvent(
            index=1,
            token_id=6,
            text="{{value}} ${x} `a`",
            source="fused",
            step=1,
            position=2,
            p_verifier=0.1,
            p_base=0.05,
            gamma_eff=0.3,
            jsd=0.2,
            verifier_argmax=7,
            steered=True,
            draft_token=8,
            top_verifier=[(7, 0.4)],
            top_fused=[(6, 0.5)],
        ),
        TokenEvent(index=2, token_id=7, text="a\x12b\n", source="bonus", step=2, position=1, p_verifier=0.9, p_base=0.8, verifier_argmax=7),
        TokenEvent(index=3, token_id=9, text="", source="greedy", step=3, position=1, p_verifier=0.5, verifier_argmax=9),
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_spans_match(html_text: str, trace, exact_floats: bool = False) -> None:
    """The rendered spans carry exactly the pipeline's trace: source class, steered mark and hover data."""
    toks = parse(html_text).tokens
    assert len(toks) == len(trace), (len(toks), len(trace))
    approx = (lambda x: x) if exact_floats else (lambda x: pytest.approx(x, rel=1e-5, abs=1e-7))
    for tok, ev in zip(toks, trace):
        a = tok["attrs"]
        assert int(a["data-token-id"]) == ev.token_id and a["data-source"] == ev.source
        if tok["end"]:  # the end mark: no source colour, no hover box
            assert not tok["classes"] & {f"tok-{s}" for s in SOURCES} and tok["tip"] == "" and tok["text"] == ""
            continue
        assert tok["classes"] & {f"tok-{s}" for s in SOURCES} == {f"tok-{ev.source}"}
        assert ("tok-steered" in tok["classes"]) == bool(ev.steered)
        assert int(a["data-token-id"]) == ev.token_id
        assert int(a["data-index"]) == ev.index and int(a["data-step"]) == ev.step
        assert int(a["data-position"]) == ev.position and a["data-source"] == ev.source
        for attr, value in (
            ("data-p-verifier", ev.p_verifier),
            ("data-p-base", ev.p_base),
            ("data-jsd", ev.jsd),
            ("data-gamma-eff", ev.gamma_eff),
        ):
            if value is None:
                assert attr not in a
            else:
                assert float(a[attr]) == approx(value)
        if ev.verifier_argmax is None:
            assert "data-verifier-argmax" not in a
        else:
            assert int(a["data-verifier-argmax"]) == ev.verifier_argmax
        assert (int(a["data-draft-token"]) if "data-draft-token" in a else None) == ev.draft_token
        for attr, tops in (("data-top-verifier", ev.top_verifier), ("data-top-fused", ev.top_fused)):
            got = json.loads(a[attr]) if attr in a else []
            assert [g[0] for g in got] == [int(i) for i, _ in tops]
            assert [g[1] for g in got] == [approx(float(p)) for _, p in tops]
        for word in ("step", "p_verifier", "p_base", "JSD", "gamma_eff"):
            assert word in tok["tip"]
        if ev.top_fused and ev.source == "fused":
            assert "top before fusion" in tok["tip"] and "top after fusion" in tok["tip"]
        else:  # no fusion made this token: the box names no fusion (#49)
            assert "fusion" not in tok["tip"]


# ------------------------------------------------------------------------------------------ pure functions


def test_render_trace_html_classes_data_and_escaping():
    trace = sample_trace()
    out = render_trace_html(trace, FakeTokenizer())
    assert "<script>" not in out and "{{" not in out and "${" not in out and "`" not in out
    p = parse(out)
    assert p.traces[0]["data-tokens"] == "4" and p.traces[0]["data-done"] == "1"
    check_spans_match(out, trace, exact_floats=True)
    texts = [t["text"] for t in p.tokens]
    assert texts[0] == "<script>alert(1)</script>"  # escaped in the source, literal on the page
    assert texts[1] == "{{value}} ${x} `a`"
    assert texts[2] == "a\u2412b\n"  # control characters shown as control pictures
    assert texts[3] == "t9"  # empty event text: decoded with the tokenizer
    fused = p.tokens[1]
    assert fused["attrs"]["data-verifier-argmax-text"] == "<b>" and fused["attrs"]["data-draft-token"] == "8"
    assert "STEERED" in fused["tip"] and "'<b>'" in fused["tip"] and "rejected" in fused["tip"]
    assert "STEERED" not in p.tokens[0]["tip"]
    assert json.loads(fused["attrs"]["data-top-verifier"]) == [[7, 0.4, "<b>"]]
    # a bonus token has no gate values: shown as a dash, no data attribute
    assert "data-jsd" not in p.tokens[2]["attrs"] and "JSD        \u2014" in p.tokens[2]["tip"]


def test_render_trace_html_dicts_streaming_and_empty():
    trace = sample_trace()
    assert render_trace_html([ev.as_dict() for ev in trace], FakeTokenizer()) == render_trace_html(trace, FakeTokenizer())
    streaming = render_trace_html(trace[:2], None, done=False)
    assert 'data-done="0"' in streaming and "tok-cursor" in streaming
    assert 'data-verifier-argmax-text="&lt;7&gt;"' in streaming  # no tokenizer: ids shown
    empty = render_trace_html([], None, empty="nothing <here>")
    assert 'data-tokens="0"' in empty and "nothing &lt;here&gt;" in empty
    panel = render_panel("AsymSpec <x>", trace, FakeTokenizer(), legend=True, stats={"tokens_per_s": 3.0})
    assert "AsymSpec &lt;x&gt;" in panel and "asym-legend" in panel and "1 fused" in panel and "1 steered" in panel


@pytest.mark.parametrize("method", ["asymspec", "sd", "floor", "drafter"])
def test_every_source_the_loops_emit_is_rendered_as_itself(tiny_pipe, method):
    case = make_case(2)
    res = tiny_pipe.generate(
        case["image"], case["question"], caption=case["caption"] or "a chart", ocr=case["ocr"] or False, method=method, max_new_tokens=16
    )
    toks = parse(render_trace_html(res.trace, tiny_pipe.tokenizer)).tokens
    assert [t["attrs"]["data-source"] for t in toks] == [ev.source for ev in res.trace]
    special = set(tiny_pipe.tokenizer.all_special_ids)
    assert all(t["end"] == (ev.token_id in special) for t, ev in zip(toks, res.trace))
    assert all(t["end"] or f"tok-{ev.source}" in t["classes"] for t, ev in zip(toks, res.trace))
    if method == "sd":  # the verifier's corrections are counted and have a legend entry and a colour
        n = sum(ev.source == "corrected" for ev in res.trace)
        assert n and f"{n} corrected" in render_panel("SD", res.trace, tiny_pipe.tokenizer, legend=True)
        assert 'class="tok tok-corrected"' in render_panel("SD", [], legend=True)
        assert ".tok-corrected {" in ui_app.CSS


def test_stats_html_and_chart():
    stats = {
        "steps": 3,
        "acceptance_rate": 0.5,
        "mean_accepted_length": 2.5,
        "accepted_per_position": [3, 2, 1, 0],
        "new_tokens": 8,
        "tokens_per_s": 12.5,
        "wall_s": 1.25,
        "vision_calls": 1,
        "vision_cache_hits": 2,
        "caption_s": 0.5,
        "ocr_s": 0.0,
        "steered": 2,
        "fused": 1,
        "stopped_by": "eos",
        "ocr_engine": "rapidocr",
    }
    out = render_stats_html(stats)
    for label, value in (
        ("acceptance rate", "0.5"),
        ("mean accepted length", "2.5"),
        ("accepted per position", "[3, 2, 1, 0]"),
        ("tokens/s (decode)", "12.5"),
        ("vision tower calls", "1"),
        ("vision cache hits", "2"),
        ("caption time (s)", "0.50"),
        ("OCR time (s)", "&lt; 0.01"),
        ("OCR engine", "rapidocr"),
    ):
        assert f'data-stat="{label}">{value}<' in out, label
    assert "after a run" in render_stats_html(None)
    img = jsd_gamma_chart(sample_trace())
    assert img is not None and img.size[0] > 300 and img.size[1] > 100
    assert jsd_gamma_chart([sample_trace()[3]]) is None  # greedy tokens carry no gate values


def test_load_examples(tmp_path):
    make_image(1).save(tmp_path / "a.png")
    (tmp_path / "examples.json").write_text(
        json.dumps(
            [
                {
                    "image": "a.png",
                    "question": "Hint: ...\nQuestion: Which bar is the tallest?\nChoices: ...",
                    "caption": "c",
                    "ocr": "1 2",
                    "family": "figure",
                },
                {"image": "missing.png", "question": "q"},
                {"image": "a.png", "question": ""},
            ]
        )
    )
    ex = load_examples(tmp_path / "examples.json")
    assert len(ex) == 1 and Path(ex[0]["image"]).is_file() and ex[0]["ocr"] == "1 2"
    assert ex[0]["label"] == "figure: Which bar is the tallest?"
    assert load_examples(tmp_path) == ex
    assert load_examples(tmp_path / "nope.json") == []
    (tmp_path / "bad.json").write_text("{not json")
    assert load_examples(tmp_path / "bad.json") == []
    for e in load_examples():  # the bundled ones, when present, all resolve
        assert Path(e["image"]).is_file() and e["question"]


def test_demo_parser_and_loopback():
    parser = argparse.ArgumentParser()
    add_demo_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["demo"])
    assert (args.host, args.port, args.share, args.preset) == ("127.0.0.1", 7860, False, None)
    assert (args.max_batch_size, args.concurrency) == (8, None)  # concurrency None: the max batch size
    assert callable(args.func)
    args = parser.parse_args(["demo", "--max-batch-size", "16", "--concurrency", "4"])
    assert (args.max_batch_size, args.concurrency) == (16, 4)
    for bad in (["--max-batch-size", "0"], ["--concurrency", "-1"], ["--max-batch-size", "x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["demo", *bad])
    args = parser.parse_args(
        ["demo", "--preset", "tiny", "--host", "0.0.0.0", "--port", "9000", "--share", "--drafter", "d", "--verifier", "v"]
    )
    assert (args.preset, args.host, args.port, args.share, args.drafter, args.verifier) == ("tiny", "0.0.0.0", 9000, True, "d", "v")
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1") and is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4") and not is_loopback("example.org")


def test_the_demos_stall_bound_reaches_its_scheduler_and_a_bad_one_is_a_one_line_error(tiny_pipe, capsys):
    """``asymspec-mm demo --max-stall X`` (as ``serve --max-stall``) reaches the app's scheduler: the flag, the
    launch options the command passes, ``build_app(max_stall=)`` and the scheduler it makes; a bound below 1 (or not
    a number) is refused in one line, by the flag and by the app, before any run."""
    from ui.serve import launch_options

    parser = argparse.ArgumentParser()
    add_demo_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["demo"]).max_stall is None
    args = parser.parse_args(["demo", "--max-stall", "2.5"])
    assert args.max_stall == 2.5 and launch_options(args)["max_stall"] == 2.5
    for bad, why in (("0.5", "'0.5' must be at least 1"), ("nan", "'nan' is not a finite number"), ("x", "'x' is not a number")):
        with pytest.raises(SystemExit):
            parser.parse_args(["demo", "--max-stall", bad])
        last = capsys.readouterr().err.splitlines()[-1]
        assert "error: argument --max-stall: " + why in last, last
    demo = ui_app.build_app(tiny_pipe, examples=[], max_stall=2.5)
    try:
        assert demo.asymspec.scheduler.max_stall == 2.5
    finally:
        demo.close()
    for bad in (0.5, True, "2"):
        with pytest.raises(ValueError, match=r"^max_stall=.* must be a number >= 1 .* or None \(no bound\)$"):
            ui_app.DemoApp(tiny_pipe, max_stall=bad)


def test_serve_defaults_and_host_warning(monkeypatch, capsys):
    class FakeBlocks:
        asymspec_max_upload_mb = 3
        asymspec_allowed_paths = ["/ex"]

        def launch(self, **kw):
            self.kw = kw

    demo = ui_app.serve(FakeBlocks(), prevent_thread_lock=True)
    kw = demo.kw
    assert kw["server_name"] == "127.0.0.1" and kw["share"] is False and kw["max_file_size"] == "3mb"
    assert kw["allowed_paths"] == ["/ex"] and kw["ssr_mode"] is False
    assert "WARNING" not in capsys.readouterr().err
    with pytest.warns(UserWarning, match="no authentication"):
        ui_app.serve(FakeBlocks(), host="0.0.0.0", prevent_thread_lock=True)
    assert "WARNING" in capsys.readouterr().err


def test_describe_fills_view(tmp_path):
    from captioning.view import CompressedView

    calls = []

    class FakePipe:
        tokenizer = None
        ocr_engine = None

        def compressed_view(self, image, caption=None, ocr=None):
            calls.append((image.size, caption, ocr))
            return CompressedView(caption="a red bar", ocr_text="")

        def scheduler(self, max_batch_size):  # the app's loop, which Describe's caption runs in
            return EndlessScheduler()

    make_image(3, (40, 30)).save(tmp_path / "x.png")
    state = ui_app.DemoApp(FakePipe())
    assert state.describe({"path": str(tmp_path / "x.png")}, "", "") == ("a red bar", "")
    assert calls == [((40, 30), None, False)]  # no OCR engine: OCR skipped, not an error


def test_upload_limit_enforced_by_the_handler(tmp_path):
    from PIL import Image

    Image.new("RGB", (64, 64), (200, 10, 10)).save(tmp_path / "x.bmp")  # ~12 KB uncompressed
    state = ui_app.DemoApp(object(), max_upload_mb=0.005)
    with pytest.raises(ui_app.DemoInputError, match="limit is"):
        state._load_image({"path": str(tmp_path / "x.bmp")})
    assert ui_app.DemoApp(object(), max_upload_mb=1)._load_image({"path": str(tmp_path / "x.bmp")}).size == (64, 64)
    with pytest.raises(ui_app.DemoInputError, match="upload an image"):
        state._load_image(None)


class EndlessHandle:
    """A scheduler handle stand-in whose row never finishes by itself (one event every ``delay`` s)."""

    def __init__(self, method: str, delay: float = 0.01):
        self.method, self.delay = method, delay
        self.cancelled = False
        self.released = threading.Event()  # its row left the batch (after a cancel)

    def __iter__(self):
        import time
        from concurrent.futures import CancelledError

        i = 0
        while not self.cancelled:
            time.sleep(self.delay)
            yield [TokenEvent(index=i, token_id=1, text="x", source="greedy", step=i + 1, position=1)]
            i += 1
        self.released.set()
        raise CancelledError("cancelled")

    def result(self, timeout=None):
        from concurrent.futures import CancelledError

        raise CancelledError("cancelled")

    def listen(self, listener):
        deliver_in_thread(self, listener)

    def cancel(self):
        self.cancelled = True


class EndlessScheduler:
    """A scheduler stand-in: every submitted row is an :class:`EndlessHandle`."""

    waiting = 0

    def __init__(self, delay: float = 0.01):
        self.delay = delay
        self.handles: list[EndlessHandle] = []

    def add(self, request):
        self.handles.append(EndlessHandle(request.method, self.delay))
        return self.handles[-1]

    @property
    def live_rows(self):
        return sum(not h.released.is_set() for h in self.handles)

    def close(self, timeout=None):
        pass


def test_abandoned_job_stops_and_releases_the_rows():
    sched = EndlessScheduler()
    req = ui_app._RunInputs(image=None, question="q", caption="c", ocr=False, method="asymspec", overrides={}, compare=("floor", "drafter"))
    job = ui_app._Job(sched, req)
    job.abandon_after_s = 0.2
    job.start()
    assert [h.method for h in sched.handles] == ["asymspec", "floor", "drafter"]  # one row per panel, submitted at once
    assert job.get()[1] == "events"  # a reader took one item, then went away
    for h in sched.handles:
        assert h.released.wait(timeout=120)
    assert job.cancel.is_set()
    assert all(h.cancelled and h.released.is_set() for h in sched.handles) and sched.live_rows == 0
    # each row's "stopped" comes from its delivery thread after it released the row: read until all three came (a
    # queue found empty at once may be one whose thread has not run since the release)
    items: list = []
    while sorted(k for k, kind in items if kind == "stopped") != ["drafter", "floor", "main"]:
        items.append(job.q.get(timeout=120))
    while not job.q.empty():
        items.append(job.q.get())
    assert sorted(k for k, kind in items if kind == "stopped") == ["drafter", "floor", "main"]
    assert not any(kind == "error" for _, kind in items) and job.settled()


def test_closed_handler_cancels_its_rows_and_status_shows_the_queue(tmp_path):
    """Gradio closes the /run generator when the client cancels: its rows are cancelled at once."""
    from types import SimpleNamespace

    make_image(5).save(tmp_path / "q.png")
    sched = EndlessScheduler(delay=0.5)
    sched.waiting = 4
    state = ui_app.DemoApp(SimpleNamespace(tokenizer=None), scheduler=sched, stream_interval=0.0)
    gen = state.run({"path": str(tmp_path / "q.png")}, "q?", "a chart", "", session="s")
    first = outputs_as_dict(next(gen))
    assert "waiting for the models (4 rows waiting for a place in the batch)" in first["status"]
    assert "AsymSpec, Floor and the drafter alone" in first["status"]
    assert all(panel_state(first[k]) == "running" for k in ("answer_html", "floor_html", "drafter_html"))
    assert first["result_json"] is None and len(sched.handles) == 3
    gen.close()
    assert all(h.cancelled for h in sched.handles)
    for h in sched.handles:
        assert h.released.wait(120)
    # the page's Stop then shows the stopped panels (Gradio has closed the handler first)
    out = outputs_as_dict(state.stop("s"))
    assert "Stopped." in out["status"] and all(panel_state(out[k]) == "stopped" for k in ("answer_html", "floor_html", "drafter_html"))
    assert state._sessions == {} and not state._live


def test_render_panel_states():
    trace = sample_trace()
    assert 'data-state="done"' in render_panel("A", trace, FakeTokenizer())
    running = render_panel("A", [], None, done=False, empty="waiting for the models...")
    assert 'data-state="running"' in running and "waiting for the models..." in running and "tok-cursor" in running
    stopped = render_panel("A", trace[:2], FakeTokenizer(), state="stopped", stats={"tokens_per_s": 3.0})
    assert 'data-state="stopped"' in stopped and "tok-cursor" not in stopped and 'data-done="1"' in stopped
    assert "2 tokens" in stopped and "stopped" in stopped and "tok/s" not in stopped  # no speed for a stopped row
    assert len(parse(stopped).tokens) == 2
    failed = render_panel("A", [], None, state="error", empty="failed: no <room>")
    assert 'data-state="error"' in failed and "failed: no &lt;room&gt;" in failed
    with pytest.raises(ValueError, match="state="):
        render_panel("A", [], None, state="nope")
    assert 'data-stat="rows per decoding step (max)">3<' in render_stats_html({"batch_size": 3})
    assert "rows per decoding step" not in render_stats_html({"steps": 1})


# ------------------------------------------------------------------------------------------ the launched app

RUN_DEFAULTS = dict(
    autofill=False,
    method="asymspec",
    k=4,
    beta=1.0,
    gamma=0.5,
    gate="cda",
    delta="contrast",
    bonus="verifier",
    max_new_tokens=10,
    drafter_view="image+text",
    compare=True,
)


def run_args(image_path, question, caption, ocr, **kw):
    from gradio_client import handle_file

    o = {**RUN_DEFAULTS, **kw}
    return (
        handle_file(str(image_path)),
        question,
        caption,
        ocr,
        o["autofill"],
        o["method"],
        o["k"],
        o["beta"],
        o["gamma"],
        o["gate"],
        o["delta"],
        o["bonus"],
        o["max_new_tokens"],
        o["drafter_view"],
        o["compare"],
    )


def reference(pipe, image_path, question, caption, ocr, method="asymspec", **kw):
    o = {**RUN_DEFAULTS, **kw}
    return pipe.generate(
        str(image_path),
        question,
        caption=caption,
        ocr=ocr or False,
        method=method,
        k=o["k"],
        beta=o["beta"],
        gamma=o["gamma"],
        gate=o["gate"],
        delta=o["delta"],
        bonus=o["bonus"],
        max_new_tokens=o["max_new_tokens"],
        drafter_view=o["drafter_view"],
    )


# ------------------------------------------------------------------------------------------ batched runs (DemoApp)


def demo_args(path, case, **kw):
    o = {**RUN_DEFAULTS, **kw}
    return (
        {"path": str(path)},
        case["question"],
        case["caption"],
        case["ocr"],
        o["autofill"],
        o["method"],
        o["k"],
        o["beta"],
        o["gamma"],
        o["gate"],
        o["delta"],
        o["bonus"],
        o["max_new_tokens"],
        o["drafter_view"],
        o["compare"],
    )


def panel_state(html_text: str) -> str:
    import re

    return re.search(r'class="asym-panel" data-state="(\w+)"', html_text).group(1)


def test_concurrent_runs_share_decoding_steps_and_equal_generate(tiny_pipe, tmp_path):
    """Six runs at once (threads, as Gradio's workers): their 18 rows share the scheduler's steps, and every
    panel shows exactly the tokens of ``pipe.generate`` of that request alone."""
    state = ui_app.DemoApp(tiny_pipe, stream_interval=0.0, max_batch_size=8)
    runs = []
    for i in range(6):
        case = make_case(40 + i)
        path = tmp_path / f"run_{i}.png"
        case["image"].save(path)
        runs.append((path, case, dict(max_new_tokens=8 + 3 * i, k=2 if i == 5 else 4)))  # one in batches of its own K
    barrier = threading.Barrier(len(runs))
    outputs: dict[int, list] = {}
    errors: list[BaseException] = []

    def worker(i):
        try:
            path, case, kw = runs[i]
            barrier.wait(timeout=60)
            outputs[i] = list(state.run(*demo_args(path, case, **kw), session=f"session-{i}"))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(runs))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        sched = state.scheduler
        assert sched.rows_stepped > sched.steps, (sched.rows_stepped, sched.steps)  # rows shared steps
        assert sched.live_rows == 0 and sched.waiting == 0
        shared = 0
        for i, (path, case, kw) in enumerate(runs):
            out = outputs_as_dict(outputs[i][-1])
            assert 'data-status="ok"' in out["status"] and "Done" in out["status"], out["status"]
            refs = {
                m: reference(tiny_pipe, path, case["question"], case["caption"], case["ocr"], method=m, **kw)
                for m in ("asymspec", "floor", "drafter")
            }
            check_spans_match(out["answer_html"], refs["asymspec"].trace)
            check_spans_match(out["floor_html"], refs["floor"].trace)
            check_spans_match(out["drafter_html"], refs["drafter"].trace)
            assert all(panel_state(out[k]) == "done" for k in ("answer_html", "floor_html", "drafter_html"))
            assert out["answer_text"] == refs["asymspec"].text
            payload = out["result_json"]
            for key, m in (("main", "asymspec"), ("floor", "floor"), ("drafter", "drafter")):
                assert payload[key]["token_ids"] == refs[m].token_ids, (i, key)
            shared = max(shared, payload["main"]["stats"]["batch_size"])
            # streamed: the main panel grew before the final answer
            counts = [len(parse(o[1]).tokens) for o in outputs[i] if isinstance(o[1], str) and "asym-trace" in o[1]]
            assert counts == sorted(counts) and counts[-1] == len(refs["asymspec"].trace)
        assert shared > 1
        assert 'data-stat="rows per decoding step (max)"' in outputs_as_dict(outputs[0][-1])["stats_html"]
        assert state._sessions == {} and state._live == set()  # finished runs are not kept
    finally:
        state.close()


def test_stop_cancels_the_rows_and_every_panel_says_stopped(tiny_pipe, tmp_path):
    import gradio as gr

    from asymspec_mm.base.errors import AsymSpecError

    state = ui_app.DemoApp(tiny_pipe, stream_interval=0.0, max_batch_size=8)
    sched = state.scheduler
    runs = []
    for i, seed in enumerate((32, 35)):  # the random pair answers these at length (no early EOS)
        case = make_case(seed)
        path = tmp_path / f"stop_{i}.png"
        case["image"].save(path)
        runs.append((path, case))
    outputs: dict[int, list] = {}
    errors: list[BaseException] = []

    def worker(i):
        try:
            path, case = runs[i]
            outputs[i] = list(state.run(*demo_args(path, case, max_new_tokens=1024), session=f"stop-{i}"))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(runs))]
    try:
        for t in threads:
            t.start()
        import time

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # every run has committed tokens in every panel
            jobs = [j for i in range(len(runs)) for j in state._sessions.get(f"stop-{i}", [])]
            if len(jobs) == len(runs) and all(all(j.traces[k] for k in j.keys) for j in jobs):
                break
            time.sleep(0.01)
        assert sched.live_rows == 6
        stops = [outputs_as_dict(state.stop(f"stop-{i}")) for i in range(len(runs))]
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        deadline = time.monotonic() + 120
        while (sched.live_rows or sched.waiting) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sched.live_rows == 0 and sched.waiting == 0  # the rows left the batches
        for i, out in enumerate(stops):
            assert 'data-status="idle"' in out["status"] and "Stopped." in out["status"]
            for key in ("answer_html", "floor_html", "drafter_html"):
                assert panel_state(out[key]) == "stopped", (i, key)
                toks = parse(out[key]).tokens
                assert 0 < len(toks) < 1024 and "stopped" in out[key]
            assert out["result_json"] is None
            # the handler ended with the same page as Stop showed (whichever reaches the browser last)
            assert outputs[i][-1][:5] == state_tuple(out)[:5]
        # a Stop with nothing running (or after a finished run) leaves every output as it was
        assert state.stop("stop-0") == (gr.skip(),) * len(RUN_OUTPUTS)
        path, case = runs[0]
        done = list(state.run(*demo_args(path, case, max_new_tokens=4), session="stop-0"))
        assert "Done" in outputs_as_dict(done[-1])["status"]
        assert state.stop("stop-0") == (gr.skip(),) * len(RUN_OUTPUTS)
        assert state.stop(None) == (gr.skip(),) * len(RUN_OUTPUTS)
    finally:
        state.close()
    with pytest.raises(AsymSpecError, match="closed"):  # the app closed its scheduler
        sched.submit(runs[0][1]["image"], "q?")


def state_tuple(out: dict) -> tuple:
    return tuple(out[k] for k in RUN_OUTPUTS)


@pytest.fixture(scope="module")
def served(tiny_pipe, tmp_path_factory):
    pytest.importorskip("gradio")
    pytest.importorskip("gradio_client")
    from gradio_client import Client

    demo = ui_app.build_app(tiny_pipe, examples=[], max_upload_mb=1, concurrency_limit=2, stream_interval=0.0)
    ui_app.serve(demo, port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        assert demo.local_url.startswith("http://127.0.0.1:")
        client = Client(demo.local_url, verbose=False)
        yield demo, client, tmp_path_factory.mktemp("ui_api")
    finally:
        demo.close()


@pytest.fixture(scope="module")
def case_file(served):
    _, _, tmp = served
    case = make_case(4)
    path = tmp / "case.png"
    case["image"].save(path)
    return path, case


def test_api_trace_matches_pipeline_and_streams(served, case_file, tiny_pipe):
    _, client, _ = served
    path, case = case_file
    job = client.submit(*run_args(path, case["question"], case["caption"], case["ocr"], k=2), api_name="/run")
    out = outputs_as_dict(job.result(timeout=300))
    assert set(out) == set(RUN_OUTPUTS)
    ref = reference(tiny_pipe, path, case["question"], case["caption"], case["ocr"], k=2)
    assert 'data-status="ok"' in out["status"] and "Done" in out["status"]
    check_spans_match(out["answer_html"], ref.trace)
    assert out["answer_text"] == ref.text
    assert {ev.source for ev in ref.trace} <= {"accepted", "fused", "bonus"}
    for method, key in (("floor", "floor_html"), ("drafter", "drafter_html")):
        check_spans_match(out[key], reference(tiny_pipe, path, case["question"], case["caption"], case["ocr"], method=method, k=2).trace)
    payload = out["result_json"]
    assert [e["token_id"] for e in payload["main"]["trace"]] == ref.token_ids
    assert set(payload) == {"main", "floor", "drafter"}
    stats = payload["main"]["stats"]
    for key in ("steps", "drafted", "accepted", "new_tokens", "accepted_per_position", "steered", "fused"):
        assert stats[key] == ref.stats[key], key
    assert stats["acceptance_rate"] == pytest.approx(ref.stats["acceptance_rate"])
    for label in (
        "acceptance rate",
        "mean accepted length",
        "accepted per position",
        "tokens/s (decode)",
        "vision tower calls",
        "vision cache hits",
        "caption time (s)",
        "OCR time (s)",
    ):
        assert f'data-stat="{label}"' in out["stats_html"]
    assert (out["caption"], out["ocr"]) == (case["caption"], case["ocr"])
    assert out["chart"] and Path(out["chart"]).is_file()
    # streamed: the main panel grew step by step before the final answer
    counts = []
    for o in job.outputs():
        html_text = outputs_as_dict(o)["answer_html"]
        if isinstance(html_text, str) and "asym-trace" in html_text:
            counts.append(len(parse(html_text).tokens))
    assert counts == sorted(counts) and counts[-1] == len(ref.trace)
    assert any(0 < c < len(ref.trace) for c in counts), counts


def test_api_bad_inputs_then_good_request(served, case_file, tiny_pipe):
    from gradio_client.exceptions import AppError

    _, client, tmp = served
    path, case = case_file
    bad = tmp / "not_an_image.txt"
    bad.write_text("hello <b>")
    with pytest.raises(AppError, match="not a recognised image"):
        client.predict(*run_args(bad, case["question"], case["caption"], case["ocr"]), api_name="/run")
    with pytest.raises(AppError, match="question is empty"):
        client.predict(*run_args(path, "   ", case["caption"], case["ocr"]), api_name="/run")
    with pytest.raises(AppError, match="limit is"):
        client.predict(*run_args(path, "x" * (MAX_QUESTION_CHARS + 1), case["caption"], case["ocr"]), api_name="/run")
    long_q = "".join(chr(0x4E00 + (i * 37) % 2000) for i in range(MAX_QUESTION_CHARS - 10))  # > 4096 tokens
    with pytest.raises(AppError, match="context window"):
        client.predict(*run_args(path, long_q, case["caption"], case["ocr"], max_new_tokens=1024), api_name="/run")
    with pytest.raises(AppError, match="max new tokens"):
        client.predict(*run_args(path, "q?", "", "", max_new_tokens=100000), api_name="/run")
    with pytest.raises(AppError, match="method="):
        client.predict(*run_args(path, "q?", "", "", method="nope"), api_name="/run")
    big = tmp / "big.png"
    import numpy as np
    from PIL import Image

    Image.fromarray(np.random.default_rng(0).integers(0, 255, (700, 800, 3), dtype=np.uint8)).save(big)
    assert big.stat().st_size > 2**20
    with pytest.raises(Exception, match="maximum file size"):  # gradio_client checks the app's limit
        client.predict(*run_args(big, "q?", "", ""), api_name="/run")
    import httpx

    demo = served[0]
    with big.open("rb") as fh:  # and the server refuses the upload itself
        assert httpx.post(demo.local_url + "gradio_api/upload", files={"files": fh}).status_code == 413
    # the server keeps serving
    out = outputs_as_dict(
        client.predict(*run_args(path, case["question"], case["caption"], case["ocr"], max_new_tokens=4, compare=False), api_name="/run")
    )
    ref = reference(tiny_pipe, path, case["question"], case["caption"], case["ocr"], max_new_tokens=4)
    check_spans_match(out["answer_html"], ref.trace)
    assert "comparison off" in out["floor_html"]


def test_concurrent_clients_get_complete_answers(served, tiny_pipe):
    from gradio_client import Client

    demo, _, tmp = served
    n = 3
    cases = []
    for i in range(n):
        c = make_case(20 + i)
        p = tmp / f"concurrent_{i}.png"
        c["image"].save(p)
        cases.append((p, c))
    results: dict[int, dict] = {}
    errors: list[BaseException] = []

    def worker(i):
        try:
            p, c = cases[i]
            client = Client(demo.local_url, verbose=False)
            results[i] = outputs_as_dict(
                client.predict(*run_args(p, c["question"], c["caption"], c["ocr"], max_new_tokens=6, compare=False), api_name="/run")
            )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert sorted(results) == list(range(n))
    for i, (p, c) in enumerate(cases):
        ref = reference(tiny_pipe, p, c["question"], c["caption"], c["ocr"], max_new_tokens=6)
        check_spans_match(results[i]["answer_html"], ref.trace)
        assert results[i]["answer_text"] == ref.text
        assert 'data-status="ok"' in results[i]["status"]


def test_cancelled_client_run_frees_its_rows(served, tiny_pipe):
    """A client that cancels (Gradio closes the /run handler) leaves no rows in the app's scheduler."""
    import time

    from gradio_client import Client

    demo, _, tmp = served
    state = demo.asymspec
    case = make_case(32)  # the random pair answers it at length
    path = tmp / "cancelled.png"
    case["image"].save(path)
    client = Client(demo.local_url, verbose=False)
    job = client.submit(*run_args(path, case["question"], case["caption"], case["ocr"], max_new_tokens=1024), api_name="/run")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and state.scheduler.live_rows < 3:
        time.sleep(0.01)
    assert state.scheduler.live_rows == 3  # the run's three rows are decoding
    job.cancel()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (state.scheduler.live_rows or state._live):
        time.sleep(0.05)
    assert state.scheduler.live_rows == 0 and state.scheduler.waiting == 0 and not state._live
    stopped = [j for jobs in state._sessions.values() for j in jobs if j.cancel.is_set() and not j.final_shown]
    assert len(stopped) == 1 and len(stopped[0].traces["main"]) < 1024  # stopped, not finished


def test_app_close_closes_its_scheduler(tiny_pipe):
    pytest.importorskip("gradio")
    from asymspec_mm.base.errors import AsymSpecError

    demo = ui_app.build_app(tiny_pipe, examples=[], max_batch_size=3)
    sched = demo.asymspec.scheduler
    assert sched.max_batch_size == 3 and demo.asymspec.scheduler is sched  # one per app
    with pytest.raises(ValueError, match="concurrency_limit"):
        ui_app.build_app(tiny_pipe, examples=[], concurrency_limit=0)
    demo.close()
    with pytest.raises(AsymSpecError, match="closed"):
        sched.submit(make_image(1), "q?")


# ------------------------------------------------------------------------------------------ issue 27: the demo as tried


def test_counts_read_as_english():
    from ui.align import alignment_summary
    from ui.outputs import STEERED_MEANING, done_summary

    trace = sample_trace()  # one steered token
    assert done_summary(1.0, trace, "asymspec").endswith(f"; 1 token steered ({STEERED_MEANING})")
    assert "; 2 tokens steered (" in done_summary(1.0, trace + trace[1:2], "asymspec")
    assert "steered" not in done_summary(1.0, trace, "floor")
    assert alignment_summary(1, 20, 3) == "1 of 20 positions differs; first difference at token #3"
    assert alignment_summary(3, 20, 3) == "3 of 20 positions differ; first difference at token #3"
    assert "1 token \u00b7" in render_panel("A", trace[:1], FakeTokenizer()) and "1 tokens" not in render_panel("A", trace[:1])


def test_set_up_status_of_a_lone_user_says_what_happens(tiny_pipe, tmp_path):
    """A lone user's run: its rows are set up side by side (the scheduler's set-up threads) while the drafter writes
    the caption, which the status says in those words, not as a queue of other users."""
    import time

    case = make_case(60)
    path = tmp_path / "alone.png"
    case["image"].save(path)
    state = ui_app.DemoApp(tiny_pipe, stream_interval=0.0)
    models = contextlib.ExitStack()  # the models held while it is open
    models.enter_context(held_forwards(tiny_pipe))  # the caption's forwards wait: the set-ups stand still
    try:
        gen = state.run(*demo_args(path, {**case, "caption": ""}, autofill=True), session="alone")
        out = first = outputs_as_dict(next(gen))
        status = first["status"]
        deadline = time.monotonic() + 120
        while "Setting up AsymSpec, Floor and the drafter alone" not in status and time.monotonic() < deadline:
            out = outputs_as_dict(next(gen))  # a heartbeat: the status as the rows now stand
            status = out["status"] if isinstance(out["status"], str) else status
        assert "Setting up AsymSpec, Floor and the drafter alone: writing the caption, then prefill." in status, status
        assert "in line" not in status and "Queued" not in status and "waiting" not in status
        assert "setting up: writing the caption, then prefill" in out["answer_html"]
        assert "setting up: prefill" in out["floor_html"]  # its set-up waits for the same caption, written once
        models.close()
        last = outputs_as_dict(list(gen)[-1])
        assert "Done" in last["status"]
    finally:
        models.close()
        state.close()


def test_progress_text_tells_own_rows_from_other_users_rows():
    from ui.progress import Row, panel_wait_text, progress_text, setup_steps

    steps = setup_steps(caption=False, ocr=True)
    assert steps == "reading the text (OCR), then prefill" and setup_steps(False, False) == "prefill"
    behind = [Row("AsymSpec", 0, "running", 2, waited=1.25), Row("Floor", 0, "running", 3), Row("the drafter alone", 0, "running", 4)]
    assert progress_text(behind) == (
        "AsymSpec, Floor and the drafter alone wait behind 2 rows of other users for a place in the batch "
        "(3rd, 4th and 5th in line); waiting 1.2 s."
    )
    assert panel_wait_text(behind[1], behind) == "waiting behind 2 rows of other users (4th in line)"
    full = [Row("AsymSpec", 0, "running", 0), Row("Floor", 0, "running", 1)]
    assert (
        progress_text(full, live_rows=8, max_batch_size=8) == "AsymSpec and Floor wait for a free row: the batch is full (8 rows decoding)."
    )
    assert progress_text(full, live_rows=3, max_batch_size=8) == "AsymSpec and Floor are next to be set up."
    mixed = [Row("AsymSpec", 5, "running"), Row("Floor", 12, "done"), Row("the drafter alone", 0, "running", 0)]
    assert progress_text(mixed) == "Running AsymSpec 5 tokens, Floor 12 tokens (done). The drafter alone is next to be set up."
    unknown = [Row("AsymSpec", 0, "running", known=False)]
    assert progress_text(unknown, waiting_total=1) == "Running AsymSpec: waiting for the models (1 row waiting for a place in the batch)..."


def test_generated_view_is_marked_and_a_new_image_empties_it(tiny_pipe, tmp_path):
    """A run that fills the caption: the field is the app's (marked) until the user edits it; a new image empties
    it while the user's own OCR text stays."""
    case = make_case(61)
    path = tmp_path / "view.png"
    case["image"].save(path)
    state = ui_app.DemoApp(tiny_pipe, stream_interval=0.0)
    try:
        out = outputs_as_dict(list(state.run(*demo_args(path, {**case, "caption": "", "ocr": "12 34"}, autofill=True), session="v"))[-1])
        written = tiny_pipe.compressed_view(str(path), caption=None, ocr=False).caption
        assert out["caption"] == written and written and out["ocr"] == "12 34"
        cap, ocr = state.view_marks(out["caption"], out["ocr"], "v")
        assert cap["elem_classes"] == ["asym-generated"] and "Written by the drafter" in cap["info"]
        assert ocr["elem_classes"] == [] and not ocr["info"]  # typed by the user: no line under it
        # the same caption sent back unchanged stays the app's; an edited one becomes the user's
        again = outputs_as_dict(list(state.run(*demo_args(path, {**case, "caption": written, "ocr": "12 34"}), session="v"))[-1])
        assert state.view_marks(again["caption"], again["ocr"], "v")[0]["elem_classes"] == ["asym-generated"]
        cap, ocr = state.image_changed(written, "12 34", "v")
        assert cap["value"] == "" and "value" not in ocr  # the generated caption goes, the typed OCR stays
        assert state.views.get("v") == {}
        # an edited caption survives a new image
        list(state.run(*demo_args(path, {**case, "caption": ""}, autofill=True), session="w"))
        import gradio as gr

        assert state.view_edited(written + " (mine)", "", "w")[0]["elem_classes"] == []
        assert state.view_edited(written + " (mine)!", "", "w") == (gr.skip(), gr.skip())
        assert "value" not in state.image_changed(written + " (mine)!", "", "w")[0]
    finally:
        state.close()
