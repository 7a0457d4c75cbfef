"""The engine core runs a turn on the thread that calls it: stepped by hand, with no scheduler and no thread of its
own, it answers a request as ``pipe.generate`` does alone (real forwards of the tiny pair)."""

from __future__ import annotations

import threading

from conftest import make_case

from asymspec_mm import AsymSpecConfig
from asymspec_mm.core.engine_core import EngineCore


def test_engine_core_stepped_on_the_callers_thread_answers_as_generate(tiny_pipe):
    case = make_case(710)
    cfg = AsymSpecConfig(max_new_tokens=8)
    # the reference: the same request alone on the single-row engines (no loop running)
    alone = tiny_pipe.generate(**case, method="asymspec", config=cfg, ignore_eos=True)

    before = set(threading.enumerate())
    stepped_on: set[int] = set()  # the threads the decode steps ran on
    core = EngineCore(tiny_pipe, max_batch_size=1, texts=True, on_step=lambda *_: stepped_on.add(threading.get_ident()))
    rid = core.add_session(tiny_pipe.prepare(**case, method="asymspec", config=cfg, ignore_eos=True, prefill=False))
    outputs = []
    while core.has_work:
        outputs.extend(core.step())

    assert stepped_on == {threading.get_ident()}  # every step on this thread
    assert not set(threading.enumerate()) - before  # and the core started no thread
    ends = [out for out in outputs if out.finished]
    assert [(out.rid, out.handle, out.error) for out in ends] == [(rid, None, None)]
    assert outputs[-1] is ends[0]  # its steps first, then its answer
    result = ends[0].result
    assert len(alone.token_ids) == 8
    assert result.token_ids == alone.token_ids
    assert result.text == alone.text
    assert [ev.token_id for out in outputs[:-1] for ev in out.events] == alone.token_ids  # each step's committed tokens
    assert core.steps == len(outputs) - 1
    assert core.table.get(rid) is None and not core.live_rows  # the request left the core
