"""OCR in worker processes (issue #42: OCR beside the engine loop): the same items as the engine in-process, a worker
that dies fails only the read it was doing, and no worker outlives its engine or pipeline.

Behaviour only, nothing timed (``python -m asymspec_mm.bench.admission --ocr rapidocr --ocr-workers 0,1`` measures).
Spawned workers cost about a second each, so the module shares one RapidOCR pool; the failure and clean-up tests use
a stand-in engine that loads nothing.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing
import os
import threading
import time

import pytest
from PIL import Image, ImageDraw
from test_ocr import _font, render_lines

from asymspec_mm.base.errors import OCRUnavailableError, UnknownOptionError
from captioning.ocr import DEFAULT_OCR_CACHE, OCREngine, OCRItem, RapidOCREngine, get_ocr_engine
from captioning.ocr.workers import OCRWorkerError, ProcessOCREngine

CRASH_WIDTH = 13  # the stand-in engine's worker exits on an image this wide
HANG_WIDTH = 17  # and hangs on an image this wide


class StandInEngine(OCREngine):
    """Reads one item naming the image's size and the reading process (``"20x10 pid 1234"``); its worker process exits
    (as a crash would) on a ``CRASH_WIDTH``-wide image. Module level: the spawned workers import it."""

    name = "stand-in"

    def _read_unordered(self, image: Image.Image) -> list[OCRItem]:
        w, h = image.size
        if w == CRASH_WIDTH:
            os._exit(7)
        if w == HANG_WIDTH:
            time.sleep(3600)
        return [OCRItem(box=[[0, 0], [w, 0], [w, h], [0, h]], text=f"{w}x{h} pid {os.getpid()}")]


def _pid(item: OCRItem) -> int:
    return int(item.text.split()[-1])


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (reaped children do not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _children_of(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (Linux: read from /proc)."""
    from pathlib import Path

    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


def _children() -> set[int]:
    return {p.pid for p in multiprocessing.active_children()}


@pytest.fixture(scope="module")
def in_process() -> RapidOCREngine:
    try:
        return RapidOCREngine(threads=1)
    except OCRUnavailableError as exc:
        pytest.skip(f"RapidOCR unavailable ({exc})")


@pytest.fixture(scope="module")
def workers(in_process: RapidOCREngine):
    engine = ProcessOCREngine("rapidocr", workers=2, threads=1, nice=5)
    yield engine
    engine.close()


def _grid() -> Image.Image:
    """Four words in two jittered rows on a transparent background (``to_rgb`` composites it on white)."""
    image = Image.new("RGBA", (640, 300), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    for word, xy in {"alpha": (40, 40), "bravo": (380, 52), "charlie": (40, 200), "delta": (380, 188)}.items():
        draw.text(xy, word, fill="black", font=_font("DejaVuSans.ttf", 36))
    return image


def test_the_same_items_as_in_process(workers: ProcessOCREngine, in_process: RapidOCREngine) -> None:
    images = [render_lines(["AB = 7 cm", "x = 42.5"], "DejaVuSans.ttf", 30), _grid(), Image.new("L", (90, 60), 255)]
    for image in images:
        assert workers.read(image) == in_process.read(image)
    assert [it.text.lower() for it in workers.read(images[1])] == ["alpha", "bravo", "charlie", "delta"]
    assert workers.read_text(images[0], "inline") == in_process.read_text(images[0], "inline") != ""
    assert workers.read(images[2]) == []
    assert workers.name == "rapidocr" and workers.cache_key == in_process.cache_key  # cached and reported as the engine
    assert 1 <= len(workers.worker_pids()) <= 2 and os.getpid() not in workers.worker_pids()  # spawned as reads need them


def test_concurrent_reads_get_their_own_items(workers: ProcessOCREngine, in_process: RapidOCREngine) -> None:
    texts = ["x = 42.5", "AB = 7 cm", "y = 3x + 2"]
    images = [render_lines([t], "DejaVuSans.ttf", 30) for t in texts]
    expected = [in_process.read(img) for img in images]
    got: dict[int, list[OCRItem]] = {}

    def read(i: int) -> None:
        got[i] = workers.read(images[i])

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(images))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i] for i in range(len(images))] == expected


def test_auto_resolves_to_the_engine_it_picks() -> None:
    engine = ProcessOCREngine("auto", workers=1, candidates=("rapidocr",))  # EasyOCR's weight check hashes 100 MB
    assert engine.name == get_ocr_engine("auto", candidates=("rapidocr",)).name == "rapidocr"
    assert engine.worker_pids() == []  # nothing started to know it
    with pytest.raises(ValueError):
        ProcessOCREngine("rapidocr", workers=0)
    with pytest.raises(ValueError):
        ProcessOCREngine(StandInEngine, workers=1, languages=("en",))


def test_a_dying_worker_fails_its_read_and_the_next_read_gets_a_new_one() -> None:
    with ProcessOCREngine(StandInEngine, workers=1) as engine:
        (first,) = engine.read(Image.new("RGB", (20, 10)))
        assert first.text.startswith("20x10 pid") and engine.name == "stand-in"
        (pid,) = engine.worker_pids()
        with pytest.raises(OCRWorkerError) as failure:
            engine.read(Image.new("RGB", (CRASH_WIDTH, 10)))
        message = str(failure.value)
        assert "died" in message and "stand-in" in message and "\n" not in message
        (after,) = engine.read(Image.new("RGB", (21, 10)))
        assert after.text.startswith("21x10 pid") and _pid(after) != pid and not _alive(pid)
        # killed between reads: at most one read fails, then a new worker reads
        (pid,) = engine.worker_pids()
        os.kill(pid, 9)
        try:
            engine.read(Image.new("RGB", (22, 10)))
        except OCRWorkerError:
            pass
        assert engine.read(Image.new("RGB", (23, 10)))[0].text.startswith("23x10 pid")


def test_a_hung_worker_fails_its_read_after_the_timeout_and_is_stopped() -> None:
    # A read's timeout counts from its submission, a worker's spawn included (seconds on a loaded machine): the worker
    # is started and waited for (start(), no time limit), only the read that hangs runs with the 5 s timeout, and the
    # reads around it may take as long as a loaded machine makes them.
    with ProcessOCREngine(StandInEngine, workers=1, read_timeout=120).start() as engine:
        engine.read(Image.new("RGB", (20, 10)))
        (pid,) = engine.worker_pids()
        engine.read_timeout = 5
        start = time.monotonic()
        with pytest.raises(OCRWorkerError) as failure:
            engine.read(Image.new("RGB", (HANG_WIDTH, 10)))
        assert 5 <= time.monotonic() - start < 600  # the hung read sleeps an hour: it ended on the timeout
        assert str(failure.value) == (
            f"the stand-in OCR worker did not answer within 5 s for this {HANG_WIDTH}x10 image (the request failed; the "
            "worker was stopped and the next read starts a new one)"
        )
        assert engine.worker_pids() == []  # stopped
        engine.read_timeout = 120
        (after,) = engine.read(Image.new("RGB", (21, 10)))
        assert _pid(after) != pid
        deadline = time.monotonic() + 120
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid)
    for bad in (0, -1, True, "5"):
        with pytest.raises(ValueError, match="read_timeout="):
            ProcessOCREngine(StandInEngine, read_timeout=bad)


def test_close_and_garbage_collection_leave_no_worker() -> None:
    engine = ProcessOCREngine(StandInEngine, workers=2).start()
    pids = engine.worker_pids()
    assert 1 <= len(pids) <= 2 and set(pids) <= _children()
    engine.close()
    assert engine.worker_pids() == [] and not any(_alive(p) for p in pids) and not set(pids) & _children()
    assert engine.read(Image.new("RGB", (5, 5)))[0].text.startswith("5x5 pid")  # a read after close starts a new pool
    pids = engine.worker_pids()
    assert pids
    del engine
    gc.collect()
    assert not any(_alive(p) for p in pids)


# --------------------------------------------------------------------------------------------- in a pipeline


def test_pipeline_reads_in_workers_and_close_stops_them(tiny_dirs, in_process: RapidOCREngine) -> None:
    from asymspec_mm import AsymSpecPipeline

    image = render_lines(["x = 42.5"], "DejaVuSans.ttf", 34).resize((256, 128))
    DEFAULT_OCR_CACHE.clear()  # the in-process read below must not serve the workers' request from the cache
    with AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="rapidocr", ocr_workers=1) as pipe:
        engine = pipe.ocr_engine
        assert isinstance(engine, ProcessOCREngine) and engine.worker_pids() == []  # started by the first read
        res = pipe.generate(image, "What is x?", caption="a formula", max_new_tokens=2)
        pids = engine.worker_pids()
        assert len(pids) == 1
    assert not any(_alive(p) for p in pids)
    assert res.stats["ocr_engine"] == "rapidocr" and res.view.ocr_text == in_process.read_text(image) != ""
    with pytest.raises(UnknownOptionError, match="needs an OCR engine name"):
        AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr=in_process, ocr_workers=1)
    with pytest.raises(UnknownOptionError):
        AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="rapidocr", ocr_workers=-1)


def test_a_dying_worker_fails_only_its_request_in_the_scheduler(tiny_pipe) -> None:
    from asymspec_mm import AsymSpecPipeline

    engine = ProcessOCREngine(functools.partial(StandInEngine), workers=1)
    pipe = AsymSpecPipeline(
        tiny_pipe.drafter, tiny_pipe.processor, tiny_pipe.verifier, tiny_pipe.verifier_tokenizer, ocr=engine, check_vocab=False
    )
    try:
        with pipe.scheduler(max_batch_size=2) as sched:
            crash = sched.submit(Image.new("RGB", (CRASH_WIDTH, 40)), "What is shown?", caption="a chart", max_new_tokens=2)
            fine = sched.submit(Image.new("RGB", (41, 40)), "What is shown?", caption="a chart", max_new_tokens=2)
            with pytest.raises(OCRWorkerError, match="died"):
                crash.result(timeout=120)
            res = fine.result(timeout=120)
        assert res.view.ocr_text.startswith("41x40 pid") and res.stats["ocr_engine"] == "stand-in"
    finally:
        engine.close()
    assert engine.worker_pids() == []


def test_serve_reads_in_a_worker_and_stops_it_on_exit(tiny_dirs, in_process: RapidOCREngine, monkeypatch) -> None:
    """``asymspec-mm serve`` (default ``--ocr-workers 1``): a request's OCR is read in a worker; the worker is gone
    once the command returns. The real app is served on a thread in place of the blocking ``serve``."""
    import base64
    import io

    import httpx

    import asymspec_mm.frontend.options as options
    import asymspec_mm.serve.server as server
    from asymspec_mm.cli.main import build_parser, main

    assert build_parser().parse_args(["serve"]).ocr_workers == 1
    assert build_parser().parse_args(["serve", "--ocr-workers", "0"]).ocr_workers == 0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--ocr-workers", "-1"])
    image = render_lines(["x = 42.5"], "DejaVuSans.ttf", 34).resize((256, 128))
    buf = io.BytesIO()
    image.save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    body = {
        "model": "any",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "x?"}]}],
        "max_tokens": 2,
        "asymspec": {"caption": "a formula", "method": "floor"},  # no OCR text: the engine reads it
    }
    seen: dict = {}
    load = options.pipeline_from_args

    def loading(args, **kwargs):
        seen["pipe"] = load(args, **kwargs)
        return seen["pipe"]

    def serving(app, sock, log_level="info"):
        with server.ServerThread(app) as srv:
            seen["response"] = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
            seen["pids"] = seen["pipe"].ocr_engine.worker_pids()

    monkeypatch.setattr(options, "pipeline_from_args", loading)
    monkeypatch.setattr(server, "serve", serving)
    DEFAULT_OCR_CACHE.clear()
    assert main(["serve", "--drafter", str(tiny_dirs[0]), "--verifier", str(tiny_dirs[1]), "--ocr-engine", "rapidocr", "--port", "0"]) == 0
    response = seen["response"]
    assert response.status_code == 200, response.text
    assert response.json()["asymspec"]["view"]["ocr_text"] == in_process.read_text(image) != ""
    assert len(seen["pids"]) == 1 and not _alive(seen["pids"][0])


def test_ctrl_c_on_the_server_leaves_no_worker(in_process: RapidOCREngine) -> None:
    """``python -m asymspec_mm.cli serve --preset tiny`` (RapidOCR, one worker by default), Ctrl-C after a request
    whose text OCR read: every process it started is gone (the worker and multiprocessing's resource tracker)."""
    import base64
    import io
    import sys
    import time
    from pathlib import Path

    import httpx
    from conftest import start_serve, stop_serve

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""}
    proc, url = start_serve([sys.executable, "-m", "asymspec_mm.cli", "serve", "--preset", "tiny", "--port", "0"], root, env)
    try:
        image = render_lines(["10 8 6 4"], "DejaVuSans.ttf", 30)
        buf = io.BytesIO()
        image.save(buf, "PNG")
        url_image = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
        message = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url_image}}, {"type": "text", "text": "?"}]}
        body = {"messages": [message], "max_tokens": 2, "asymspec": {"caption": "a chart", "method": "floor"}}
        response = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        extra = response.json()["asymspec"]
        assert extra["stats"]["ocr_engine"] == "rapidocr" and extra["view"]["ocr_text"] == in_process.read_text(image, "inline") != ""
        children = _children_of(proc.pid)
        assert children, "the server started no OCR worker"
    finally:
        stop_serve(proc)
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if _alive(pid)]


# --------------------------------------------------------------------------------------------- the benchmark's parts


def test_bench_figures_arms_and_contention_run(tiny_pipe) -> None:
    """The admission benchmark's OCR parts, on numbers and a short run (what they print is not checked)."""
    from asymspec_mm.bench.admission import Arm, arms_of, measure_contention, measure_lock_wait, stall_figures

    stamps = [0.0, 0.1, 0.2, 0.3, 1.3, 1.4, 1.6, 1.8, 2.0]  # a 1.0 s gap in the set-up window, then 0.2 s steps
    got = stall_figures(stamps, (0.35, 1.45), after_steps=3)
    # the gaps overlapping the window: 1.0, 0.1 and 0.2 s; after it: 0.2 and 0.2 s
    assert got["mean_step_setup_s"] == pytest.approx(1.3 / 3) and got["mean_step_after_s"] == pytest.approx(0.2)
    assert got["setup_vs_after"] == pytest.approx(1.3 / 0.6) and got["p99_gap_setup_s"] == pytest.approx(1.0)
    arms = arms_of("none,rapidocr", "0,1", "0,1", "0,10")
    assert arms[0] == Arm("none") and len(arms) == 1 + 2 + 4 and len(set(arms)) == len(arms)  # nice only with workers
    assert Arm("rapidocr", 1, 1).label == "rapidocr in 1 worker process, 1 thread"
    case = {"image": Image.new("RGB", (64, 64), "white"), "question": "What is shown?", "caption": "a chart"}
    with ProcessOCREngine(StandInEngine, workers=1) as engine:
        r = measure_contention(tiny_pipe, case, [case["image"]], engine, steps=8, warm_steps=2)
        assert r["ocr_per_s"] > 0 and r["longest_gap_s"] >= r["p99_step_s"] >= r["median_step_s"] > 0
        assert set(measure_lock_wait([case["image"]], engine, seconds=0.05)) == {"lock_wait_mean_s", "lock_wait_p99_s"}
    assert measure_contention(tiny_pipe, case, [], None, steps=5, warm_steps=1)["ocr_per_s"] == 0.0
