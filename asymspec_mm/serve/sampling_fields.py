"""The sampling fields of a chat request: ``temperature``, ``top_p``, ``top_k`` (an extension, as vLLM takes it),
``seed`` and ``n``, checked into :class:`~asymspec_mm.base.config.AsymSpecConfig` fields; the seeds of ``n`` choices; and
the model's own sampling defaults for ``serve --generation-config model``.

A request without ``temperature`` is greedy unless the server was started with ``--generation-config model``: its
verifier's ``generation_config.json`` then supplies temperature, top_p and top_k (as vLLM's
``--generation-config auto``); a request's own fields always win.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..base.config import RANGES, SEED_LIMIT, AsymSpecConfig, range_error
from .errors import bad_request

#: Choices one request may ask for (``n``); each is a row of the batch.
MAX_CHOICES = 8
#: ``serve --generation-config``: ``none`` (greedy unless a request sends temperature) or ``model``.
GENERATION_CONFIGS = ("none", "model")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def sampling_fields(data: dict) -> dict[str, Any]:
    """The config fields the request's ``temperature``, ``top_p``, ``top_k`` and ``seed`` set (absent or null: not
    set); a 400 naming the field for a bad value."""
    out: dict[str, Any] = {}
    t = data.get("temperature")
    if t is not None:
        if (problem := range_error("temperature", t, f"temperature={json.dumps(t)[:40]}")) is not None:
            raise bad_request(f"{problem} (0 decodes greedily)", "temperature")
        out["temperature"] = float(t)
    p = data.get("top_p")
    if p is not None:
        if not _number(p) or not 0 < p <= 1:
            raise bad_request(f"top_p={json.dumps(p)[:40]} must be a number > 0 and <= 1 (1 keeps every token)", "top_p")
        out["top_p"] = float(p)
    k = data.get("top_k")
    if k is not None:
        # vLLM's -1 and 0 both mean off
        if isinstance(k, bool) or not isinstance(k, int) or k < -1:
            raise bad_request(f"top_k={json.dumps(k)[:40]} must be an integer >= 0 (0 or -1: off)", "top_k")
        out["top_k"] = max(0, k)
    seed = data.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
            raise bad_request(f"seed={json.dumps(seed)[:40]} must be an integer >= 0 and < 2**63", "seed")
        out["seed"] = seed
    return out


def choice_count(data: dict) -> int:
    """The request's ``n`` (default 1), checked: 1 to :data:`MAX_CHOICES`."""
    n = data.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise bad_request(f"n={json.dumps(n)[:40]} must be an integer >= 1 and <= {MAX_CHOICES}", "n")
    return n


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
