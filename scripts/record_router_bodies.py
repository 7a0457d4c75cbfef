"""Record the request bodies that vllm-router and SGLang's gateway forward to a replica (run once; the output is
``tests/data/router_bodies/``, which ``tests/test_router_bodies.py`` reads).

A stand-in backend on 127.0.0.1 records every POST it receives and answers with a fixed OpenAI-shaped reply (streamed
when asked). Each case of ``tests/router_cases.py`` (real ``openai``-client calls: chat, completions, Responses;
streamed and not; tools, images, the ``asymspec`` extension) is sent once straight to the backend (the client's own
body) and once through each router (the body the router forwards). Writes ``<router>.json``: the router's version and
command, and per case the endpoint, the client's body, the forwarded body and the ``x-*`` headers the router added.

    pip install vllm-router==0.1.17 sglang-router==0.3.2    # a scratch venv is fine: ASYMSPEC_ROUTER_BIN=<venv>/bin
    python scripts/record_router_bodies.py [--out tests/data/router_bodies] [--router vllm-router ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from router_cases import CASES, POLICY, ROUTERS, VERSIONS, running_router, send, shown_command  # noqa: E402

MODELS = {"object": "list", "data": [{"id": "tiny", "object": "model", "created": 0, "owned_by": "asymspec-mm"}]}
USAGE = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}


def _chat_reply(stream: bool) -> list[dict[str, Any]]:
    base = {"id": "chatcmpl-1", "created": 0, "model": "tiny"}
    if not stream:
        message = {"role": "assistant", "content": "ok"}
        return [
            {**base, "object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": USAGE}
        ]
    chunk = {**base, "object": "chat.completion.chunk"}
    return [
        {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": None}]},
        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**chunk, "choices": [], "usage": USAGE},
    ]


def _completion_reply(stream: bool) -> list[dict[str, Any]]:
    base = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "tiny"}
    if not stream:
        return [{**base, "choices": [{"index": 0, "text": "ok", "logprobs": None, "finish_reason": "stop"}], "usage": USAGE}]
    return [
        {**base, "choices": [{"index": 0, "text": "ok", "logprobs": None, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}]},
        {**base, "choices": [], "usage": USAGE},
    ]


def _response_reply(stream: bool) -> list[dict[str, Any]]:
    text = {"type": "output_text", "text": "ok", "annotations": []}
    response = {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "model": "tiny",
        "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [text]}],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 5,
            "output_tokens": 1,
            "total_tokens": 6,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }
    if not stream:
        return [response]
    created = {**response, "status": "in_progress", "output": [], "usage": None}
    return [
        {"type": "response.created", "sequence_number": 0, "response": created},
        {"type": "response.completed", "sequence_number": 1, "response": response},
    ]


REPLIES = {"/v1/chat/completions": _chat_reply, "/v1/completions": _completion_reply, "/v1/responses": _response_reply}


class Recorder(ThreadingHTTPServer):
    """The stand-in backend: ``received`` holds (path, headers, body) of every POST, in arrival order."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Recorder

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path in ("/health", "/v1/health"):
            self._json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._json(200, MODELS)
        else:  # /get_server_info, /get_load, ...: what the server answered when these were recorded
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error", "code": "not_found"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        headers = {k.lower(): v for k, v in self.headers.items()}
        with self.server.lock:
            self.server.received.append((self.path, headers, body))
        reply = REPLIES.get(self.path)
        if reply is None:
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error", "code": "not_found"}})
            return
        chunks = reply(bool(body.get("stream")))
        if not body.get("stream"):
            self._json(200, chunks[0])
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for chunk in chunks:
            event = f"event: {chunk['type']}\n" if self.path == "/v1/responses" else ""
            self.wfile.write(f"{event}data: {json.dumps(chunk)}\n\n".encode())
        if self.path != "/v1/responses":
            self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def record(backend: Recorder, base_url: str, name: str) -> tuple[dict[str, str], dict[str, Any], dict[str, list[str]]]:
    """Send case ``name`` to ``base_url``: (headers, body) of the POST to the case's endpoint the backend received,
    and the other POSTs the router made for it (path -> the body's keys; vllm-router's ``cache_aware`` asks for
    ``/v1/chat/completions/render`` and ``/tokenize`` first)."""
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=30)
    with backend.lock:
        backend.received.clear()
    endpoint = CASES[name][0]
    send(client, name)
    with backend.lock:
        got = list(backend.received)
    answered = [(headers, body) for path, headers, body in got if path == endpoint]
    if len(answered) != 1:
        raise RuntimeError(f"{name}: the backend received {len(answered)} requests to {endpoint}, expected 1")
    return answered[0][0], answered[0][1], {path: sorted(body) for path, _, body in got if path != endpoint}


def main(argv: list[str] | None = None) -> int:
    import openai

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "router_bodies")
    ap.add_argument("--router", action="append", choices=list(ROUTERS), help="record only these (default: both)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    backend = Recorder()
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    try:
        direct = {name: record(backend, backend.url, name) for name in CASES}
        for router in args.router or list(ROUTERS):
            cases = {}
            with running_router(router, backend.url, log=args.out / f"{router}.log") as url:
                for name in CASES:
                    try:
                        headers, body, side = record(backend, url, name)
                    except openai.APIStatusError as exc:  # the router itself refuses the client's body
                        cases[name] = {
                            "path": CASES[name][0],
                            "client_body": direct[name][1],
                            "router_refused": f"{exc.status_code} {exc.message}",
                        }
                        continue
                    added = {k: v for k, v in headers.items() if k.startswith("x-") and k not in direct[name][0]}
                    cases[name] = {
                        "path": CASES[name][0],
                        "client_body": direct[name][1],
                        "router_body": body,
                        "router_headers": added,
                        "other_requests": side,
                    }
            (args.out / f"{router}.log").unlink()
            doc = {"router": router, "version": VERSIONS[router], "policy": POLICY, "command": shown_command(router), "cases": cases}
            (args.out / f"{router}.json").write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n", encoding="utf-8")
            print(f"{router}: {len(cases)} bodies -> {args.out / (router + '.json')}")
    finally:
        backend.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
