"""Single benchmark runs: one request of one variant through the pipeline (or on synthetic caches),
instrumented or plain, recorded with its bookkeeping checks."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..timing import Clock, Ledger, wrap_streams
from .pairs import BenchPair
from .settings import STREAMS, SYNTHETIC_PENDING_TOKEN

if TYPE_CHECKING:
    import torch

    from ..variants import Variant


@contextlib.contextmanager
def _caption_budget(enabled: bool) -> Iterator[None]:
    """Lift the compressed view's caption budget (1600 chars) so a padded caption reaches the model."""
    if not enabled:
        yield
        return
    import captioning.captioner as cap

    original = cap.compress

    def compress(*args, **kwargs):
        kwargs.setdefault("max_caption_chars", 10**9)
        return original(*args, **kwargs)

    cap.compress = compress
    try:
        yield
    finally:
        cap.compress = original


@contextlib.contextmanager
def _eos(pipe, ignore: bool) -> Iterator[None]:
    saved = pipe.eos_ids
    if ignore:
        pipe.eos_ids = set()
    try:
        yield
    finally:
        pipe.eos_ids = saved


def rotate(items: Sequence, r: int) -> list:
    """``items`` rotated left by ``r``: repetition ``r``'s run order, so no variant always runs first."""
    items = list(items)
    if not items:
        return items
    r %= len(items)
    return items[r:] + items[:r]


ENGINES = ("dynamic", "static", "static-compile")


def engine_factories(engine: str, headroom: int, device: torch.device) -> dict[str, Callable] | None:
    """Engine constructors for ``engine`` (None: the pipeline's own): ``static`` / ``static-compile`` build
    :mod:`asymspec_mm.engines`' static-KV-cache engines, the latter with a compiled one-token decode."""
    from .. import engines as eng
    from ..errors import UnknownOptionError

    if engine == "dynamic":
        return None
    if engine not in ENGINES:
        raise UnknownOptionError(f"engine={engine!r}; choose one of {', '.join(ENGINES)}")
    opts = dict(headroom=headroom, compile_decode=engine == "static-compile",
                compile_mode="reduce-overhead" if device.type == "cuda" else "default")
    return {"text": lambda model, name="verifier": eng.StaticTextEngine(model, name, **opts),
            "vl": lambda model, name="drafter_full": eng.StaticVLEngine(model, name, **opts)}


@contextlib.contextmanager
def _engines(factories: dict | None) -> Iterator[None]:
    """Let the pipeline build its streams with ``factories`` for one request."""
    if not factories:
        yield
        return
    from .. import pipeline as pl

    saved = pl.TextEngine, pl.VLEngine
    pl.TextEngine, pl.VLEngine = factories["text"], factories["vl"]
    try:
        yield
    finally:
        pl.TextEngine, pl.VLEngine = saved


def synthetic_prefill(engine, length: int, seed: int = 0) -> None:
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
    engine.cache = cache
    if hasattr(engine, "rope_delta"):
        engine.rope_delta = 0


def _expected_forwarded(method: str, k: int, steps: int, full_accept_steps: int, deferred_at_end: int = 0) -> dict[str, int]:
    """Decode-phase tokens each stream must forward under the loop's rules (see decode.py's docstring): d_K of
    every step with K acceptances is forwarded once, in that step or the next, except a last one left pending."""
    if method == "asymspec":
        return {"drafter_full": steps * k + full_accept_steps - deferred_at_end, "drafter_comp": steps * (k + 1), "verifier": steps * (k + 1)}
    if method == "sd":
        return {"drafter_comp": steps * k + full_accept_steps - deferred_at_end, "verifier": steps * (k + 1)}
    if method == "floor":
        return {"verifier": steps}
    return {"drafter_full": steps}


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
    checks: dict[str, Any] = {"forwarded_ok": forwarded_ok, "expected_forwarded": expected, "tokens_ok": tokens_ok,
                              "per_position_monotone": monotone}
    if run.get("split"):
        total = sum(run["split"].values())
        checks["split_sum_rel_err"] = abs(total - run["decode_s"]) / run["decode_s"] if run["decode_s"] > 0 else 0.0
        checks["split_nonnegative"] = min(run["split"].values()) >= -0.01 * total
    return checks


class _Runner:
    """Runs single requests of one pair, instrumented or plain, through the pipeline or on synthetic caches."""

    def __init__(self, pair: BenchPair, *, ignore_eos: bool, image_tokens: int, sync: bool, factories: dict | None = None):
        self.pair = pair
        self.factories = factories
        self.pipe = pair.pipe
        self.ignore_eos = ignore_eos
        self.image_tokens = image_tokens
        self.clock = Clock(sync=sync)
        self.current: Ledger | None = None

    def run(self, variant: Variant, cfg, *, case: dict | None = None, caption: str | None = None, length: int | None = None,
            instrument: bool = True, synthetic: bool = False) -> dict[str, Any]:
        ledger = Ledger() if instrument else None
        self.current = ledger
        self._prefill_calls: dict[str, int] = {}
        try:
            with _eos(self.pipe, self.ignore_eos):
                if synthetic:
                    stats, loop_s, context = self._run_synthetic(variant, cfg, length or 256, ledger)
                else:
                    stats, loop_s, context = self._run_pipeline(variant, cfg, case or {}, caption, ledger)
        finally:
            self.current = None
        return self._record(variant, cfg, stats, loop_s, context, ledger, case, synthetic)

    # -- the request path: compress, prompts, vision cache, prefill, loop -----------------------
    def _run_pipeline(self, variant: Variant, cfg, case: dict, caption: str | None, ledger: Ledger | None):
        pipe = self.pipe
        marks: dict[str, float] = {}
        contexts: dict[str, int] = {}

        def start(method, prompts, c, image=None):
            streams, pending = type(pipe)._start(pipe, method, prompts, c, image)
            contexts.update({n: e.length + 1 for n, e in streams.items()})
            self._prefill_calls = {n: e.forward_calls for n, e in streams.items()}
            if ledger is not None:
                streams = wrap_streams(streams, ledger, self.clock)
                for e in streams.values():
                    e.mark_decode()
            marks["ready"] = self.clock.now()
            return streams, pending

        pipe._start = start  # instance attribute: shadows the method for this request only
        try:
            with _caption_budget(caption is not None), _engines(self.factories):
                gen = pipe.stream(case["image"], case["question"], caption=caption if caption is not None else case["caption"],
                                  ocr=case["ocr"], method=variant.method, config=cfg)
                loop_s = 0.0
                while True:
                    t0 = self.clock.now()
                    try:
                        next(gen)
                    except StopIteration as stop:
                        result = stop.value
                        loop_s += self.clock.now() - max(t0, marks.get("ready", t0))
                        break
                    loop_s += self.clock.now() - max(t0, marks.get("ready", t0))
        finally:
            pipe.__dict__.pop("_start", None)
        return result.stats, loop_s, contexts

    # -- synthetic caches: decode cost at a given context length, no prefill ---------------------
    def _run_synthetic(self, variant: Variant, cfg, length: int, ledger: Ledger | None):
        import torch

        from ..decode import Counters
        from ..engines import TextEngine, VLEngine

        pipe = self.pipe
        need = {"asymspec": STREAMS, "sd": ("drafter_comp", "verifier"), "floor": ("verifier",), "drafter": ("drafter_full",)}[variant.method]
        streams: dict[str, Any] = {}
        pending: dict[str, torch.Tensor] = {}
        contexts: dict[str, int] = {}
        text_cls, vl_cls = (self.factories["text"], self.factories["vl"]) if self.factories else (TextEngine, VLEngine)
        for i, name in enumerate(need):
            e = text_cls(pipe.verifier, name="verifier") if name == "verifier" else vl_cls(pipe.drafter, name=name)
            n = length + (self.image_tokens if name == "drafter_full" else 0)
            synthetic_prefill(e, n, seed=i)
            if hasattr(e, "_to_static"):
                e._to_static()
            streams[name] = e
            pending[name] = torch.tensor([SYNTHETIC_PENDING_TOKEN], device=e.device)
            contexts[name] = n + 1
        self._prefill_calls = {n: e.forward_calls for n, e in streams.items()}
        if ledger is not None:
            streams = wrap_streams(streams, ledger, self.clock)
            for e in streams.values():
                e.mark_decode()
        counters = Counters(cfg.k, streams)
        gen = pipe._loop(variant.method, streams, pending, cfg, None, counters)
        loop_s = 0.0
        t_ready = self.clock.now()
        for _ in gen:
            pass
        loop_s = self.clock.now() - t_ready
        stats = counters.as_dict()
        stats.update(stopped_by=getattr(counters, "stopped_by", "max_new_tokens"), vision_calls=0, prefill_s=0.0)
        return stats, loop_s, contexts

    def _record(self, variant, cfg, stats, loop_s, contexts, ledger, case, synthetic) -> dict[str, Any]:
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
            "prefill_calls": dict(getattr(self, "_prefill_calls", {})),
            "prefill_tokens": dict(prefill),
            "vision_calls": stats.get("vision_calls", 0),
            "vision_cache_hits": stats.get("vision_cache_hits", 0),
            "prefill_s": stats.get("prefill_s", 0.0),
            "stopped_by": stats.get("stopped_by"),
            "instrumented": ledger is not None,
        }
        if ledger is not None:
            split = {s: ledger.forward_seconds(s) for s in STREAMS}
            split["gate"] = ledger.buckets.get("gate", 0.0)
            split["trace"] = ledger.buckets.get("trace", 0.0)
            split["other"] = loop_s - sum(split.values())
            run["loop_s"] = loop_s
            run["split"] = split
            run["truncate_s"] = ledger.truncate_seconds()
            run["gate_calls"] = ledger.bucket_calls.get("gate", 0)
            run["extend_costs"] = {s: {str(n): ts for n, ts in d.items()} for s, d in ledger.extend_costs().items()}
        run["checks"] = check_run(run)
        return run

