"""The one request object (issue #42): each edge builds a :class:`Request`, checks it once, and the same object reaches
the row and comes back on the result; a request's own method and settings hold in a batch of others; a bad field is
refused once, in one line, naming it. Real forwards of the tiny random pair."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_case

from asymspec_mm import AsymSpecConfig, Request
from asymspec_mm.base.errors import InvalidTextError, UnknownOptionError
from asymspec_mm.request.request import request_of
from asymspec_mm.request.tools import ToolError

_TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}
_SHORT = AsymSpecConfig(max_new_tokens=6)


def _question(seed: int = 3, **fields) -> Request:
    c = make_case(seed)
    return Request(c["image"], c["question"], c["caption"], c["ocr"], **fields)


def test_checked_fills_the_defaults_once_and_is_then_taken_as_it_is():
    raw = Request(messages=[{"role": "user", "content": "Add 2 and 3."}], tools=[_TOOL], seed=7, config=_SHORT)
    checked = raw.checked()
    assert not raw.is_checked and checked.is_checked
    assert checked.method == "asymspec" and checked.config.seed == 7 and checked.config.max_new_tokens == 6
    assert checked.tool_choice == "auto" and checked.reads_tool_calls  # the default with tools offered
    assert checked.checked() is checked  # never checked twice
    none = dataclasses.replace(raw, tool_choice="none").checked()
    assert "<tool_call>" in none.config.stop_strings and not none.reads_tool_calls  # the stop string its tools need


@pytest.mark.parametrize(
    ("request_", "error", "param", "text"),
    [
        (Request(None, "What?", method="beam"), UnknownOptionError, None, "method='beam' is not valid"),
        (Request(None, "\ud800?"), InvalidTextError, "question", "question: not valid Unicode text"),
        (Request(None, "What?", tools=[_TOOL]), UnknownOptionError, None, "need a conversation: pass messages"),
        (Request(messages=[{"role": "user", "content": "Hi"}], tool_choice="required"), ToolError, "tool_choice", "no tools are offered"),
        (Request(messages=[{"role": "user", "content": "Hi"}], tools="add"), ToolError, "tools", "tools must be a list"),
        (Request(None, "What?", priority=1.5), UnknownOptionError, None, "priority=1.5 must be an integer"),
        (Request(None, "What?", max_caption_chars=0), UnknownOptionError, None, "max_caption_chars=0 must be an integer >= 1"),
        (Request(None, "What?", config=AsymSpecConfig(k=0)), UnknownOptionError, None, "k"),
    ],
)
def test_a_bad_field_is_one_line_naming_it(request_, error, param, text):
    with pytest.raises(error) as info:
        request_.checked()
    assert text in str(info.value) and "\n" not in str(info.value)
    assert getattr(info.value, "param", None) == param


def test_request_of_splits_request_fields_from_config_fields():
    req = request_of(AsymSpecConfig(beta=0.5), image=None, question="Q?", caption="c", k=2, ignore_eos=True)
    assert (req.caption, req.ignore_eos, req.config.k, req.config.beta) == ("c", True, 2, 0.5)
    with pytest.raises(UnknownOptionError, match="unknown option\\(s\\) kk"):
        request_of(question="Q?", kk=2)


def test_the_same_object_reaches_the_row_and_comes_back(tiny_pipe):
    """Built and checked at the edge, handed unchanged through the line, the set-up thread, the ready queue and the
    decoder's row: the result carries that very object, and its answer equals the facade's for the same request."""
    checked = _question(config=_SHORT).checked()
    with tiny_pipe.scheduler(max_batch_size=2) as sched:
        h = sched.add(checked)
        res = h.result(timeout=300)
    assert h.request is checked and res.request is checked and res.config is checked.config
    alone = tiny_pipe.run(tiny_pipe.set_up(checked, prefill=True)).result
    assert alone.request is checked and alone.token_ids == res.token_ids
    c = make_case(3)
    assert tiny_pipe.generate(c["image"], c["question"], caption=c["caption"], ocr=c["ocr"], config=_SHORT).token_ids == res.token_ids


def test_a_requests_own_method_and_settings_hold_in_a_batch(tiny_pipe):
    """generate_batch's method and config fill what a Request leaves unset, never what it sets."""
    own = _question(4, method="floor", config=AsymSpecConfig(max_new_tokens=5))
    plain = {k: v for k, v in make_case(5).items() if k in ("image", "question", "caption", "ocr")}
    results = tiny_pipe.generate_batch([own, plain], method="asymspec", config=AsymSpecConfig(k=2, max_new_tokens=4))
    assert results[0].method == "floor" and results[0].config.max_new_tokens == 5
    assert results[1].method == "asymspec" and results[1].config.k == 2 and results[1].config.max_new_tokens == 4
    c = make_case(4)
    alone = tiny_pipe.generate(c["image"], c["question"], caption=c["caption"], ocr=c["ocr"], method="floor", max_new_tokens=5)
    assert results[0].token_ids == alone.token_ids


def test_the_server_builds_the_request_once(tiny_pipe):
    """The server's parsed body holds the engine's Request, checked: the tools normalized, the default tool choice,
    the AsymSpec extension's method and settings; the fields only the HTTP answer reads stay beside it."""
    from asymspec_mm.serve.chat_request import parse_chat_request

    body = {
        "messages": [{"role": "user", "content": "Add 2 and 3."}],
        "tools": [_TOOL],
        "max_tokens": 7,
        "n": 2,
        "asymspec": {"method": "sd", "k": 3, "return_trace": True},
    }
    parsed = parse_chat_request(body)
    req = parsed.request
    assert req.is_checked and req.method == "sd" and req.config.k == 3 and req.config.max_new_tokens == 7
    assert req.tool_choice == "auto" and req.tools[0]["function"]["name"] == "add" and req.return_trace
    assert parsed.n == 2 and parsed.config is req.config
