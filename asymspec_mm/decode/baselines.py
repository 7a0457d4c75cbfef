"""The baselines' steps over rows, beside Algorithm 1 in :mod:`.rows`: symmetric SD (drafts on the compressed view, the
verifier's argmax keeps them: Floor's tokens) and the plain methods (Floor: the verifier alone; ``drafter``: the
drafter alone on the image). Each is a group's step coroutine (:mod:`.calls`): its forwards ride in the other
groups' calls of the same phase (a Floor row in the verifier's scoring forward, a drafter-alone row in the first
drafting forward)."""

from __future__ import annotations

import torch

from .calls import DECIDE, DRAFT, SCORE, Ask, Forward, GroupStep
from .row import Row
from .row_engines import stack_rows
from .step_events import Timer, make_event, sd_events
from .transfer import topk_logprobs

#: The streams each method decodes with (:data:`asymspec_mm.decode.rows.STREAMS_OF` re-exports it).
STREAMS_OF = {
    "asymspec": ("drafter_full", "drafter_comp", "verifier"),
    "sd": ("drafter_comp", "verifier"),
    "floor": ("verifier",),
    "drafter": ("drafter_full",),
}


class BaselineSteps:
    """The SD and plain-method group steps of :class:`~asymspec_mm.decode.rows.RowDecoder` (which provides
    ``_draft``, ``_scoring``, ``_masked``, ``_in_loop`` and ``_draws``)."""

    def _sd(self, key: tuple, rows: list[Row], timer: Timer) -> GroupStep:
        """Symmetric SD: greedy, keep the drafts that match the verifier's argmax, then its own token (equals Floor);
        sampled rows keep drafts by the lossless rule (A empty, target softmax(F(t / tau))): Floor in distribution."""
        k, top = rows[0].config.k, rows[0].config.trace_top
        masks: dict[int, list[torch.Tensor]] = {}
        draws = self._draws(key, rows, k + 1)
        drafts, _ = yield from self._draft(rows, k, masks, draws)
        (t_out,) = yield Ask(SCORE, [self._scoring("verifier", rows, drafts)])
        t = self._masked(stack_rows([t_out[r.id] for r in rows]).float(), masks)  # [R, K+1, V]
        v_ids = t.argmax(-1)  # [R, K+1]
        drafts_v = drafts.to(v_ids.device)  # the verifier may live on another GPU
        padded = torch.cat([drafts_v, drafts_v[:, :1]], dim=1)
        tokens, accepted = v_ids, torch.cat([drafts_v == v_ids[:, :k], torch.zeros_like(v_ids[:, :1], dtype=torch.bool)], dim=1)
        if draws is not None:
            q = torch.stack(draws.proposals, dim=1)
            s = draws.decide(q, t[:, :k].flatten(0, 1), drafts_v, 0, None, (accepted[:, :k].flatten(), v_ids[:, :k].flatten()))
            tokens = torch.cat([s.residual.view(-1, k), draws.draw_residual(t[:, k], k)[:, None]], dim=1)
            accepted = torch.cat([s.accepted.view(-1, k), accepted[:, k:]], dim=1)
        log_t = t.log_softmax(-1)
        p_v = log_t.gather(-1, tokens[..., None])[..., 0].exp()
        p_draft = log_t.gather(-1, padded[..., None])[..., 0].exp()
        cols = (tokens, p_v, padded, accepted, v_ids, p_draft)
        packed = torch.stack([c.double() for c in cols], dim=2)
        if top:  # the verifier's top tokens at every position, in the same transfer
            packed = torch.cat([packed, topk_logprobs(log_t.flatten(0, 1), top).view(*log_t.shape[:2], -1)], dim=2)
        host = _rows_of((yield Ask(DECIDE, transfer=packed)), packed.shape)  # the step's one transfer
        emitted = []
        for j, (row, h) in enumerate(zip(rows, host)):
            events, n_acc = sd_events(row.step, k, h, top)
            row.counters.record_step(k, n_acc)
            carry = None
            if n_acc < k:
                for s in row.streams.values():
                    s.rollback(n_acc)
            else:
                carry = drafts[j, k - 1 :]  # d_K rides in the next step's first drafting forward
            row.counters.record_deferred(carry is not None)
            emitted.append((events, tokens[j, n_acc : n_acc + 1].to(drafts.device), carry))
        return emitted

    def _greedy(self, key: tuple, rows: list[Row], timer: Timer) -> GroupStep:
        """Plain greedy decoding of one stream (Floor: the verifier, in the scoring phase; ``drafter``: the drafter on
        the full view, in the first drafting phase), each forward shared with the other groups' rows there."""
        method, top = rows[0].method, rows[0].config.trace_top
        name = STREAMS_OF[method][0]
        phase = SCORE if method == "floor" else DRAFT
        (out,) = yield Ask(phase, [Forward(rows[0].storage[name], {row.id: row.streams[name].pending for row in rows})])
        logits = self._in_loop(
            rows, name, stack_rows([out[r.id][-1:] for r in rows]).float()
        )  # a cross-family drafter's in the verifier's ids
        logits = self._masked(logits, {j: [row.constraint.mask()] for j, row in enumerate(rows) if row.constraint is not None})[
            :, 0
        ]  # [R, V]
        draws = self._draws(key, rows, 1)
        argmax = logits.argmax(-1)
        tokens = argmax if draws is None else draws.draw_residual(logits, 0)
        log_p = logits.log_softmax(-1)
        p = log_p.gather(-1, tokens[:, None])[:, 0].exp()
        packed = torch.stack([tokens.double(), p.double(), argmax.double()], dim=1)
        if top:  # the stream's own top tokens, in the same transfer
            packed = torch.cat([packed, topk_logprobs(log_p, top)], dim=1)
        host = _rows_of((yield Ask(DECIDE, transfer=packed)), packed.shape)  # the step's one transfer
        verifier = method == "floor"
        emitted = []
        for j, (row, h) in enumerate(zip(rows, host)):
            row.counters.record_step(0, 0)
            tok, p_host, argmax = int(h[0]), h[1], int(h[2])
            pairs = [(int(h[3 + i]), float(h[3 + top + i])) for i in range(top)] if top else None
            tops = (pairs, list(pairs)) if verifier and pairs else None
            events = [
                make_event(
                    row.step,
                    0,
                    tok,
                    "greedy",
                    p_host if verifier else None,
                    verifier_argmax=argmax if verifier else None,
                    tops=tops,
                    p_fused=p_host,
                )
            ]
            emitted.append((events, tokens[j : j + 1], None))
        return emitted


def _rows_of(flat: list[float], shape: torch.Size) -> list:
    """``flat`` (a tensor's values in order) nested as the tensor's ``shape`` (2 or 3 dims), as ``tolist`` gives."""
    if len(shape) == 2:
        w = shape[1]
        return [flat[i * w : (i + 1) * w] for i in range(shape[0])]
    n, w = shape[1], shape[2]
    return [[flat[(j * n + i) * w : (j * n + i + 1) * w] for i in range(n)] for j in range(shape[0])]
