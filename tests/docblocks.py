"""The fenced code blocks of the README and the documentation pages, for the tests that run them.

A test names the block it runs with ``block_with(page, lang, marker)`` (``page`` relative to the checkout, e.g.
``"docs/serving.md"``) and literal arguments: ``tests/test_docs.py`` reads those calls from the tests' source to
check that every runnable block of every page is run by some test, or listed there as not runnable with a reason.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
#: A fenced block: its language and its text (fences start at the line's beginning, as every page writes them).
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```", flags=re.S | re.M)


def doc_pages() -> list[str]:
    """README.md and every Markdown page under docs/ (the site's own hooks excluded), relative to the checkout."""
    pages = sorted(p.relative_to(REPO).as_posix() for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)
    return ["README.md", *pages]


def read_page(page: str) -> str:
    return (REPO / page).read_text(encoding="utf-8")


def fenced_blocks(page: str) -> list[tuple[str, str]]:
    """``(lang, text)`` of every fenced block of ``page``, in order."""
    return FENCE.findall(read_page(page))


def blocks(page: str, lang: str) -> list[str]:
    """The fenced blocks of ``lang`` in ``page``, in order."""
    return [text for block_lang, text in fenced_blocks(page) if block_lang == lang]


def block_with(page: str, lang: str, marker: str) -> str:
    """The one ``lang`` block of ``page`` that contains ``marker``."""
    found = [b for b in blocks(page, lang) if marker in b]
    assert len(found) == 1, f"expected one {lang} block containing {marker!r} in {page}, found {len(found)}"
    return found[0]
