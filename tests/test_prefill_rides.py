"""Prompt chunks inside the decode step's forwards (issue #51, item 4): an arriving row is a row of its paged decode
storages from its admission, and each turn its prompt pieces ride in the first forward the step makes on each
storage. Counted with forward hooks on the real models (each forward's storage told apart by the cache it runs on):
a turn that carries an arriving row's pieces makes exactly the forwards per storage that a turn without them makes,
no staging storage runs, and every row's answer equals its answer alone. Real forwards of the tiny pair."""

from __future__ import annotations

import functools
from collections import Counter

import pytest
from conftest import make_case

from asymspec_mm import AsymSpecConfig
from asymspec_mm.core import BatchDecoder

LIVE = AsymSpecConfig(k=3, max_new_tokens=48)
NEW = AsymSpecConfig(k=2, max_new_tokens=10)


def _case(seed: int) -> dict:
    c = make_case(seed)
    return {"image": c["image"], "question": c["question"], "caption": c["caption"], "ocr": c["ocr"]}


@functools.cache
def _alone(pipe, seed: int, method: str, cfg: AsymSpecConfig) -> list[int]:
    """The tokens of request ``seed`` decoded alone (``pipe.generate``)."""
    return pipe.generate(**_case(seed), method=method, config=cfg, ignore_eos=True).token_ids


class ForwardLog:
    """Every forward of the pair's models, by the row storage whose cache it ran on (``None``: any other cache, such
    as a staging storage's or a single-row engine's); a hook on each model, no model code replaced."""

    def __init__(self, pipe, decoder: BatchDecoder):
        self.decoder, self.turn = decoder, Counter()
        self.hooks = [m.register_forward_hook(self._hook, with_kwargs=True) for m in (pipe.drafter, pipe.verifier)]

    def _hook(self, module, args, kwargs, out) -> None:
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        names = [key for key, engine in self.decoder.engines.items() if getattr(engine, "cache", None) is cache]
        self.turn[names[0] if names else None] += 1

    def take(self) -> dict:
        out, self.turn = dict(self.turn), Counter()
        return out

    def close(self) -> None:
        for h in self.hooks:
            h.remove()


def _live_decoder(pipe) -> BatchDecoder:
    decoder = BatchDecoder(pipe)
    decoder.add(0, pipe.prepare(**_case(500), method="asymspec", config=LIVE, ignore_eos=True, prefill=False))
    while decoder.arriving:
        decoder.prefill_step()
    assert list(decoder.rows) == [0]
    return decoder


@pytest.mark.parametrize("chunk", ["1", "block", "prompt-1"])
def test_arriving_chunks_ride_in_the_steps_forwards_and_the_row_equals_itself_alone(tiny_pipe, chunk):
    """A live AsymSpec row decodes while an AsymSpec request arrives, its prompts cut into pieces of 1 token, of one
    KV block (16) and of its verifier prompt less one. While both hold rows, every turn makes exactly the step's
    forwards per storage (K drafting forwards on the full view, one scoring forward on the compressed view and one
    on the verifier: a step without an arriving row makes the same), no other forward runs (no staging storage, no
    forward of pieces alone), the prompts are in after the turns their pieces need, the new row joins with no copy
    (its blocks are those it was prefilled into) and decodes from the next turn, and both rows equal themselves
    alone."""
    tiny_pipe.prefix_kv.clear()
    decoder = _live_decoder(tiny_pipe)
    log = ForwardLog(tiny_pipe, decoder)
    try:
        decoder.step()
        plain = log.take()
        assert plain == {"drafter_full": LIVE.k, "drafter_comp": 1, "verifier": 1}  # a step with no arriving row
        session = tiny_pipe.prepare(**_case(501), config=NEW, ignore_eos=True, prefill=False)
        decoder.add(1, session)
        assert set(decoder.arriving.held(1)) == set(session.to_prefill)  # its decode storages hold it from admission
        left = {name: p.left for name, p in decoder.arriving.prompts(1).items()}  # past its stored prefix
        sizes = {"1": [1, 1, 1], "block": [16] * 99, "prompt-1": [left["verifier"] - 1]}[chunk]
        turns = 0
        while decoder.arriving:
            size = decoder.arriving.chunk_tokens = sizes[turns] if turns < len(sizes) else 512
            rides = decoder.stage()
            want = {name: min(size, n) for name, n in left.items() if n}
            assert {name: {r: int(c.ids.numel()) for r, c in p.items()} for name, p in rides.items()} == {
                name: {1: n} for name, n in want.items()
            }
            left = {name: n - want.get(name, 0) for name, n in left.items()}
            decoder.step(rides=rides)
            assert log.take() == plain  # the pieces rode in the step's own forwards
            blocks = {name: decoder.engines[name].blocks(1) for name in left}
            joined = decoder.join_ready()
            turns += 1
            assert (1 in decoder.rows) == (not any(left.values()))
        assert [r.id for r in joined] == [1]
        assert {name: decoder.engines[name].blocks(1) for name in left} == blocks  # nothing copied at join
        results = {}
        while decoder.rows:
            results.update({row.id: row.result for row, _ in decoder.step() if row.result is not None})
        assert log.turn[None] == 0
    finally:
        log.close()
    assert results[1].token_ids == _alone(tiny_pipe, 501, "asymspec", NEW)
    assert results[0].token_ids == _alone(tiny_pipe, 500, "asymspec", LIVE)


def test_a_storage_the_step_does_not_call_runs_its_pieces_alone_and_a_prefilling_row_can_be_preempted(tiny_pipe):
    """A live Floor row steps on the verifier only: an arriving AsymSpec request's verifier pieces ride in its
    scoring forward, the drafter storages' pieces run in one forward each (alone), so every turn makes one forward
    per storage with pieces. Taken back out half-way (a PREFILLING row preempted: ``unstage``), its blocks go back to the pool;
    admitted again it prefills from the start and equals itself alone."""
    tiny_pipe.prefix_kv.clear()
    decoder = BatchDecoder(tiny_pipe)
    floor = AsymSpecConfig(max_new_tokens=60)
    decoder.add(0, tiny_pipe.prepare(**_case(510), method="floor", config=floor, ignore_eos=True, prefill=False))
    while decoder.arriving:
        decoder.prefill_step()
    log = ForwardLog(tiny_pipe, decoder)
    decoder.arriving.chunk_tokens = 8
    try:
        session = tiny_pipe.prepare(**_case(511), config=NEW, ignore_eos=True, prefill=False)
        decoder.add(1, session)
        pool = decoder.engines["drafter_full"].pool
        decoder.step(rides=decoder.stage())
        assert log.take() == {"drafter_full": 1, "drafter_comp": 1, "verifier": 1}
        prompt = decoder.arriving.prompts(1)["verifier"]
        assert decoder.engines["verifier"].length(1) == prompt.done == prompt.cached + 8  # after its stored prefix
        used = pool.used_blocks
        back = decoder.unstage(1)  # preempted while prefilling: a new request goes back to the line
        assert back is session and 1 not in decoder.engines["verifier"].rows and pool.used_blocks < used
        assert all(p.done == 0 for p in session.to_prefill.values())
        decoder.add(1, session)
        while decoder.arriving:
            rides = decoder.stage()
            decoder.step(rides=rides)
            assert log.take() == {"verifier": 1, **dict.fromkeys(rides, 1)}  # a stream whose prompt is in runs none
            decoder.join_ready()
        results = {}
        while decoder.rows:
            results.update({row.id: row.result for row, _ in decoder.step() if row.result is not None})
    finally:
        log.close()
    assert results[1].token_ids == _alone(tiny_pipe, 511, "asymspec", NEW)
    assert results[0].token_ids == _alone(tiny_pipe, 510, "floor", floor)


def test_the_scheduler_admits_a_request_beside_a_live_row_with_no_forward_of_its_own(tiny_pipe):
    """Through the scheduler (its threads, its plan): a live AsymSpec row decodes while a request (caption and OCR
    given) is set up and arrives. Counted per turn in the decode loop (from one step's end to the next's): every
    turn makes the forwards of a step, K on the full view and one on each scoring storage, whether a request
    arrives in it or not; no forward runs on any other cache; both rows equal themselves alone."""
    from asymspec_mm.core.scheduler import Scheduler

    tiny_pipe.prefix_kv.clear()
    cfg = AsymSpecConfig(k=3, max_new_tokens=120)
    turns: list[tuple[int, dict]] = []
    with Scheduler(tiny_pipe, max_batch_size=2, prefill_chunk_tokens=16) as sched:
        log = ForwardLog(tiny_pipe, sched._decoder)
        sched.on_step = lambda rows, calls, seconds: turns.append((rows, log.take()))
        try:
            live = sched.submit(**_case(520), config=cfg, ignore_eos=True)
            steps = iter(live)
            for _ in range(3):
                next(steps)
            new = sched.submit(**_case(521), config=AsymSpecConfig(k=3, max_new_tokens=10), ignore_eos=True)
            got = new.result(timeout=300)
            live_result = live.result(timeout=300)
        finally:
            log.close()
    plain = {"drafter_full": 3, "drafter_comp": 1, "verifier": 1}
    assert any(rows == 2 for rows, _ in turns)  # the new row joined the live row's steps
    assert all(forwards == plain for _, forwards in turns[1:])  # the first also holds the live row's own prefill
    assert None not in turns[0][1] and log.turn[None] == 0  # no staging storage, no single-row engine ran a forward
    assert got.token_ids == tiny_pipe.generate(**_case(521), config=AsymSpecConfig(k=3, max_new_tokens=10), ignore_eos=True).token_ids
    assert live_result.token_ids == tiny_pipe.generate(**_case(520), config=cfg, ignore_eos=True).token_ids


@pytest.mark.parametrize("max_stall", [None, 1.5])
def test_a_stall_bound_cuts_the_pieces_beside_a_live_row_and_no_token_changes(tiny_pipe, max_stall):
    """``max_stall`` (the policy's rule 6): once the live row's step is measured, the first turn that carries the
    arriving request's prompt takes MIN_PREFILL_TOKENS (a prompt token counts as a decode token's share of the step
    until measured: 0.5 x 11 tokens is below the floor), 5 tokens on each of its three storages; without the bound
    the token budget takes its whole prompt at once. Both rows equal themselves alone either way."""
    from asymspec_mm.core.policy import MIN_PREFILL_TOKENS
    from asymspec_mm.core.scheduler import Scheduler

    tiny_pipe.prefix_kv.clear()
    cfg, new_cfg = AsymSpecConfig(k=3, max_new_tokens=60), AsymSpecConfig(k=3, max_new_tokens=6)
    per_turn: list[int] = []
    with Scheduler(tiny_pipe, max_batch_size=2, max_stall=max_stall) as sched:
        done = [0]

        def on_step(rows, calls, seconds) -> None:  # on the loop thread, after the step's forwards
            per_turn.append(sched._decoder.arriving.tokens - done[0])
            done[0] = sched._decoder.arriving.tokens

        sched.on_step = on_step
        live = sched.submit(**_case(530), config=cfg, ignore_eos=True)
        steps = iter(live)
        for _ in range(3):
            next(steps)
        new = sched.submit(**_case(531), config=new_cfg, ignore_eos=True)
        got, live_result = new.result(timeout=300), live.result(timeout=300)
    pieces = [n for n in per_turn[1:] if n]  # the first step's count is the live row's own prompt
    prompt = sum(pieces)
    if max_stall is None:
        assert pieces == [prompt], pieces  # the whole prompt beside one step (it fits the token budget)
    else:
        assert pieces[0] == 3 * (MIN_PREFILL_TOKENS // 3) and len(pieces) > 1 and max(pieces) < prompt
    assert got.token_ids == _alone(tiny_pipe, 531, "asymspec", new_cfg)
    assert live_result.token_ids == _alone(tiny_pipe, 530, "asymspec", cfg)
