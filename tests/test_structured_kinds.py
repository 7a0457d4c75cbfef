"""The ``response_format`` kinds of vLLM's ``structured_outputs`` (regex, choice, EBNF grammar): each compiles to
a grammar that accepts exactly its language, every method's answer on real forwards of the tiny random pair lies in
it, and what the grammar engine cannot take is refused in one line naming ``response_format``."""

from __future__ import annotations

import re

import pytest
from conftest import make_image

pytest.importorskip("xgrammar")

from xgrammar.testing import _is_grammar_accept_string

from asymspec_mm import AsymSpecConfig
from asymspec_mm.request.grammar import output_grammar
from asymspec_mm.request.tools import ToolError, check_response_format

CFG = AsymSpecConfig(k=3, max_new_tokens=40)
METHODS = ("asymspec", "floor", "sd", "drafter")
CHOICES = ["red", "Blue bar", 'say "hi"', "back\\slash", "two\nlines", "naïve 7"]


def _messages(i: int) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image", "image": make_image(700 + i)}, "Which colour is the tallest bar?"]}]


@pytest.mark.parametrize("choice", CHOICES)
def test_a_choice_grammar_accepts_each_choice_and_nothing_else(choice):
    grammar = output_grammar([], "none", {"type": "choice", "choice": CHOICES})
    assert _is_grammar_accept_string(grammar, choice)
    for other in (choice + "x", choice[:-1], " " + choice, choice.upper() if choice.upper() not in CHOICES else "zz"):
        assert not _is_grammar_accept_string(grammar, other), other


@pytest.mark.parametrize(
    ("fmt", "text", "ok"),
    [
        ({"type": "regex", "regex": r"[0-9]{1,3}"}, "42", True),
        ({"type": "regex", "regex": r"[0-9]{1,3}"}, "1234", False),
        ({"type": "regex", "regex": r"(yes|no), [a-z]+"}, "no, red", True),
        ({"type": "regex", "regex": r"(yes|no), [a-z]+"}, "no red", False),
        ({"type": "grammar", "grammar": 'root ::= "Answer: " [A-D]'}, "Answer: C", True),
        ({"type": "grammar", "grammar": 'root ::= "Answer: " [A-D]'}, "Answer: E", False),
    ],
)
def test_regex_and_ebnf_grammars_accept_their_language(fmt, text, ok):
    check_response_format(fmt)
    assert _is_grammar_accept_string(output_grammar([], "none", fmt), text) is ok


@pytest.mark.parametrize("method", METHODS)
def test_every_method_answers_inside_the_language(tiny_pipe, method):
    regex = r"(red|blue|green) [0-9]{1,2}"
    res = tiny_pipe.chat(
        _messages(1), caption="a bar chart", ocr=False, method=method, response_format={"type": "regex", "regex": regex}, config=CFG
    )
    assert res.finish_reason == "stop" and re.fullmatch(regex, res.text), res.text
    res = tiny_pipe.chat(
        _messages(2), caption="a bar chart", ocr=False, method=method, response_format={"type": "choice", "choice": CHOICES}, config=CFG
    )
    assert res.finish_reason == "stop" and res.text in CHOICES, res.text
    fmt = {"type": "grammar", "grammar": 'root ::= "The answer is " ("A" | "B" | "C") "."'}
    res = tiny_pipe.chat(_messages(3), caption="a bar chart", ocr=False, method=method, response_format=fmt, config=CFG)
    assert res.finish_reason == "stop" and re.fullmatch(r"The answer is [ABC]\.", res.text), res.text


@pytest.mark.parametrize(
    ("fmt", "message", "param"),
    [
        (
            {"type": "regex", "regex": "(["},
            r"^response_format.regex: the regex cannot be compiled to a grammar: Regex parsing error at position \d+",
            "response_format.regex",
        ),
        (
            {"type": "grammar", "grammar": "root ::= foo"},
            '^response_format.grammar: the EBNF grammar cannot be compiled to a grammar: EBNF parser error .*"foo"',
            "response_format.grammar",
        ),
        (
            {"type": "choice", "choice": []},
            "^response_format choice needs a non-empty list of non-empty strings$",
            "response_format.choice",
        ),
        ({"type": "choice", "choice": ["a", ""]}, "^response_format choice needs a non-empty list", "response_format.choice"),
        ({"type": "regex", "regex": 5}, "^response_format regex needs a non-empty string in 'regex'$", "response_format.regex"),
        ({"type": "grammar"}, "^response_format grammar needs a non-empty string", "response_format.grammar"),
        ({"type": "xml"}, "^response_format=.* is not text, json_object, .*regex, choice or grammar$", "response_format"),
    ],
)
def test_what_cannot_be_compiled_is_one_line_naming_response_format(tiny_pipe, fmt, message, param):
    with pytest.raises(ToolError, match=message) as err:
        tiny_pipe.chat(_messages(0), caption="c", ocr=False, response_format=fmt, config=CFG)
    assert err.value.param == param and "\n" not in str(err.value) and ".cc:" not in str(err.value)
