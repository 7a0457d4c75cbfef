"""Algorithm 1 (greedy) and its baselines, written once, over rows: one request is a batch of one.

Terms, as in the paper: ``a`` the drafter's logits on the full view (image), ``b`` the same drafter's on the
compressed view (caption + OCR), ``t`` the verifier's on the compressed view; ``d_1..d_K`` the drafts. A *row*
is one request's streams; R rows step together. Each step forwards K tokens one at a time on the drafting
stream (or lets an engine draft them itself) and K+1 in one forward on each scoring stream, for all rows; the
gate runs over ``[R*K, V]``; one device-to-host transfer carries every row's decision. Rows accept different
numbers of drafts, roll back alone (see :mod:`.streams` for the pending-token convention), stop alone and
leave at once; new rows join between steps.

Where a row's KV lives is the :class:`RowEngine`'s business: :class:`SoloEngine` adopts one prefilled
single-row engine (a single request, the static-cache GPU path, any custom engine), the batched engines of
:mod:`asymspec_mm.batch` hold many rows in one cache (transformers) or one ``LLM.generate`` call (vLLM).
Rows of one decoder share K, the gate, the delta source and the bonus rule (they shape the step); gamma,
beta and lam are per row in the gate, the token budget and stop strings per row in its emitter, and the sampling
settings (temperature, top-k, top-p, seed) per row in :mod:`.draws`: a row with temperature > 0 draws its tokens
by the sampled rule of :mod:`asymspec_mm.sampling` from its own generator; a step whose rows are all greedy runs
the greedy rule alone.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import AsymSpecConfig, check_method
from ..engines import Engine
from ..gate import gate_step
from ..sampling import new_seed, row_generator
from .constraints import Constraint, apply_masks, step_masks
from .draws import StepDraws
from .events import TokenEvent
from .row_engines import GATE_ROW_FIELDS, RowEngine, SoloEngine, gate_settings, stack_rows  # noqa: F401 - re-exported
from .stats import Counters
from .step_events import Timer, bonus_event, gate_event, make_event, no_timer, sd_events, tops_at
from .streams import Emitter, StopFn, Stream
from .transfer import gated_tops, pack_bonus, pack_gate, to_host, topk_logprobs, trace_tops

#: The streams each method decodes with.
STREAMS_OF = {
    "asymspec": ("drafter_full", "drafter_comp", "verifier"),
    "sd": ("drafter_comp", "verifier"),
    "floor": ("verifier",),
    "drafter": ("drafter_full",),
}


@dataclass
class Row:
    """One request being decoded: its streams (pending tokens), settings, statistics and trace."""

    id: int
    config: AsymSpecConfig
    streams: dict[str, Stream]
    counters: Counters
    emitter: Emitter
    trace: list[TokenEvent] = field(default_factory=list)
    session: Any = None  # the pipeline's Session, for rows that came from one
    final_lengths: dict[str, int] = field(default_factory=dict)  # each stream's most tokens (for a KV bound)
    engine_calls: int = 0
    step: int = 0
    max_batch: int = 0
    result: Any = None
    constraint: Constraint | None = None  # the grammar its output follows (forced tool calls, JSON), if any
    rng: torch.Generator | None = None  # a sampled row's own generator (None: greedy)


Emitted = tuple[list[TokenEvent], torch.Tensor, Any]  # (events, the next pending token [1], carried d_K or None)


class RowDecoder:
    """Rows of one method, stepped together on one :class:`RowEngine` per stream.

    ``lock`` (a context manager) is held around each step's model calls; ``decode_token(id) -> str`` fills
    each committed event's ``text``.
    """

    def __init__(self, method: str, config: AsymSpecConfig, engines: dict[str, RowEngine], *, lock=None, decode_token=None):
        check_method(method)
        self.method, self.cfg = method, config.validated()
        missing = [name for name in STREAMS_OF[method] if name not in engines]
        if missing:
            raise ValueError(f"method {method!r} needs the streams {STREAMS_OF[method]}; missing {missing}")
        self.engines = {name: engines[name] for name in STREAMS_OF[method]}
        self.lock = lock if lock is not None else contextlib.nullcontext()
        self.decode_token = decode_token
        self.rows: dict[int, Row] = {}
        self._settings: dict[int, tuple[tuple, dict]] = {}  # per positions a row: (its rows' key, their gate settings)
        self._draw_settings: dict = {}  # the stepping rows' sampling settings on the device (StepDraws.of)

    def _gate_settings(self, rows: list[Row], per_row: int, device: torch.device) -> dict[str, float | torch.Tensor]:
        """:func:`gate_settings` of ``rows``, reused while the same rows step (no host-to-device copy a step)."""
        key = (str(device), tuple((r.id, r.config.gamma, r.config.beta, r.config.lam) for r in rows))
        cached = self._settings.get(per_row)
        if cached is None or cached[0] != key:
            cached = self._settings[per_row] = (key, gate_settings([r.config for r in rows], per_row, device))
        return cached[1]

    def join(
        self,
        rid: int,
        streams: dict[str, Engine],
        pending: dict[str, torch.Tensor],
        config: AsymSpecConfig,
        eos_ids: set[int],
        stop_fn: StopFn | None = None,
        counters: Counters | None = None,
        constraint: Constraint | None = None,
    ) -> Row:
        """Add a row from its prefilled single-row ``streams`` and their pending tokens (``constraint``: the grammar
        its output follows). All or nothing: if any stream's join fails, the ones it joined already leave again and
        it raises."""
        drafter = self.engines.get(self.drafting)
        if constraint is not None and getattr(drafter, "drafts_itself", False):
            raise ValueError(f"{self.drafting}: an engine that drafts by itself (vLLM) cannot follow a grammar here")
        joined = []
        try:
            for name, engine in self.engines.items():
                engine.join(rid, streams[name])
                joined.append(engine)
        except BaseException:
            for engine in joined:
                engine.leave(rid)
            raise
        for name, engine in self.engines.items():
            if not getattr(engine, "adopts", False):
                streams[name].release()  # the storage holds its own copy of the row's KV now
        views = {name: engine.view(rid) for name, engine in self.engines.items()}
        counters = counters or Counters(config.k, views)
        rng = None
        if config.sampling:
            counters.seed = config.seed if config.seed is not None else new_seed()
            rng = row_generator(counters.seed, views[self.deciding].device)
        emitter = Emitter(counters, config.max_new_tokens, eos_ids, stop_fn)
        streams_of_row = {name: Stream(views[name], pending[name]) for name in views}
        row = Row(rid, config, streams_of_row, counters, emitter, constraint=constraint, rng=rng)
        self.rows[rid] = row
        return row

    def remove(self, rid: int) -> None:
        """Drop a row before it finishes (a cancelled request): its slots are freed, no result is made."""
        for engine in self.engines.values():
            engine.leave(rid)
        del self.rows[rid]

    @property
    def engine_calls(self) -> int:
        """Model calls made so far by the engines (transformers forwards or ``LLM.generate`` calls)."""
        return sum(engine.engine_calls for engine in self.engines.values())

    @property
    def drafting(self) -> str:
        """The stream that drafts: the drafter on the compressed view for SD, on the full view otherwise."""
        return "drafter_comp" if self.method == "sd" else "drafter_full"

    @property
    def deciding(self) -> str:
        """The stream on whose device the step's decision (and a sampled row's uniforms) is computed."""
        return "verifier" if self.method in ("sd", "floor") else "drafter_full"

    def step(self, timer: Timer | None = None) -> list[tuple[Row, list[TokenEvent]]]:
        """One step of every live row; rows that finish leave (see :meth:`finish`). Returns (row, committed events)."""
        rows = list(self.rows.values())
        if not rows:
            return []
        for row in rows:
            row.step += 1
            row.max_batch = max(row.max_batch, len(rows))
            for s in row.streams.values():
                s.begin_step()
        calls = self.engine_calls
        with self.lock:
            step = {"asymspec": self._asymspec, "sd": self._sd}.get(self.method, self._greedy)
            emitted = step(rows, timer or no_timer)
        calls = self.engine_calls - calls
        out = []
        for row, (events, token, carry) in zip(rows, emitted):
            row.engine_calls += calls
            committed = row.emitter.commit(events)
            if self.decode_token is not None:
                for ev in committed:
                    ev.text = self.decode_token(ev.token_id)
            row.trace.extend(committed)
            row.counters.record_gate_excess([ev.gate_excess for ev in committed if ev.gate_excess is not None])
            if row.constraint is not None:
                row.constraint.settle([ev.token_id for ev in committed])
            if committed:
                token = row.emitter.next_token(committed, events, token)
                for name, s in row.streams.items():
                    s.advance(token, carry if name == self.drafting else None)
            out.append((row, committed))
            if row.emitter.done:
                self.finish(row)
        return out

    def finish(self, row: Row) -> None:
        """A row is done: its slots are freed (subclasses make its result first)."""
        for engine in self.engines.values():
            engine.leave(row.id)
        del self.rows[row.id]

    # ------------------------------------------------------------------ the step of each method
    def _extend(self, name: str, ids: dict[int, torch.Tensor]) -> torch.Tensor:
        """One call of ``name`` where every row forwards n tokens: logits ``[R, n, V]`` in ``ids`` order."""
        out = self.engines[name].extend(ids)
        return stack_rows([out[r] for r in ids])

    def _draft(
        self, rows: list[Row], k: int, masks: dict[int, list[torch.Tensor]] | None = None, draws: StepDraws | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K drafts of all rows: drafts ``[R, K]`` and their logits ``[R, K, V]`` float32; greedy, or drawn by
        ``draws`` for its sampled rows. An engine that drafts by itself (vLLM decodes the K tokens in one call)
        does; else K forwards of all rows. A constrained row drafts under its grammar's mask, each draft pushed as
        it is made; ``masks[j]`` collects row ``j``'s K + 1 masks (the last one after d_K, for the bonus position)."""
        name = self.drafting
        x = {row.id: row.streams[name].pending for row in rows}
        if getattr(self.engines[name], "drafts_itself", False) and draws is None:  # its drafts are greedy: not for sampled rows
            return self.engines[name].draft(x, k)
        constrained = [(j, row.constraint) for j, row in enumerate(rows) if row.constraint is not None]
        drafts, logits = [], []
        for _ in range(k):
            out = self.engines[name].extend(x)
            last = stack_rows([out[r][-1] for r in x]).float()  # [R, V]
            for j, c in constrained:
                masks.setdefault(j, []).append(c.mask())
                last[j] = apply_masks(last[j], masks[j][-1])
            logits.append(last)
            d = last.argmax(-1) if draws is None else draws.draw(last, len(drafts))
            for j, c in constrained:
                c.push(int(d[j]))
            drafts.append(d)
            x = {r: d[j : j + 1] for j, r in enumerate(x)}
        for j, c in constrained:
            masks[j].append(c.mask())
        return torch.stack(drafts, dim=1), torch.stack(logits, dim=1)

    @staticmethod
    def _masked(logits: torch.Tensor, masks: dict[int, list[torch.Tensor]]) -> torch.Tensor:
        """``logits`` ``[R, n, V]`` under the constrained rows' masks of their n positions (unchanged without any)."""
        if not masks:
            return logits
        return apply_masks(logits.float(), step_masks(masks, logits.shape[0], logits.shape[1], logits.shape[-1]))

    def _score(self, name: str, rows: list[Row], drafts: torch.Tensor) -> torch.Tensor:
        """Pending + drafts of every row in one call: logits ``[R, n + K, V]``."""
        eng = self.engines[name]
        ids = {row.id: torch.cat([row.streams[name].pending.to(drafts.device), drafts[j]]).to(eng.device) for j, row in enumerate(rows)}
        return self._extend(name, ids)

    def _asymspec(self, rows: list[Row], timer: Timer) -> list[Emitted]:
        """Algorithm 1: draft on a, score with b and t, gate and fuse, commit the accepted prefix (sampled rows: the
        rule of :mod:`asymspec_mm.sampling`, the residual's draw in place of the fused token)."""
        cfg, k, top = self.cfg, self.cfg.k, self.cfg.trace_top
        masks: dict[int, list[torch.Tensor]] = {}  # constrained rows' allowed tokens, positions 1..K+1
        draws = StepDraws.of(rows, k + 1, self.engines[self.deciding].device, self._draw_settings)  # None: every row is greedy
        drafts, a = self._draft(rows, k, masks, draws)  # d_1..d_K [R, K], a_1..a_K [R, K, V]
        b = self._masked(self._score("drafter_comp", rows, drafts), masks)  # b_1..b_{K+1} [R, K+1, V]
        t = self._masked(self._score("verifier", rows, drafts), masks).to(a.device)  # t_1..t_{K+1} [R, K+1, V]
        settings = self._gate_settings(rows, k, a.device)
        with timer("gate"):
            g = gate_step(
                a.flatten(0, 1),
                b[:, :k].flatten(0, 1),
                t[:, :k].flatten(0, 1),
                drafts.flatten(),
                gate=cfg.gate,
                delta=cfg.delta,
                **settings,
            )
            sampled = bonus_drawn = None
            if draws is not None:
                q = torch.stack(draws.proposals, dim=1)  # [R, K, V]
                sampled = draws.decide(q, g.fused_logits, drafts, 0, g, (g.accepted, g.fused))
                bonus_drawn = draws.draw_residual(t[:, k], k)  # ~ softmax(F(t_{K+1} / tau))
        bonus_ids, log_t_bonus, bonus = pack_bonus(t[:, k], b[:, k], bonus_drawn)
        with timer("trace"):
            tops = trace_tops(g, log_t_bonus, top) if top else None
        hosts = to_host(pack_gate(g, drafts.flatten(), sampled), bonus, tops, top, rows=len(rows))  # the step's one transfer
        emitted: list[list] = []
        gated: list[int] = []
        for j, (row, host) in enumerate(zip(rows, hosts)):
            n_acc = host.accepted_prefix()
            row.counters.record_step(k, n_acc)
            events = [gate_event(row.step, i, host.rows[i], tops_at(host.tops, i)) for i in range(min(n_acc + 1, k))]
            carry = None
            if n_acc < k:  # pending + the accepted drafts stay cached; the fused token comes next
                for s in row.streams.values():
                    s.rollback(n_acc)
                token = (g.fused if sampled is None else sampled.residual)[j * k + n_acc : j * k + n_acc + 1]
            elif cfg.bonus == "gated":  # a_{K+1} is needed now, so d_K is forwarded now
                gated.append(j)
                token = None
            else:  # the verifier's t_{K+1}; d_K rides in the next step's first drafting forward
                events.append(bonus_event(row.step, k, host.bonus, tops_at(host.tops, k)))
                token, carry = bonus_ids[j : j + 1], drafts[j, k - 1 :]
            row.counters.record_deferred(carry is not None)
            emitted.append([events, token, carry])
        if gated:
            bonus_masks = {i: [masks[j][k]] for i, j in enumerate(gated) if j in masks}
            self._gated_bonus(
                [rows[j] for j in gated],
                drafts[gated, k - 1 :],
                b[gated, k],
                t[gated, k],
                [emitted[j] for j in gated],
                timer,
                bonus_masks,
                None if draws is None else draws.subset(gated),
            )
        return [tuple(e) for e in emitted]

    def _gated_bonus(
        self,
        rows: list[Row],
        d_k: torch.Tensor,
        b_bonus: torch.Tensor,
        t_bonus: torch.Tensor,
        emitted: list[list],
        timer: Timer,
        masks: dict[int, list[torch.Tensor]] | None = None,
        draws: StepDraws | None = None,
    ) -> None:
        """``bonus="gated"`` for the rows with K acceptances: d_K ``[G, 1]`` forwarded for a_{K+1}, gated against
        ``b_bonus`` / ``t_bonus`` ``[G, V]`` in one forward, one gate call and one transfer (``masks``: the
        constrained rows' allowed tokens at the bonus position; ``draws``: these rows' draws, column K)."""
        cfg, k = self.cfg, self.cfg.k
        a_bonus = self._extend("drafter_full", {row.id: d_k[j] for j, row in enumerate(rows)})[:, -1:].float()
        a_bonus = self._masked(a_bonus, masks or {})[:, 0]  # a_{K+1} [G, V]
        d_bonus = a_bonus.argmax(-1) if draws is None else draws.draw(a_bonus, k)
        settings = self._gate_settings(rows, 1, a_bonus.device)
        with timer("gate"):
            g = gate_step(a_bonus, b_bonus, t_bonus, d_bonus, gate=cfg.gate, delta=cfg.delta, **settings)
            sampled = None
            if draws is not None:
                sampled = draws.decide(draws.proposals[-1][:, None], g.fused_logits, d_bonus[:, None], k, g, (g.accepted, g.fused))
        with timer("trace"):
            tops = gated_tops(g, cfg.trace_top) if cfg.trace_top else None
        hosts = to_host(pack_gate(g, d_bonus, sampled), None, tops, cfg.trace_top, rows=len(rows))  # the bonus decision's one transfer
        fused = g.fused if sampled is None else sampled.residual
        for j, (row, host, slot) in enumerate(zip(rows, hosts, emitted)):
            bonus_row = host.rows[0]
            row.counters.record_bonus(bonus_row.accepted)
            slot[0].append(gate_event(row.step, cfg.k, bonus_row, tops_at(host.tops, 0)))
            slot[1] = d_bonus[j : j + 1] if bonus_row.accepted else fused[j : j + 1]

    def _sd(self, rows: list[Row], timer: Timer) -> list[Emitted]:
        """Symmetric SD: greedy, keep the drafts that match the verifier's argmax, then its own token (equals Floor);
        sampled rows keep drafts by the lossless rule (A empty, target softmax(F(t / tau))): Floor in distribution."""
        k = self.cfg.k
        masks: dict[int, list[torch.Tensor]] = {}
        draws = StepDraws.of(rows, k + 1, self.engines[self.deciding].device, self._draw_settings)
        drafts, _ = self._draft(rows, k, masks, draws)
        t = self._masked(self._score("verifier", rows, drafts).float(), masks)  # [R, K+1, V]
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
        top = self.cfg.trace_top
        if top:  # the verifier's top tokens at every position, in the same transfer
            packed = torch.cat([packed, topk_logprobs(log_t.flatten(0, 1), top).view(*log_t.shape[:2], -1)], dim=2)
        host = packed.tolist()  # the step's one transfer
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

    def _greedy(self, rows: list[Row], timer: Timer) -> list[Emitted]:
        """Plain greedy decoding of one stream (Floor: the verifier; ``drafter``: the drafter on the full view)."""
        name = STREAMS_OF[self.method][0]
        logits = self._extend(name, {row.id: row.streams[name].pending for row in rows})[:, -1:].float()
        logits = self._masked(logits, {j: [row.constraint.mask()] for j, row in enumerate(rows) if row.constraint is not None})[
            :, 0
        ]  # [R, V]
        draws = StepDraws.of(rows, 1, logits.device, self._draw_settings)
        argmax = logits.argmax(-1)
        tokens = argmax if draws is None else draws.draw_residual(logits, 0)
        log_p = logits.log_softmax(-1)
        p = log_p.gather(-1, tokens[:, None])[:, 0].exp()
        top = self.cfg.trace_top
        packed = torch.stack([tokens.double(), p.double(), argmax.double()], dim=1)
        if top:  # the stream's own top tokens, in the same transfer
            packed = torch.cat([packed, topk_logprobs(log_p, top)], dim=1)
        host = packed.tolist()  # the step's one transfer
        verifier = self.method == "floor"
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
