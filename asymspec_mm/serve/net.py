"""Binding addresses: :func:`is_loopback` (stdlib only; ``ui.serve`` has the same check and could use this one)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
