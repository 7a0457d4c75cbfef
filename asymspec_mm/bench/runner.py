"""Single benchmark runs: one request of one variant through the pipeline (or on synthetic caches),
instrumented or plain, recorded with its bookkeeping checks.

A run goes through the pipeline's public steps: :meth:`~asymspec_mm.pipeline.facade.AsymSpecPipeline.prepare`
(view, prompts, prefill), then the bench swaps the session's streams for timing proxies (so the prefill
is not in the split) and decodes with :meth:`~asymspec_mm.pipeline.facade.AsymSpecPipeline.run` and a
:class:`~asymspec_mm.base.timing.BucketTimer` for the gate and the trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..base.timing import BucketTimer, Clock, Ledger, wrap_streams
from .pairs import BenchPair
from .settings import STREAMS, SYNTHETIC_PENDING_TOKEN, TIMER_BUCKETS, UNBOUNDED_CAPTION

if TYPE_CHECKING:
    import torch

    from ..base.config import AsymSpecConfig
    from ..engines import Engine, EngineFactory
    from ..frontend.variants import Variant


def rotate(items: Sequence, r: int) -> list:
    """``items`` rotated left by ``r``: repetition ``r``'s run order, so no variant always runs first."""
    items = list(items)
    if not items:
        return items
    r %= len(items)
    return items[r:] + items[:r]


ENGINES = ("dynamic", "static", "static-compile")


def engine_factory(engine: str, headroom: int, device: torch.device) -> EngineFactory | None:
    """The engine factory ``engine`` names (None: the pipeline's own): ``static`` / ``static-compile`` build
    :class:`asymspec_mm.engines.StaticEngines`' static-KV-cache engines, the latter with a compiled one-token decode."""
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


class Runner:
    """Runs single requests of one pair, instrumented or plain, through the pipeline or on synthetic caches.

    ``ignore_eos``: decode every request to its token budget; ``image_tokens``: image positions of the
    full stream's synthetic context; ``sync``: the clock synchronizes the device; ``engines``: the engine
    factory of every stream (None: the pipeline's own).
    """

    def __init__(self, pair: BenchPair, *, ignore_eos: bool, image_tokens: int, sync: bool, engines: EngineFactory | None = None):
        self.pair = pair
        self.engines = engines
        self.pipe = pair.pipe
        self.ignore_eos = ignore_eos
        self.image_tokens = image_tokens
        self.clock = Clock(sync=sync)

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
            stats, loop_s, contexts, prefill_calls = self._run_synthetic(variant, cfg, length or 256, ledger)
        else:
            stats, loop_s, contexts, prefill_calls = self._run_pipeline(variant, cfg, case or {}, caption, ledger)
        return self._record(variant, cfg, stats, loop_s, contexts, prefill_calls, ledger, case, synthetic)

    def _take_over(self, streams: dict[str, Engine], ledger: Ledger | None) -> tuple[dict[str, int], dict[str, int]]:
        """The prefilled ``streams``' contexts and prefill calls; instrumented, they are replaced in place by
        timing proxies whose calls all count as decoding."""
        contexts = {n: e.length + 1 for n, e in streams.items()}
        prefill_calls = {n: e.forward_calls for n, e in streams.items()}
        if ledger is not None:
            streams.update(wrap_streams(streams, ledger, self.clock, decode=True))
        return contexts, prefill_calls

    def _timer(self, ledger: Ledger | None) -> BucketTimer | None:
        return BucketTimer(ledger, self.clock) if ledger is not None else None

    # -- the request path: compress, prompts, vision cache, prefill, loop -----------------------
    def _run_pipeline(self, variant: Variant, cfg: AsymSpecConfig, case: dict, caption: str | None, ledger: Ledger | None):
        pipe = self.pipe
        session = pipe.prepare(
            case["image"],
            case["question"],
            caption=caption if caption is not None else case["caption"],
            ocr=case["ocr"],
            method=variant.method,
            config=cfg,
            engines=self.engines,
            prefill=True,
            ignore_eos=self.ignore_eos,
            max_caption_chars=UNBOUNDED_CAPTION if caption is not None else None,
        )
        contexts, prefill_calls = self._take_over(session.streams, ledger)
        t_ready = self.clock.now()
        stream = pipe.run(session, timer=self._timer(ledger))
        for _ in stream:
            pass
        loop_s = self.clock.now() - t_ready
        return stream.result.stats, loop_s, contexts, prefill_calls

    # -- synthetic caches: decode cost at a given context length, no prefill ---------------------
    def _run_synthetic(self, variant: Variant, cfg: AsymSpecConfig, length: int, ledger: Ledger | None):
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
        contexts, prefill_calls = self._take_over(streams, ledger)
        counters = Counters(cfg.k, streams)
        steps = steps_for(
            variant.method, streams, pending, cfg, set() if self.ignore_eos else pipe.eos_ids, counters=counters, timer=self._timer(ledger)
        )
        t_ready = self.clock.now()
        for _ in steps:
            pass
        loop_s = self.clock.now() - t_ready
        stats = counters.as_dict()
        stats.update(vision_calls=0, prefill_s=0.0)
        return stats, loop_s, contexts, prefill_calls

    def _record(
        self,
        variant: Variant,
        cfg: AsymSpecConfig,
        stats: dict[str, Any],
        loop_s: float,
        contexts: dict[str, int],
        prefill_calls: dict[str, int],
        ledger: Ledger | None,
        case: dict | None,
        synthetic: bool,
    ) -> dict[str, Any]:
        """The run as the bench keeps it: counts, times, the split (instrumented) and its checks."""
        prefill = stats.get("prefill_tokens", {})
        decode_fwd = {s: n - prefill.get(s, 0) for s, n in stats["tokens_forwarded"].items()}
        run: dict[str, Any] = {
            "variant": variant.name,
            "method": variant.method,
            "k": cfg.k,
            "case": case.get("id") if case else None,
            "synthetic": synthetic,
            "context": contexts,
            "new_tokens": stats["new_tokens"],
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
            "prefill_calls": prefill_calls,
            "prefill_tokens": dict(prefill),
            "vision_calls": stats.get("vision_calls", 0),
            "vision_cache_hits": stats.get("vision_cache_hits", 0),
            "prefill_s": stats.get("prefill_s", 0.0),
            "stopped_by": stats.get("stopped_by"),
            "instrumented": ledger is not None,
        }
        if ledger is not None:
            split = {s: ledger.forward_seconds(s) for s in STREAMS}
            split.update({b: ledger.buckets.get(b, 0.0) for b in TIMER_BUCKETS})
            split["other"] = loop_s - sum(split.values())
            run["loop_s"] = loop_s
            run["split"] = split
            run["truncate_s"] = ledger.truncate_seconds()
            run["gate_calls"] = ledger.bucket_calls.get("gate", 0)
            run["extend_costs"] = {s: {str(n): ts for n, ts in d.items()} for s, d in ledger.extend_costs().items()}
        run["checks"] = check_run(run)
        return run
