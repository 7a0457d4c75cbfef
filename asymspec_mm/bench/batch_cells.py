"""The cells of the batch sweep (:mod:`.batching`): one (variant, B) cell over the sweep's requests, each step timed.

A pipeline cell takes the engine core's route (``route: "core"``), the route every request of the library takes:
each request is set up without prefill (``pipe.prepare(..., prefill=False)``: view, prompts, vision cache) and its
prompts are prefilled in the paged row storages' own forwards, where it then decodes (static slots, ``--batch-engine
static`` at B > 1, take no prompt pieces: their rows are prefilled on staging storages and copied in at join, as
``generate_batch`` does with them).

* **B = 1, the sequential loop**: one request after another, each on an engine core of its own, as ``pipe.generate``
  decodes a request alone (:func:`~asymspec_mm.core.direct_loop.direct_core`): its first turn prefills the prompts,
  the row joins, then it decodes a step a turn.
* **B > 1, the stepped decoder**: the requests through an :class:`~asymspec_mm.core.engine_core.EngineCore` built as
  ``generate_batch``'s scheduler builds it (``max_batch_size`` = B, the sweep's row storage), stepped here turn by
  turn as its decode thread steps it, a request set up whenever a row is free: the arriving rows' prompt pieces ride
  in the step's forwards and they join in place (nothing copied at join). Its tokens are checked against
  ``generate_batch``'s.

Every turn is one model call of the pipeline (:func:`~asymspec_mm.core.loop_client.model_call`). Each decode step
is timed by the core itself (its ``on_step``: the decoder's step, with the prompt pieces that rode in its forwards;
the rest of its turn, admission and a static storage's staging prefill and joins, is not); a turn that stepped no
row (prompt pieces alone: a request alone's first turn, a batch's first rows) is prefill, kept out of the steps and
reported apart (``prefill_s``). Instrumented (CPU), each row storage is a timing proxy
(:class:`~asymspec_mm.base.timing.TimedStorage`, through :class:`~asymspec_mm.engines.RowStorages`' ``wrap`` or
``direct_core``'s ``wrap_storage``; static slots, which have no such parameter, are composed with it) and a
:class:`~asymspec_mm.base.timing.BucketTimer` times the gate and the trace; a forward carrying prompt pieces is
recorded as prefill, apart from the step's split.

Synthetic caches stay on single-row engines: random keys/values poured into single-row caches
(:func:`~.runner.synthetic_prefill`) give real-shape pairs on a CPU, where a prefill takes minutes, a context
without one; the core's storages fill only through forwards (a prefill), which is what these cells leave out. At
B = 1 ``pipe.run`` decodes them on those engines (``route: "single-row"``, timing proxies
:class:`~asymspec_mm.base.timing.TimedEngine`; a step is the time between two of its steps' events); at B > 1 the
engine core takes them as they are, each row's caches copied into its row storages at join (``route:
"copy-at-join"``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..base.timing import BucketTimer, Clock, Ledger, TimedStorage, median, wrap_streams
from .pairs import BenchPair
from .runner import synthetic_prefill
from .settings import STREAMS, SYNTHETIC_PENDING_TOKEN, TIMER_BUCKETS

if TYPE_CHECKING:
    from ..base.config import AsymSpecConfig
    from ..core.engine_core import EngineCore
    from ..frontend.variants import Variant
    from ..request.session import Session

#: Synthetic contexts: case i's streams hold ``base + SYNTHETIC_STAGGER * i`` positions, so rows are ragged.
SYNTHETIC_STAGGER = 4
#: Where a cell's requests decode (module docstring).
ROUTE_CORE, ROUTE_SINGLE_ROW, ROUTE_COPY_AT_JOIN = "core", "single-row", "copy-at-join"

Step = tuple[int, float, dict[str, float] | None]  # (rows stepped, seconds, the step's split when instrumented)


def kv_bytes_per_token(model: Any) -> int:
    """Bytes one cached token takes in ``model``'s KV cache: layers x 2 (keys, values) x KV heads x head dim x dtype size."""
    import torch

    text = model.config.get_text_config(decoder=True)
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    size = torch.empty((), dtype=model.get_input_embeddings().weight.dtype).element_size()
    return text.num_hidden_layers * 2 * heads * head_dim * size


def held_at_join(session: Session) -> dict[str, int]:
    """Tokens each of ``session``'s streams holds when its row joins: a staged prompt's (``prompt[:-1]``, the last
    token pending), or a stream's prefilled elsewhere (synthetic caches) as it is."""
    held = {name: e.length for name, e in session.streams.items()}
    held.update({name: int(p.ids.numel()) for name, p in session.to_prefill.items()})
    return held


def slot_bytes(core: EngineCore, method: str) -> dict[str, int]:
    """Bytes one token takes in each of ``method``'s row storages of ``core`` (by stream)."""
    decoder = core.decoder
    return {name: decoder.engines[key].slot_bytes() for name, key in decoder.storage_of(method).items()}


def with_wrap(factory: Callable[[Any, str], Any], wrap: Callable[[Any], Any] | None) -> Callable[[Any, str], Any]:
    """A row storage factory with no ``wrap`` parameter of its own (static slots) composed with ``wrap``: each storage
    it builds goes through it (``factory`` itself without one)."""
    if wrap is None:
        return factory

    def build(model: Any, name: str) -> Any:
        return wrap(factory(model, name))

    return build


class StepParts:
    """Seconds per step in each stream's decode forwards and in the gate / trace blocks, from the ledger's records
    since the previous :meth:`take` (so a step's parts are its own, and the steps with the batch full can be picked)."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._seen = {s: 0 for s in STREAMS}
        self._buckets = {b: 0.0 for b in TIMER_BUCKETS}

    def take(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in STREAMS:
            recs = self.ledger.calls.get(s, [])
            out[s] = sum(r.seconds for r in recs[self._seen[s] :] if r.op == "extend")
            self._seen[s] = len(recs)
        for b in TIMER_BUCKETS:
            total = self.ledger.buckets.get(b, 0.0)
            out[b], self._buckets[b] = total - self._buckets[b], total
        return out


class CachePeak:
    """The most bytes a batch's row storages held (their pools, free blocks and holes included) and the rows of the
    turn that grew them to it."""

    def __init__(self) -> None:
        self.bytes, self.rows = 0, 0

    def see(self, core: EngineCore, rows: int) -> None:
        """After a turn of ``rows`` rows (read then, the rows it finished are gone already)."""
        held = sum(e.kv_bytes() for e in core.decoder.engines.values())
        if held > self.bytes:
            self.bytes, self.rows = held, rows

    def per_row(self) -> float | None:
        return self.bytes / self.rows if self.rows else None


class CellRecord:
    """What one cell measured: its steps (rows, seconds, their split when ``instrument``), the seconds of set-up and of
    the turns that only prefilled, and each case's answer."""

    def __init__(self, clock: Clock, instrument: bool):
        self.clock = clock
        self.ledger = Ledger() if instrument else None
        self.timer = BucketTimer(self.ledger, clock) if self.ledger is not None else None
        self.parts = StepParts(self.ledger) if self.ledger is not None else None
        self.steps: list[Step] = []
        self.setup = 0.0
        self.prefill = 0.0
        self.results: dict[int, Any] = {}

    def wrap(self) -> Callable[[Any], Any] | None:
        """Each row storage through a timing proxy into the ledger (None: not instrumented)."""
        return functools.partial(TimedStorage, ledger=self.ledger, clock=self.clock) if self.ledger is not None else None

    def step(self, rows: int, seconds: float) -> None:
        """A decode step of ``rows`` rows took ``seconds``; its split is what the ledger recorded since the last."""
        self.steps.append((rows, seconds, self.parts.take() if self.parts else None))

    def on_step(self, rows: int, engine_calls: int, seconds: float) -> None:
        """An engine core's ``on_step``: its decode step (the decoder's step, whatever prompt pieces rode in its
        forwards; the rest of the turn, admission, a static storage's staging prefill and joins, is not the step's)."""
        self.step(rows, seconds)

    def turn(self, pipe: Any, core: EngineCore, cases: dict[int, int]) -> None:
        """One turn of ``core`` (a model call of ``pipe``, as a request's turns are; its step comes through
        :meth:`on_step`): a turn that stepped no row only prefilled, its seconds are prefill's. The answers it made
        go to their cases (``cases``: request id -> case); a request's error is raised."""
        from ..core.loop_client import model_call

        steps = core.steps
        t0 = self.clock.now()
        outs = model_call(pipe, core.step)
        if core.steps == steps:
            self.prefill += self.clock.now() - t0
        for out in outs:
            if out.error is not None:
                raise out.error
            if out.finished:
                self.results[cases[out.rid]] = out.result


class BatchSweep:
    """Runs the cells of the batch sweep on one pair; ``instrument``: time each stream's forwards and the gate
    (CPU; on CUDA the clocks synchronize, so only step boundaries are timed)."""

    def __init__(
        self,
        bp: BenchPair,
        inputs: list[dict[str, Any]],
        *,
        synthetic: bool,
        base_len: int,
        image_tokens: int,
        clock: Clock,
        instrument: bool,
        batch_engine: str = "dynamic",
        batch_max_len: int = 2048,
    ):
        self.batch_engine, self.batch_max_len = batch_engine, batch_max_len
        self.bp, self.pipe, self.inputs = bp, bp.pipe, inputs
        self.synthetic, self.base_len, self.image_tokens = synthetic, base_len, image_tokens
        self.clock, self.instrument = clock, instrument

    # -- one request's session ------------------------------------------------------------------
    def session(self, v: Variant, cfg: AsymSpecConfig, i: int) -> Session:
        """Case ``i`` set up for ``v`` as ``pipe.generate`` and ``generate_batch`` set a request up (``prefill=False``:
        its prompts wait for the core's storages), or streams over synthetic single-row caches (EOS ignored)."""
        case = self.inputs[i]
        if not self.synthetic:
            return self.pipe.prepare(
                case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], method=v.method, config=cfg, prefill=False
            )
        import torch

        from ..request.record import RequestRecord
        from ..request.request import Request
        from ..request.session import Session

        factory = self.pipe.engines
        streams: dict[str, Any] = {}
        pending: dict[str, torch.Tensor] = {}
        length = self.base_len + SYNTHETIC_STAGGER * i
        for j, (name, model) in enumerate(self.pipe.stream_models(v.method).items()):
            e = factory.vision(model, name) if model is self.pipe.drafter else factory.text(model, name)
            synthetic_prefill(e, length + (self.image_tokens if name == "drafter_full" else 0), seed=1000 * i + j)
            streams[name] = e
            pending[name] = torch.tensor([SYNTHETIC_PENDING_TOKEN], device=e.device)
        request = Request(method=v.method, config=cfg)
        return Session(request, None, None, streams, pending, set(), None, RequestRecord(stats={"vision_calls": 0}))

    def _set_up(self, v: Variant, cfg: AsymSpecConfig, i: int, rec: CellRecord) -> Session:
        t0 = self.clock.now()
        session = self.session(v, cfg, i)
        rec.setup += self.clock.now() - t0
        return session

    def _kv_row(self, method: str, i: int, lengths: dict[str, int], slots: dict[str, int] | None) -> dict[str, Any]:
        """Case ``i``'s KV bytes at its join: ``lengths`` tokens per stream times its row storages' bytes per token
        (``slots``; the engines' own :meth:`kv_bytes` of a row is the same product), beside the model configs'
        formula (``slots`` None, single-row caches: the formula alone)."""
        models = self.pipe.stream_models(method)
        formula = sum(n * kv_bytes_per_token(models[s]) for s, n in lengths.items())
        measured = formula if slots is None else sum(n * slots[s] for s, n in lengths.items())
        return {"case": i, "lengths": dict(lengths), "bytes": measured, "formula_bytes": formula}

    def row_storage(self, size: int, wrap: Callable[[Any], Any] | None = None) -> Any:
        """The row storage factory at batch ``size`` (generate_batch's and the stepped decoder's), each storage through
        ``wrap`` when given: None (the default paged storages) or static slots, one per row. Unwrapped, the default
        stays None, the very factory generate_batch builds."""
        from ..engines import RowStorages

        if self.batch_engine == "dynamic":
            return None if wrap is None else RowStorages(wrap=wrap)
        from ..engines.static_rows import static_batch_engines

        static = static_batch_engines(max_rows=size, max_len=self.batch_max_len, compile_decode=self.batch_engine == "static-compile")
        return with_wrap(static, wrap)

    # -- the cells ---------------------------------------------------------------------------------
    def sequential(self, v: Variant, cfg: AsymSpecConfig, idx: Sequence[int]) -> dict[str, Any]:
        """B = 1: each request set up, then decoded alone, one after another (on the engine core; synthetic caches
        on their single-row engines)."""
        rec = CellRecord(self.clock, self.instrument)
        kv_rows: list[dict[str, Any]] = []
        t0 = self.clock.now()
        for i in idx:
            session = self._set_up(v, cfg, i, rec)
            lengths = held_at_join(session)
            if self.synthetic:
                self._alone_single_row(session, i, rec)
                slots = None  # no row storage holds it: the formula's bytes
            else:
                slots = self._alone_on_core(session, i, rec)
            kv_rows.append(self._kv_row(v.method, i, lengths, slots))
        wall = self.clock.now() - t0
        out = self._summary(1, wall, rec, [list(rec.results[i].token_ids) for i in idx], kv_rows)
        out["route"] = ROUTE_SINGLE_ROW if self.synthetic else ROUTE_CORE
        out["steps_ok"] = sum(rec.results[i].stats["steps"] for i in idx) == len(rec.steps)
        return out

    def _alone_on_core(self, session: Session, i: int, rec: CellRecord) -> dict[str, int]:
        """``session`` (set up without prefill) decoded on an engine core of its own, a request alone, as
        ``pipe.generate`` decodes it; returns its row storages' bytes per token."""
        from ..base.gc_heap import frozen_heap
        from ..core.direct_loop import direct_core

        core = direct_core(self.pipe, timer=rec.timer, wrap_storage=rec.wrap(), on_step=rec.on_step)
        cases = {core.add_session(session): i}
        with frozen_heap():  # as pipe.generate decodes a request alone (core.direct.session_steps)
            while core.has_work:
                rec.turn(self.pipe, core, cases)
        return slot_bytes(core, session.method)

    def _alone_single_row(self, session: Session, i: int, rec: CellRecord) -> None:
        """``session`` over synthetic single-row caches decoded by ``pipe.run`` on them (through timing proxies when
        instrumented), each step timed; no row storage holds it."""
        if rec.ledger is not None:
            session.streams.update(wrap_streams(session.streams, rec.ledger, self.clock, decode=True))
        stream = self.pipe.run(session, timer=rec.timer)
        last = self.clock.now()
        for _ in stream:
            now = self.clock.now()
            rec.step(1, now - last)
            last = now
        rec.results[i] = stream.result

    def generate_batch(self, v: Variant, cfg: AsymSpecConfig, idx: Sequence[int], size: int) -> dict[str, Any]:
        """``pipe.generate_batch(batch_size=size)`` over the requests, timed as one call."""
        reqs = [{k: self.inputs[i][k] for k in ("image", "question", "caption", "ocr")} for i in idx]
        t0 = self.clock.now()
        results = self.pipe.generate_batch(reqs, method=v.method, config=cfg, batch_size=size, batch_engines=self.row_storage(size))
        wall = self.clock.now() - t0
        return {
            "wall_s": wall,
            "token_ids": [list(r.token_ids) for r in results],
            "max_batch_stat": max((r.stats.get("batch_size", 0) for r in results), default=0),
        }

    def stepped(self, v: Variant, cfg: AsymSpecConfig, idx: Sequence[int], size: int) -> dict[str, Any]:
        """The requests through an engine core of ``size`` rows stepped here as ``generate_batch``'s decode thread
        steps it (module docstring), a request set up whenever a row is free; its steps timed, and the turns that
        only prefilled."""
        from ..base.gc_heap import frozen_heap
        from ..core.engine_core import EngineCore

        rec = CellRecord(self.clock, self.instrument)
        # generate_batch's core (its scheduler's settings); tokens only, as its texts are made on an output thread
        core = EngineCore(self.pipe, size, batch_engines=self.row_storage(size, rec.wrap()), texts=False, on_step=rec.on_step)
        core.timer = rec.timer
        upcoming = iter(idx)
        cases: dict[int, int] = {}  # request id -> case
        lengths: dict[int, dict[str, int]] = {}
        peak = CachePeak()
        t0 = self.clock.now()
        with frozen_heap():  # as the scheduler's decode thread runs
            while True:
                while core.live_rows + len(core.ready) < size and (i := next(upcoming, None)) is not None:
                    session = self._set_up(v, cfg, i, rec)
                    lengths[i] = held_at_join(session)
                    cases[core.add_session(session)] = i
                if not core.has_work:
                    break
                held = min(size, core.live_rows + len(core.ready))  # the turn's rows: those live and those it admits
                rec.turn(self.pipe, core, cases)
                peak.see(core, held)
        wall = self.clock.now() - t0
        slots = slot_bytes(core, v.method)
        kv_rows = [self._kv_row(v.method, i, lengths[i], slots) for i in idx]
        out = self._summary(size, wall, rec, [list(rec.results[i].token_ids) for i in idx], kv_rows)
        out["route"] = ROUTE_COPY_AT_JOIN if self.synthetic else ROUTE_CORE
        out["cache_bytes_per_row_peak"] = peak.per_row()
        out["max_batch_stat"] = max((rec.results[i].stats.get("batch_size", 0) for i in idx), default=0)
        out["compactions"] = sum(getattr(e, "compactions", 0) for e in core.decoder.engines.values())
        return out

    def _summary(
        self, size: int, wall: float, rec: CellRecord, token_ids: list[list[int]], kv_rows: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """One cell of one repetition: tokens, times, step times (all steps, and the steps with the batch full) and,
        instrumented, the split of the full steps. ``decode_s``: the wall less set-up and the turns that only
        prefilled (``setup_frac``: their share of the wall); a prompt riding in a step is in that step's time."""
        steps = rec.steps
        new = sum(len(t) for t in token_ids)
        decode = wall - rec.setup - rec.prefill
        walls = [s for _, s, _ in steps]
        most = max((n for n, _, _ in steps), default=0)
        full = [(s, p) for n, s, p in steps if n == most]
        out: dict[str, Any] = {
            "batch_size": size,
            "new_tokens": new,
            "tokens_per_case": [len(t) for t in token_ids],
            "wall_s": wall,
            "setup_s": rec.setup,
            "prefill_s": rec.prefill,
            "decode_s": decode,
            "setup_frac": (rec.setup + rec.prefill) / wall if wall > 0 else None,
            "decode_tokens_per_s": new / decode if decode > 0 else 0.0,
            "steps": len(steps),
            "step_s": median([s for s, _ in full]),
            "step_s_mean": sum(walls) / len(walls) if walls else float("nan"),
            "full_step_s_mean": sum(s for s, _ in full) / len(full) if full else float("nan"),
            "full_rows": most,
            "full_steps": len(full),
            "rows_per_step": sum(n for n, _, _ in steps) / len(steps) if steps else 0.0,
            "kv_rows": kv_rows,
            "kv_bytes_per_row": sum(r["bytes"] for r in kv_rows) / len(kv_rows) if kv_rows else 0.0,
            "token_ids": token_ids,  # dropped from the result once compared across sizes
        }
        if full and all(p is not None for _, p in full):
            # seconds per step of the full-batch steps (the ones the step column takes), the rest host work
            split = {k: sum(p[k] for _, p in full) / len(full) for k in (*STREAMS, *TIMER_BUCKETS)}
            split["other"] = out["full_step_s_mean"] - sum(split.values())
            out["split_step_s"] = split
        return out

    # -- a whole cell ------------------------------------------------------------------------------
    def cell(self, v: Variant, cfg: AsymSpecConfig, idx: Sequence[int], size: int) -> dict[str, Any]:
        """Cell (``v``, ``size``) over the requests ``idx``: the sequential loop at 1; else ``generate_batch`` (request
        path) and the stepped decoder, whose times give the step columns."""
        if size == 1:
            out = self.sequential(v, cfg, idx)
            out["tokens_per_s"] = None if self.synthetic else out["new_tokens"] / out["wall_s"]
            if self.batch_engine != "dynamic":  # the chosen row storage at one row too (static slots, B=1)
                one = self.stepped(v, cfg, idx, 1)
                out["storage_b1"] = {
                    "decode_tokens_per_s": one["decode_tokens_per_s"],
                    "step_s": one["step_s"],
                    "same_tokens": one["token_ids"] == out["token_ids"],
                }
            return out
        api = None if self.synthetic else self.generate_batch(v, cfg, idx, size)
        out = self.stepped(v, cfg, idx, size)
        if api is None:
            out["tokens_per_s"] = None
        else:
            out["api_wall_s"] = api["wall_s"]
            out["tokens_per_s"] = out["new_tokens"] / api["wall_s"] if api["wall_s"] > 0 else 0.0
            out["stepped_same_as_generate_batch"] = api["token_ids"] == out["token_ids"]
            out["max_batch_stat"] = api["max_batch_stat"]
        return out
