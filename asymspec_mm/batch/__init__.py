"""Batched decoding (issue #19): many requests decoded together, one forward per stream per step for all rows."""

from __future__ import annotations

from .engines import BatchEngine, RowView

__all__ = ["BatchEngine", "RowView"]
