"""Every ``asymspec-mm`` command's ``--help`` (and the ``python -m`` commands') is written for a terminal: no reST
or Sphinx markup from the docstrings it is made of (issue #41)."""

from __future__ import annotations

import argparse
import contextlib
import io
import re

import pytest

from asymspec_mm.cli.main import build_parser, main
from asymspec_mm.frontend.help import terminal_text

#: What a terminal would show literally: ``code``, Sphinx roles, **bold**.
MARKUP = re.compile(r"``|:(?:meth|class|func|mod|attr|data|obj|exc|ref|doc|py:[a-z]+):`|\*\*\w")


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand of ``parser``, as the words that name it (``()``: the program itself)."""
    paths = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += command_paths(sub, (*prefix, name))
    return paths


def help_of(words: tuple[str, ...]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        main([*words, "--help"])
    assert exit_.value.code == 0
    return out.getvalue()


PATHS = command_paths(build_parser())


def test_every_command_is_covered():
    names = {p[0] for p in PATHS if p}
    assert {"generate", "quickstart", "batch", "demo", "eval", "bench", "serve"} <= names
    assert {("eval", c) for c in ("mathvista", "gaia", "simpleqa", "score", "merge", "report")} <= set(PATHS)


@pytest.mark.parametrize("words", PATHS, ids=lambda p: " ".join(p) or "asymspec-mm")
def test_help_has_no_rest_markup(words):
    text = help_of(words)
    assert text.strip()
    found = [line for line in text.splitlines() if MARKUP.search(line)]
    assert not found, "\n".join(found)


#: The ``python -m`` commands whose parsers are made of their module docstrings.
MODULE_COMMANDS = (
    "asymspec_mm.tiny.train",
    "asymspec_mm.tiny.finetune",
    "asymspec_mm.tiny.results",
    "asymspec_mm.tiny.agent_results",
    "asymspec_mm.tiny.xfamily",
    "asymspec_mm.tiny.xfamily_results",
    "asymspec_mm.eval.tokenizer_pairs",
    "asymspec_mm.eval.agent_smolagents",
    "asymspec_mm.bench.grammar",
    "asymspec_mm.bench.conversation",
    "asymspec_mm.bench.sampling",
    "asymspec_mm.bench.admission",
    "asymspec_mm.bench.mixed",
    "asymspec_mm.bench.memory",
    "asymspec_mm.bench.kv_peak",
    "asymspec_mm.bench.paged_forward",
    "asymspec_mm.bench.serving",
    "asymspec_mm.bench.direct_threads",
)


@pytest.mark.parametrize("module", MODULE_COMMANDS)
def test_module_commands_help_has_no_rest_markup(module):
    import importlib

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        importlib.import_module(module).main(["--help"])
    assert exit_.value.code == 0 and out.getvalue().strip()
    found = [line for line in out.getvalue().splitlines() if MARKUP.search(line)]
    assert not found, "\n".join(found)


def test_terminal_text_keeps_the_words():
    doc = (
        "``asymspec-mm batch``: as :meth:`AsymSpecPipeline.prepare`, :class:`~asymspec_mm.base.timing.BucketTimer`, "
        ":mod:`.batching`, :ref:`the guide <serving>`; lists split by ``;`` -- **bold**\n  indented"
    )
    assert terminal_text(doc) == (
        "asymspec-mm batch: as AsymSpecPipeline.prepare, BucketTimer, batching, the guide; lists split by ';' -- bold\n  indented"
    )
