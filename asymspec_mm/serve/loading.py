"""Answers while the models load: :class:`LoadingResponder` serves the bound socket with the standard library's HTTP
server until the app takes it over, so probes and clients get an answer instead of a connection that hangs in the
backlog: ``/health`` and ``/ready`` ``503 {"status": "loading"}``, any other request ``503`` with ``Retry-After``
and OpenAI's error object (``code: model_loading``). Stdlib only: it runs before FastAPI and torch are imported."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .drain import DRAIN_RETRY_AFTER_S
from .errors import RequestError


def loading_answer(path: str) -> tuple[dict, dict[str, str]]:
    """The body and headers of the 503 a request to ``path`` gets while the models load."""
    if path.split("?", 1)[0] in ("/health", "/ready"):
        return {"status": "loading"}, {}
    err = RequestError(
        503,
        "the server is loading its models and takes no requests yet; retry shortly",
        code="model_loading",
        headers={"Retry-After": str(DRAIN_RETRY_AFTER_S)},
    )
    return err.body(), err.headers


class _LoadingHandler(BaseHTTPRequestHandler):
    """Every method, every path: the 503 of :func:`loading_answer` (HTTP/1.0: the connection closes after it, so the
    client's next request reaches the app once it serves)."""

    def _answer(self) -> None:
        body, headers = loading_answer(self.path)
        data = json.dumps(body).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _answer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass  # the server's log is uvicorn's; a probe polling during the load is not news


class LoadingResponder:
    """Serve ``sock`` (bound and listening, from :func:`~asymspec_mm.serve.server.bind_socket`) with the loading
    503s on a background thread between :meth:`start` and :meth:`stop`; the socket stays open for the app."""

    def __init__(self, sock: socket.socket) -> None:
        self.server = ThreadingHTTPServer(sock.getsockname()[:2], _LoadingHandler, bind_and_activate=False)
        self.server.socket.close()  # the socket it made for itself: it serves the one already bound instead
        self.server.socket = sock  # no second bind, and stop() leaves it open
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self) -> LoadingResponder:
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop answering (the connections accepted so far get their answer); the socket is left to the app."""
        if self.thread.is_alive():
            self.server.shutdown()
            self.thread.join()
