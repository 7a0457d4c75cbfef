"""The shared number checks refuse bools (ints in Python) and respect inclusive bounds."""

from __future__ import annotations

import pytest

from asymspec_mm.base.checks import is_int, is_number


@pytest.mark.parametrize(
    ("value", "minimum", "maximum", "expected"),
    [
        (3, None, None, True),
        (-5, None, None, True),
        (True, None, None, False),
        (False, 0, None, False),
        (1.0, None, None, False),
        ("1", None, None, False),
        (None, None, None, False),
        (0, 0, 19, True),
        (19, 0, 19, True),
        (20, 0, 19, False),
        (0, 1, None, False),
        (2**63 - 1, 0, 2**63 - 1, True),
    ],
)
def test_is_int(value: object, minimum: int | None, maximum: int | None, expected: bool) -> None:
    assert is_int(value, minimum, maximum) is expected


@pytest.mark.parametrize(("value", "expected"), [(1, True), (1.5, True), (float("nan"), True), (True, False), ("2", False), (None, False)])
def test_is_number(value: object, expected: bool) -> None:
    assert is_number(value) is expected
