"""The built site reads right (#41): the home page's "Each step" table has a header, the serve API page shows the
defaults' values and links the request schema, and code wraps rather than being cut off (the site's extra CSS)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docblocks import REPO, read_page


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """``mkdocs build --strict`` of the checkout into a scratch folder."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs / mkdocstrings are not installed (pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _header_cells(table_html: str) -> list[str]:
    head = re.search(r"<thead>(.*?)</thead>", table_html, re.S)
    assert head, table_html[:300]
    return [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<th[^>]*>(.*?)</th>", head.group(1), re.S)]


def test_each_step_table_has_a_header_row(site):
    html = (site / "index.html").read_text(encoding="utf-8")
    table = html[html.index("Each step (greedy)") :]
    table = table[table.index("<table>") : table.index("</table>")]
    cells = _header_cells(table)
    assert len(cells) == 2 and all(cells), cells
    for page in ("README.md", "docs/index.md"):  # the Markdown the README shows on GitHub too
        text = read_page(page)
        assert not re.search(r"^\|(\s*\|)+\s*$", text, re.M), f"{page}: a table row of empty cells"


def test_serve_page_shows_the_defaults_values_and_links_the_schema(site):
    from asymspec_mm.serve import app, chat_request

    html = (site / "api" / "serve" / "index.html").read_text(encoding="utf-8")
    text = re.sub(r"<[^>]+>", "", html)
    for name, value in (
        ("DEFAULT_MAX_QUEUE", app.DEFAULT_MAX_QUEUE),
        ("DEFAULT_MAX_BATCH_SIZE", app.DEFAULT_MAX_BATCH_SIZE),
        ("DEFAULT_MAX_REQUEST_MB", app.DEFAULT_MAX_REQUEST_MB),
        ("DEFAULT_MAX_IMAGES", chat_request.DEFAULT_MAX_IMAGES),
    ):
        assert f"{name} = {value}" in text, name
        assert re.search(rf'href="#asymspec_mm\.serve\.\w+\.{name}"', html), f"{name}: the signature does not link its value"
    assert re.search(r'<a [^>]*href="#asymspec_mm\.serve\.chat_request"[^>]*>asymspec_mm\.serve\.chat_request</a> for what', html)


def test_code_wraps_instead_of_being_cut_off(site):
    html = (site / "index.html").read_text(encoding="utf-8")
    links = re.findall(r'<link[^>]+href="([^"]*extra\.css)"', html)
    assert links, "the extra CSS is not linked"
    css = (site / links[0]).read_text(encoding="utf-8")
    rule = re.search(r"pre\s*>\s*code[^{]*\{([^}]*)\}", css)
    assert rule and "white-space: pre-wrap" in rule.group(1), css
