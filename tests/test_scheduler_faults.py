"""Per-row gate settings in one batch, and fault isolation of the batch decoder and the scheduler (real forwards;
faults come in through the public ``batch_engines`` factory, the way a custom engine would bring them)."""

from __future__ import annotations

import pytest
from conftest import make_case
from row_checks import rows_counted

from asymspec_mm import AsymSpecConfig
from asymspec_mm.core import BatchDecoder
from asymspec_mm.core.decoder import gate_settings
from asymspec_mm.core.handle import KVBudgetError, SchedulerStoppedError
from asymspec_mm.decode.rows import step_shape
from asymspec_mm.engines.rows import BatchEngine


def _case_kwargs(seed: int) -> dict:
    c = make_case(seed)
    return {"image": c["image"], "question": c["question"], "caption": c["caption"], "ocr": c["ocr"]}


def _decode_all(decoder: BatchDecoder) -> dict:
    results = {}
    while decoder.rows:
        results.update({row.id: row.result for row, _ in decoder.step() if row.result is not None})
    return results


def test_gate_settings_are_floats_when_rows_agree_and_tensors_when_not():
    same = gate_settings([AsymSpecConfig(gamma=0.3), AsymSpecConfig(gamma=0.3)], 4, "cpu")
    assert same == {"gamma": 0.3, "beta": 1.0, "lam": 0.1}
    mixed = gate_settings([AsymSpecConfig(gamma=0.3), AsymSpecConfig(gamma=0.7, beta=0.0)], 2, "cpu")
    assert mixed["gamma"].tolist() == pytest.approx([0.3, 0.3, 0.7, 0.7]) and mixed["beta"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert mixed["lam"] == 0.1
    assert step_shape("asymspec", AsymSpecConfig(gamma=0.2, beta=3.0, lam=0.5, seed=3, temperature=0.5)) == step_shape(
        "asymspec", AsymSpecConfig()
    )
    assert step_shape("asymspec", AsymSpecConfig(k=3)) != step_shape("asymspec", AsymSpecConfig())
    assert step_shape("floor", AsymSpecConfig(k=3, gate="fixed")) == step_shape("floor", AsymSpecConfig())


@pytest.mark.parametrize("gate", ["cda", "tuned_kl"])
def test_rows_differing_in_gamma_beta_lam_share_a_batch_and_each_equals_its_request_alone(tiny_pipe, gate):
    settings = [dict(gamma=0.5, beta=1.0, lam=0.1), dict(gamma=0.05, beta=0.0, lam=0.0), dict(gamma=0.9, beta=2.5, lam=2.0)]
    settings += [dict(gamma=0.3, beta=0.4, lam=6.0), dict(gamma=0.5, beta=1.0, lam=0.1)]
    cfgs = [AsymSpecConfig(gate=gate, max_new_tokens=14, **s) for s in settings]
    decoder = BatchDecoder(tiny_pipe)
    cases = [_case_kwargs(300 + i) for i in range(len(cfgs))]
    for i, (case, cfg) in enumerate(zip(cases, cfgs)):
        decoder.add(i, tiny_pipe.prepare(**case, config=cfg, prefill=True))
    results = _decode_all(decoder)
    fused = 0
    for i, (case, cfg) in enumerate(zip(cases, cfgs)):
        ref = tiny_pipe.generate(**case, config=cfg)
        got = results[i]
        assert got.token_ids == ref.token_ids and [e.source for e in got.trace] == [e.source for e in ref.trace], settings[i]
        # each row's own gamma (batched forwards round the logits a little differently, hence approx)
        # (bonus tokens have no gamma_eff)
        gammas = lambda res: [e.gamma_eff for e in res.trace if e.gamma_eff is not None]  # noqa: E731
        assert gammas(got) == pytest.approx(gammas(ref), rel=1e-5) and len(gammas(got)) == len(gammas(ref))
        assert got.stats["batch_size"] == len(cfgs)
        fused += ref.stats["fused"]
    assert fused > 0  # beta mattered somewhere


def test_scheduler_puts_rows_with_other_gamma_and_beta_in_one_batch(tiny_pipe):
    """Rows long enough (EOS ignored) that all three are live together: one batch for all three, each equal to its
    request alone."""
    cases = [_case_kwargs(320 + i) for i in range(3)]
    cfgs = [AsymSpecConfig(max_new_tokens=n, gamma=g, beta=b) for n, g, b in ((150, 0.5, 1.0), (80, 0.2, 0.0), (40, 0.8, 2.0))]
    with tiny_pipe.scheduler(max_batch_size=3) as sched:
        handles = [sched.submit(**c, config=cfg, ignore_eos=True) for c, cfg in zip(cases, cfgs)]
        got = [h.result(timeout=120) for h in handles]
    for c, cfg, res in zip(cases, cfgs, got):
        assert res.token_ids == tiny_pipe.generate(**c, config=cfg, ignore_eos=True).token_ids
    assert got[0].stats["batch_size"] == 3


class FailingForward(BatchEngine):
    """A batched engine whose ``fail_on``-th forward raises ``error``."""

    def __init__(self, model, name, error: BaseException, fail_on: int = 2):
        super().__init__(model, name)
        self.error, self.fail_on, self.calls = error, fail_on, 0

    def extend(self, ids):
        self.calls += 1
        if self.calls >= self.fail_on:
            raise self.error
        return super().extend(ids)


class FailingWhenShared(BatchEngine):
    """A batched engine whose forward raises ``error`` once it carries two rows or more."""

    def __init__(self, model, name, error: BaseException):
        super().__init__(model, name)
        self.error = error

    def extend(self, ids):
        if len(ids) >= 2:
            raise self.error
        return super().extend(ids)


def test_a_failing_forward_fails_the_rows_of_its_step_and_the_scheduler_goes_on(tiny_pipe):
    """The verifier's forward raises in the first step that an AsymSpec row and a Floor row share (mixed batches:
    both ride in it, so the step cannot finish for either): both fail with that error, the scheduler goes on, a
    request after them finishes equal to itself alone, and the storages keep no counters of the three rows."""
    boom = RuntimeError("boom in the verifier forward")
    factory = lambda model, name: FailingWhenShared(model, name, boom) if name == "verifier" else BatchEngine(model, name)  # noqa: E731
    cfg = AsymSpecConfig(max_new_tokens=12)
    a, f, later = _case_kwargs(340), _case_kwargs(341), _case_kwargs(342)
    alone = tiny_pipe.generate(**later, method="floor", config=cfg).token_ids  # before the scheduler: not one of its rows
    with tiny_pipe.scheduler(max_batch_size=4, batch_engines=factory) as sched:
        # the AsymSpec row outlasts the Floor row's set-up however loaded the machine: they share a step
        h_asym = sched.submit(**a, config=AsymSpecConfig(max_new_tokens=2000), ignore_eos=True)
        h_floor = sched.submit(**f, method="floor", config=cfg)
        for h in (h_asym, h_floor):
            with pytest.raises(RuntimeError, match="boom in the verifier forward"):
                h.result(timeout=300)
        assert sched.submit(**later, method="floor", config=cfg).result(timeout=120).token_ids == alone
        assert sched.error is None
        assert rows_counted(sched) == {}


class FailingJoin(BatchEngine):
    def __init__(self, model, name):
        super().__init__(model, name)
        self.fail_next = True

    def join(self, row, engine):
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("join refused")
        super().join(row, engine)


def test_add_is_all_or_nothing(tiny_pipe):
    factory = lambda model, name: FailingJoin(model, name) if name == "verifier" else BatchEngine(model, name)  # noqa: E731
    cfg = AsymSpecConfig(max_new_tokens=8)
    decoder = BatchDecoder(tiny_pipe, engines=factory)
    case = _case_kwargs(350)
    with pytest.raises(RuntimeError, match="join refused"):
        decoder.add(0, tiny_pipe.prepare(**case, config=cfg, prefill=True))
    assert decoder.rows == {} and all(engine.rows == [] for engine in decoder.engines.values())  # no ghost row anywhere
    decoder.add(1, tiny_pipe.prepare(**case, config=cfg, prefill=True))
    assert _decode_all(decoder)[1].token_ids == tiny_pipe.generate(**case, config=cfg).token_ids


def test_a_request_that_can_never_fit_is_refused_with_the_numbers(tiny_pipe):
    with tiny_pipe.scheduler(max_batch_size=2, max_kv_bytes=1000) as sched:
        h = sched.submit(**_case_kwargs(360), config=AsymSpecConfig(max_new_tokens=8))
        with pytest.raises(KVBudgetError, match=r"needs up to [\d,]+ bytes of KV cache .* max_kv_bytes is 1,000: lower max_new_tokens"):
            h.result(timeout=120)
        assert sched.error is None


class WorkerKilled(BaseException):
    """Not an Exception: no per-request guard catches it, as with a bug that escapes them."""


def test_a_dead_worker_fails_every_waiting_and_live_handle_at_once(tiny_pipe):
    factory = lambda model, name: FailingForward(model, name, WorkerKilled("the worker was killed"), fail_on=3)  # noqa: E731
    sched = tiny_pipe.scheduler(max_batch_size=1, batch_engines=factory)
    cfg = AsymSpecConfig(max_new_tokens=30)
    handles = [sched.submit(**_case_kwargs(370 + i), config=cfg) for i in range(3)]  # one live, two waiting
    for h in handles:
        with pytest.raises(SchedulerStoppedError, match="worker stopped on WorkerKilled: the worker was killed; create a new scheduler"):
            h.result(timeout=120)  # an error, not a TimeoutError
        with pytest.raises(SchedulerStoppedError):
            list(h)
    assert isinstance(sched.error, SchedulerStoppedError) and isinstance(sched.error.__cause__, WorkerKilled)
    with pytest.raises(SchedulerStoppedError, match="WorkerKilled"):
        sched.submit(**_case_kwargs(380), config=cfg)
    sched.close(timeout=30)
    assert not sched._worker.is_alive()


def test_server_answers_503_and_health_says_so_when_the_worker_stops(tiny_pipe):
    import httpx
    import openai
    from test_serve import data_url, user_message

    from asymspec_mm.serve import ServerThread, create_app

    factory = lambda model, name: FailingForward(model, name, WorkerKilled("the worker was killed"), fail_on=2)  # noqa: E731
    sched = tiny_pipe.scheduler(max_batch_size=2, batch_engines=factory)
    app = create_app(tiny_pipe, scheduler=sched)
    case = make_case(390)
    with ServerThread(app) as srv:
        assert httpx.get(srv.url + "/health", timeout=30).json()["status"] == "ok"
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        body = dict(model="tiny", messages=[user_message(case["question"], data_url(case["image"]))], max_tokens=8)
        body["extra_body"] = {"asymspec": {"caption": case["caption"], "ocr": case["ocr"]}}
        for _ in range(2):  # the request that met the fault, then one after it: both 503, the server keeps answering
            with pytest.raises(openai.APIStatusError) as info:
                client.chat.completions.create(**body)
            assert info.value.status_code == 503 and info.value.body["code"] == "scheduler_stopped"
            assert "worker stopped on WorkerKilled" in info.value.body["message"]
        health = httpx.get(srv.url + "/health", timeout=30)
        assert health.status_code == 503 and health.json()["status"] == "error" and "WorkerKilled" in health.json()["error"]
    sched.close(timeout=30)


def test_a_live_row_keeps_stepping_while_new_requests_are_captioned(tiny_pipe):
    """Set-up runs on its own thread and takes the models' lock per model call: while four requests have their
    captions written (one drafter step per caption token), the live row steps in between, instead of waiting for
    all four set-ups (the old scheduler made 2 steps in that window). Counted in steps, not seconds."""
    from asymspec_mm.bench.admission import measure_stall

    live = make_case(407)
    new = [{"image": make_case(410 + i)["image"], "question": f"Question {i}?", "caption": None, "ocr": False} for i in range(4)]
    got = measure_stall(tiny_pipe, live, new, live_tokens=300, warm_steps=3, new_tokens=4)
    assert got["live_steps"] == 300
    assert got["caption_tokens"] >= 600, got  # the captions were really written, token by token: longer than the row
    # the live row stepped beside the caption rows while the four were set up (the old scheduler made 2 steps in that
    # window; one set-up thread at a time, 297: all it had left). Set up side by side, the four captions are written
    # in the same steps, and the window can close before the live row ends: counted, not timed
    assert got["steps_during_setup"] >= 100, got


def test_listen_hands_over_the_backlog_then_every_update_in_order(tiny_pipe):
    case = _case_kwargs(420)
    cfg = AsymSpecConfig(max_new_tokens=12)
    ref = tiny_pipe.generate(**case, config=cfg)
    got: list = []
    with tiny_pipe.scheduler(max_batch_size=2) as sched:
        h = sched.submit(**case, config=cfg)
        first = next(iter(h))  # one step read by iteration
        h.listen(lambda kind, value: got.append((kind, value)))
        h.result(timeout=120)
    kinds = [k for k, _ in got]
    assert kinds[-1] == "result" and set(kinds[:-1]) <= {"events"} and got[-1][1].token_ids == ref.token_ids
    tokens = [ev.token_id for ev in first] + [ev.token_id for k, evs in got[:-1] for ev in evs]
    assert tokens == ref.token_ids  # nothing lost, nothing twice, in order


def test_the_server_follows_requests_without_a_thread_each(tiny_pipe):
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import openai
    from test_serve import data_url, user_message

    from asymspec_mm.serve import ServerThread, create_app

    cases = [make_case(430 + i) for i in range(6)]
    refs = [
        tiny_pipe.generate(c["image"], c["question"], caption=c["caption"], ocr=c["ocr"], config=AsymSpecConfig(max_new_tokens=16))
        for c in cases
    ]
    seen_threads: set[str] = set()
    with ServerThread(create_app(tiny_pipe, max_batch_size=8)) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)

        def ask(c):
            body = {"asymspec": {"caption": c["caption"], "ocr": c["ocr"]}}
            stream = client.chat.completions.create(
                model="tiny", messages=[user_message(c["question"], data_url(c["image"]))], max_tokens=16, stream=True, extra_body=body
            )
            text = ""
            for chunk in stream:
                seen_threads.update(t.name for t in threading.enumerate())
                text += chunk.choices[0].delta.content or "" if chunk.choices else ""
            return text

        with ThreadPoolExecutor(6) as pool:
            texts = list(pool.map(ask, cases))
    assert texts == [r.text for r in refs]
    assert not [name for name in seen_threads if name.startswith("asymspec-serve-")]


def test_stall_figures_from_step_times():
    from asymspec_mm.bench.admission import stall_figures

    # steps every 0.1 s, a 1.0 s gap while set-up runs in [0.35, 1.45], then 0.2 s steps with every row decoding
    stamps = [0.0, 0.1, 0.2, 0.3, 1.3, 1.4, 1.6, 1.8, 2.0]
    got = stall_figures(stamps, (0.35, 1.45), after_steps=3)
    assert got["median_step_s"] == pytest.approx(0.1) and got["median_step_all_s"] == pytest.approx(0.2)
    assert got["longest_gap_s"] == pytest.approx(1.0) and got["stall"] == pytest.approx(10.0) and got["stall_all"] == pytest.approx(5.0)
    assert got["steps_during_setup"] == 2


def test_generate_batch_sets_requests_up_ahead_and_raises_a_bad_one_at_its_turn(tiny_pipe):
    """generate_batch runs on a scheduler (set-up on its own thread): results stay in input order and equal each
    request alone; a request whose image is broken raises its own error from generate_batch (after the rows before
    it were decoded), and the scheduler's threads do not outlive the call."""
    import threading

    from asymspec_mm.base.errors import InvalidImageError

    cfg = AsymSpecConfig(max_new_tokens=6)
    good = [_case_kwargs(440 + i) for i in range(5)]
    got = tiny_pipe.generate_batch(good, config=cfg, batch_size=2)
    assert [r.token_ids for r in got] == [tiny_pipe.generate(**c, config=cfg).token_ids for c in good]
    steps = []
    bad = good[:3] + [{**good[3], "image": b"not an image"}] + good[4:]
    with pytest.raises(InvalidImageError):
        tiny_pipe.generate_batch(bad, config=cfg, batch_size=2, on_step=lambda *a: steps.append(a))
    assert steps  # the rows set up before the broken one were decoding when its error came
    assert not [t for t in threading.enumerate() if t.name in ("asymspec-setup", "asymspec-scheduler", "asymspec-output")]
