"""Probes beside the main comparison: whether batching the drafter's two streams in one forward pays, and
the loop's host cost with the models taken out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..base.timing import Clock, median
from .pairs import BenchPair
from .runner import synthetic_prefill
from .settings import STREAMS, SYNTHETIC_PENDING_TOKEN

if TYPE_CHECKING:
    import torch


def probe_drafter_batching(bp: BenchPair, k: int, length: int, reps: int, clock: Clock) -> dict[str, Any]:
    """Does one forward of the drafter's two streams' tokens pay? Times ``extend(1) + extend(K+1)`` (full stream's
    one-token draft, compressed stream's K+1 tokens: two forwards) against ``extend(K+2)`` (one forward with
    both token counts) on a synthetic cache, interleaved. An upper bound on the saving of batching: a real
    batch of the two streams also pays padding and a second cache's attention."""
    import torch

    with torch.no_grad():
        return _probe_batching(bp, k, length, reps, clock)


def _probe_batching(bp: BenchPair, k: int, length: int, reps: int, clock: Clock) -> dict[str, Any]:
    import torch

    from ..engines import VLEngine

    e = VLEngine(bp.pipe.drafter, name="probe")
    synthetic_prefill(e, length, seed=7)
    tok = torch.tensor([SYNTHETIC_PENDING_TOKEN] * (k + 2), device=e.device)
    base = e.length
    e.extend(tok[:1])  # warm
    e.truncate(base)
    sep, bat = [], []
    for r in range(reps):
        for mode in ("sep", "bat") if r % 2 == 0 else ("bat", "sep"):
            t0 = clock.now()
            if mode == "sep":
                e.extend(tok[:1])
                e.extend(tok[: k + 1])
            else:
                e.extend(tok[: k + 2])
            dt = clock.now() - t0
            e.truncate(base)
            (sep if mode == "sep" else bat).append(dt)
    s, b = median(sep), median(bat)
    return {
        "context": length,
        "k": k,
        "separate_s": s,
        "batched_s": b,
        "saving_frac": (s - b) / s if s else None,
        "separate_reps": sep,
        "batched_reps": bat,
        "label": "one (K+2)-token forward vs a 1-token + a (K+1)-token forward of the drafter (upper bound of a two-stream batch)",
    }


class _FakeEngine:
    """A zero-cost stream for the loop probe: ``extend`` returns precomputed logits rows (no model)."""

    def __init__(self, name: str, pool, length: int = 64):
        self.name, self.pool, self._len = name, pool, length
        self.tokens_forwarded = self.forward_calls = 0
        self.device = pool.device
        self._at = 0

    @property
    def length(self) -> int:
        return self._len

    def prefill(self, ids, *args, **kwargs) -> None:
        self._len = int(ids.numel())

    def extend(self, ids):
        n = int(ids.shape[-1])
        self._at = (self._at + n) % (self.pool.shape[0] - 16)
        self._len += n
        self.tokens_forwarded += n
        self.forward_calls += 1
        return self.pool[self._at : self._at + n]

    def truncate(self, length: int) -> None:
        self._len = min(self._len, length)


def probe_loop(
    vocab: int, k: int, steps: int, reps: int, dtype: torch.dtype, device: torch.device, clock: Clock, trace_top: int | None = None
) -> dict[str, Any]:
    """Host cost of one AsymSpec step with the models taken out: the three streams are zero-cost fakes returning
    precomputed ``[n, vocab]`` logits, so what remains is the loop itself (gate, trace, packing, transfers,
    events, truncation). Median per-step time over ``reps`` runs of ``steps`` steps."""
    import torch

    from ..decode import AsymSpecConfig, Counters, steps_for

    gen = torch.Generator(device="cpu").manual_seed(3)
    base = torch.randn(256, vocab, generator=gen) * 3.0
    pools = {s: (base + 0.8 * torch.randn(256, vocab, generator=gen)).to(device=device, dtype=dtype) for s in STREAMS}
    cfg = AsymSpecConfig(k=k, max_new_tokens=10**6)
    if trace_top is not None:
        cfg = cfg.with_(trace_top=trace_top)
    per: list[float] = []
    for _ in range(reps):
        streams = {s: _FakeEngine(s, pools[s]) for s in STREAMS}
        counters = Counters(k, streams)
        pend = torch.tensor([5], device=device)
        it = steps_for("asymspec", streams, {s: pend for s in STREAMS}, cfg, set(), counters=counters)
        next(it)  # first step allocates buffers
        t0 = clock.now()
        for _ in range(steps):
            next(it)
        per.append((clock.now() - t0) / steps)
    return {
        "vocab": vocab,
        "k": k,
        "steps": steps,
        "dtype": str(dtype).replace("torch.", ""),
        "trace_top": cfg.trace_top,
        "step_s": median(per),
        "reps_s": per,
        "label": "AsymSpec loop with zero-cost fake engines (models removed): host cost per step",
    }
