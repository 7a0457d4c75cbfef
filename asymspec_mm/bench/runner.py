"""Single benchmark runs: one request of one variant, instrumented or plain, recorded with its bookkeeping checks.

A pipeline run (``route: "core"``) takes the route every request of the library takes: the pipeline sets it up
without prefill (:meth:`~asymspec_mm.pipeline.facade.AsymSpecPipeline.prepare` with ``prefill=False``: view, prompts,
vision cache), then it decodes on an engine core of its own (:func:`~asymspec_mm.core.direct_loop.direct_core`, a
request alone as ``pipe.generate`` decodes it), whose turns the runner drives as model calls of the pipeline. Its
first turn prefills the prompts in the paged row storages' own forwards; the row then joins and decodes. Instrumented,
each row storage is a timing proxy (:class:`~asymspec_mm.base.timing.TimedStorage`: forwards carrying prompt pieces
are recorded as prefill, apart from the decode forwards) and a :class:`~asymspec_mm.base.timing.BucketTimer` times the
gate and the trace; the split's clock starts when the row joins, so the prefill is not in it.

Two routes stay on single-row engines (``route: "single-row"``). ``engine=static`` / ``static-compile``
(:func:`engine_factory`): StaticEngines' fixed-shape slots, which CUDA graphs need, exist only as single-row engines,
so such a run is prefilled by ``prepare`` on them (``prefill=True``) and decoded by ``pipe.run`` through
:class:`~asymspec_mm.base.timing.TimedEngine` proxies. Synthetic caches (:meth:`Runner._run_synthetic`): random KV of a
given length poured into a single-row cache, decode cost at that length without paying its prefill; the core's
storages are filled by forwards only.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..base.timing import BucketTimer, Clock, Ledger, TimedStorage, wrap_streams
from .pairs import BenchPair
from .settings import STREAMS, SYNTHETIC_PENDING_TOKEN, TIMER_BUCKETS, UNBOUNDED_CAPTION

if TYPE_CHECKING:
    import torch

    from ..base.config import AsymSpecConfig
    from ..core.engine_core import EngineCore
    from ..engines import Engine, EngineFactory
    from ..frontend.variants import Variant
    from ..request.session import Session


def rotate(items: Sequence, r: int) -> list:
    """``items`` rotated left by ``r``: repetition ``r``'s run order, so no variant always runs first."""
    items = list(items)
    if not items:
        return items
    r %= len(items)
    return items[r:] + items[:r]


ENGINES = ("dynamic", "static", "static-compile")


def engine_factory(engine: str, headroom: int, device: torch.device) -> EngineFactory | None:
    """The single-row engine factory ``engine`` names (None: ``dynamic``, the requests decode on the engine core):
    ``static`` / ``static-compile`` build :class:`asymspec_mm.engines.StaticEngines`' static-KV-cache engines, the
    latter with a compiled one-token decode. Their fixed-shape slots (what CUDA graphs replay) are single-row engines
    only, so a :class:`Runner` given one keeps the single-row route."""
    from ..base.errors import UnknownOptionError
    from ..engines import StaticEngines

    if engine == "dynamic":
        return None
    if engine not in ENGINES:
        raise UnknownOptionError(f"engine={engine!r}; choose one of {', '.join(ENGINES)}")
    return StaticEngines(
        headroom=headroom, compile_decode=engine == "static-compile", compile_mode="reduce-overhead" if device.type == "cuda" else "default"
    )


def synthetic_prefill(engine: Engine, length: int, seed: int = 0) -> None:
    """Fill ``engine``'s cache with ``length`` random key/value positions (nothing forwarded): a context of that
    length for decode-cost measurements without paying its prefill."""
    import torch
    from transformers import DynamicCache

    cfg = engine.model.config
    text = cfg.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    dtype = next(engine.model.parameters()).dtype
    dev = engine.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    cache = DynamicCache(config=cfg)
    for layer in range(text.num_hidden_layers):
        shape = (1, text.num_key_value_heads, length, head_dim)
        k = torch.randn(shape, generator=gen, device=dev, dtype=torch.float32).to(dtype)
        v = torch.randn(shape, generator=gen, device=dev, dtype=torch.float32).to(dtype)
        cache.update(k, v, layer)
    engine.adopt_cache(cache)


def _expected_forwarded(method: str, k: int, steps: int, full_accept_steps: int, deferred_at_end: int = 0) -> dict[str, int]:
    """Decode-phase tokens each stream must forward under the loop's rules (see asymspec_mm.decode.streams): d_K of
    every step with K acceptances is forwarded once, in that step or the next, except a last one left pending."""
    if method == "asymspec":
        return {
            "drafter_full": steps * k + full_accept_steps - deferred_at_end,
            "drafter_comp": steps * (k + 1),
            "verifier": steps * (k + 1),
        }
    if method == "sd":
        return {"drafter_comp": steps * k + full_accept_steps - deferred_at_end, "verifier": steps * (k + 1)}
    if method == "floor":
        return {"verifier": steps}
    return {"drafter_full": steps}


SPLIT_SUM_REL_TOL = 0.05  # the split (forwards + gate + trace + rest) sums to the loop's own clock within 5% ...
SPLIT_SUM_JITTER_S = 0.005  # ... plus one scheduler time slice of jitter between the two clocks


def check_run(run: dict[str, Any]) -> dict[str, Any]:
    """Bookkeeping checks of one run: forwarded counts, accepted-per-position, token bounds, split sum."""
    k, steps = run["k"], run["steps"]
    app = run["accepted_per_position"]
    method = run["method"]
    spec = method in ("asymspec", "sd")
    full = app[k - 1] if spec and len(app) >= k else 0
    expected = _expected_forwarded(method, k, steps, full, run.get("deferred_draft_at_end", 0))
    forwarded_ok = all(run["decode_forwarded"].get(s, 0) == n for s, n in expected.items())
    accepted_k = sum(app) if spec else 0
    tokens_ok = (accepted_k + steps - (k + 1 if spec else 1) < run["new_tokens"] <= accepted_k + steps) if steps else run["new_tokens"] == 0
    monotone = all(app[i] >= app[i + 1] for i in range(len(app) - 1))
    checks: dict[str, Any] = {
        "forwarded_ok": forwarded_ok,
        "expected_forwarded": expected,
        "tokens_ok": tokens_ok,
        "per_position_monotone": monotone,
    }
    if run.get("split"):
        total = sum(run["split"].values())
        gap = abs(total - run["decode_s"])
        checks["split_sum_rel_err"] = gap / run["decode_s"] if run["decode_s"] > 0 else 0.0
        # The two clocks start and stop a few statements apart, so a thread switch between them (a loaded machine,
        # short runs) shows as a few ms of gap that no bookkeeping error explains.
        checks["split_sum_ok"] = gap <= SPLIT_SUM_REL_TOL * run["decode_s"] + SPLIT_SUM_JITTER_S
        checks["split_nonnegative"] = min(run["split"].values()) >= -0.01 * total
    return checks


@dataclass
class Decoded:
    """What one run's decoding left: the answer's statistics and tokens, ``loop_s`` (the split's clock: from the moment
    the streams hold their prompts to the end) and each stream's context when decoding began (its prompt's tokens,
    the last one pending)."""

    stats: dict[str, Any]
    token_ids: list[int]
    loop_s: float
    contexts: dict[str, int]


class Runner:
    """Runs single requests of one pair, instrumented or plain, on the engine core, single-row engines or synthetic
    caches (see the module docstring).

    ``ignore_eos``: decode every request to its token budget; ``image_tokens``: image positions of the
    full stream's synthetic context; ``sync``: the clock synchronizes the device; ``engines``: a single-row engine
    factory (``engine=static``) for every stream, which keeps pipeline runs on the single-row route (None: they
    decode on the engine core; synthetic runs: the pipeline's own factory).
    """

    def __init__(self, pair: BenchPair, *, ignore_eos: bool, image_tokens: int, sync: bool, engines: EngineFactory | None = None):
        self.pair = pair
        self.engines = engines
        self.pipe = pair.pipe
        self.ignore_eos = ignore_eos
        self.image_tokens = image_tokens
        self.clock = Clock(sync=sync)

    def route(self, synthetic: bool = False) -> str:
        """Where a run decodes: ``"core"`` (a pipeline run with no single-row factory) or ``"single-row"``."""
        return "core" if self.engines is None and not synthetic else "single-row"

    def run(
        self,
        variant: Variant,
        cfg: AsymSpecConfig,
        *,
        case: dict | None = None,
        caption: str | None = None,
        length: int | None = None,
        instrument: bool = True,
        synthetic: bool = False,
    ) -> dict[str, Any]:
        """One request of ``variant`` at ``cfg``: ``case`` (``caption`` in place of its own, budget lifted) or,
        ``synthetic``, caches of ``length`` positions; ``instrument``: time every call and the gate/trace."""
        ledger = Ledger() if instrument else None
        if synthetic:
            decoded = self._run_synthetic(variant, cfg, length or 256, ledger)
        else:
            decoded = self._run_pipeline(variant, cfg, case or {}, caption, ledger)
        return self._record(variant, cfg, decoded, ledger, case, synthetic)

    def _take_over(self, streams: dict[str, Engine], ledger: Ledger | None) -> dict[str, int]:
        """The prefilled single-row ``streams``' contexts (length + 1: the pending token); instrumented, they are
        replaced in place by timing proxies whose calls all count as decoding."""
        contexts = {n: e.length + 1 for n, e in streams.items()}
        if ledger is not None:
            streams.update(wrap_streams(streams, ledger, self.clock, decode=True))
        return contexts

    def _timer(self, ledger: Ledger | None) -> BucketTimer | None:
        return BucketTimer(ledger, self.clock) if ledger is not None else None

    # -- the request path: compress, prompts, vision cache, then prefill and decode ---------------
    def _run_pipeline(self, variant: Variant, cfg: AsymSpecConfig, case: dict, caption: str | None, ledger: Ledger | None) -> Decoded:
        """One request set up by the pipeline: on the engine core (``prefill=False``), or with a single-row factory
        prefilled on its engines by ``prepare`` (``prefill=True``) and decoded on them."""
        on_core = self.route() == "core"
        session = self.pipe.prepare(
            case["image"],
            case["question"],
            caption=caption if caption is not None else case["caption"],
            ocr=case["ocr"],
            method=variant.method,
            config=cfg,
            engines=self.engines,
            prefill=not on_core,
            ignore_eos=self.ignore_eos,
            max_caption_chars=UNBOUNDED_CAPTION if caption is not None else None,
        )
        return self._decode_on_core(session, ledger) if on_core else self._decode_single_row(session, ledger)

    def _decode_on_core(self, session: Session, ledger: Ledger | None) -> Decoded:
        """``session`` (set up without prefill) decoded on an engine core of its own, a request alone, as
        ``pipe.generate`` decodes it: its first turn prefills the prompts in the row storages' forwards, the row
        joins, then it decodes a step a turn. The split's clock starts at the join (see :meth:`_turns`) and stops
        after the turn that made the answer, so its rest holds the core's turn bookkeeping and the row's finish (its
        answer made, its slots freed: 0.25-0.45 ms a request on the tiny pair), which the single-row route makes
        after its clock stopped; the answer's decode clock (``decode_s``) stops as the finish begins."""
        from ..base.gc_heap import frozen_heap
        from ..core.direct_loop import direct_core

        timed = functools.partial(TimedStorage, ledger=ledger, clock=self.clock) if ledger is not None else None
        core = direct_core(self.pipe, timer=self._timer(ledger), wrap_storage=timed)
        contexts = _staged_contexts(session)
        core.add_session(session)
        with frozen_heap():  # as pipe.generate decodes a request alone (core.direct.session_steps)
            result, t_join = self._turns(core)
            loop_s = self.clock.now() - t_join
        return Decoded(result.stats, list(result.token_ids), loop_s, contexts)

    def _turns(self, core: EngineCore) -> tuple[Any, float]:
        """Every turn of ``core`` (one request), each a model call of the pipeline; returns the request's answer and
        when its decoding began: its row's join, where the row's own decode clock (its counters') starts, read once a
        turn leaves the row in the core. A row that joins and ends within one turn (prompts found whole in the stored
        prefixes, one step) began with that turn. The request's error is raised."""
        from ..core.loop_client import model_call

        result, t_join = None, None
        while core.has_work:
            t_turn = time.perf_counter()  # the counters' clock; self.clock would synchronize a plain run's device
            for out in model_call(self.pipe, core.step):
                if out.error is not None:
                    raise out.error
                if out.finished:
                    result = out.result
            if t_join is None and core.decoder.rows:
                t_join = next(iter(core.decoder.rows.values())).counters.t0
            elif t_join is None and result is not None:
                t_join = t_turn
        return result, t_join

    def _decode_single_row(self, session: Session, ledger: Ledger | None) -> Decoded:
        """``session`` prefilled on single-row engines, decoded by ``pipe.run`` on them (through timing proxies)."""
        contexts = self._take_over(session.streams, ledger)
        t_ready = self.clock.now()
        stream = self.pipe.run(session, timer=self._timer(ledger))
        for _ in stream:
            pass
        loop_s = self.clock.now() - t_ready
        return Decoded(stream.result.stats, list(stream.result.token_ids), loop_s, contexts)

    # -- synthetic caches: decode cost at a given context length, no prefill ---------------------
    def _run_synthetic(self, variant: Variant, cfg: AsymSpecConfig, length: int, ledger: Ledger | None) -> Decoded:
        """Caches of ``length`` random positions (+ image positions on the full stream) decoded by the single-row
        loop: :func:`synthetic_prefill` pours random KV into a single-row engine's cache; the engine core's storages
        take KV only through forwards (a prefill), which is what these runs leave out."""
        import torch

        from ..decode import Counters, steps_for

        pipe = self.pipe
        factory = self.engines or pipe.engines
        streams: dict[str, Any] = {}
        pending: dict[str, torch.Tensor] = {}
        for i, (name, model) in enumerate(pipe.stream_models(variant.method).items()):
            e = factory.vision(model, name) if model is pipe.drafter else factory.text(model, name)
            synthetic_prefill(e, length + (self.image_tokens if name == "drafter_full" else 0), seed=i)
            streams[name] = e
            pending[name] = torch.tensor([SYNTHETIC_PENDING_TOKEN], device=e.device)
        contexts = self._take_over(streams, ledger)
        counters = Counters(cfg.k, streams)
        steps = steps_for(
            variant.method, streams, pending, cfg, set() if self.ignore_eos else pipe.eos_ids, counters=counters, timer=self._timer(ledger)
        )
        t_ready = self.clock.now()
        token_ids = [ev.token_id for events in steps for ev in events]
        loop_s = self.clock.now() - t_ready
        stats = counters.as_dict()
        stats.update(vision_calls=0, prefill_s=0.0)
        return Decoded(stats, token_ids, loop_s, contexts)

    def _record(
        self,
        variant: Variant,
        cfg: AsymSpecConfig,
        decoded: Decoded,
        ledger: Ledger | None,
        case: dict | None,
        synthetic: bool,
    ) -> dict[str, Any]:
        """The run as the bench keeps it: counts, times, the split (instrumented) and its checks.

        ``context``: each stream's context when decoding began (its prompt's tokens, the last one pending; synthetic:
        the random positions + 1). ``prefill_calls``: the forward calls each stream made before decoding began (the
        answer's statistics): on the core, the row storage's forwards that carried the row's prompt pieces (one per
        stream for a request alone, the direct core's prompt budget being unbounded; 0 where a stored prefix held
        the whole prompt), on single-row engines the prefill's calls; ``forward_calls`` minus them are the decode
        forwards. ``route``: ``"core"`` or ``"single-row"`` (:meth:`Runner.route`)."""
        stats = decoded.stats
        prefill = stats.get("prefill_tokens", {})
        decode_fwd = {s: n - prefill.get(s, 0) for s, n in stats["tokens_forwarded"].items()}
        run: dict[str, Any] = {
            "variant": variant.name,
            "method": variant.method,
            "k": cfg.k,
            "case": case.get("id") if case else None,
            "synthetic": synthetic,
            "route": self.route(synthetic),
            "context": decoded.contexts,
            "new_tokens": stats["new_tokens"],
            "token_ids": decoded.token_ids,
            "steps": stats["steps"],
            "decode_s": stats["decode_wall_s"],
            "tokens_per_s": stats["tokens_per_s"],
            "drafted": stats["drafted"],
            "accepted": stats["accepted"],
            "bonus_drafted": stats.get("bonus_drafted", 0),
            "bonus_accepted": stats.get("bonus_accepted", 0),
            "deferred_draft_at_end": stats.get("deferred_draft_at_end", 0),
            "accepted_per_position": list(stats["accepted_per_position"]) if variant.method in ("asymspec", "sd") else [],
            "decode_forwarded": decode_fwd,
            "forward_calls": dict(stats["forward_calls"]),
            "prefill_calls": dict(stats["prefill_calls"]),
            "prefill_tokens": dict(prefill),
            "vision_calls": stats.get("vision_calls", 0),
            "vision_cache_hits": stats.get("vision_cache_hits", 0),
            "prefill_s": stats.get("prefill_s", 0.0),
            "stopped_by": stats.get("stopped_by"),
            "instrumented": ledger is not None,
        }
        if ledger is not None:
            loop_s = decoded.loop_s
            split = {s: ledger.forward_seconds(s) for s in STREAMS}
            split.update({b: ledger.buckets.get(b, 0.0) for b in TIMER_BUCKETS})
            split["other"] = loop_s - sum(split.values())
            run["loop_s"] = loop_s
            run["split"] = split
            # the core's forwards that carried prompt pieces (single-row routes: prefilled before the proxies)
            run["prefill_forward_s"] = {s: ledger.forward_seconds(s, decode_only=False) - split[s] for s in STREAMS}
            run["truncate_s"] = ledger.truncate_seconds()  # single-row rollbacks; the core's are its views' (not calls)
            run["gate_calls"] = ledger.bucket_calls.get("gate", 0)
            run["extend_costs"] = {s: {str(n): ts for n, ts in d.items()} for s, d in ledger.extend_costs().items()}
        run["checks"] = check_run(run)
        return run


def _staged_contexts(session: Session) -> dict[str, int]:
    """Each stream's context when decoding begins on the core: its staged prompt (``prompt[:-1]``) + the pending
    token, as a prefilled single-row engine's length + 1; a stream prefilled at set-up (served elsewhere): its
    length + 1."""
    contexts = {n: e.length + 1 for n, e in session.streams.items()}
    contexts.update({n: int(p.ids.numel()) + 1 for n, p in session.to_prefill.items()})
    return {n: contexts[n] for n in STREAMS if n in contexts}
