"""Batched, chunked prefill (issue #28): several requests' prompts in one ragged forward per stream, split by a token
budget, equal single-row prefill (KV and next logits) with images, M-RoPE and prefix-store hits; admitting requests
never holds a decoding row up for more than one bounded forward per stream (counted, not timed)."""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import make_case

from asymspec_mm import AsymSpecConfig
from asymspec_mm.core.prefill import ChunkedPrefill
from asymspec_mm.core.request_state import RequestStatus
from asymspec_mm.engines import PrefixKV, TextEngine, VLEngine

CFG = AsymSpecConfig(k=3, max_new_tokens=8)


def _kwargs(seed: int, **extra) -> dict:
    c = make_case(seed)
    return {"image": c["image"], "question": c["question"], "caption": c["caption"], "ocr": c["ocr"], **extra}


def _next_logits(pipe, name: str, cache, rope_delta: int, pending: torch.Tensor) -> torch.Tensor:
    """The logits after ``pending`` on a single-row engine holding ``cache`` (what the decoder's first step computes)."""
    engine = TextEngine(pipe.verifier, name) if name == "verifier" else VLEngine(pipe.drafter, name)
    engine.cache = cache
    if name != "verifier":
        engine.rope_delta = rope_delta
    return engine.extend(pending)


def _prefill_all(stage: ChunkedPrefill) -> tuple[dict, int]:
    calls = 0
    while True:
        ready = stage.step()
        calls += 1
        if len(ready) == len(stage):
            prompts = {rid: stage.prompts(rid) for rid in ready}
            return {rid: (stage.take(rid)[0], prompts[rid]) for rid in ready}, calls


@pytest.mark.parametrize("chunk", [3, 17, 4096])
def test_chunked_prefill_equals_single_row_prefill(tiny_pipe, chunk):
    """Rows of different lengths and images, prefilled together with pieces of ``chunk`` tokens: every stream's KV,
    length, rope delta and next-token logits equal the single-row prefill of that request; a second pass over the
    same requests starts from their stored prompts (nothing left to forward) and still equals it."""
    seeds = [11, 12, 13]
    single = [tiny_pipe.prepare(**_kwargs(s), config=CFG, prefill=True) for s in seeds]
    staged = [tiny_pipe.prepare(**_kwargs(s), config=CFG, prefill=False) for s in seeds]
    assert all(not s.streams and set(s.to_prefill) == {"drafter_full", "drafter_comp", "verifier"} for s in staged)
    lengths = {s.to_prefill["drafter_full"].ids.numel() for s in staged}
    assert len(lengths) == len(seeds)  # ragged rows
    store = PrefixKV(2**30)
    for attempt in ("miss", "hit"):
        stage = ChunkedPrefill(tiny_pipe.stream_models("asymspec"), chunk_tokens=chunk, prefix_kv=store)
        for i, s in enumerate(staged):
            stage.add(i, {n: _fresh(p) for n, p in s.to_prefill.items()})
        rows, calls = _prefill_all(stage)
        longest = max(p.ids.numel() for s in staged for p in s.to_prefill.values())
        if attempt == "hit":
            assert calls == 1 and stage.forwards == 0 and stage.tokens == 0
        elif chunk < longest:
            assert calls >= -(-longest // chunk)
        else:  # one forward a stream
            assert calls == 1 and stage.forwards == 3
        for i, (ref, s) in enumerate(zip(single, staged)):
            contexts, prompts = rows[i]
            for name, prompt in prompts.items():
                assert prompt.cached == (prompt.ids.numel() if attempt == "hit" else 0), (name, attempt)
            for name, ctx in contexts.items():
                want = ref.streams[name]
                assert ctx.length == want.length, (name, attempt)
                assert ctx.rope_delta == getattr(want, "rope_delta", 0)
                for got_layer, want_layer in zip(ctx.cache.layers, want.cache.layers):
                    torch.testing.assert_close(got_layer.keys, want_layer.keys[..., : want.length, :], atol=2e-5, rtol=1e-4)
                    torch.testing.assert_close(got_layer.values, want_layer.values[..., : want.length, :], atol=2e-5, rtol=1e-4)
                pending = s.pending[name]
                got = _next_logits(tiny_pipe, name, ctx.cache, ctx.rope_delta, pending)
                expect = want.extend(pending)
                want.truncate(want.length - 1)
                torch.testing.assert_close(got, expect, atol=2e-5, rtol=1e-4)
                assert torch.equal(got.argmax(-1), expect.argmax(-1))


def _fresh(prompt):
    """A copy of a stream prompt with nothing prefilled (one prompt is prefilled once per stage)."""
    from dataclasses import replace

    return replace(prompt, done=0, cached=0)


def test_a_budget_splits_a_long_prompt_and_shares_a_forward(tiny_pipe):
    """The budget caps each stream's forward: pieces of the first-come row first, the next row in the same forward
    when budget is left; a row joins the decoder only once every stream's prompt is in."""
    a, b = (tiny_pipe.prepare(**_kwargs(s), config=CFG, prefill=False) for s in (21, 22))
    stage = ChunkedPrefill(tiny_pipe.stream_models("asymspec"), chunk_tokens=40)
    stage.add(0, a.to_prefill)
    stage.add(1, b.to_prefill)
    verifier = [a.to_prefill["verifier"], b.to_prefill["verifier"]]
    total = sum(p.ids.numel() for p in verifier)
    before = stage.tokens
    stage.step()
    first = [p.done for p in verifier]
    assert sum(first) == min(40, total) and first[0] == min(40, verifier[0].ids.numel())
    assert stage.tokens - before <= 40 * 3
    ready = []
    while len(ready) < 2:
        ready = stage.step()
    assert all(p.left == 0 for s in (a, b) for p in s.to_prefill.values())


def test_a_turns_token_budget_is_shared_by_every_streams_pieces(tiny_pipe):
    """One token budget a turn (issue #42): with ``budget`` given, the three streams' forwards carry at most that many
    prompt tokens together (an even share each, never more than the chunk), and the prompts still all get in."""
    a = tiny_pipe.prepare(**_kwargs(23), config=CFG, prefill=False)
    stage = ChunkedPrefill(tiny_pipe.stream_models("asymspec"), chunk_tokens=40)
    stage.add(0, a.to_prefill)
    shares = []
    while True:
        before = {name: p.done for name, p in a.to_prefill.items()}
        waiting = sum(p.left > 0 for p in a.to_prefill.values())
        tokens = stage.tokens
        ready = stage.step(budget=30)
        assert stage.tokens - tokens <= 30
        share = 30 // waiting
        for name, p in a.to_prefill.items():
            had = p.ids.numel() - before[name]
            assert p.done - before[name] == min(share, had), name  # an even share, or what was left
        shares.append(share)
        if ready:
            break
    assert all(p.left == 0 for p in a.to_prefill.values()) and shares[0] == 10 and len(shares) > 1


def test_generate_batch_prefills_in_batches_and_equals_requests_alone(tiny_pipe):
    """generate_batch's rows are prefilled by the batched stage (fewer forwards than one per request and stream) and
    each equals pipe.generate of its request, for chunk budgets that split the prompts."""
    reqs = [_kwargs(30 + i) for i in range(5)]
    alone = [tiny_pipe.generate(**r, config=CFG).token_ids for r in reqs]
    for chunk in (16, 512):
        got = tiny_pipe.generate_batch(reqs, config=CFG, batch_size=5, prefill_chunk_tokens=chunk)
        assert [g.token_ids for g in got] == alone, chunk


def test_admission_holds_a_live_row_up_for_at_most_one_forward_per_stream(tiny_pipe):
    """A live row decodes while four requests that need captioning are admitted. Every model forward is recorded
    (a forward hook on each model: the thread, the tokens, the rows) beside the live row's steps: between two steps
    of the live row the decode thread runs one step's forwards and no other (the prompt pieces ride in them), the
    set-up thread runs none (captions are rows of the batch), and the live row keeps stepping while the requests
    arrive."""
    chunk = 24
    log: list[tuple] = []
    lock = threading.Lock()

    def hook(module, args, kwargs, out):
        ids = kwargs.get("input_ids")
        with lock:
            log.append(("forward", threading.current_thread().name, tuple(ids.shape) if ids is not None else None))

    hooks = [m.register_forward_hook(hook, with_kwargs=True) for m in (tiny_pipe.drafter, tiny_pipe.verifier)]
    try:
        # the live row's steps marked by the decode loop itself (a handle's listener runs on the output thread, which
        # may hand it several steps at once): a step the live row took part in, which is every step while it decodes
        # (the loop calls on_step before a row that finished in the step leaves)
        held: list = []

        def on_step(*_):
            if held and held[0].status is RequestStatus.RUNNING:
                with lock:
                    log.append(("step", None, None))

        with tiny_pipe.scheduler(max_batch_size=5, prefill_chunk_tokens=chunk, on_step=on_step) as sched:
            live = sched.submit(**_kwargs(40), config=AsymSpecConfig(k=3, max_new_tokens=400), ignore_eos=True)
            held.append(live)
            for _ in range(6000):  # the live row is decoding (a bound of 120 s on a hang, not a timing claim)
                with lock:
                    if sum(e[0] == "step" for e in log) >= 3:
                        break
                threading.Event().wait(0.02)
            with lock:
                start = len(log)
            news = [sched.submit(**_kwargs(41 + i, caption=None), config=AsymSpecConfig(k=3, max_new_tokens=4)) for i in range(4)]
            for h in news:
                h.result(timeout=300)
            with lock:
                window = log[start:]
            live.cancel()
    finally:
        for h in hooks:
            h.remove()
    steps = [i for i, e in enumerate(window) if e[0] == "step"]
    forwards = [e for e in window if e[0] == "forward"]
    # a forward with more tokens than five rows decoding make (K + 1 = 4 each) carried prompt pieces
    carried = [e for e in forwards if e[2] is not None and e[2][0] * e[2][1] > 5 * 4]
    assert carried and all(h.result().view.caption for h in news)  # captions were written and prompts prefilled
    # the set-up thread runs no model: captions are rows of the batch, the tower's call runs in the decode loop
    assert {e[1] for e in forwards} == {"asymspec-scheduler"}
    assert len(steps) > 10  # the live row went on decoding
    for lo, hi in zip(steps, steps[1:]):
        between = [e for e in window[lo + 1 : hi] if e[0] == "forward"]
        # one step's forwards (K = 3 drafting on the full view, one scoring forward on each other stream) and no
        # other: the prompt pieces ride in them (the staging path ran up to one more forward per stream)
        assert len(between) <= 3 + 2
