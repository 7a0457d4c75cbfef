"""Running the app: :func:`bind_socket` (a busy port is a one-line error naming the port and the fix),
:func:`serve` (uvicorn in the foreground, a warning when the address is reachable from the network; SIGTERM
drains, :class:`DrainingServer`) and :class:`ServerThread` (uvicorn on a background thread, for tests and
notebooks)."""

from __future__ import annotations

import errno
import signal
import socket
import sys
import threading
import time
from typing import Any

from ..base.checks import is_int
from ..base.errors import AsymSpecError
from .drain import Drain
from .net import is_loopback


def bind_socket(host: str = "127.0.0.1", port: int = 8000) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port=0``: any free port; read it with ``sock.getsockname()[1]``)."""
    if not is_int(port, 0, 65535):
        raise AsymSpecError(f"--port {port!r} must be an integer between 0 and 65535")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise AsymSpecError(f"cannot use --host {host!r}: {exc.strerror}; pass an address such as 127.0.0.1") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free; one being listened on is not
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise AsymSpecError(
                f"port {port} on {host} is already in use (another server is listening there); stop it, or choose another port "
                f"with --port (e.g. --port {port + 1 if 0 < port < 65535 else 8001}, or --port 0 for any free one)"
            ) from None
        if exc.errno == errno.EACCES:
            raise AsymSpecError(f"no permission to bind port {port} on {host}; use a port of 1024 or more, e.g. --port 8000") from None
        raise AsymSpecError(f"cannot bind {host}:{port}: {exc.strerror or exc}; check --host and --port") from None
    sock.listen(128)  # hold the port (clients connecting while the models load wait in the backlog)
    return sock


def url_of(sock: socket.socket) -> str:
    """``http://host:port`` of a bound socket."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def warn_if_exposed(host: str, port: int, api_key: str | None) -> None:
    """Print a warning to stderr when ``host`` is reachable from other machines."""
    if is_loopback(host):
        return
    auth = "they need the API key" if api_key else "there is NO API key (--api-key), so they need nothing"
    print(
        f"asymspec-mm serve: WARNING: listening on {host}:{port}: anyone who can reach this machine can send requests "
        f"({auth}). Use the default --host 127.0.0.1 to keep the server local.",
        file=sys.stderr,
    )


def _config(app: Any, log_level: str):
    import uvicorn

    return uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=5, server_header=False)


def _draining_server_class() -> type:
    """:class:`DrainingServer` (made on first use: uvicorn is imported only when a server runs)."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn's server, but SIGTERM drains: the app refuses new work (``503`` + ``Retry-After``, readiness
        down), the requests in flight finish, those still running after ``drain_timeout`` seconds end with a clear
        error, then the server shuts down and :meth:`run` returns (SIGINT stops at once, as uvicorn does).
        ``drain``: the app's :class:`~asymspec_mm.serve.drain.Drain` (its timeout is ``--drain-timeout``).

        uvicorn alone re-raises a SIGTERM after its shutdown, which kills the process with the default action: the
        caller's clean-up (the OCR worker processes) never ran and they outlived the server."""

        def __init__(self, config: Any, drain: Drain) -> None:
            super().__init__(config)
            self.drain = drain

        def handle_exit(self, sig: int, frame: Any) -> None:
            if sig == signal.SIGTERM:  # not captured: nothing is re-raised once the server has stopped
                self.drain.begin()
                return
            super().handle_exit(sig, frame)

        async def on_tick(self, counter: int) -> bool:
            if self.drain.draining and self.drain.done():
                if self.drain.left() <= 0:
                    self.drain.expire()  # the late requests answer their error while uvicorn waits for them
                return True
            return await super().on_tick(counter)

    return DrainingServer


def serve(app: Any, sock: socket.socket, *, log_level: str = "info") -> None:
    """Serve ``app`` on ``sock`` (from :func:`bind_socket`) until SIGINT, or until SIGTERM and its drain (the app's
    :class:`~asymspec_mm.serve.drain.Drain`, ``app.state.asymspec.drain`` of
    :func:`~asymspec_mm.serve.app.create_app`: at most its ``drain_timeout``); then returns."""
    state = getattr(getattr(app, "state", None), "asymspec", None)
    drain = getattr(state, "drain", None) or Drain()  # another ASGI app: SIGTERM still stops it cleanly
    _draining_server_class()(_config(app, log_level), drain).run(sockets=[sock])


class ServerThread:
    """``app`` served on a background thread: ``with ServerThread(app) as srv: httpx.get(srv.url + "/health")``.

    Binds ``host:port`` at once (``port=0``: a free port), starts on :meth:`start` (or ``with``) and waits until
    the server accepts requests; :meth:`stop` shuts it down (the app's scheduler closes with it).
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning"):
        import uvicorn

        self.sock = bind_socket(host, port)
        self.url = url_of(self.sock)
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(_config(app, log_level))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, name="asymspec-serve", daemon=True)

    def start(self, timeout: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise AsymSpecError(f"the server on {self.url} did not start within {timeout} s")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
