"""The per-stream and per-request state the loops share: pending tokens with rollback, and the emitter.

Cache convention of every loop: a stream's cache holds its prompt and all committed tokens except the
*pending* ones, which the stream's next forward starts with. The prefill caches ``prompt[:-1]``, so the
first step forwards the prompt's last token and every step has the same shape. Pending is one token,
or two on a drafting stream after K acceptances: d_K (not forwarded when the step did not need its
logits) rides in the next step's first forward beside the new token instead of costing a call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..engines import Engine
from .events import TokenEvent
from .stats import Counters

StopFn = Callable[[list[int]], bool]


class Stream:
    """One engine and its pending tokens ``[n]`` (n = 1, or 2 with a carried d_K), in the engine's own ids.

    ``own`` maps the loop's token ids to this engine's (a drafter stream of a cross-family pair: the loop's ids are the
    verifier's, :meth:`asymspec_mm.base.vocab_bridge.VocabBridge.drafter_ids`); None: the same ids. The first pending
    token is the stream's own prompt's last token, so it is never mapped."""

    def __init__(self, engine: Engine, pending: torch.Tensor, own: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.engine = engine
        self.pending = pending
        self.base = engine.length
        self.own = own

    def own_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """The loop's token ids ``[n]`` as this engine's ids."""
        return ids if self.own is None else self.own(ids)

    def begin_step(self) -> None:
        """Remember the cache length the step starts from (what a rollback returns to)."""
        self.base = self.engine.length

    def score(self, drafts: torch.Tensor) -> torch.Tensor:
        """Forward pending + ``drafts`` ``[K]`` in one call: next-token logits ``[n + K, V]``."""
        return self.engine.extend(torch.cat([self.pending.to(drafts.device), drafts]).to(self.engine.device))

    def rollback(self, n_accepted: int) -> None:
        """Keep pending + the first ``n_accepted`` drafts of this step; drop the rejected rest."""
        self.engine.truncate(self.base + len(self.pending) + n_accepted)

    def advance(self, token: torch.Tensor, carry: torch.Tensor | None = None) -> None:
        """The next step starts with ``token`` ``[1]`` (after ``carry`` ``[1]``, an unforwarded d_K), loop ids."""
        pending = token if carry is None else torch.cat([carry, token])
        self.pending = self.own_ids(pending)


def draft_greedy(
    stream: Stream, k: int, rows_out: torch.Tensor | None = None, keep_rows: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Forward the stream's pending tokens, then k-1 of its own drafts one at a time: drafts ``[k]`` and
    their logits ``[k, V]`` float32.

    Drafts stay on the device (no host sync while drafting). The rows go into one float32 buffer, what
    the gate reads; ``rows_out`` reuses the previous step's, so a request allocates it once.
    """
    drafts = []
    rows = rows_out
    x = stream.pending
    for i in range(k):
        logits = stream.engine.extend(x)[-1]
        if keep_rows:
            if rows is None or rows.shape != (k, logits.shape[-1]) or rows.device != logits.device:
                rows = torch.empty(k, logits.shape[-1], dtype=torch.float32, device=logits.device)
            rows[i].copy_(logits)
        x = logits.argmax(-1, keepdim=True)
        drafts.append(x)
    return torch.cat(drafts), (rows if keep_rows else None)


class Emitter:
    """Commits tokens, enforcing EOS, the token budget and stop strings; tells the loop when to stop."""

    def __init__(self, counters: Counters, max_new_tokens: int, eos_ids: set[int], stop_fn: StopFn | None):
        self.counters = counters
        self.max_new = max_new_tokens
        self.eos_ids = eos_ids
        self.stop_fn = stop_fn
        self.tokens: list[int] = []
        self.done = False

    def commit(self, events: list[TokenEvent]) -> list[TokenEvent]:
        """Append what fits of ``events`` (numbering them); returns the committed ones."""
        kept: list[TokenEvent] = []
        reason = None
        for ev in events:
            if len(self.tokens) >= self.max_new:
                break
            ev.index = len(self.tokens)
            self.tokens.append(ev.token_id)
            kept.append(ev)
            if ev.token_id in self.eos_ids:
                reason = "eos"
                break
        if reason is None and len(self.tokens) >= self.max_new:
            reason = "max_new_tokens"
        if reason is None and self.stop_fn is not None and self.stop_fn(self.tokens):
            reason = "stop_string"
        self.done = reason is not None
        self.counters.record_commit(len(self.tokens), reason)
        return kept

    def next_token(self, committed: list[TokenEvent], emitted: list[TokenEvent], on_device: torch.Tensor) -> torch.Tensor:
        """The new pending token ``[1]``: the device copy when every event was kept (no host-to-device copy)."""
        if len(committed) == len(emitted):
            return on_device
        return torch.tensor([committed[-1].token_id], device=on_device.device)
