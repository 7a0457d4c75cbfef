"""SIGTERM drains a real ``asymspec-mm serve`` process (issue #50, item 4, and its process leak): the requests in
flight finish with their full answers, a request that comes meanwhile gets 503 + ``Retry-After`` (connections are
refused once the server has exited), the process exits 0 within ``--drain-timeout``, and no process it started
outlives it (the OCR worker and multiprocessing's resource tracker included). A drain timeout shorter than a
request ends that request with a clear error, and the server still exits 0.

Each test starts ``python -m asymspec_mm.cli serve --preset tiny`` on a free 127.0.0.1 port and talks to it with the
``openai`` client on threads."""

from __future__ import annotations

import base64
import io
import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from conftest import start_serve
from test_ocr_workers import _alive

ROOT = Path(__file__).resolve().parents[1]
#: Every answer runs its whole token budget (vLLM's ignore_eos): requests stay in flight as long as the test needs.
LONG = {"ignore_eos": True}
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""}


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid`` (children, grandchildren, ...), with its command line (Linux: from /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                try:
                    found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    found[child] = "?"
                frontier.append(child)
    return found


def ocr_available() -> bool:
    try:
        from captioning.ocr import RapidOCREngine

        RapidOCREngine(threads=1).read_text(image_with_text())
    except Exception:  # noqa: BLE001 - any reason the engine cannot read: the test runs without OCR workers
        return False
    return True


def image_with_text():
    from test_ocr import render_lines

    return render_lines(["10 8 6 4"], "DejaVuSans.ttf", 30)


def ocr_message() -> dict:
    buf = io.BytesIO()
    image_with_text().save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]}


def prompt(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Tell me about the number {i} and what follows it."}]


def stream_answer(client: openai.OpenAI, messages: list[dict], max_tokens: int, out: dict, key: int, started: threading.Event) -> None:
    """One streamed chat answer: ``out[key]`` = (text, finish_reason), or the exception it raised."""
    try:
        text, finish = [], None
        stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens, stream=True, extra_body=LONG)
        for chunk in stream:
            started.set()
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        out[key] = ("".join(text), finish)
    except Exception as exc:  # noqa: BLE001 - the test reads it
        out[key] = exc


def start(*flags: str):
    cmd = [sys.executable, "-m", "asymspec_mm.cli", "serve", "--preset", "tiny", "--port", "0", *flags]
    return start_serve(cmd, ROOT, ENV)


def wait_for_load(url: str, running: int, waiting: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        load = httpx.get(url + "/get_load", timeout=30).json()[0]
        if (load["num_running_reqs"], load["num_waiting_reqs"]) == (running, waiting):
            return
        time.sleep(0.05)
    raise AssertionError(f"the server never had {running} running and {waiting} waiting requests; last {load}")


def test_sigterm_finishes_the_requests_in_flight_refuses_new_ones_and_leaves_no_process() -> None:
    with_ocr = ocr_available()
    drain_timeout = 300.0  # a bound on a hang: the requests in flight take seconds
    proc, url = start("--max-batch-size", "2", "--drain-timeout", str(drain_timeout), *(() if with_ocr else ("--ocr-workers", "0")))
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
        if with_ocr:  # a read starts the OCR worker (and multiprocessing's resource tracker)
            r = client.chat.completions.create(
                model="tiny", messages=[ocr_message()], max_tokens=2, extra_body={"asymspec": {"method": "floor"}}
            )
            assert r.model_extra["asymspec"]["stats"]["ocr_engine"] == "rapidocr"
        started_procs = descendants(proc.pid)
        if with_ocr:
            assert any("resource_tracker" in cmd for cmd in started_procs.values()), started_procs
            assert any("spawn_main" in cmd for cmd in started_procs.values()), started_procs
        max_tokens = 48
        references = [
            client.chat.completions.create(model="tiny", messages=prompt(i), max_tokens=max_tokens, extra_body=LONG).choices[0]
            for i in range(3)
        ]

        out: dict = {}
        events = [threading.Event() for _ in range(3)]
        threads = [
            threading.Thread(target=stream_answer, args=(client, prompt(i), max_tokens, out, i, events[i]), daemon=True) for i in range(3)
        ]
        for t in threads:
            t.start()
        wait_for_load(url, running=2, waiting=1)  # two rows decoding, the third request waiting for one
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()

        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="tiny", messages=prompt(9), max_tokens=2)
        assert refused.value.status_code == 503 and refused.value.response.headers["retry-after"] == "1"
        assert refused.value.body["code"] == "server_draining" and refused.value.body["type"] == "server_error"
        ready = httpx.get(url + "/ready", timeout=30)
        assert ready.status_code == 503 and ready.json()["status"] == "draining"

        for t in threads:
            t.join(drain_timeout)
        rc = proc.wait(timeout=drain_timeout)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert rc == 0
    assert took < drain_timeout
    for i, ref in enumerate(references):  # every request in flight finished with its whole answer
        assert out[i] == (ref.message.content, ref.finish_reason), (i, out[i])
    with pytest.raises(httpx.ConnectError):  # the listener is closed once the process has exited
        httpx.get(url + "/health", timeout=5)
    deadline = time.monotonic() + 120  # the resource tracker ends when it reads EOF from the exited server
    while any(_alive(pid) for pid in started_procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not {pid: cmd for pid, cmd in started_procs.items() if _alive(pid)}


@pytest.fixture(scope="module")
def loaded_after_503():
    """One ``serve`` (``--drain-timeout 1``, no OCR workers) for the two tests below, watched from its bind on: what
    ``/ready``, ``/health`` and a request got while the models loaded, then ``/ready`` and an answer once loaded;
    ``(proc, url, seen)``. Everything the loading test reads is recorded here, so that the drain test may stop the
    process whichever runs first (one start instead of two: a start is most of either test's time)."""
    import subprocess

    cmd = [sys.executable, "-m", "asymspec_mm.cli", "serve", "--preset", "tiny", "--port", "0", "--ocr-workers", "0"]
    proc = subprocess.Popen([*cmd, "--drain-timeout", "1"], cwd=ROOT, env=ENV, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        line = proc.stderr.readline()
        while line and "loading the models" not in line:
            line = proc.stderr.readline()
        url = line.split("; ", 1)[1].split()[0]
        seen: dict = {}
        ready = httpx.get(url + "/ready", timeout=30)  # the models take seconds to load: this comes before
        health = httpx.get(url + "/health", timeout=30)
        seen["loading"] = [(ready.status_code, ready.json()), (health.status_code, health.json())]
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
        try:
            client.chat.completions.create(model="tiny", messages=prompt(1), max_tokens=1)
        except openai.APIStatusError as exc:
            seen["refused"] = (exc.status_code, exc.response.headers.get("retry-after"), exc.body.get("code"))
        for line in proc.stderr:
            if "serving" in line:
                break
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        deadline = time.monotonic() + 60
        while httpx.get(url + "/ready", timeout=30).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        seen["ready"] = httpx.get(url + "/ready", timeout=30).json()["status"]
        seen["finish"] = client.chat.completions.create(model="tiny", messages=prompt(1), max_tokens=1).choices[0].finish_reason
        yield proc, url, seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_while_the_models_load_the_probes_and_requests_get_503_loading(loaded_after_503) -> None:
    """From the bind on, ``serve`` answers: ``/ready`` and ``/health`` 503 ``loading``, a request 503 with
    ``Retry-After`` (the ``openai`` client's APIStatusError); once loaded, /ready is 200 and a request is answered."""
    _, _, seen = loaded_after_503
    assert seen["loading"] == [(503, {"status": "loading"}), (503, {"status": "loading"})]
    assert seen.get("refused") == (503, "1", "model_loading")
    assert seen["ready"] == "ready" and seen["finish"]


def test_a_drain_timeout_shorter_than_a_request_ends_it_with_an_error_and_the_server_exits(loaded_after_503) -> None:
    proc, url, _ = loaded_after_503  # --drain-timeout 1
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    out: dict = {}
    started = threading.Event()
    streamed = threading.Thread(target=stream_answer, args=(client, prompt(1), 2000, out, 0, started), daemon=True)

    def whole() -> None:
        try:
            out[1] = client.chat.completions.create(model="tiny", messages=prompt(2), max_tokens=2000, extra_body=LONG)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            out[1] = exc

    plain = threading.Thread(target=whole, daemon=True)
    streamed.start()
    plain.start()
    wait_for_load(url, running=2, waiting=0)
    proc.send_signal(signal.SIGTERM)
    streamed.join(300)
    plain.join(300)
    rc = proc.wait(timeout=300)  # only a bound on a hang: the errors below say the drain timeout ended them
    assert isinstance(out[1], openai.APIStatusError) and out[1].status_code == 503, out[1]
    assert out[1].body["code"] == "drain_timeout" and "--drain-timeout 1 s" in out[1].body["message"]
    assert isinstance(out[0], openai.APIError) and "--drain-timeout 1 s" in str(out[0]), out[0]
    assert rc == 0


def test_sigterm_while_loading_exits_143_at_once() -> None:
    """A SIGTERM before the server runs unwinds the load (the clean-up runs) and exits as a SIGTERM'd process does."""
    import subprocess

    cmd = [sys.executable, "-m", "asymspec_mm.cli", "serve", "--preset", "tiny", "--port", "0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        line = proc.stderr.readline()
        while line and "loading the models" not in line:
            line = proc.stderr.readline()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 143
        assert "serving" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_a_drain_lingers_before_its_server_may_stop_even_when_idle(monkeypatch) -> None:
    """``--drain-linger``: a draining server may stop once idle AND the linger has passed (so routers take it out of
    rotation before its port closes), or at its deadline whatever is in flight; the linger never outlasts the
    timeout, 0 stops at once, and a bad value is one line naming the option. On a clock the test moves."""
    from types import SimpleNamespace

    from asymspec_mm.base.errors import AsymSpecError
    from asymspec_mm.serve import drain as drain_module
    from asymspec_mm.serve.drain import Drain

    now = [100.0]
    monkeypatch.setattr(drain_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    idle = Drain(timeout=10, linger=2)
    assert not idle.done()  # not draining
    idle.begin()
    assert not idle.done()
    now[0] += 1.5
    assert not idle.done()  # idle, still lingering
    now[0] += 0.5
    assert idle.done()
    busy = Drain(timeout=10, linger=2)
    busy.begin()
    busy.enter()
    now[0] += 5
    assert not busy.done()  # past the linger, a request in flight
    busy.leave()
    assert busy.done()
    busy.enter()
    now[0] += 5
    assert busy.done()  # the deadline, whatever is in flight
    at_once = Drain(timeout=10, linger=0)
    at_once.begin()
    assert at_once.done()
    short = Drain(timeout=1, linger=5)
    short.begin()
    now[0] += 1
    assert short.linger == 1 and short.done()
    for bad in (-1, float("nan"), float("inf"), True):
        with pytest.raises(AsymSpecError, match=r"drain_linger=.*\(--drain-linger\)"):
            Drain(linger=bad)
