"""Mixed batches (issue #42): one decoder steps rows of every method and setting together, each step's forwards shared
(one call per row storage per phase), and every row equals itself run alone, token for token: greedy and seeded
sampling, with and without a grammar, whatever rows step beside it. Real forwards of the tiny pair."""

from __future__ import annotations

import pytest
from conftest import make_case, make_image

from asymspec_mm import AsymSpecConfig
from asymspec_mm.core import BatchDecoder
from asymspec_mm.decode.rows import step_shape

#: (method, settings): four step shapes of AsymSpec (K 2 / 4 / 6, gates, delta sources, both bonus rules), SD with
#: two K, Floor and the drafter alone; greedy and seeded sampling.
MIX = [
    ("asymspec", dict(k=2)),
    ("asymspec", dict(k=4, gate="fixed", beta=0.5)),
    ("asymspec", dict(k=6, delta="scd", gamma=0.3)),
    ("asymspec", dict(k=4, bonus="gated")),
    ("asymspec", dict(k=3, gate="tuned_kl", lam=2.0)),
    ("sd", dict(k=2)),
    ("sd", dict(k=5)),
    ("floor", dict(k=4)),
    ("drafter", dict()),
    ("asymspec", dict(k=4, temperature=0.8, seed=11)),
    ("asymspec", dict(k=2, temperature=1.2, top_p=0.9, seed=12, bonus="gated")),
    ("sd", dict(k=3, temperature=1.0, seed=5)),
    ("floor", dict(temperature=0.7, seed=3)),
    ("drafter", dict(temperature=1.0, top_k=20, seed=9)),
]


def _case(seed: int) -> dict:
    c = make_case(seed)
    return {"image": c["image"], "question": c["question"], "caption": c["caption"], "ocr": c["ocr"]}


def _expected_calls(rows, bonus_rows: int) -> int:
    """Model calls one step of ``rows`` makes: the drafting forwards of the longest AsymSpec K on the full view (the
    drafter-alone rows ride in the first), the longest SD K on the compressed view, one scoring forward on the
    compressed view for AsymSpec, one on the verifier (Floor rows ride in it), and one gated-bonus forward."""
    by = lambda m: [r for r in rows if r.method == m]  # noqa: E731
    a, s, f, d = by("asymspec"), by("sd"), by("floor"), by("drafter")
    full = max((r.config.k for r in a), default=1 if d else 0)
    comp = max((r.config.k for r in s), default=0) + (1 if a else 0)
    return full + comp + (1 if a or s or f else 0) + (1 if bonus_rows else 0)


def _step_all(decoder: BatchDecoder) -> tuple[dict, list[tuple[int, int]]]:
    """Step until every row is done: the results by row id and each step's (calls made, calls expected)."""
    results, calls = {}, []
    while decoder.rows:
        rows = list(decoder.rows.values())
        bonus_before = {r.id: r.counters.bonus_drafted for r in rows}
        before = decoder.engine_calls
        out = decoder.step()
        gated = sum(r.counters.bonus_drafted > bonus_before[r.id] for r in rows)
        calls.append((decoder.engine_calls - before, _expected_calls(rows, gated)))
        results.update({row.id: row.result for row, _ in out if row.result is not None})
    return results, calls


def test_every_row_of_a_mixed_batch_equals_itself_alone_and_the_step_shares_its_forwards(tiny_pipe):
    decoder = BatchDecoder(tiny_pipe)
    requests = []
    for i, (method, settings) in enumerate(MIX):
        cfg = AsymSpecConfig(max_new_tokens=12 + 3 * (i % 4), **settings)
        case = _case(700 + i)
        requests.append((method, cfg, case))
        decoder.add(i, tiny_pipe.prepare(**case, method=method, config=cfg, ignore_eos=True, prefill=True))
    results, calls = _step_all(decoder)
    for i, (method, cfg, case) in enumerate(requests):
        alone = tiny_pipe.generate(**case, method=method, config=cfg, ignore_eos=True)
        got = results[i]
        assert got.token_ids == alone.token_ids, (method, cfg)
        assert [e.source for e in got.trace] == [e.source for e in alone.trace], (method, cfg)
        assert got.stats["accepted_per_position"] == alone.stats["accepted_per_position"]
        assert got.stats.get("seed") == alone.stats.get("seed")
        assert got.stats["batch_size"] == len(MIX)
    assert all(made == want for made, want in calls), calls
    # the whole mix's first step: K_max = 6 drafting forwards, SD's 5 on the compressed view, 2 scoring forwards
    assert calls[0][0] in (6 + 5 + 2, 6 + 5 + 2 + 1)
    # one set of forwards for the mix, where one decoder per setting group (the old scheduler) made one set each
    shapes = {step_shape(m, AsymSpecConfig(**s)): (m, AsymSpecConfig(**s)) for m, s in MIX}
    assert calls[0][0] < sum(_expected_calls([_Fake(m, c)], 0) for m, c in shapes.values())


class _Fake:
    def __init__(self, method: str, config: AsymSpecConfig):
        self.method, self.config = method, config


def test_without_sd_a_step_makes_at_most_k_max_plus_two_calls(tiny_pipe):
    decoder = BatchDecoder(tiny_pipe)
    mix = [
        ("asymspec", dict(k=2)),
        ("asymspec", dict(k=5, gate="fixed")),
        ("floor", {}),
        ("drafter", {}),
        ("asymspec", dict(k=3, beta=0.0)),
    ]
    for i, (method, settings) in enumerate(mix):
        cfg = AsymSpecConfig(max_new_tokens=8, **settings)
        decoder.add(i, tiny_pipe.prepare(**_case(760 + i), method=method, config=cfg, ignore_eos=True, prefill=True))
    _, calls = _step_all(decoder)
    assert calls[0][0] == 5 + 2 and all(made <= 5 + 2 for made, _ in calls)


def test_constrained_and_free_rows_of_every_method_mix_and_each_equals_itself_alone(tiny_pipe):
    pytest.importorskip("xgrammar")
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["red", "blue", "A"]}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    }
    schema |= {"required": ["answer", "n"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    mix = [("asymspec", dict(k=3), fmt), ("asymspec", dict(k=5), None), ("sd", dict(k=2), fmt), ("floor", {}, fmt), ("drafter", {}, fmt)]
    mix += [("asymspec", dict(k=4, temperature=0.9, seed=21), fmt), ("floor", dict(temperature=1.0, seed=4), None)]
    decoder = BatchDecoder(tiny_pipe)
    requests = []
    for i, (method, settings, rf) in enumerate(mix):
        cfg = AsymSpecConfig(max_new_tokens=40, **settings)
        messages = [{"role": "user", "content": [{"type": "image", "image": make_image(780 + i)}, "Describe the chart as JSON."]}]
        requests.append((method, cfg, messages, rf))
        decoder.add(
            i, tiny_pipe.prepare_chat(messages, caption="a chart", ocr=False, method=method, config=cfg, response_format=rf, prefill=True)
        )
    results, calls = _step_all(decoder)
    assert all(made == want for made, want in calls), calls
    for i, (method, cfg, messages, rf) in enumerate(requests):
        alone = tiny_pipe.chat(messages, caption="a chart", ocr=False, method=method, config=cfg, response_format=rf)
        assert results[i].token_ids == alone.token_ids, (method, cfg, rf is not None)


def test_the_scheduler_serves_mixed_settings_from_one_batch(tiny_pipe):
    """16 requests in four setting groups through the scheduler at once: every answer equals its request alone and
    the rows shared their steps (one batch, whatever the settings)."""
    groups = [
        ("asymspec", dict(k=2, gate="cda", beta=0.5)),
        ("asymspec", dict(k=6, gate="fixed", beta=1.0)),
        ("floor", dict(k=4)),
        ("sd", dict(k=4)),
    ]
    requests = [(groups[i % 4][0], AsymSpecConfig(max_new_tokens=10, **groups[i % 4][1]), _case(800 + i)) for i in range(16)]
    steps: list[tuple[int, int, float]] = []
    with tiny_pipe.scheduler(max_batch_size=16, on_step=lambda *s: steps.append(s)) as sched:
        handles = [sched.submit(**case, method=m, config=cfg) for m, cfg, case in requests]
        got = [h.result(timeout=300) for h in handles]
    for (m, cfg, case), res in zip(requests, got):
        assert res.token_ids == tiny_pipe.generate(**case, method=m, config=cfg).token_ids, (m, cfg)
    assert max(res.stats["batch_size"] for res in got) > 4  # rows of different groups stepped together
    assert max(c for _, c, _ in steps) <= 6 + 4 + 2  # K_max drafting, SD's drafting, two scoring forwards


def test_the_mixed_traffic_bench_counts_what_each_arm_did(tiny_pipe):
    """bench/mixed.py on 8 requests: every arm decodes the same tokens; the mixed arm's first step makes K_max (6)
    drafting forwards, SD's 4 on the compressed view and 2 scoring forwards; one decoder per group makes at most one
    group's set (6 + 2); the report names both ratios."""
    from asymspec_mm.bench.mixed import measure, report
    from asymspec_mm.bench.pairs import bench_cases

    figures = measure(tiny_pipe, bench_cases(8), tokens=4, reps=1)
    arms = figures["arms"]
    assert arms["mixed"]["tokens"] == arms["groups"]["tokens"] == arms["uniform"]["tokens"] == 8 * 4
    assert arms["mixed"]["max_calls_per_step"] == 6 + 4 + 2
    assert arms["groups"]["max_calls_per_step"] == 6 + 2 and arms["uniform"]["max_calls_per_step"] == 4 + 2
    assert arms["mixed"]["steps"] < arms["groups"]["steps"]
    text = report(figures)
    assert "mixed over groups" in text and "mixed over uniform" in text
