"""MkDocs hook: publish the repository's own Markdown files (BENCHMARKS.md, VLLM.md, the tiny pair's notes, the
data notices) as pages of the site, so the docs link to them without copies that could drift.

Each file keeps its text; links between these files are rewritten to their page names, and any other relative
link (a source file of the checkout, which the site does not hold) becomes its path in code, so
``mkdocs build --strict`` finds no broken link.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]

#: repository file -> its page in the site
PAGES = {
    "BENCHMARKS.md": "files/BENCHMARKS.md",
    "VLLM.md": "files/VLLM.md",
    "asymspec_mm/tiny/README.md": "files/tiny-pair-training.md",
    "asymspec_mm/tiny/RESULTS.md": "files/tiny-pair-results.md",
    "asymspec_mm/eval/mathvista/data/NOTICE.md": "files/mathvista-data-notice.md",
    "asymspec_mm/qwen_data/PROVENANCE.md": "files/qwen-files-provenance.md",
}

LINK = re.compile(r"\[([^\]]*)\]\(([^)#\s]+)(#[^)\s]*)?\)")


def rewrite_links(text: str, source: str) -> str:
    """``text`` of the repository file ``source`` with its relative links pointed at the site's pages."""
    here = Path(source).parent

    def one(m: re.Match) -> str:
        label, target, anchor = m.group(1), m.group(2), m.group(3) or ""
        if re.match(r"[a-z]+:", target):
            return m.group(0)
        path = os.path.normpath(here / target).replace(os.sep, "/")
        if path in PAGES:
            return f"[{label}]({Path(PAGES[path]).name}{anchor})"
        return f"{label} (`{path}`)"

    return LINK.sub(one, text)


def on_files(files, config):
    for source, page in PAGES.items():
        text = (ROOT / source).read_text(encoding="utf-8")
        files.append(File.generated(config, page, content=rewrite_links(text, source)))
    return files


SPHINX_ROLE = re.compile(r":(?:class|mod|func|meth|data|attr|exc|obj):(?=<code>)")


def on_page_content(html, page, config, files):
    """Docstrings write Sphinx roles (``:class:`Name```); the API pages show the name as code without the role."""
    return SPHINX_ROLE.sub("", html)
