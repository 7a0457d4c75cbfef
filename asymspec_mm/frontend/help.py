"""Help text for a terminal: the reST of the docstrings that ``--help`` prints, as plain text.

The commands' module docstrings are written for the API docs (``code``, Sphinx roles, bold); argparse prints a
description as given, so each command's parser passes its docstring through :func:`terminal_text`.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

# :meth:`AsymSpecPipeline.prepare`, :class:`~asymspec_mm.base.timing.BucketTimer`, :mod:`.batching`, :ref:`text <target>`
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(?:([^`<]*?)\s*<[^`>]*>|~?\.?([^`]*))`")
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
_STRONG = re.compile(r"\*\*(.+?)\*\*", re.DOTALL)


def _role_text(m: re.Match) -> str:
    """What a role shows: its title, else its target (``~`` keeps the last dotted name only)."""
    if m.group(1) is not None:
        return m.group(1)
    target = m.group(2)
    return target.rsplit(".", 1)[-1] if m.group(0).split("`", 1)[1].startswith("~") else target


def terminal_text(doc: str | None) -> str:
    """``doc`` with reST markup turned into plain text: ````code```` -> ``code``, Sphinx roles -> their text
    (``:meth:`AsymSpecPipeline.prepare``` -> ``AsymSpecPipeline.prepare``), ``**bold**`` -> ``bold``, punctuation
    in code quoted (``;`` -> ``';'``); line
    breaks and indentation kept (the parsers print it raw)."""
    text = _ROLE.sub(_role_text, doc or "")
    # punctuation alone (``;``) would vanish into the sentence: quote it
    text = _LITERAL.sub(lambda m: m.group(1) if re.search(r"\w", m.group(1)) else f"'{m.group(1)}'", text)
    return _STRONG.sub(r"\1", text)


def documented_parser(sub: Any, name: str, help: str, doc: str | None) -> argparse.ArgumentParser:
    """Add the subcommand ``name`` to ``sub`` (an argparse subparsers object): ``help`` in its parent's list,
    ``doc`` (its module's docstring) as its ``--help`` description, printed as :func:`terminal_text` lays it out."""
    return sub.add_parser(name, help=help, description=terminal_text(doc), formatter_class=argparse.RawDescriptionHelpFormatter)
