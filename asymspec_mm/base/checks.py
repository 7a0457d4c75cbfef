"""Type checks of user-given numbers: :mod:`vision_cache.checks` (the bottom of the import order, so that every
package shares one copy) under the package's usual ``base`` path."""

from __future__ import annotations

from vision_cache.checks import is_int, is_number

__all__ = ["is_int", "is_number"]
