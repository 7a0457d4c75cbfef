"""Memory by allocation, with preemption (issue #42): a preempted row's KV is dropped and rebuilt from its prompt and
committed tokens, and the row decodes on exactly as if nothing happened; under a KV budget that holds about two
long rows, eight finish, each equal to itself alone, and the measured peak never passes the budget. Real forwards of
the tiny pair."""

from __future__ import annotations

import time

import pytest
from conftest import held_forwards, make_case

from asymspec_mm import AsymSpecConfig
from asymspec_mm.core import BatchDecoder


def _case(seed: int) -> dict:
    c = make_case(seed)
    return {"image": c["image"], "question": c["question"], "caption": c["caption"], "ocr": c["ocr"]}


MIX = [
    ("asymspec", dict(k=3)),
    ("asymspec", dict(k=4, bonus="gated")),
    ("sd", dict(k=3)),
    ("floor", {}),
    ("drafter", {}),
    ("asymspec", dict(k=2, temperature=1.0, seed=7)),
]


@pytest.mark.parametrize("at_step", [1, 3])
def test_a_row_preempted_and_resumed_equals_itself_alone(tiny_pipe, at_step):
    """Every method (greedy and sampled): each row is preempted after ``at_step`` steps, waits parked while the
    others decode a step, comes back through the batched prefill and finishes with the tokens, sources and
    statistics it has alone."""
    decoder = BatchDecoder(tiny_pipe)
    requests = []
    for i, (method, settings) in enumerate(MIX):
        cfg = AsymSpecConfig(max_new_tokens=24, **settings)
        case = _case(900 + i)
        requests.append((method, cfg, case))
        decoder.add(i, tiny_pipe.prepare(**case, method=method, config=cfg, ignore_eos=True, prefill=False))
    while decoder.arriving:
        decoder.prefill_step()
    results: dict[int, object] = {}

    def step() -> None:
        results.update({row.id: row.result for row, _ in decoder.step() if row.result is not None})

    for _ in range(at_step):
        step()
    for rid in list(decoder.rows):
        assert decoder.preemptible(rid)
        decoder.preempt(rid)
        assert rid not in decoder.rows and rid in decoder.parked
        decoder.resume(rid)
        while rid in decoder.arriving.rows:
            decoder.prefill_step()
        step()  # the others step while each one comes back
    while decoder.rows:
        step()
    for i, (method, cfg, case) in enumerate(requests):
        alone = tiny_pipe.generate(**case, method=method, config=cfg, ignore_eos=True)
        got = results[i]
        assert got.token_ids == alone.token_ids, (method, cfg)
        assert [e.source for e in got.trace] == [e.source for e in alone.trace]
        assert got.stats["accepted_per_position"] == alone.stats["accepted_per_position"]
        assert got.stats["preemptions"] == 1
        # the rebuilt context was forwarded again: more tokens than alone, never fewer
        for name, n in alone.stats["tokens_forwarded"].items():
            assert got.stats["tokens_forwarded"][name] >= n


def test_eight_long_rows_under_a_budget_of_about_two_all_finish_within_it(tiny_pipe):
    cases = [_case(950 + i) for i in range(8)]
    methods = ["asymspec", "asymspec", "sd", "floor", "asymspec", "drafter", "asymspec", "sd"]
    cfgs = [AsymSpecConfig(k=3 + i % 3, max_new_tokens=72) for i in range(8)]
    alone = [tiny_pipe.generate(**c, method=m, config=cfg, ignore_eos=True) for c, m, cfg in zip(cases, methods, cfgs)]
    probe = BatchDecoder(tiny_pipe)
    sessions = [tiny_pipe.prepare(**c, method=m, config=cfg, ignore_eos=True, prefill=False) for c, m, cfg in zip(cases, methods, cfgs)]
    one = max(probe.kv_bound(s, alone=True) for s in sessions)
    budget = int(1.3 * one)  # the worst case of the largest row and a bit: about two rows' real need
    with tiny_pipe.scheduler(max_batch_size=8, max_kv_bytes=budget) as sched:
        handles = [sched.submit(**c, method=m, config=cfg, ignore_eos=True) for c, m, cfg in zip(cases, methods, cfgs)]
        got = [h.result(timeout=600) for h in handles]
        peak, preemptions = sched.peak_kv_bytes, sched.preemptions
    for g, a in zip(got, alone):
        assert g.token_ids == a.token_ids
    assert 0 < peak <= budget, (peak, budget)
    assert preemptions > 0 and preemptions == sum(g.stats["preemptions"] for g in got)
    assert max(g.stats["batch_size"] for g in got) >= 2


def test_preemption_takes_the_highest_priority_value_latest_first(tiny_pipe):
    """Two rows, a budget for about one and a half: the row submitted with the more urgent priority is never
    preempted, whichever came first."""
    cases = [_case(980 + i) for i in range(3)]
    cfg = AsymSpecConfig(k=3, max_new_tokens=64)
    probe = BatchDecoder(tiny_pipe)
    one = max(probe.kv_bound(tiny_pipe.prepare(**c, config=cfg, ignore_eos=True, prefill=False), alone=True) for c in cases)
    # one and a half rows: the bound of a row alone is close to what it holds on paged storage (BENCHMARKS.md)
    with tiny_pipe.scheduler(max_batch_size=3, max_kv_bytes=int(1.5 * one)) as sched:
        handles = [sched.submit(**c, config=cfg, ignore_eos=True, priority=p) for c, p in zip(cases, (5, 5, -1))]
        got = [h.result(timeout=600) for h in handles]
    assert got[2].stats["preemptions"] == 0 and got[0].stats["preemptions"] + got[1].stats["preemptions"] > 0
    with tiny_pipe.scheduler() as sched, pytest.raises(Exception, match="priority"):  # closed: no threads left behind
        sched.submit(**cases[0], priority="high")


def test_a_server_under_a_tight_kv_budget_answers_every_client_as_alone(tiny_pipe):
    """``serve --max-kv-bytes``' app: six ``openai`` clients at once under a budget of about two long rows; every
    answer equals its request alone and the scheduler preempted rows to stay within the budget."""
    import base64
    import io
    import threading

    openai = pytest.importorskip("openai")
    from asymspec_mm.serve import ServerThread, create_app

    cases = [_case(1000 + i) for i in range(6)]
    cfg = AsymSpecConfig(k=3, max_new_tokens=96)
    alone = [tiny_pipe.generate(**c, config=cfg) for c in cases]
    assert sum(len(a.token_ids) > 60 for a in alone) >= 3  # long rows (the random pair rarely ends early)
    probe = BatchDecoder(tiny_pipe)
    one = max(probe.kv_bound(tiny_pipe.prepare(**c, config=cfg, prefill=False), alone=True) for c in cases)
    budget = int(1.05 * one)  # the largest row alone fits; two long rows at once do not

    def url(img) -> str:
        buf = io.BytesIO()
        img.save(buf, "PNG")
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()

    app = create_app(tiny_pipe, max_batch_size=6, max_kv_bytes=budget)
    got: dict[int, object] = {}
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=600)

        def ask(i: int) -> None:
            c = cases[i]
            got[i] = client.chat.completions.create(
                model="tiny",
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": url(c["image"])}}, {"type": "text", "text": c["question"]}],
                    }
                ],
                max_tokens=96,
                extra_body={"asymspec": {"caption": c["caption"], "ocr": c["ocr"], "k": 3, "return_trace": True}},
            )

        sched = app.state.asymspec.scheduler
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
        # the six arrive together however loaded the machine is: the models wait until every request is set up (their
        # images' features are cached by the runs alone, so the set-up needs no model)
        with held_forwards(tiny_pipe):
            for t in threads:
                t.start()
            deadline = time.monotonic() + 120
            while sched.waiting + sched.live_rows < 6 and time.monotonic() < deadline:
                time.sleep(0.02)
        for t in threads:
            t.join(timeout=600)
        assert sched.preemptions > 0 and 0 < sched.peak_kv_bytes <= budget
        import httpx

        from asymspec_mm.frontend.prometheus import parse_prometheus

        metrics = parse_prometheus(httpx.get(srv.url + "/metrics", timeout=30).text)
        assert metrics["asymspec_preemptions_total"] == sched.preemptions and metrics["asymspec_kv_peak_bytes"] == sched.peak_kv_bytes
    for i, ref in enumerate(alone):
        assert [t["token_id"] for t in got[i].model_extra["asymspec"]["trace"]] == ref.token_ids, i


def test_the_memory_bench_runs_both_arms_and_keeps_within_its_budget(tiny_pipe):
    from asymspec_mm.bench.memory import run
    from asymspec_mm.bench.pairs import bench_cases

    cases = bench_cases(4)
    cfg = AsymSpecConfig(max_new_tokens=48)
    probe = BatchDecoder(tiny_pipe)
    one = max(
        probe.kv_bound(
            tiny_pipe.prepare(c["image"], c["question"], caption=c["caption"], ocr=c["ocr"], config=cfg, prefill=False), alone=True
        )
        for c in cases
    )
    free, bound = run(tiny_pipe, cases, 48, None), run(tiny_pipe, cases, 48, int(1.1 * one))
    assert bound["tokens"] == free["tokens"] and all(len(t) == 48 for t in free["tokens"])
    assert 0 < bound["peak"] <= int(1.1 * one) and free["preemptions"] == 0 and free["peak"] > 0
    assert free["most_rows"] == 4 and 1 <= bound["most_rows"] <= 4 and all(h > 0 for h in free["held"])
