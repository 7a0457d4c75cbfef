"""One range per decoding option (issue #27, point 7): :data:`asymspec_mm.base.config.RANGES` is what the library, the
command line, eval's sweeps, the server's request fields and the demo's sliders accept, and every refusal is one
line naming the option, the value and the range."""

from __future__ import annotations

import pytest

from asymspec_mm.base.config import RANGES, AsymSpecConfig, Range, range_error
from asymspec_mm.base.errors import UnknownOptionError
from asymspec_mm.eval.cli import main as eval_main
from asymspec_mm.serve.chat_request import parse_chat_request
from asymspec_mm.serve.errors import RequestError

ENDS = {"k": (1, 16), "beta": (0.0, 4.0), "gamma": (0.0, 1.0), "lam": (0.0, 10.0), "max_new_tokens": (1, None), "trace_top": (0, 20)}
ENDS |= {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0), "top_k": (0, None)}


def test_the_table_holds_one_range_per_numeric_field():
    assert {name: rng.bounds() for name, rng in RANGES.items()} == ENDS
    assert [RANGES[n].text() for n in ("k", "gamma", "beta", "max_new_tokens")] == ["1 to 16", "0 to 1", "0 to 4", "1 or more"]
    assert RANGES["k"].integer and not RANGES["gamma"].integer and Range(0.5, 2.5).text() == "0.5 to 2.5"


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("k", 100, "k=100 must be an integer >= 1 and <= 16"),
        ("k", 2.0, "k=2.0 must be an integer >= 1 and <= 16"),
        ("k", True, "k=True must be an integer >= 1 and <= 16"),
        ("gamma", 2.0, "gamma=2.0 must be >= 0 and <= 1"),
        ("gamma", -1.0, "gamma=-1.0 must be >= 0 and <= 1"),
        ("beta", float("nan"), "beta=nan must be a finite number >= 0 and <= 4"),
        ("lam", "0.1", "lam='0.1' must be a finite number >= 0 and <= 10"),
        ("trace_top", 21, "trace_top=21 must be an integer >= 0 and <= 20"),
        ("max_new_tokens", 0, "max_new_tokens=0 must be an integer >= 1"),
    ],
)
def test_range_error_exact_lines(name, value, message):
    assert range_error(name, value) == message
    with pytest.raises(UnknownOptionError) as info:
        AsymSpecConfig().with_(**{name: value}).validated()
    assert str(info.value) == message


def test_both_ends_are_inside():
    for name, (low, high) in ENDS.items():
        assert range_error(name, low) is None and (high is None or range_error(name, high) is None)
    AsymSpecConfig(k=16, beta=4.0, gamma=1.0, lam=10.0, max_new_tokens=32768, trace_top=20).validated()
    assert range_error("k", 100, "--k 100") == "--k 100 must be an integer >= 1 and <= 16"


def _body(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "Which bar is the tallest?"}], **fields}


@pytest.mark.parametrize(
    "fields, param, message",
    [
        ({"asymspec": {"k": 100}}, "asymspec.k", "asymspec.k=100 must be an integer >= 1 and <= 16"),
        ({"asymspec": {"gamma": 2}}, "asymspec.gamma", "asymspec.gamma=2.0 must be >= 0 and <= 1"),
        ({"asymspec": {"beta": 4.5}}, "asymspec.beta", "asymspec.beta=4.5 must be >= 0 and <= 4"),
        ({"asymspec": {"k": 17}}, "asymspec.k", "asymspec.k=17 must be an integer >= 1 and <= 16"),
    ],
)
def test_the_server_refuses_the_same_values_naming_the_field(fields, param, message):
    with pytest.raises(RequestError) as info:
        parse_chat_request(_body(**fields))
    assert info.value.status == 400 and info.value.param == param and info.value.message == message


def test_eval_sweeps_are_checked_against_the_table(capsys):
    argv = ["eval", "mathvista", "--dataset", "minivista", "--minivista-n", "2", "--dry-run", "--methods", "asymspec"]
    assert eval_main([*argv, "--k", "2,100"]) == 2
    assert capsys.readouterr().err.strip() == "error: --k 100 must be an integer >= 1 and <= 16"
    assert eval_main([*argv, "--gamma", "0.5,1.5"]) == 2
    assert capsys.readouterr().err.strip() == "error: --gamma 1.5 must be >= 0 and <= 1"
    assert eval_main([*argv, "--max-new-tokens", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --max-new-tokens 0 must be an integer >= 1"
    assert eval_main([*argv, "--k", "16", "--gamma", "1"]) == 0


def test_the_demo_sliders_span_the_table(tiny_pipe):
    pytest.importorskip("gradio")
    from ui.app import build_app

    demo = build_app(tiny_pipe, examples=[])
    sliders = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None) in ("asym-k", "asym-beta", "asym-gamma")}
    assert {key: (s.minimum, s.maximum) for key, s in sliders.items()} == {
        "asym-k": RANGES["k"].bounds(),
        "asym-beta": RANGES["beta"].bounds(),
        "asym-gamma": RANGES["gamma"].bounds(),
    }
