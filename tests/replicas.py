"""Real ``asymspec-mm serve --preset tiny`` replicas as subprocesses (so that a test can SIGKILL or SIGTERM one), and
the routers in front of them: the process helpers the failover tests and the soak benchmark share.

- :func:`start_replica` starts one replica on a free 127.0.0.1 port and returns a :class:`Replica` once ``/ready``
  answers 200; :func:`running_replicas` starts several and stops every one left on exit.
- :func:`start_router` / :func:`running_router` start a router (``vllm-router`` or SGLang's ``smg``) in front of
  them with extra flags (:data:`router_cases.ROUTERS`); :func:`router_or_skip` skips a test, naming the install
  line, where a router is absent.

Everything binds 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from conftest import start_serve
from router_cases import ROUTER_BIN_ENV, VERSIONS, router_executable, running_router

ROOT = Path(__file__).resolve().parents[1]
#: The environment of a replica: this checkout's code, no network, no GPU (CPU threads are the machine's).
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""}
READY_S = 180.0

__all__ = ["ENV", "Replica", "router_or_skip", "running_replicas", "running_router", "start_replica", "wait_ready"]


@dataclass
class Replica:
    """One ``serve`` subprocess and its base URL (no ``/v1``)."""

    proc: subprocess.Popen
    url: str

    def kill(self) -> None:
        """SIGKILL: the process dies at once, its connections reset (a crash, an OOM kill)."""
        self.proc.kill()
        self.proc.wait(30)

    def terminate(self) -> None:
        """SIGTERM: the server drains (``--drain-timeout``) and exits; does not wait."""
        self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """End the process if it still runs (SIGTERM, SIGKILL after 30 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def wait_ready(url: str, timeout: float = READY_S) -> None:
    """Wait until ``url/ready`` answers 200 (the models loaded, not draining); AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/ready", timeout=5).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"{url}/ready did not answer 200 within {timeout:.0f} s")


def start_replica(*flags: str, preset: str = "tiny") -> Replica:
    """``python -m asymspec_mm.cli serve --preset PRESET --port 0 --ocr-workers 0 FLAGS`` on 127.0.0.1, ready."""
    cmd = [sys.executable, "-m", "asymspec_mm.cli", "serve", "--preset", preset, "--port", "0", "--ocr-workers", "0", *flags]
    proc, url = start_serve(cmd, ROOT, ENV, timeout=READY_S)
    replica = Replica(proc, url)
    try:
        wait_ready(url)
    except AssertionError:
        replica.stop()
        raise
    return replica


@contextlib.contextmanager
def running_replicas(count: int, *flags: str) -> Iterator[list[Replica]]:
    """``count`` replicas (each with ``flags``), started at once (loading side by side halves the wait on a busy
    machine), every one still running stopped on exit. A replica that fails to start raises its error."""
    from concurrent.futures import ThreadPoolExecutor

    replicas: list[Replica] = []
    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(start_replica, *flags) for _ in range(count)]
    try:
        replicas = [f.result() for f in futures if f.exception() is None]
        for f in futures:
            if f.exception() is not None:
                raise f.exception()
        yield replicas
    finally:
        for replica in replicas:
            replica.stop()


def router_or_skip(name: str) -> None:
    """Skip the calling test, naming the install line, where router ``name``'s console script is absent."""
    import pytest

    if router_executable(name) is None:
        pytest.skip(f"{name} is not installed: pip install {name}=={VERSIONS[name]} (or set {ROUTER_BIN_ENV} to the bin folder holding it)")


def start_router(name: str, replicas: Sequence[Replica], *flags: str, log: Path | None = None, policy: str = "round_robin"):
    """:func:`router_cases.running_router` over ``replicas`` with extra router ``flags`` (a context manager yielding
    the router's base URL)."""
    return running_router(name, [r.url for r in replicas], log=log, policy=policy, extra=list(flags))
