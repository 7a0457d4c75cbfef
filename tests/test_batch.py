"""Batched decoding: every row of ``generate_batch`` and of the scheduler equals ``pipe.generate`` of that request
alone (real forwards, fp32, the random tiny pair), whatever the other rows do."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import CancelledError

import pytest
from conftest import make_case
from row_checks import rows_counted

from asymspec_mm import AsymSpecConfig
from asymspec_mm.base.errors import AsymSpecError, UnknownOptionError
from asymspec_mm.core import BatchDecoder, Request

N_REQUESTS = 30


def _requests(n: int, seed: int = 0) -> list[dict]:
    """Requests with different images, prompt lengths and token budgets (so rows stop at different steps)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        case = make_case(100 + i)
        out.append(
            {
                "image": case["image"],
                "question": case["question"],
                "caption": case["caption"],
                "ocr": case["ocr"],
                "max_new_tokens": rng.randint(3, 18),
            }
        )
    return out


def _row_config(cfg: AsymSpecConfig, r: dict) -> AsymSpecConfig:
    return cfg.with_(max_new_tokens=r["max_new_tokens"], stop_strings=tuple(r.get("stop", ())))


def _alone(pipe, reqs, method, cfg):
    return [
        pipe.generate(r["image"], r["question"], caption=r["caption"], ocr=r["ocr"], method=method, config=_row_config(cfg, r))
        for r in reqs
    ]


def _with_stop_strings(pipe, reqs, method, cfg):
    """Every third request also stops at a string its answer alone reaches half-way (rows stop by stop string); each
    request's answer alone. Only the requests given a stop string are run again: the others are the same requests
    (greedy, real forwards), so their first answers are their answers alone."""
    plain = _alone(pipe, reqs, method, cfg)
    for i, (r, res) in enumerate(zip(reqs, plain)):
        piece = res.trace[len(res.trace) // 2].text.strip() if res.trace else ""
        if i % 3 == 0 and piece:
            r["stop"] = (piece,)
            plain[i] = _alone(pipe, [r], method, cfg)[0]
    return plain


def _same(batched, alone) -> None:
    for i, (got, ref) in enumerate(zip(batched, alone)):
        assert got.token_ids == ref.token_ids, (i, got.token_ids, ref.token_ids)
        assert [ev.source for ev in got.trace] == [ev.source for ev in ref.trace], i
        for key in ("steps", "drafted", "accepted", "accepted_per_position", "bonus_drafted", "bonus_accepted", "new_tokens", "stopped_by"):
            assert got.stats[key] == ref.stats[key], (i, key)


def _batched(pipe, reqs, method, cfg, batch_size):
    """The requests through one decoder, refilled up to ``batch_size`` live rows (rows of one batch have
    different token budgets, which ``generate_batch`` takes from one config)."""
    results = [None] * len(reqs)
    decoder = BatchDecoder(pipe)
    todo = list(range(len(reqs)))
    live_max = 0
    while todo or decoder.rows:
        while todo and len(decoder.rows) < batch_size:
            i = todo.pop(0)
            r = reqs[i]
            decoder.add(
                i,
                pipe.prepare(
                    r["image"],
                    r["question"],
                    caption=r["caption"],
                    ocr=r["ocr"],
                    method=method,
                    config=_row_config(cfg, r),
                    prefill=True,
                ),
            )
        live_max = max(live_max, len(decoder.rows))
        for row, _ in decoder.step():
            if row.result is not None:
                results[row.id] = row.result
    assert live_max == min(batch_size, len(reqs))
    return results


CASES = [
    ("asymspec", AsymSpecConfig(k=3, gamma=0.5)),
    ("asymspec", AsymSpecConfig(k=2, gamma=0.3, bonus="gated")),
    ("sd", AsymSpecConfig(k=3)),
    ("floor", AsymSpecConfig()),
    ("drafter", AsymSpecConfig()),
]


@pytest.mark.parametrize("method,cfg", CASES, ids=["asymspec", "asymspec-gated", "sd", "floor", "drafter"])
def test_batched_rows_equal_each_request_alone(tiny_pipe, method, cfg):
    reqs = _requests(N_REQUESTS, seed=len(method))
    alone = _with_stop_strings(tiny_pipe, reqs, method, cfg)
    assert any(a.stats["stopped_by"] == "stop_string" for a in alone)
    assert len({len(a.token_ids) for a in alone}) > 3  # rows stop at different points
    for batch_size in (3, 8):  # rows joining as others leave (3), and every row at once
        _same(_batched(tiny_pipe, reqs, method, cfg, batch_size), alone)


def test_generate_batch_api(tiny_pipe):
    reqs = _requests(7, seed=3)
    cfg = AsymSpecConfig(k=3, max_new_tokens=10)
    alone = _alone(tiny_pipe, [dict(r, max_new_tokens=10) for r in reqs], "asymspec", cfg)
    as_input = [
        Request(r["image"], r["question"], r["caption"], r["ocr"]) if i % 2 else {k: r[k] for k in ("image", "question", "caption", "ocr")}
        for i, r in enumerate(reqs)
    ]
    got = tiny_pipe.generate_batch(as_input, config=cfg, batch_size=3)
    assert [g.token_ids for g in got] == [a.token_ids for a in alone]  # input order
    assert max(g.stats["batch_size"] for g in got) == 3 and min(g.stats["batch_size"] for g in got) >= 1
    for g in got:  # K drafting forwards + one scoring forward on each other stream, + 1 a step with a gated bonus
        assert g.stats["engine_calls"] == (cfg.k + 2) * g.stats["steps"] and g.stats["engine_calls_per_step"] == cfg.k + 2
    steps: list[tuple[int, int, float]] = []
    again = tiny_pipe.generate_batch(as_input, config=cfg, batch_size=3, on_step=lambda *s: steps.append(s))
    assert [g.token_ids for g in again] == [a.token_ids for a in alone]
    assert max(r for r, _, _ in steps) == 3 and all(c == cfg.k + 2 for _, c, _ in steps) and all(t > 0 for _, _, t in steps)
    assert len(steps) >= max(g.stats["steps"] for g in again)
    with pytest.raises(UnknownOptionError, match="batch_size"):
        tiny_pipe.generate_batch(as_input, batch_size=0)
    with pytest.raises(UnknownOptionError, match="request 0"):
        tiny_pipe.generate_batch([{"image": reqs[0]["image"]}])


def test_scheduler_concurrent_submitters_cancel_and_errors(tiny_pipe):
    """16 threads submit 48 requests at random times: every result equals the request alone; the scheduler's rows
    shared steps; a cancelled request frees its row; a broken image fails only its own handle; once all have ended
    the row storages keep nothing of any of them (not even a row's counters)."""
    reqs = _requests(48, seed=7)
    cfg = AsymSpecConfig(k=3)
    methods = ["asymspec", "floor", "sd"]
    alone = {}
    for i, r in enumerate(reqs):
        m = methods[i % 3]
        alone[i] = _alone(tiny_pipe, [r], m, cfg)[0]
    sched = tiny_pipe.scheduler(max_batch_size=6)
    handles: dict[int, object] = {}
    lock = threading.Lock()

    def submitter(worker: int) -> None:
        rng = random.Random(worker)
        for i in range(worker, len(reqs), 16):
            time.sleep(rng.random() * 0.05)
            r = reqs[i]
            h = sched.submit(
                r["image"],
                r["question"],
                caption=r["caption"],
                ocr=r["ocr"],
                method=methods[i % 3],
                config=cfg.with_(max_new_tokens=r["max_new_tokens"]),
            )
            with lock:
                handles[i] = h

    threads = [threading.Thread(target=submitter, args=(w,)) for w in range(16)]
    for t in threads:
        t.start()
    bad = sched.submit(b"not an image", "what?", caption="", ocr=False)
    long = sched.submit(reqs[0]["image"], reqs[0]["question"], caption="", ocr=False, max_new_tokens=400)
    for t in threads:
        t.join()
    for i, h in handles.items():
        assert h.result(timeout=300).token_ids == alone[i].token_ids, i
    first = next(iter(handles.values()))
    assert [ev.token_id for events in first for ev in events] == first.result().token_ids  # the handle streams its steps
    with pytest.raises(AsymSpecError):
        bad.result(timeout=60)
    long.cancel()
    with pytest.raises(CancelledError):
        long.result(timeout=60)
    assert sched.live_rows == 0 and sched.waiting == 0
    assert sched.rows_stepped > sched.steps  # rows shared steps
    after = sched.submit(
        reqs[1]["image"],
        reqs[1]["question"],
        caption=reqs[1]["caption"],
        ocr=reqs[1]["ocr"],
        method=methods[1],
        config=cfg.with_(max_new_tokens=reqs[1]["max_new_tokens"]),
    )
    assert after.result(timeout=120).token_ids == alone[1].token_ids  # still serving after the error and the cancel
    assert rows_counted(sched) == {}
    sched.close(timeout=60)
    with pytest.raises(AsymSpecError, match="closed"):
        sched.submit(reqs[0]["image"], "q")


def test_eval_batch_size_gives_the_sequential_records_and_resumes(tiny_pipe, tmp_path):
    """``run_mathvista(batch_size=4)`` writes the records a sequential run writes (same order, same answers and
    counts; only timings differ), and a batched run resumed after an interrupt finishes the same set."""
    import json

    from asymspec_mm.eval import mathvista as mv

    problems = mv.load_minivista_problems(9, seed=5)
    variants = mv.build_variants("asymspec,floor", common={"max_new_tokens": 12})
    kw = dict(compressed="official", progress=False, log=lambda s: None, dataset="minivista")
    mv.run_mathvista(tiny_pipe, problems, variants, tmp_path / "seq.jsonl", **kw)
    mv.run_mathvista(tiny_pipe, problems, variants, tmp_path / "bat.jsonl", batch_size=4, **kw)
    counts = ("steps", "drafted", "accepted", "accepted_per_position", "new_tokens")

    def view(path):
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        return [
            ({k: v for k, v in r.items() if k not in ("time", "wall_s", "stats")}, {k: r["stats"].get(k) for k in counts}) for r in rows
        ]

    seq, bat = view(tmp_path / "seq.jsonl"), view(tmp_path / "bat.jsonl")
    assert len(seq) == 18 and seq == bat

    class Interrupt:
        """The pipeline, interrupted (Ctrl-C) at its third batch."""

        def __init__(self, pipe):
            self.pipe, self.calls = pipe, 0

        def generate(self, *a, **k):
            return self.pipe.generate(*a, **k)

        def generate_batch(self, *a, **k):
            self.calls += 1
            if self.calls == 3:
                raise KeyboardInterrupt
            return self.pipe.generate_batch(*a, **k)

    part = tmp_path / "part.jsonl"
    with pytest.raises(KeyboardInterrupt):
        mv.run_mathvista(Interrupt(tiny_pipe), problems, variants, part, batch_size=4, **kw)
    assert 0 < len(part.read_text().splitlines()) < 18
    mv.run_mathvista(tiny_pipe, problems, variants, part, batch_size=4, resume=True, **kw)
    assert sorted(map(json.dumps, view(part))) == sorted(map(json.dumps, seq))


def _bound(pipe, reqs: list[dict], cfg: AsymSpecConfig, arriving: list[bool], kind: str = "paged") -> int:
    """The KV bound of a batch holding ``reqs``, each still arriving (its prompts in the batched prefill) or decoding,
    on ``kind`` row storage."""
    from asymspec_mm.engines import RowStorages

    decoder = BatchDecoder(pipe, engines=RowStorages(kind))
    for i, (r, a) in enumerate(zip(reqs, arriving)):
        decoder.add(i, pipe.prepare(**r, config=cfg, prefill=not a))
    return decoder.kv_bound()


def _two_not_three(pipe, reqs: list[dict], cfg: AsymSpecConfig, kind: str = "paged") -> int:
    """A budget that lets any two of ``reqs`` live together (both still arriving: the most they can take) but no
    three (a third is admitted arriving, beside two at best decoding), on ``kind`` row storage."""
    from itertools import combinations, permutations

    budget = max(_bound(pipe, list(p), cfg, [True, True], kind) for p in combinations(reqs, 2))
    assert min(_bound(pipe, list(t), cfg, [False, False, True], kind) for t in permutations(reqs, 3)) > budget
    return budget


def test_kv_budget_bounds_the_rows(tiny_pipe):
    """A KV budget that two rows' worst case fits and no three rows' does: results unchanged (rows are admitted by
    what they need now and preempted when they cannot grow); each result reports the KV it held per stream, layers x
    2 x kv_heads x head_dim x 4 bytes per cached token."""
    reqs = [{k: r[k] for k in ("image", "question", "caption", "ocr")} for r in _requests(5, seed=11)]
    cfg = AsymSpecConfig(k=3, max_new_tokens=40)
    free = tiny_pipe.generate_batch(reqs, config=cfg, batch_size=5)
    budget = _two_not_three(tiny_pipe, reqs, cfg)
    bound = tiny_pipe.generate_batch(reqs, config=cfg, batch_size=5, kv_budget_bytes=budget)
    assert [b.token_ids for b in bound] == [f.token_ids for f in free]
    assert max(f.stats["batch_size"] for f in free) == 5
    text = tiny_pipe.verifier.config
    per_token = text.num_hidden_layers * 2 * text.num_key_value_heads * text.head_dim * 4
    res = bound[0]
    prompt = res.prompts.verifier_ids.shape[1]
    # the verifier caches the prompt and every token but the pending one (fewer after a final rollback)
    assert res.stats["kv_bytes"]["verifier"] % per_token == 0
    assert prompt * per_token <= res.stats["kv_bytes"]["verifier"] <= (prompt + len(res.token_ids)) * per_token


@pytest.mark.parametrize("kind", ["padded", "paged"])
def test_scheduler_kv_budget(tiny_pipe, kind):
    """A budget of any two rows' worst case: the same tokens, the measured peak within it. On the padded storage,
    admission by what a row needs now lets more than two rows in (the worst case pads every row to the longest and
    adds compaction slack); the paged worst case is each row's own blocks, close to what it really holds, so two
    worst cases hold about two rows there."""
    from asymspec_mm.engines import RowStorages

    reqs = [{k: r[k] for k in ("image", "question", "caption", "ocr")} for r in _requests(5, seed=12)]
    cfg = AsymSpecConfig(k=3, max_new_tokens=40)
    free = tiny_pipe.generate_batch(reqs, config=cfg, batch_size=5)
    budget = _two_not_three(tiny_pipe, reqs, cfg, kind)
    with tiny_pipe.scheduler(max_batch_size=5, max_kv_bytes=budget, batch_engines=RowStorages(kind)) as sched:
        handles = [sched.submit(r["image"], r["question"], caption=r["caption"], ocr=r["ocr"], config=cfg) for r in reqs]
        got = [h.result(timeout=120) for h in handles]
        peak = sched.peak_kv_bytes
    assert [g.token_ids for g in got] == [f.token_ids for f in free]
    assert 0 < peak <= budget
    assert max(g.stats["batch_size"] for g in got) > (2 if kind == "padded" else 1)


def test_floor_rows_with_other_settings_share_a_batch(tiny_pipe):
    """Settings a method does not read do not split its batch: Floor rows with different K and gates decode together
    and each equals its request alone (statistics included)."""
    reqs = _requests(4, seed=13)
    cfgs = [AsymSpecConfig(k=k, gate=g, max_new_tokens=6) for k, g in ((2, "cda"), (4, "fixed"), (3, "tuned"), (1, "cda"))]
    decoder = BatchDecoder(tiny_pipe)
    for i, (r, c) in enumerate(zip(reqs, cfgs)):
        decoder.add(
            i, tiny_pipe.prepare(r["image"], r["question"], caption=r["caption"], ocr=r["ocr"], method="floor", config=c, prefill=True)
        )
    results = {}
    while decoder.rows:
        results.update({row.id: row.result for row, _ in decoder.step() if row.result is not None})
    for i, (r, c) in enumerate(zip(reqs, cfgs)):
        ref = tiny_pipe.generate(r["image"], r["question"], caption=r["caption"], ocr=r["ocr"], method="floor", config=c)
        assert results[i].token_ids == ref.token_ids and results[i].stats["accepted_per_position"] == ref.stats["accepted_per_position"]
        assert results[i].stats["batch_size"] == 4
