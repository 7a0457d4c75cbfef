"""Replicas and routers as subprocesses on 127.0.0.1: ``asymspec-mm serve`` replicas (so that a run can SIGKILL or
SIGTERM one) and the routers people put in front of them, vllm-router (PyPI ``vllm-router``) and SGLang's Model
Gateway (PyPI ``sglang-router``, command ``smg``). The soak benchmark (:mod:`asymspec_mm.bench.soak`) and the router
tests start and stop their processes with these, so that both stop them the same way.

- :class:`Replica` is one ``serve`` process on a fixed free port (kept across a restart, so that a router finds it
  again); :func:`running_replicas` starts several side by side and stops every one left on exit.
- :func:`running_router` starts a router in front of them with a policy and extra flags; :func:`router_command` is
  its command line, :func:`shown_command` the same as docs/deployment.md shows it.

Every wait is bounded; a process that does not stop on its signal is killed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

#: The routers and their console scripts, and the versions tested (and the recorded router bodies come from).
ROUTERS = {"vllm-router": "vllm-router", "sglang-router": "smg"}
VERSIONS = {"vllm-router": "0.1.17", "sglang-router": "0.3.2"}
#: The routing policy of a router started without one (both routers' default).
POLICY = "cache_aware"
#: Each router's session policy and the header it reads the session key from (docs/deployment.md, "Sessions").
SESSION_POLICY = {"vllm-router": "consistent_hash", "sglang-router": "manual"}
SESSION_HEADER = {"vllm-router": "X-Session-Id", "sglang-router": "X-SMG-Routing-Key"}
#: Environment variable naming a folder holding the routers' console scripts (a venv's ``bin``) when they are not on PATH.
ROUTER_BIN_ENV = "ASYMSPEC_ROUTER_BIN"
#: The router settings docs/deployment.md documents for failover (the same flag names in both routers): a health
#: check every second that marks a replica down after 2 failures, a circuit breaker that opens after 2 failed
#: requests and tries the replica again after 30 s, and 3 retries (with a session policy, the first ones go to the
#: session's replica again: the circuit breaker opening after 2 is what moves the third to another one).
FAILOVER_FLAGS = (
    "--health-check-interval-secs", "1",
    "--health-check-timeout-secs", "2",
    "--health-failure-threshold", "2",
    "--cb-failure-threshold", "2",
    "--cb-timeout-duration-secs", "30",
    "--retry-max-retries", "3",
)  # fmt: skip
ROUTER_STARTUP_S = 60.0
REPLICA_READY_S = 180.0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    """Send ``sig`` to ``proc`` if it still runs and wait ``timeout`` s for its exit; SIGKILL after that."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def wait_until(check: Callable[[], bool], proc: subprocess.Popen, what: str, timeout: float) -> None:
    """Poll ``check()`` (an HTTP error counts as false) until it is true; RuntimeError naming ``what`` when ``proc``
    exits first or ``timeout`` s pass."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if check():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not ready within {timeout:.0f} s")
        time.sleep(0.2)


# ---------------------------------------------------------------------------------------------- replicas
def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (``/proc/PID/task/*/children``)."""
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in task.read_text().split()]
    return tree


def rss_kb(pid: int) -> int:
    """``VmRSS`` of ``pid`` in kB (0 once it has exited)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Replica:
    """One ``python -m asymspec_mm.cli serve --preset PRESET --host 127.0.0.1 --port PORT FLAGS`` subprocess, its
    output appended to ``log`` (discarded when None), run with ``env`` (this process's environment when None)."""

    def __init__(
        self, port: int, flags: Sequence[str] = (), log: Path | None = None, env: Mapping[str, str] | None = None, preset: str = "tiny"
    ) -> None:
        self.port, self.flags, self.log, self.env, self.preset = port, list(flags), log, env, preset
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        serve = ["serve", "--preset", self.preset, "--host", "127.0.0.1", "--port", str(self.port)]
        return [sys.executable, "-m", "asymspec_mm.cli", *serve, *self.flags]

    def start(self) -> Replica:
        """Start the process (it loads in the background: :meth:`wait_ready`)."""
        env = None if self.env is None else dict(self.env)
        if self.log is None:
            self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        else:
            with open(self.log, "a") as out:
                self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, env=env)
        return self

    def wait_ready(self, timeout: float = REPLICA_READY_S) -> Replica:
        """Wait until ``/ready`` answers 200 (the models loaded, not draining)."""
        import httpx

        wait_until(lambda: httpx.get(self.url + "/ready", timeout=5).status_code == 200, self.proc, f"replica {self.url}", timeout)
        return self

    def kill(self) -> None:
        """SIGKILL: the process dies at once, its connections reset (a crash, an OOM kill)."""
        self.stop(signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM without waiting: the server drains (``--drain-timeout``) and exits."""
        self.proc.send_signal(signal.SIGTERM)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send ``sig`` and wait for the exit (SIGKILL after ``timeout``); the child processes (OCR workers) still
        alive after it, which are then killed, so that no process of the run outlives it. 0 when it was not running."""
        if self.proc is None or self.proc.poll() is not None:
            return 0
        children = process_tree(self.proc.pid)[1:]
        stop_process(self.proc, sig, timeout)
        left = [pid for pid in children if rss_kb(pid) > 0]
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return len(left)

    def metric(self, name: str) -> float:
        """The sum of series ``name`` (all labels) in this replica's ``/metrics``."""
        import httpx

        from ..frontend.prometheus import parse_prometheus

        values = parse_prometheus(httpx.get(self.url + "/metrics", timeout=10).text)
        return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))

    def served(self) -> int:
        """Requests this replica took (``asymspec_requests_total``, all outcomes) since it started."""
        return int(self.metric("asymspec_requests_total"))

    def rss_mb(self) -> float:
        """Resident memory of the server and its child processes (OCR workers), MB, from ``/proc``."""
        return sum(rss_kb(pid) for pid in process_tree(self.proc.pid)) / 1024


@contextlib.contextmanager
def running_replicas(
    count: int, flags: Sequence[str] = (), logs: Path | None = None, env: Mapping[str, str] | None = None
) -> Iterator[list[Replica]]:
    """``count`` replicas with ``flags`` (their logs ``logs/replicaN.log`` when ``logs`` is set), started side by side
    (loading at once halves the wait on a busy machine) and ready; every one still running is stopped on exit."""
    replicas = [Replica(free_port(), flags, None if logs is None else logs / f"replica{i}.log", env).start() for i in range(count)]
    try:
        for replica in replicas:
            replica.wait_ready()
        yield replicas
    finally:
        for replica in replicas:
            replica.stop()


# ---------------------------------------------------------------------------------------------- routers
def router_executable(name: str, folder: str | None = None) -> str | None:
    """The path of router ``name``'s console script: in ``folder``, ``$ASYMSPEC_ROUTER_BIN``, next to this Python,
    or on PATH (None when none holds it)."""
    exe = ROUTERS[name]
    for where in (folder, os.environ.get(ROUTER_BIN_ENV), str(Path(sys.executable).parent)):
        if where and (Path(where) / exe).is_file():
            return str(Path(where) / exe)
    return shutil.which(exe)


def router_command(
    name: str, exe: str, port: int, worker: str | Sequence[str], policy: str = POLICY, extra: Sequence[str] = ()
) -> list[str]:
    """The command line starting router ``name`` on 127.0.0.1:``port`` in front of the replica ``worker`` (or each of
    a list) with ``policy`` and the ``extra`` flags at its end (its metrics exporter on a free loopback port too, so
    that two routers never share one)."""
    workers = [worker] if isinstance(worker, str) else list(worker)
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers, "--policy", policy]
    metrics = ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    if name == "vllm-router":
        return [exe, *common, *metrics, "--worker-startup-timeout-secs", "30", "--log-level", "warning", *extra]
    return [exe, "launch", *common, *metrics, "--worker-startup-timeout-secs", "30", "--log-level", "warn", *extra]


def shown_command(
    name: str, worker: str | Sequence[str] = "http://127.0.0.1:8000", port: int = 30000, policy: str = POLICY, extra: Sequence[str] = ()
) -> str:
    """The command line of :func:`router_command` as the docs show it (fixed ports)."""
    cmd = router_command(name, ROUTERS[name], port, worker, policy, extra)
    at = cmd.index("--prometheus-port")
    cmd[at + 1] = "29000"
    return " ".join(cmd)


def worker_health(router_url: str) -> dict[str, bool]:
    """The router's health view: each worker URL and whether the router counts it healthy (``GET /workers``, which
    vllm-router 0.1.17 and sglang-router 0.3.2 both answer with ``is_healthy`` per worker)."""
    import httpx

    workers = httpx.get(router_url + "/workers", timeout=5).json()["workers"]
    return {w["url"]: bool(w["is_healthy"]) for w in workers}


@contextlib.contextmanager
def running_router(
    name: str,
    worker: str | Sequence[str],
    log: Path | None = None,
    policy: str = POLICY,
    extra: Sequence[str] = (),
    exe: str | None = None,
) -> Iterator[str]:
    """Router ``name`` (console script ``exe``, else :func:`router_executable`) in front of ``worker`` (a base URL
    without ``/v1``, or a list of them) with ``policy`` and the ``extra`` flags: its base URL once it routes a request
    (``GET /v1/models`` answered), stopped (SIGTERM, then SIGKILL) on exit. RuntimeError naming the install line when
    it is absent, and naming its log when it does not start within :data:`ROUTER_STARTUP_S`."""
    import httpx

    exe = exe or router_executable(name)
    if exe is None:
        raise RuntimeError(f"{name} is not installed: pip install {name}=={VERSIONS[name]} (or set {ROUTER_BIN_ENV})")
    port = free_port()
    out = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below
    proc = subprocess.Popen(router_command(name, exe, port, worker, policy, extra), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        what = f"{name} ({policy})" + (f", log {log}" if log else "")
        wait_until(lambda: httpx.get(url + "/v1/models", timeout=2).status_code == 200, proc, what, ROUTER_STARTUP_S)
        yield url
    finally:
        stop_process(proc)
        if log is not None:
            out.close()
