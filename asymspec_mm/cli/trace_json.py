"""Results as JSON with token texts: the trace names every token by id and by text.

Shared by ``asymspec-mm generate --json`` and ``asymspec-mm batch --trace``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON: tensors and numpy values to lists/numbers, non-finite floats to null."""
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple, dict, str)):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


class TokenTexts:
    """Token id -> text, cached (the trace names every token by its text too)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.cache = tokenizer, {}

    def __call__(self, token_id: int | None) -> str | None:
        if token_id is None:
            return None
        if token_id not in self.cache:
            self.cache[token_id] = self.tokenizer.decode([int(token_id)])
        return self.cache[token_id]


def trace_entry(ev: Any, text_of: TokenTexts) -> dict[str, Any]:
    """One :class:`TokenEvent` as JSON, with the texts of the verifier's own token, the rejected draft and the top tokens."""
    d = ev.as_dict()
    d["verifier_text"] = text_of(ev.verifier_argmax)
    d["draft_text"] = text_of(ev.draft_token)
    for name in ("top_verifier", "top_fused"):
        d[name] = [[int(t), text_of(int(t)), p] for t, p in getattr(ev, name)]
    return jsonable(d)


def result_json(res: Any, tokenizer: Any) -> dict[str, Any]:
    """``res.as_dict()`` with every trace entry carrying the texts of its tokens (see :func:`trace_entry`)."""
    d = res.as_dict()
    text_of = TokenTexts(tokenizer)
    d["trace"] = [trace_entry(ev, text_of) for ev in res.trace]
    return jsonable(d)
