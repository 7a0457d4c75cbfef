"""Thin fixtures over :mod:`asymspec_mm.bench.replicas` for the failover tests: real ``asymspec-mm serve --preset
tiny`` replicas as subprocesses (so that a test can SIGKILL or SIGTERM one) with this checkout's code and no GPU, and
the routers in front of them.

- :func:`running_replicas` starts several (``--ocr-workers 0`` and the given flags), ready, and stops every one left
  on exit; :func:`loading_replica` starts one without waiting for it (it loads while others start);
- :func:`start_router` starts a router (``vllm-router`` or SGLang's ``smg``) in front of them with extra flags;
  :func:`router_or_skip` skips a test, naming the install line, where a router is absent.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from asymspec_mm.bench import replicas as procs
from asymspec_mm.bench.replicas import ROUTER_BIN_ENV, VERSIONS, Replica, router_executable, running_router

ROOT = Path(__file__).resolve().parents[1]
#: The environment of a replica: this checkout's code, no network, no GPU (CPU threads are the machine's).
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""}

__all__ = ["ENV", "Replica", "loading_replica", "router_or_skip", "running_replicas", "start_router"]


def running_replicas(count: int, *flags: str, logs: Path | None = None):
    """:func:`asymspec_mm.bench.replicas.running_replicas` of ``count`` tiny replicas without OCR workers, with
    ``flags`` (a context manager yielding the :class:`Replica` list)."""
    return procs.running_replicas(count, ["--ocr-workers", "0", *flags], logs=logs, env=ENV)


@contextlib.contextmanager
def loading_replica(*flags: str) -> Iterator[Replica]:
    """One tiny replica without OCR workers, with ``flags``, started but not waited for (it loads while the caller
    starts others; :meth:`Replica.wait_ready` before use); stopped on exit."""
    replica = Replica(procs.free_port(), ["--ocr-workers", "0", *flags], env=ENV).start()
    try:
        yield replica
    finally:
        replica.stop()


def router_or_skip(name: str) -> None:
    """Skip the calling test, naming the install line, where router ``name``'s console script is absent."""
    import pytest

    if router_executable(name) is None:
        pytest.skip(f"{name} is not installed: pip install {name}=={VERSIONS[name]} (or set {ROUTER_BIN_ENV} to the bin folder holding it)")


def start_router(name: str, replicas: Sequence[Replica], *flags: str, log: Path | None = None, policy: str = "round_robin"):
    """:func:`asymspec_mm.bench.replicas.running_router` over ``replicas`` with extra router ``flags`` (a context
    manager yielding the router's base URL)."""
    return running_router(name, [r.url for r in replicas], log=log, policy=policy, extra=flags)
