"""The demo's per-turn compression field (ui.views_side): empty is off, a setting is the Compression the rows get,
and a bad one is the one-line error naming its field (the browser test runs the panel itself)."""

from __future__ import annotations

import pytest

from asymspec_mm.request.compression import Compression, CompressionError
from ui.views_side import check_compression_input, render_views_html


def test_the_field_is_off_when_empty_and_a_compression_otherwise():
    assert check_compression_input("") == {} and check_compression_input("   ") == {} and check_compression_input(None) == {}
    got = check_compression_input("truncate,limit=40,keep_last_turns=2")["compression"]
    assert got == Compression("truncate", limit=40, keep_last_turns=2).checked()


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("truncate,rate=2", "compression.rate"),
        ("gzip", "compression.method"),
        ("truncate,keep_last_turns=-1", "compression.keep_last_turns"),
    ],
)
def test_a_bad_setting_is_one_line_naming_its_field(spec, field):
    with pytest.raises(CompressionError) as err:
        check_compression_input(spec)
    assert err.value.param == field and str(err.value).startswith(field) and "\n" not in str(err.value)


def test_before_a_run_the_panel_says_what_it_will_show():
    assert "No run yet" in render_views_html([])
