"""A reader of the Prometheus text exposition format, for the clients of the server's ``GET /metrics`` (the
serving benchmarks, the soak run, tests): it sits below the server so that they need not import it."""

from __future__ import annotations


def parse_prometheus(text: str) -> dict[str, float]:
    """``{"name{labels}": value}`` of a Prometheus text (for tests and quick checks)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return values
