"""Shared fixtures: small random-weight checkpoints built once per session and loaded through the real path."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# xdist runs one worker per core, and torch would give every worker (and every server or command a test starts, which
# inherit this) one OpenMP thread per core: on 2 cores that is 4+ spin-waiting threads, and the suite ran 2x slower
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

WORDS = (
    "red blue green chart bar value axis circle square triangle angle degrees label title "
    "left right top bottom count total sum largest smallest number line point area"
).split()


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """(drafter_dir, verifier_dir) of correlated random tiny checkpoints."""
    from asymspec_mm.checkpoints.small import build_tiny_checkpoints

    return build_tiny_checkpoints(tmp_path_factory.mktemp("tiny_ckpt"))


@pytest.fixture(scope="session")
def tiny_pipe(tiny_dirs):
    from asymspec_mm import AsymSpecPipeline

    return AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none")


@pytest.fixture(scope="module")
def eager_pipe(tiny_dirs):
    """The tiny pair with eager attention (the 2D mask becomes an additive float mask instead of SDPA's boolean)."""
    from asymspec_mm import AsymSpecPipeline

    pipe = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none")
    pipe.drafter.set_attn_implementation("eager")
    pipe.verifier.set_attn_implementation("eager")
    assert pipe.verifier.config._attn_implementation == "eager"
    assert pipe.drafter.config.get_text_config()._attn_implementation == "eager"
    return pipe


@pytest.fixture(scope="session")
def two_vocab_verifier(tmp_path_factory):
    """A random Qwen3 verifier with a tokenizer of another family than the tiny drafter's (tests/two_vocab_pair.py)."""
    from two_vocab_pair import build_verifier

    return build_verifier(tmp_path_factory.mktemp("two_vocab_verifier"))


@pytest.fixture(scope="session")
def two_vocab_pipe(two_vocab_verifier):
    """A cross-family pair: the bundled tiny drafter and :func:`two_vocab_verifier`, through ``from_pretrained``."""
    from two_vocab_pair import TINY_DRAFTER

    from asymspec_mm import AsymSpecPipeline

    return AsymSpecPipeline.from_pretrained(TINY_DRAFTER, two_vocab_verifier, ocr="none")


@pytest.fixture(scope="session")
def standin_dirs(tmp_path_factory):
    """(drafter_dir, verifier_dir): real-layout Qwen3-VL-2B / Qwen3-32B stand-ins (real hub files, small random weights)."""
    from asymspec_mm.checkpoints.standins import build_standin_pair

    return build_standin_pair(tmp_path_factory.mktemp("standins"))


@pytest.fixture(scope="session")
def standin_pipe(standin_dirs):
    from asymspec_mm import AsymSpecPipeline

    return AsymSpecPipeline.from_pretrained(*standin_dirs, ocr="none")


#: A function tool (OpenAI's chat shape) that the tests' tool parsing and tool-support checks share.
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]},
    },
}


def make_image(seed: int, size: tuple[int, int] | None = None):
    """A deterministic image with a few coloured rectangles."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    w, h = size or (rng.randint(40, 160), rng.randint(40, 160))
    img = Image.new("RGB", (w, h), tuple(rng.randint(0, 255) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    for _ in range(3):
        x0, y0 = rng.randint(0, w - 2), rng.randint(0, h - 2)
        draw.rectangle([x0, y0, rng.randint(x0 + 1, w), rng.randint(y0 + 1, h)], fill=tuple(rng.randint(0, 255) for _ in range(3)))
    return img


def saved_case(tmp_path, seed: int, name: str) -> tuple:
    """``(path, case)``: :func:`make_case` with its image saved to ``tmp_path / name`` and loaded back as the demo
    loads an upload (``case["pil"]``)."""
    from vision_cache.image import load_image

    case = make_case(seed)
    path = tmp_path / name
    case["image"].save(path)
    case["pil"] = load_image(str(path))
    return path, case


@pytest.fixture
def state(tiny_pipe):
    """The steering inspector's handlers on the tiny random pair (no Gradio server), closed after the test."""
    from ui import app as ui_app

    app = ui_app.DemoApp(tiny_pipe, stream_interval=0.0)
    try:
        yield app
    finally:
        app.close()


@pytest.fixture(scope="module")
def served_demo(tiny_pipe):
    """(demo, gradio_client.Client) of the steering inspector on the tiny random pair, served on a free port."""
    pytest.importorskip("gradio_client")
    import socket

    from gradio_client import Client

    from ui import app as ui_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo = ui_app.build_app(tiny_pipe, examples=[], stream_interval=0.0)
    ui_app.serve(demo, port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield demo, Client(demo.local_url, verbose=False)
    finally:
        demo.close()


@pytest.fixture(scope="module")
def shipped_tiny():
    """The shipped, trained tiny preset (OCR off): what a new user's ``from_preset("tiny")`` loads."""
    from asymspec_mm import AsymSpecPipeline

    return AsymSpecPipeline.from_preset("tiny", ocr="none")


@pytest.fixture(scope="module")
def served_tiny():
    """``asymspec-mm serve --preset tiny`` (OCR off) as a subprocess on a free loopback port: its base URL."""
    import os
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "asymspec_mm.cli", "serve", "--preset", "tiny", "--ocr-engine", "none", "--port", "0"]
    proc, url = start_serve(cmd, root, env)
    try:
        yield url
    finally:
        stop_serve(proc)


@pytest.fixture(scope="module")
def server_pipe(tiny_pipe):
    """The pipeline :func:`server` serves: the tiny random pair (a module overrides this fixture to serve another)."""
    return tiny_pipe


@pytest.fixture(scope="module")
def server_options():
    """``create_app``'s keyword arguments for :func:`server` (a module overrides this fixture for other limits)."""
    return {"max_batch_size": 4}


@pytest.fixture(scope="module")
def server(server_pipe, server_options):
    """``create_app(server_pipe, **server_options)`` served in a thread on a free loopback port, one per module:
    ``srv.url``, ``srv.state`` (the app's engine state: its scheduler, metrics) and ``srv.store`` (its Responses store)."""
    from asymspec_mm.serve import ServerThread, create_app

    app = create_app(server_pipe, **server_options)
    with ServerThread(app) as srv:
        srv.state = app.state.asymspec
        srv.store = app.state.responses_store
        yield srv


@pytest.fixture(scope="module")
def client_timeout():
    """Seconds the :func:`client` waits for an answer (a module overrides this fixture to fail faster)."""
    return 300


@pytest.fixture(scope="module")
def client(server, client_timeout):
    """The ``openai`` package's client of :func:`server`, without retries."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=client_timeout)


@pytest.fixture
def grammar_builds(monkeypatch):
    """The options of every grammar built from now on (each call of
    :func:`~asymspec_mm.request.grammar.output_grammar`, which the check at submission and the set-up's compile both
    build through), in order."""
    from asymspec_mm.request import grammar

    built: list[tuple] = []
    real = grammar.output_grammar

    def counted(tools, tool_choice, response_format):
        built.append((tool_choice, response_format))
        return real(tools, tool_choice, response_format)

    monkeypatch.setattr(grammar, "output_grammar", counted)
    return built


def deliver_in_thread(handle, listener) -> None:
    """A stand-in handle's ``listen`` (the scheduler's delivery): every step's events from iterating ``handle``, then
    its cancellation as an error, on a thread of its own."""
    import threading
    from concurrent.futures import CancelledError

    def deliver() -> None:
        try:
            for events in handle:
                listener("events", events)
        except CancelledError as exc:
            listener("error", exc)

    threading.Thread(target=deliver, daemon=True).start()


@contextlib.contextmanager
def held_forwards(pipe):
    """Every forward of ``pipe``'s models (any of their modules: the vision tower's too) waits while the block runs:
    the loop running them goes up to its next model forward, then stands still (what a set-up or a turn does before
    it still happens). Real forward pre-hooks on the real modules. Yields an event set once a forward waits."""
    import torch

    release, reached = threading.Event(), threading.Event()
    models = [m for m in (pipe.drafter, pipe.verifier, pipe.models.sd_drafter) if isinstance(m, torch.nn.Module)]

    def wait(*_) -> None:  # a pre-hook's return value would replace the forward's arguments
        reached.set()
        release.wait()

    hooks = [module.register_forward_pre_hook(wait) for model in models for module in model.modules()]
    try:
        yield reached
    finally:
        release.set()
        for hook in hooks:
            hook.remove()


def make_case(seed: int) -> dict:
    """A deterministic (image, question, caption, ocr) request."""
    rng = random.Random(1000 + seed)
    return {
        "image": make_image(seed),
        "question": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) + "?",
        "caption": " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 12))),
        "ocr": " ".join(str(rng.randint(0, 99)) for _ in range(rng.randint(0, 5))),
    }


def sigint_as_a_terminal_gives_it() -> None:
    """A ``preexec_fn`` for a child that a test stops with SIGINT: in the child before exec, SIGINT at its default
    disposition and unblocked, as a terminal starts a command. An ignored or blocked SIGINT is inherited through exec
    (a test run started in the background of a non-interactive shell ignores it), and then the child never sees it.
    Only calls into the already imported ``signal`` module: the child of a threaded process may not import."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def start_serve(cmd: list[str], cwd, env: dict[str, str], timeout: float = 600.0):
    """Start ``asymspec-mm serve ... --port 0`` as a subprocess (SIGINT at its default: :func:`stop_serve` sends it);
    return ``(proc, base_url)`` once it answers ``/health`` (the URL is read from its "serving ... on http://..."
    line on stderr, which stays drained)."""
    import subprocess
    import threading
    import time

    import httpx

    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        preexec_fn=sigint_as_a_terminal_gives_it,
    )
    url, seen, deadline = None, [], time.monotonic() + timeout
    while url is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if "serving" in line and " on http://" in line:
            url = line.split(" on ", 1)[1].split()[0].removesuffix("/v1")
    if url is None:
        proc.kill()
        raise AssertionError("the server did not start:\n" + "".join(seen))
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"{url}/health did not answer")


def stop_serve(proc) -> None:
    """SIGINT, then kill after 120 s (a shutdown on a loaded machine takes seconds; a kill skips its clean-up)."""
    import subprocess

    proc.send_signal(2)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


#: The test files that take longest (each over a minute on 2 cores), longest first. ``make test`` hands whole files to
#: two workers in collection order; started first, they no longer run alone at the end while the other worker idles.
LONGEST_FIRST = (
    "test_router_failover.py",
    "test_tiny_train.py",
    "test_batch.py",
    "test_tiny_agent.py",
    "test_minivista.py",
    "test_router_e2e.py",
    "test_readme.py",
    "test_ui.py",
    "test_decode_reference.py",
    "test_soak_bench.py",
    "test_router_sessions.py",
    "test_grammar.py",
)


def pytest_collection_modifyitems(config, items):
    """Run the :data:`LONGEST_FIRST` files first, in that order; every other file keeps its place (a stable sort)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
