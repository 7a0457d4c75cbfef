"""OCR in worker processes: :class:`ProcessOCREngine` runs a real engine (RapidOCR, EasyOCR) in a pool of spawned
processes behind the :class:`~captioning.ocr.base.OCREngine` interface, so nothing above it changes.

Why: beside a decode loop (the server's engine core), OCR slows the loop's steps in two ways. Its inference threads
(ONNX Runtime's default is one per core, EasyOCR's torch shares the models' thread pool in-process) take the cores
from the models' threads: the larger part, which ``threads=1`` removes, and which for EasyOCR only a process of its
own can bound. And its Python (pre- and post-processing) holds the interpreter lock the loop needs after each model
call: the smaller part, which only a process removes. BENCHMARKS.md ("OCR beside the loop") has the measurement.

Each worker creates the engine once (and reads a blank image, so the models are loaded before the first request);
an image travels as its RGB pixels and comes back as the same :class:`~captioning.ocr.items.OCRItem` list,
in the same order, as the engine in-process. A worker that dies fails the read it was doing with
:class:`OCRWorkerError` (one line) and the next read starts a fresh pool. :meth:`ProcessOCREngine.close` stops
the workers (so does garbage collection of the engine, and the interpreter's exit).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from PIL import Image

from vision_cache.checks import is_int, is_number
from vision_cache.rgb import to_rgb

from .base import OCREngine
from .items import OCRItem

__all__ = ["OCRWorkerError", "ProcessOCREngine", "limit_threads"]

#: The engine of this worker process (set by :func:`_start_worker`).
_ENGINE: OCREngine | None = None

#: The environment variables that bound the thread pools of OpenMP, BLAS and friends in a worker.
#: How long a read waits for its worker by default: far above any real read (RapidOCR reads a page in about a second
#: on one thread; a worker's first read also loads its models), so only a hung engine reaches it.
DEFAULT_READ_TIMEOUT = 120.0
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


class OCRWorkerError(RuntimeError):
    """An OCR worker process died while it read an image (not the request's fault: a server answers 500)."""


def limit_threads(threads: int) -> None:
    """Bound this process's compute threads to ``threads``: OpenMP/BLAS (through the environment, for the libraries
    not imported yet), OpenCV and torch (when imported). Meant for a worker process: in the models' process it would
    slow the models down."""
    for name in _THREAD_VARIABLES:
        os.environ[name] = str(threads)
    try:
        import cv2

        cv2.setNumThreads(threads)
    except ImportError:  # pragma: no cover - RapidOCR and EasyOCR both bring OpenCV
        pass
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def _start_worker(factory: Callable[[], OCREngine], threads: int | None, nice: int) -> None:
    """A worker's initializer: lower its priority, bound its threads, create the engine, load its models (one blank
    read). Ctrl-C is the parent's to handle (it shuts the pool down): a worker ignores it rather than print a
    traceback."""
    global _ENGINE
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if nice:
        os.nice(nice)
    if threads is not None:
        limit_threads(threads)
    engine = factory()
    engine.read(Image.new("RGB", (32, 32), "white"))
    if threads is not None and "torch" in sys.modules:  # EasyOCR imports torch as its models load
        sys.modules["torch"].set_num_threads(threads)
    _ENGINE = engine


def _read_in_worker(size: tuple[int, int], pixels: bytes) -> list[tuple[Any, str, float]]:
    """One read in a worker: the items, in reading order, as plain tuples (box, text, confidence)."""
    assert _ENGINE is not None, "the worker's initializer did not run"
    items = _ENGINE.read(Image.frombytes("RGB", size, pixels))
    return [(it.box, it.text, it.confidence) for it in items]


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Kill ``pool``'s worker processes (the executor keeps them in ``_processes``; it has no public way to)."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        if proc.is_alive():
            proc.kill()


def _shut_down(pool: ProcessPoolExecutor) -> None:
    pool.shutdown(wait=True, cancel_futures=True)


class ProcessOCREngine(OCREngine):
    """An OCR engine run in ``workers`` spawned processes, each with its own engine made by ``factory``.

    Args:
        engine: an engine name of :func:`~captioning.ocr.selection.get_ocr_engine` (``"auto"`` is resolved here, on
            first use, to the engine it picks) or a picklable zero-argument callable returning an engine (e.g.
            ``functools.partial(RapidOCREngine, params={...})``).
        workers: processes in the pool (reads beyond that many at once wait for one).
        threads: compute threads of each worker (RapidOCR's ONNX Runtime sessions, OpenCV, torch for EasyOCR);
            ``None`` leaves the engine's own default (all cores).
        read_timeout: seconds a read may wait for its worker's answer (``None``: no limit). A worker that does not
            answer in time (a hung engine) is stopped and its read fails with :class:`OCRWorkerError`; the next read
            starts a new worker (reads that shared the stopped pool fail too, as when a worker dies).
        nice: how much lower the workers' CPU priority is than this process's (``os.nice``, 0-19): the operating
            system then runs the models' threads first when both want a core. Off by default: at one thread it
            measured no gain, and while other programs kept the cores busy the workers starved (set-ups took
            1.3-1.5x as long).
        **engine_kwargs: passed to the engine's constructor with an engine name.

    ``name`` and ``cache_key`` are the engine's own, so results are cached and reported as the engine's. The pool
    starts on the first read (or :meth:`start`).
    """

    def __init__(
        self,
        engine: str | Callable[[], OCREngine] = "auto",
        workers: int = 1,
        *,
        threads: int | None = None,
        nice: int = 0,
        read_timeout: float | None = DEFAULT_READ_TIMEOUT,
        **engine_kwargs: Any,
    ) -> None:
        if not is_int(workers, minimum=1):
            raise ValueError(f"workers={workers!r} must be an integer >= 1")
        if threads is not None and not is_int(threads, minimum=1):
            raise ValueError(f"threads={threads!r} must be an integer >= 1 or None")
        if not isinstance(engine, str) and engine_kwargs:
            raise ValueError("engine keyword arguments go with an engine name, not with a factory")
        if not is_int(nice, 0, 19):
            raise ValueError(f"nice={nice!r} must be an integer from 0 to 19")
        if read_timeout is not None and (not is_number(read_timeout) or not read_timeout > 0):
            raise ValueError(f"read_timeout={read_timeout!r} must be a number of seconds > 0 or None")
        self.workers, self.threads, self.nice, self.read_timeout = workers, threads, nice, read_timeout
        self._spec, self._engine_kwargs = engine, engine_kwargs
        self._probe: OCREngine | None = None  # the engine made here (no models loaded): its name and cache key
        self._factory: Callable[[], OCREngine] | None = None
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._finalizer: weakref.finalize | None = None

    # ------------------------------------------------------------------ the engine it runs
    def _resolve(self) -> tuple[OCREngine, Callable[[], OCREngine]]:
        """The engine made in this process (cheap: the engines load their models on first read) and the factory
        the workers call; an unusable engine raises :class:`~captioning.errors.OCRUnavailableError` here."""
        with self._lock:
            if self._probe is None or self._factory is None:
                if isinstance(self._spec, str):
                    from .selection import _accepted_kwargs, get_ocr_engine

                    probe = get_ocr_engine(self._spec, **self._engine_kwargs)
                    kwargs = _accepted_kwargs(type(probe), self._engine_kwargs)
                    if self.threads is not None and "threads" in _accepted_kwargs(type(probe), {"threads": 1}):
                        kwargs.setdefault("threads", self.threads)
                    factory: Callable[[], OCREngine] = functools.partial(get_ocr_engine, probe.name, **kwargs)
                else:
                    probe, factory = self._spec(), self._spec
                self._probe, self._factory = probe, factory
            return self._probe, self._factory

    @property  # type: ignore[override]
    def name(self) -> str:
        """The engine's name (``"rapidocr"``, ``"easyocr"``, ...)."""
        return self._resolve()[0].name

    @property
    def cache_key(self) -> str:
        return self._resolve()[0].cache_key

    # ------------------------------------------------------------------ the pool
    def _executor(self) -> ProcessPoolExecutor:
        _, factory = self._resolve()
        with self._lock:
            if self._pool is None:
                pool = ProcessPoolExecutor(
                    self.workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_worker,
                    initargs=(factory, self.threads, self.nice),
                )
                self._pool, self._finalizer = pool, weakref.finalize(self, _shut_down, pool)
            return self._pool

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        """Drop a broken ``pool`` (once, whichever read saw it break first): the next read starts a new one."""
        with self._lock:
            if self._pool is pool:
                finalizer, self._pool, self._finalizer = self._finalizer, None, None
                if finalizer is not None:
                    finalizer.detach()
        pool.shutdown(wait=False, cancel_futures=True)

    def start(self) -> ProcessOCREngine:
        """Start the workers now (each loads its engine's models) and wait until they are ready; returns ``self``. (The
        pool otherwise starts a worker when a read finds none idle, up to ``workers``.)"""
        pool = self._executor()
        blank = to_rgb(Image.new("RGB", (8, 8), "white"))
        futures = [pool.submit(_read_in_worker, blank.size, blank.tobytes()) for _ in range(self.workers)]
        for future in futures:
            future.result()
        return self

    def worker_pids(self) -> list[int]:
        """The process ids of the running workers (none before the first read or after :meth:`close`)."""
        with self._lock:
            pool = self._pool
        processes = getattr(pool, "_processes", None) or {}
        return sorted(pid for pid, proc in list(processes.items()) if proc.is_alive())

    def close(self) -> None:
        """Stop the workers and wait for them to exit. A later read starts a new pool."""
        with self._lock:
            finalizer, self._pool, self._finalizer = self._finalizer, None, None
        if finalizer is not None:
            finalizer()

    def __enter__(self) -> ProcessOCREngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reading
    def read(self, image: Image.Image) -> list[OCRItem]:
        """The engine's items for ``image``, read in a worker (concurrent reads go to different workers)."""
        rgb = to_rgb(image)
        size, pixels = rgb.size, rgb.tobytes()
        pool = self._executor()
        try:
            future = pool.submit(_read_in_worker, size, pixels)
        except BrokenProcessPool:  # a worker died between reads: this read has lost nothing, so it goes to a new pool
            self._discard(pool)
            pool = self._executor()
            future = pool.submit(_read_in_worker, size, pixels)
        try:
            found = future.result(timeout=self.read_timeout)
        except FutureTimeout:
            _stop_workers(pool)  # a hung worker never takes the shutdown message: stop it, or it holds its core
            self._discard(pool)
            raise OCRWorkerError(
                f"the {self.name} OCR worker did not answer within {self.read_timeout:g} s for this {size[0]}x{size[1]} "
                "image (the request failed; the worker was stopped and the next read starts a new one)"
            ) from None
        except BrokenProcessPool:
            self._discard(pool)
            # several set-ups read at once: a worker that dies breaks every read in flight in its pool, not only the
            # one that killed it; each is read again once, alone in a worker of its own, so only the image that
            # kills a worker fails
            found = self._read_alone(size, pixels)
        return [OCRItem(box=box, text=text, confidence=conf) for box, text, conf in found]

    def _read_alone(self, size: tuple[int, int], pixels: bytes) -> list:
        """Read once in a fresh single-worker pool that nothing else uses (after a read's pool broke)."""
        _, factory = self._resolve()
        pool = ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker, initargs=(factory, self.threads, self.nice)
        )
        try:
            return pool.submit(_read_in_worker, size, pixels).result(timeout=self.read_timeout)
        except (BrokenProcessPool, FutureTimeout):
            _stop_workers(pool)
            raise OCRWorkerError(
                f"the {self.name} OCR worker process died while reading this {size[0]}x{size[1]} image, twice (the "
                "request failed; the next read starts a new worker)"
            ) from None
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _read_unordered(self, image: Image.Image) -> list[OCRItem]:
        return self.read(image)

    def __repr__(self) -> str:
        spec = self._spec if isinstance(self._spec, str) else getattr(self._spec, "__name__", repr(self._spec))
        return f"ProcessOCREngine(engine={spec!r}, workers={self.workers}, threads={self.threads}, nice={self.nice})"
