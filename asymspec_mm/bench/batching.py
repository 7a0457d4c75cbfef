"""Batched decoding in the benchmark: ``pipe.generate_batch(batch_size=B)`` against the sequential loop, side by side.

Every cell decodes the same N requests (held-out MiniVista problems) with one variant:

* **B = 1 is the sequential loop**: one request after another on the single-row engines, the reference route
  (``prepare(prefill=True)``, then ``run``, so that each step and each stream's forward can be timed), not
  ``generate_batch(batch_size=1)``.
* **B > 1** is ``pipe.generate_batch(requests, batch_size=B)``, timed as one call (the tokens/s a caller gets),
  then the same requests through a :class:`~asymspec_mm.core.BatchDecoder` stepped here as ``generate_batch``
  steps it (prepare, join, step, refill): each ``step`` is timed, each batched forward of each stream is timed
  (CPU), and each row's KV bytes (:meth:`BatchEngine.kv_bytes`, summed over its streams) are read right after it
  joins, i.e. at the end of its prefill.

Repetitions are interleaved (each one runs every (variant, B) cell, the order rotating), and ratios to B = 1 are
medians of per-repetition ratios. On synthetic caches (real shapes on a CPU, where a 2B prefill takes minutes)
``generate_batch`` cannot run (it prefills): rows are sessions over random keys/values of ragged lengths, both
loops decode them (``pipe.run`` one after another; the stepped decoder), and tokens/s is decode-only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..base.checks import is_int
from ..base.timing import BucketTimer, CallRecord, Clock, Ledger, median, wrap_streams
from .pairs import BenchPair
from .runner import rotate, synthetic_prefill
from .settings import STREAMS, SYNTHETIC_PENDING_TOKEN, TIMER_BUCKETS

if TYPE_CHECKING:
    from ..base.config import AsymSpecConfig
    from ..frontend.variants import Variant
    from ..request.session import Session

#: Synthetic contexts: case i's streams hold ``base + SYNTHETIC_STAGGER * i`` positions, so rows are ragged.
SYNTHETIC_STAGGER = 4
LABEL = "generate_batch(batch_size=B) vs the sequential loop (B=1: pipe.generate one request after another)"
#: The row storages of the stepped decoder: the default (dynamic) one, or static slots (optionally compiled).
BATCH_ENGINES = ("dynamic", "static", "static-compile")

Say = Callable[[str], None]


def parse_sizes(sizes: Sequence[int]) -> list[int]:
    """The batch sizes to run: unique, ascending, each >= 1, with the sequential reference B = 1 first."""
    from ..base.errors import UnknownOptionError

    bad = [b for b in sizes if not is_int(b, minimum=1)]
    if bad:
        raise UnknownOptionError(f"batch size {bad[0]!r} must be an integer >= 1")
    return sorted({1, *sizes})


def kv_bytes_per_token(model: Any) -> int:
    """Bytes one cached token takes in ``model``'s KV cache: layers x 2 (keys, values) x KV heads x head dim x dtype size."""
    import torch

    text = model.config.get_text_config(decoder=True)
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    size = torch.empty((), dtype=model.get_input_embeddings().weight.dtype).element_size()
    return text.num_hidden_layers * 2 * heads * head_dim * size


def _time_extends(decoder: Any, ledger: Ledger, clock: Clock) -> None:
    """Record every batched forward of ``decoder``'s engines in ``ledger`` (the engines' ``extend`` wrapped on the
    instance; the decoder is this module's own, so nothing shared changes)."""
    for name, engine in decoder.engines.items():
        ledger.calls.setdefault(name, [])
        inner = engine.extend

        def timed(ids, _inner=inner, _name=name):
            t0 = clock.now()
            out = _inner(ids)
            ledger.calls[_name].append(CallRecord("extend", sum(int(t.numel()) for t in ids.values()), clock.now() - t0, True))
            return out

        engine.extend = timed


class StepParts:
    """Seconds per step in each stream's forwards and in the gate / trace blocks, from the ledger's records since
    the previous :meth:`take` (so a step's parts are its own, and the steps with the batch full can be picked)."""

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
        """Case ``i`` set up and prefilled for ``v`` on single-row engines (``prepare(prefill=True)``, the reference route;
        ``generate_batch`` prepares with ``prefill=False`` and prefills in batches), or streams over synthetic caches
        (EOS ignored)."""
        case = self.inputs[i]
        if not self.synthetic:
            return self.pipe.prepare(
                case["image"], case["question"], caption=case["caption"], ocr=case["ocr"], method=v.method, config=cfg, prefill=True
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

    def _kv_row(self, method: str, i: int, lengths: dict[str, int], measured: int | None) -> dict[str, Any]:
        models = self.pipe.stream_models(method)
        formula = sum(n * kv_bytes_per_token(models[s]) for s, n in lengths.items())
        return {"case": i, "lengths": dict(lengths), "bytes": formula if measured is None else measured, "formula_bytes": formula}

    def row_storage(self, size: int) -> Any:
        """The row storage factory at batch ``size`` (generate_batch's and the stepped decoder's): None (the default)
        or static slots, one per row."""
        if self.batch_engine == "dynamic":
            return None
        from ..engines.static_rows import static_batch_engines

        return static_batch_engines(max_rows=size, max_len=self.batch_max_len, compile_decode=self.batch_engine == "static-compile")

    # -- the cells ---------------------------------------------------------------------------------
    def sequential(self, v: Variant, cfg: AsymSpecConfig, idx: Sequence[int]) -> dict[str, Any]:
        """B = 1: each request set up, then decoded by the single-row loop, one after another."""
        clock = self.clock
        ledger = Ledger() if self.instrument else None
        timer = BucketTimer(ledger, clock) if ledger is not None else None
        parts = StepParts(ledger) if ledger is not None else None
        steps: list[tuple[int, float, dict | None]] = []
        token_ids: list[list[int]] = []
        kv_rows: list[dict[str, Any]] = []
        setup = 0.0
        counted_steps = 0
        t0 = clock.now()
        for i in idx:
            ts = clock.now()
            session = self.session(v, cfg, i)
            setup += clock.now() - ts
            kv_rows.append(self._kv_row(v.method, i, {n: e.length for n, e in session.streams.items()}, None))
            if ledger is not None:
                session.streams.update(wrap_streams(session.streams, ledger, clock, decode=True))
            stream = self.pipe.run(session, timer=timer)
            last = clock.now()
            for _ in stream:
                now = clock.now()
                steps.append((1, now - last, parts.take() if parts else None))
                last = now
            res = stream.result
            counted_steps += res.stats["steps"]
            token_ids.append(list(res.token_ids))
        wall = clock.now() - t0
        out = self._summary(1, wall, setup, steps, token_ids, kv_rows)
        out["steps_ok"] = counted_steps == len(steps)
        return out

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
        """The requests through a :class:`BatchDecoder` stepped as ``generate_batch`` steps it, every step timed,
        each row's KV bytes read right after it joins."""
        from ..core import BatchDecoder

        clock = self.clock
        ledger = Ledger() if self.instrument else None
        timer = BucketTimer(ledger, clock) if ledger is not None else None
        decoder = BatchDecoder(self.pipe, engines=self.row_storage(size))
        decoder.storage_of(v.method)  # its storages now, so that their forwards are timed
        parts = StepParts(ledger) if ledger is not None else None
        if ledger is not None:
            _time_extends(decoder, ledger, clock)
        results: dict[int, Any] = {}
        kv_rows: list[dict[str, Any]] = []
        acc = {"setup": 0.0, "join": 0.0, "peak_cache": 0, "peak_rows": 0}
        upcoming = iter(idx)

        def refill() -> None:
            while len(decoder.rows) < size:
                i = next(upcoming, None)
                if i is None:
                    break
                ts = clock.now()
                session = self.session(v, cfg, i)
                tj = clock.now()
                decoder.add(i, session)
                acc["setup"] += tj - ts
                acc["join"] += clock.now() - tj
                lengths = {n: e.length(i) for n, e in decoder.engines.items()}
                kv_rows.append(self._kv_row(v.method, i, lengths, sum(e.kv_bytes(i) for e in decoder.engines.values())))
            cache = sum(e.kv_bytes() for e in decoder.engines.values())  # the whole batched caches, holes included
            if cache > acc["peak_cache"]:
                acc["peak_cache"], acc["peak_rows"] = cache, len(decoder.rows)

        steps: list[tuple[int, float, dict | None]] = []
        t0 = clock.now()
        refill()
        while decoder.rows:
            n = len(decoder.rows)
            ts = clock.now()
            out = decoder.step(timer)
            steps.append((n, clock.now() - ts, parts.take() if parts else None))
            for row, _ in out:
                if row.result is not None:
                    results[row.id] = row.result
            refill()
        wall = clock.now() - t0
        token_ids = [list(results[i].token_ids) for i in idx]
        out = self._summary(size, wall, acc["setup"], steps, token_ids, kv_rows)
        out["join_s"] = acc["join"]
        out["cache_bytes_per_row_peak"] = acc["peak_cache"] / acc["peak_rows"] if acc["peak_rows"] else None
        out["max_batch_stat"] = max((results[i].stats.get("batch_size", 0) for i in idx), default=0)
        out["compactions"] = sum(getattr(e, "compactions", 0) for e in decoder.engines.values())
        return out

    def _summary(
        self,
        size: int,
        wall: float,
        setup: float,
        steps: list[tuple[int, float, dict | None]],
        token_ids: list[list[int]],
        kv_rows: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """One cell of one repetition: tokens, times, step times (all steps, and the steps with the batch full) and,
        instrumented, the split of the full steps."""
        new = sum(len(t) for t in token_ids)
        decode = wall - setup
        walls = [s for _, s, _ in steps]
        most = max((n for n, _, _ in steps), default=0)
        full = [(s, p) for n, s, p in steps if n == most]
        out: dict[str, Any] = {
            "batch_size": size,
            "new_tokens": new,
            "tokens_per_case": [len(t) for t in token_ids],
            "wall_s": wall,
            "setup_s": setup,
            "decode_s": decode,
            "setup_frac": setup / wall if wall > 0 else None,
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


def batch_sweep(
    bp: BenchPair,
    inputs: list[dict[str, Any]],
    *,
    sizes: Sequence[int],
    variants: list[Variant],
    base_cfg: AsymSpecConfig,
    reps: int,
    warmup: int,
    synthetic: bool,
    base_len: int,
    image_tokens: int,
    clock: Clock,
    instrument: bool,
    say: Say,
    batch_engine: str = "dynamic",
    batch_max_len: int = 2048,
) -> dict[str, Any]:
    """Every (variant, B) cell over the same ``inputs``, ``reps`` interleaved repetitions: the ``batching`` section.
    ``batch_engine``: the stepped decoder's row storage (:data:`BATCH_ENGINES`; static slots of ``batch_max_len``
    columns, ``max_rows`` = B); B = 1 stays the sequential loop on the pipeline's engines."""
    sizes = parse_sizes(sizes)
    sweep = BatchSweep(
        bp,
        inputs,
        synthetic=synthetic,
        base_len=base_len,
        image_tokens=image_tokens,
        clock=clock,
        instrument=instrument,
        batch_engine=batch_engine,
        batch_max_len=batch_max_len,
    )
    idx = list(range(len(inputs)))
    cells = [(v, b) for v in variants for b in sizes]
    for w in range(warmup):
        say(f"batch sweep warm-up {w + 1}/{warmup}")
        short = base_cfg.with_(max_new_tokens=min(2, base_cfg.max_new_tokens))
        for v, b in cells:
            # the sequential warm-up goes over every request on the request path (vision and prefix caches warm)
            rows = idx if (b == 1 and not synthetic) else idx[: min(b, len(idx))]
            sweep.cell(v, v.apply(short), rows, b)
    per_rep: dict[str, dict[str, list[dict]]] = {v.name: {str(b): [] for b in sizes} for v in variants}
    same_tokens = True
    for r in range(reps):
        got: dict[tuple[str, int], dict] = {}
        for v, b in rotate(cells, r):
            t0 = time.perf_counter()
            c = sweep.cell(v, v.apply(base_cfg), idx, b)
            got[(v.name, b)] = c
            rate = c["tokens_per_s"] if c["tokens_per_s"] is not None else c["decode_tokens_per_s"]
            say(
                f"batch rep {r + 1}/{reps} {v.name} B={b}: {rate:.2f} tok/s, step {c['step_s'] * 1e3:.1f} ms ({time.perf_counter() - t0:.1f}s)"
            )
        for v in variants:
            ref = got[(v.name, 1)]["token_ids"]
            for b in sizes:
                c = got[(v.name, b)]
                c["same_tokens_as_sequential"] = c.pop("token_ids") == ref
                same_tokens &= c["same_tokens_as_sequential"]
                per_rep[v.name][str(b)].append(c)
    by_variant = {v.name: _summarize_variant(per_rep[v.name], sizes) for v in variants}
    return {
        "label": LABEL,
        "mode": "synthetic" if synthetic else "pipeline",
        "batch_engine": batch_engine,
        "sizes": sizes,
        "variants": [v.name for v in variants],
        "methods": {v.name: v.method for v in variants},
        "cases": len(inputs),
        "case_ids": [c.get("id") for c in inputs],
        "reps": reps,
        "warmup": warmup,
        "max_new_tokens": base_cfg.max_new_tokens,
        "k": base_cfg.k,
        "instrumented": instrument,
        "synthetic_context": {"base": base_len, "stagger": SYNTHETIC_STAGGER, "image_tokens": image_tokens} if synthetic else None,
        "per_rep": per_rep,
        "by_variant": by_variant,
        "checks": {
            "same_tokens_as_sequential": same_tokens,
            "stepped_same_as_generate_batch": all(
                c.get("stepped_same_as_generate_batch", True) for reps_ in per_rep.values() for cs in reps_.values() for c in cs
            ),
            "sequential_steps_ok": all(c.get("steps_ok", True) for reps_ in per_rep.values() for cs in reps_.values() for c in cs),
        },
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _storage_b1(reps: list[dict]) -> dict[str, Any] | None:
    """The chosen row storage at one row (static slots) beside the sequential loop: medians and the paired ratio of
    decode tokens/s."""
    if "storage_b1" not in reps[0]:
        return None
    got = [c["storage_b1"] for c in reps]
    ratios = [g["decode_tokens_per_s"] / c["decode_tokens_per_s"] for g, c in zip(got, reps) if c["decode_tokens_per_s"]]
    return {
        "decode_tokens_per_s": median([g["decode_tokens_per_s"] for g in got]),
        "ratio_to_sequential_decode": median(ratios) if ratios else None,
        "ratio_reps": ratios,
        "step_s": median([g["step_s"] for g in got]),
        "same_tokens": all(g["same_tokens"] for g in got),
    }


def _summarize_variant(per_size: dict[str, list[dict]], sizes: Sequence[int]) -> dict[str, dict[str, Any]]:
    """Medians over repetitions per batch size, ratios to B = 1 paired within each repetition."""
    seq = per_size["1"]
    out: dict[str, dict[str, Any]] = {}
    for b in sizes:
        reps = per_size[str(b)]
        tps = [c["tokens_per_s"] for c in reps if c["tokens_per_s"] is not None]
        dtps = [c["decode_tokens_per_s"] for c in reps]
        ratio = [_ratio(c["tokens_per_s"], s["tokens_per_s"]) for c, s in zip(reps, seq)]
        ratio = [x for x in ratio if x is not None]
        dratio = [c["decode_tokens_per_s"] / s["decode_tokens_per_s"] for c, s in zip(reps, seq) if s["decode_tokens_per_s"]]
        sratio = [c["step_s"] / s["step_s"] for c, s in zip(reps, seq) if s["step_s"] and s["step_s"] == s["step_s"]]
        row: dict[str, Any] = {
            "batch_size": b,
            "sequential": b == 1,
            "tokens_per_s": median(tps) if tps else None,
            "tokens_per_s_min": min(tps) if tps else None,
            "tokens_per_s_max": max(tps) if tps else None,
            "tokens_per_s_reps": tps,
            "ratio_to_seq": median(ratio) if ratio else None,
            "ratio_to_seq_reps": ratio,
            "decode_tokens_per_s": median(dtps),
            "decode_tokens_per_s_min": min(dtps),
            "decode_tokens_per_s_max": max(dtps),
            "decode_tokens_per_s_reps": dtps,
            "decode_ratio_to_seq": median(dratio) if dratio else None,
            "decode_ratio_to_seq_reps": dratio,
            "step_s": median([c["step_s"] for c in reps]),
            "step_s_reps": [c["step_s"] for c in reps],
            "step_s_mean": median([c["step_s_mean"] for c in reps]),
            "step_ratio": median(sratio) if sratio else None,
            "step_ratio_reps": sratio,
            "full_rows": reps[0]["full_rows"],
            "rows_per_step": median([c["rows_per_step"] for c in reps]),
            "steps": median([c["steps"] for c in reps]),
            "setup_frac": median([c["setup_frac"] for c in reps if c["setup_frac"] is not None]),
            "new_tokens": reps[0]["new_tokens"],
            "tokens_per_case": reps[0]["tokens_per_case"],
            "same_tokens_as_sequential": all(c["same_tokens_as_sequential"] for c in reps),
            "kv_bytes_per_row": reps[0]["kv_bytes_per_row"],
            "kv_rows": reps[0]["kv_rows"],
            "cache_bytes_per_row_peak": reps[0].get("cache_bytes_per_row_peak"),
            "max_batch_stat": reps[0].get("max_batch_stat"),
            "join_s_per_row": median([c["join_s"] / len(c["kv_rows"]) for c in reps]) if "join_s" in reps[0] else None,
            "storage_b1": _storage_b1(reps),
        }
        if all("split_step_s" in c for c in reps):
            keys = reps[0]["split_step_s"]
            row["split_step_s"] = {k: median([c["split_step_s"][k] for c in reps]) for k in keys}
        out[str(b)] = row
    return out
