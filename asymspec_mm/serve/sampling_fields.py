"""The sampling side of a request's choices: the seeds of ``n`` choices, and the model's own sampling defaults for
``serve --generation-config model`` (the fields themselves, ``temperature``, ``top_p``, ``top_k`` and ``seed``, are
the request models': :mod:`.models_fields`).

A request without ``temperature`` is greedy unless the server was started with ``--generation-config model``: its
verifier's ``generation_config.json`` then supplies temperature, top_p and top_k (as vLLM's
``--generation-config auto``); a request's own fields always win.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..base.checks import is_number
from ..base.config import RANGES, SEED_LIMIT, AsymSpecConfig, range_error

#: ``serve --generation-config``: ``none`` (greedy unless a request sends temperature) or ``model``.
GENERATION_CONFIGS = ("none", "model")


def _number(v: Any) -> bool:
    return is_number(v)


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice ``index`` of a request seeded with ``seed``: the seed itself for the first choice (so n=1
    and n=3 share it), a digest of both for the others (independent streams, the same on every run)."""
    if index == 0:
        return seed
    digest = hashlib.sha256(f"asymspec-choice:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % SEED_LIMIT


def choice_configs(config: AsymSpecConfig, n: int) -> list[AsymSpecConfig]:
    """The configs of a request's ``n`` choices: seeded choices get :func:`choice_seed`, unseeded ones each draw a
    fresh seed when they start (reported in their stats)."""
    if config.seed is None:
        return [config] * n
    return [config.with_(seed=choice_seed(config.seed, i)) for i in range(n)]


def model_sampling_defaults(generation_config: Any) -> dict[str, Any]:
    """temperature / top_p / top_k of a model's ``GenerationConfig`` that samples (``do_sample``), within the
    toolkit's ranges; {} for one that decodes greedily."""
    if generation_config is None or not getattr(generation_config, "do_sample", False):
        return {}
    out: dict[str, Any] = {}
    t = getattr(generation_config, "temperature", None)
    if _number(t) and range_error("temperature", t) is None:
        out["temperature"] = float(t)
    p = getattr(generation_config, "top_p", None)
    if _number(p) and 0 < p <= 1:
        out["top_p"] = float(p)
    k = getattr(generation_config, "top_k", None)
    if isinstance(k, int) and RANGES["top_k"].holds(k):
        out["top_k"] = k
    return out
