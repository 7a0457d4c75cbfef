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
:mod:`asymspec_mm.core` hold many rows in one cache (transformers) or one ``LLM.generate`` call (vLLM).
Rows of one decoder may differ in every setting, method included: each step groups them by :func:`step_shape`
(the method, K, the gate, the delta source, the bonus rule and the trace width shape a group's tensors) and
runs the groups' steps side by side (:mod:`.calls`), so the groups share each phase's model calls, one per row
storage, and one host transfer. Within a group gamma, beta and lam are per row in the gate, the token budget
and stop strings per row in its emitter, and the sampling settings (temperature, top-k, top-p, seed) per row
in :mod:`.draws`: a row with temperature > 0 draws its tokens by the sampled rule of
:mod:`asymspec_mm.base.sampling` from its own generator; a step whose rows are all greedy runs the greedy rule alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import Any

import torch

from ..base.config import AsymSpecConfig, check_method
from ..base.errors import VocabularyMismatchError
from ..base.gate import gate_step
from ..base.sampling import new_seed, row_generator
from ..engines import Engine
from .baselines import STREAMS_OF, BaselineSteps
from .calls import BONUS, BONUS_DECIDE, DECIDE, DRAFT, SCORE, Ask, Forward, GroupStep, drive
from .constraints import Constraint, apply_masks, step_masks
from .draws import StepDraws
from .events import TokenEvent
from .row import Row
from .row_engines import GATE_ROW_FIELDS, RowEngine, SoloEngine, gate_settings, stack_rows  # noqa: F401 - re-exported
from .stats import Counters
from .step_events import Timer, bonus_event, gate_event, no_timer, tops_at
from .streams import Emitter, StopFn, Stream
from .transfer import gated_tops, pack_bonus, pack_gate, pack_host, read_host, trace_tops

#: The streams that read the drafter's ids: on a cross-family pair (a row with a ``vocab``) the loop's ids are the
#: verifier's, and these streams' ids and logits go through the row's :class:`~asymspec_mm.base.vocab_bridge.VocabBridge`.
DRAFTER_STREAMS = ("drafter_full", "drafter_comp")


def drafting_stream(method: str) -> str:
    """The stream that drafts: the drafter on the compressed view for SD, on the full view otherwise."""
    return "drafter_comp" if method == "sd" else "drafter_full"


def deciding_stream(method: str) -> str:
    """The stream on whose device a step's decision (and a sampled row's uniforms) is computed."""
    return "verifier" if method in ("sd", "floor") else "drafter_full"


def step_shape(method: str, cfg: AsymSpecConfig) -> tuple:
    """What rows decided together share: the method and the settings that shape its step's tensors (K, the gate,
    the delta source, the bonus rule, the trace's width). Everything else (gamma, beta, lam, sampling, budgets,
    stop strings, grammars) is per row, and rows of every shape share each step's model calls."""
    if method == "asymspec":
        return (method, cfg.k, cfg.gate, cfg.delta, cfg.bonus, cfg.trace_top)
    if method == "sd":
        return (method, cfg.k, cfg.trace_top)
    return (method, cfg.trace_top)


Emitted = tuple[list[TokenEvent], torch.Tensor, Any]  # (events, the next pending token [1], carried d_K or None)


class RowDecoder(BaselineSteps):
    """Rows of any method and settings, stepped together on named row storages (:class:`RowEngine`).

    Each step groups the rows by :func:`step_shape` and runs every group's step as a coroutine (:mod:`.calls`):
    the groups' forwards of one phase share one call per storage, their decisions one host transfer.
    ``lock`` (a context manager) is held around each step's model calls; ``decode_token(id) -> str`` fills each
    committed event's ``text``.
    """

    def __init__(self, engines: dict[str, RowEngine], *, lock=None, decode_token=None):
        self.engines = engines
        self.lock = lock if lock is not None else contextlib.nullcontext()
        self.decode_token = decode_token
        self.rows: dict[int, Row] = {}
        self._settings: dict[tuple, tuple[tuple, dict]] = {}  # per (group, positions a row): (its rows' key, gate settings)
        self._draw_settings: dict[tuple, dict] = {}  # per group: its rows' sampling settings on the device (StepDraws.of)

    def _gate_settings(self, group: tuple, rows: list[Row], per_row: int, device: torch.device) -> dict[str, float | torch.Tensor]:
        """:func:`gate_settings` of ``rows``, reused while the same rows step (no host-to-device copy a step)."""
        key = (str(device), tuple((r.id, r.config.gamma, r.config.beta, r.config.lam) for r in rows))
        cached = self._settings.get((group, per_row))
        if cached is None or cached[0] != key:
            cached = self._settings[(group, per_row)] = (key, gate_settings([r.config for r in rows], per_row, device))
        return cached[1]

    def join(
        self,
        rid: int,
        method: str,
        streams: dict[str, Engine],
        pending: dict[str, torch.Tensor],
        config: AsymSpecConfig,
        eos_ids: set[int],
        stop_fn: StopFn | None = None,
        counters: Counters | None = None,
        constraint: Constraint | None = None,
        storage: dict[str, str] | None = None,
        vocab: Any = None,
        held: frozenset[str] = frozenset(),
    ) -> Row:
        """Add a row of ``method`` from its prefilled single-row ``streams`` and their pending tokens (``constraint``:
        the grammar its output follows; ``storage``: the row storage of each stream, default its name; ``vocab``: a
        cross-family pair's :class:`~asymspec_mm.base.vocab_bridge.VocabBridge`, the row's ids then the verifier's;
        ``held``: streams whose storage holds the row already, its prompt prefilled there in the steps' forwards).
        All or nothing: if any stream's join fails, the ones it joined already leave again and it raises."""
        check_method(method)
        config = config.validated()
        if vocab is not None and method == "sd":
            raise ValueError(
                "method='sd' verifies with the verifier's argmax over its whole vocabulary, which the drafter of a "
                "cross-family pair cannot always read: use method='floor' (the same tokens) or an sd_drafter of the "
                "verifier's vocabulary"
            )
        storage = {name: (storage or {}).get(name, name) for name in STREAMS_OF[method]}
        missing = [name for name, key in storage.items() if key not in self.engines]
        if missing:
            raise ValueError(f"method {method!r} needs the streams {STREAMS_OF[method]}; missing {missing}")
        drafter = self.engines[storage.get(drafting_stream(method), "")] if method in ("asymspec", "sd") else None
        if constraint is not None and drafter is not None and drafter.drafts_itself:
            raise ValueError(f"{drafting_stream(method)}: an engine that drafts by itself (vLLM) cannot follow a grammar here")
        if vocab is not None and drafter is not None and drafter.drafts_itself:
            raise ValueError(f"{drafting_stream(method)}: an engine that drafts by itself (vLLM) cannot draft for a cross-family pair")
        joined = []
        try:
            for name, key in storage.items():
                if name not in held:
                    self.engines[key].join(rid, streams[name])
                    joined.append(key)
        except BaseException:
            for key in joined:
                self.engines[key].leave(rid)
            raise
        for name, key in storage.items():
            if name not in held and not self.engines[key].adopts:
                streams[name].release()  # the storage holds its own copy of the row's KV now
        views = {name: self.engines[key].view(rid) for name, key in storage.items()}
        counters = counters or Counters(config.k, views)
        rng = None
        if config.sampling:
            counters.seed = config.seed if config.seed is not None else new_seed()
            rng = row_generator(counters.seed, views[deciding_stream(method)].device)
        emitter = Emitter(counters, config.max_new_tokens, eos_ids, stop_fn)
        own = {name: vocab.drafter_ids for name in DRAFTER_STREAMS if vocab is not None}
        streams_of_row = {name: Stream(views[name], pending[name], own.get(name)) for name in views}
        row = Row(rid, method, config, streams_of_row, storage, counters, emitter, constraint=constraint, rng=rng, vocab=vocab)
        self.rows[rid] = row
        return row

    def _leave(self, row: Row) -> None:
        for key in row.storage.values():
            self.engines[key].leave(row.id)
        del self.rows[row.id]

    def remove(self, rid: int) -> None:
        """Drop a row before it finishes (a cancelled request): its slots are freed, no result is made."""
        self._leave(self.rows[rid])

    def park(self, rid: int) -> Row:
        """Take a live row out of the steps with its KV dropped (preemption); it keeps its pending tokens, counters,
        trace, generator and grammar, and :meth:`rejoin` brings it back on contexts rebuilt from its tokens."""
        row = self.rows[rid]
        self._leave(row)
        row.preemptions += 1
        return row

    def rejoin(self, row: Row, contexts: dict[str, Engine], held: frozenset[str] = frozenset()) -> None:
        """A parked row joins again with ``contexts`` (per stream: its prompt and the tokens its stream had cached,
        prefilled anew; ``held``: streams whose storage holds the row again already); its tokens-forwarded count
        goes on from where it was. All or nothing, as :meth:`join`."""
        joined = []
        try:
            for name, key in row.storage.items():
                if name in held:
                    continue
                engine, context = self.engines[key], contexts[name]
                if not engine.rebuilds:
                    raise ValueError(f"{key}: this storage cannot take a row back on a rebuilt context")
                before = engine.tokens_forwarded.get(row.id, 0), engine.forward_calls.get(row.id, 0)
                engine.join(row.id, context)
                joined.append(key)
                engine.tokens_forwarded[row.id] += before[0]  # the re-prefill counts on top
                engine.forward_calls[row.id] += before[1]
        except BaseException:
            for key in joined:
                self.engines[key].leave(row.id)
            raise
        for name, key in row.storage.items():
            if name not in held and not self.engines[key].adopts:
                contexts[name].release()
            view = self.engines[key].view(row.id)
            row.streams[name].engine = view
            row.streams[name].base = view.length
            row.counters.streams[name] = view
        self.rows[row.id] = row

    @property
    def engine_calls(self) -> int:
        """Model calls made so far by the storages (transformers forwards or ``LLM.generate`` calls)."""
        return sum(engine.engine_calls for engine in self.engines.values())

    def step(self, timer: Timer | None = None, rides: dict[str, dict[int, Any]] | None = None) -> list[tuple[Row, list[TokenEvent]]]:
        """One step of every live row; rows that finish leave (see :meth:`finish`). Returns (row, committed events).

        ``rides``: storage -> ``{row: PrefillChunk}``, prompt pieces of rows still arriving (rows of those storages,
        not yet decoding) carried by the first forward the step makes on each storage (:func:`~.calls.drive`); a
        storage the step does not call runs one forward of its pieces alone, after the step's forwards."""
        rows = list(self.rows.values())
        if not rows and not rides:
            return []
        groups: dict[tuple, list[Row]] = {}
        for row in rows:
            row.step += 1
            row.max_batch = max(row.max_batch, len(rows))
            for s in row.streams.values():
                s.begin_step()
            shape = (step_shape(row.method, row.config), tuple(sorted(row.storage.items())), row.vocab is not None)
            groups.setdefault(shape, []).append(row)
        calls = self.engine_calls
        left = dict(rides or {})
        with self.lock:
            steps = [self._group_step(key, members, timer or no_timer) for key, members in groups.items()]
            results = drive(steps, self.engines, left)
            calls = self.engine_calls - calls  # the step's calls (a forward of prompt pieces alone is not one)
            for storage, pieces in left.items():
                self.engines[storage].extend({}, prompts=pieces)
        for key in [k for k in self._draw_settings if k not in groups]:  # groups gone: their cached settings go too
            del self._draw_settings[key]
        emitted = {row.id: e for members, res in zip(groups.values(), results) for row, e in zip(members, res)}
        out = []
        for row in rows:
            events, token, carry = emitted[row.id]
            row.engine_calls += calls
            committed = row.emitter.commit(events)
            if self.decode_token is not None:
                for ev in committed:
                    ev.text = self.decode_token(ev.token_id)
            if row.vocab is not None:  # both ids of each token (the drafter's fed its streams)
                for ev in committed:
                    ev.drafter_token_id = row.vocab.drafter_id(ev.token_id)
            row.trace.extend(committed)
            row.counters.record_gate_excess([ev.gate_excess for ev in committed if ev.gate_excess is not None])
            if row.constraint is not None:
                row.constraint.settle([ev.token_id for ev in committed])
            if committed:
                token = row.emitter.next_token(committed, events, token)
                drafting = drafting_stream(row.method)
                for name, s in row.streams.items():
                    s.advance(token, carry if name == drafting else None)
            out.append((row, committed))
            if row.emitter.done:
                self.finish(row)
        return out

    def finish(self, row: Row) -> None:
        """A row is done: its slots are freed (subclasses make its result first)."""
        self._leave(row)

    def _group_step(self, key: tuple, rows: list[Row], timer: Timer) -> GroupStep:
        method = rows[0].method
        if method == "asymspec":
            return self._asymspec(key, rows, timer)
        if method == "sd":
            return self._sd(key, rows, timer)
        return self._greedy(key, rows, timer)

    def _device(self, rows: list[Row], stream: str) -> torch.device:
        return self.engines[rows[0].storage[stream]].device

    def _draws(self, key: tuple, rows: list[Row], n: int) -> StepDraws | None:
        """The step's draws of ``rows`` (n positions a row) on the deciding device; None when all are greedy."""
        device = self._device(rows, deciding_stream(rows[0].method))
        return StepDraws.of(rows, n, device, self._draw_settings.setdefault(key, {}))

    # ------------------------------------------------------------------ the step of each method (coroutines, see .calls)
    def _draft(
        self, rows: list[Row], k: int, masks: dict[int, list[torch.Tensor]] | None = None, draws: StepDraws | None = None
    ) -> Generator[Ask, Any, tuple[torch.Tensor, torch.Tensor]]:
        """K drafts of the rows: drafts ``[R, K]`` and their logits ``[R, K, V]`` float32; greedy, or drawn by
        ``draws`` for its sampled rows. An engine that drafts by itself (vLLM decodes the K tokens in one call)
        does; else K drafting forwards. A constrained row drafts under its grammar's mask, each draft pushed as it
        is made; ``masks[j]`` collects row ``j``'s K + 1 masks (the last one after d_K, for the bonus position)."""
        name = drafting_stream(rows[0].method)
        storage = rows[0].storage[name]
        x = {row.id: row.streams[name].pending for row in rows}
        if self.engines[storage].drafts_itself and draws is None:  # its drafts are greedy: not for sampled rows
            (out,) = yield Ask(DRAFT, [Forward(storage, x, k)])
            return out
        constrained = [(j, row.constraint) for j, row in enumerate(rows) if row.constraint is not None]
        drafts, logits = [], []
        for _ in range(k):
            (out,) = yield Ask(DRAFT, [Forward(storage, x)])
            last = self._in_loop(rows, name, stack_rows([out[r][-1] for r in x]).float())  # [R, V]
            for j, c in constrained:
                masks.setdefault(j, []).append(_grammar_mask(rows[j], c))
                last[j] = apply_masks(last[j], masks[j][-1])
            logits.append(last)
            d = last.argmax(-1) if draws is None else draws.draw(last, len(drafts))
            for j, c in constrained:
                c.push(int(d[j]))
            drafts.append(d)
            fed = self._fed(rows, name, d)
            x = {r: fed[j : j + 1] for j, r in enumerate(x)}
        for j, c in constrained:
            masks[j].append(_grammar_mask(rows[j], c))
        return torch.stack(drafts, dim=1), torch.stack(logits, dim=1)

    @staticmethod
    def _masked(logits: torch.Tensor, masks: dict[int, list[torch.Tensor]]) -> torch.Tensor:
        """``logits`` ``[R, n, V]`` under the constrained rows' masks of their n positions (unchanged without any)."""
        if not masks:
            return logits
        return apply_masks(logits.float(), step_masks(masks, logits.shape[0], logits.shape[1], logits.shape[-1]))

    @staticmethod
    def _in_loop(rows: list[Row], name: str, logits: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., V]`` of stream ``name`` in the loop's vocabulary: a cross-family row's drafter logits in the
        verifier's order (:meth:`~asymspec_mm.base.vocab_bridge.VocabBridge.verifier_order`), else unchanged."""
        vocab = rows[0].vocab  # rows of one group agree (the group key holds whether they have a map)
        return logits if vocab is None or name not in DRAFTER_STREAMS else vocab.verifier_order(logits)

    @staticmethod
    def _fed(rows: list[Row], name: str, ids: torch.Tensor) -> torch.Tensor:
        """The loop's token ids ``[...]`` as stream ``name`` reads them (a cross-family row's drafter streams: the
        drafter's ids), else unchanged."""
        vocab = rows[0].vocab
        return ids if vocab is None or name not in DRAFTER_STREAMS else vocab.drafter_ids(ids)

    def _scoring(self, name: str, rows: list[Row], drafts: torch.Tensor) -> Forward:
        """Pending + drafts ``[R, K]`` of every row on stream ``name``, one forward."""
        storage = rows[0].storage[name]
        device = self.engines[storage].device
        fed = self._fed(rows, name, drafts)
        ids = {row.id: torch.cat([row.streams[name].pending.to(fed.device), fed[j]]).to(device) for j, row in enumerate(rows)}
        return Forward(storage, ids)

    def _asymspec(self, key: tuple, rows: list[Row], timer: Timer) -> GroupStep:
        """Algorithm 1: draft on a, score with b and t, gate and fuse, commit the accepted prefix (sampled rows: the
        rule of :mod:`asymspec_mm.base.sampling`, the residual's draw in place of the fused token)."""
        cfg = rows[0].config  # K, gate, delta, bonus and trace width are the group's (step_shape)
        k, top = cfg.k, cfg.trace_top
        masks: dict[int, list[torch.Tensor]] = {}  # constrained rows' allowed tokens, positions 1..K+1
        draws = self._draws(key, rows, k + 1)  # None: every row is greedy
        drafts, a = yield from self._draft(rows, k, masks, draws)  # d_1..d_K [R, K], a_1..a_K [R, K, V]
        b_out, t_out = yield Ask(SCORE, [self._scoring("drafter_comp", rows, drafts), self._scoring("verifier", rows, drafts)])
        b = self._masked(self._in_loop(rows, "drafter_comp", stack_rows([b_out[r.id] for r in rows])), masks)  # b_1..b_{K+1} [R, K+1, V]
        t = self._masked(stack_rows([t_out[r.id] for r in rows]), masks).to(a.device)  # t_1..t_{K+1} [R, K+1, V]
        alone = None  # [R, K+1]: where a cross-family row's verifier decides alone (its best token has no drafter id)
        if rows[0].vocab is not None:
            t, alone = rows[0].vocab.restrict(t)
        settings = self._gate_settings(key, rows, k, a.device)
        with timer("gate"):
            g = gate_step(
                a.flatten(0, 1),
                b[:, :k].flatten(0, 1),
                t[:, :k].flatten(0, 1),
                drafts.flatten(),
                gate=cfg.gate,
                delta=cfg.delta,
                alone=None if alone is None else alone[:, :k].flatten(),
                **settings,
            )
            sampled = bonus_drawn = None
            if draws is not None:
                q = torch.stack(draws.proposals, dim=1)  # [R, K, V]
                sampled = draws.decide(q, g.fused_logits, drafts, 0, g, (g.accepted, g.fused))
                bonus_drawn = draws.draw_residual(t[:, k], k)  # ~ softmax(F(t_{K+1} / tau))
        bonus_ids, log_t_bonus, bonus = pack_bonus(t[:, k], b[:, k], bonus_drawn, None if alone is None else alone[:, k])
        with timer("trace"):
            tops = trace_tops(g, log_t_bonus, top) if top else None
        flat = yield Ask(DECIDE, transfer=pack_host(pack_gate(g, drafts.flatten(), sampled), bonus, tops))  # the step's one transfer
        hosts = read_host(flat, k, len(rows), True, k + 1 if top else 0, top)
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
            yield from self._gated_bonus(
                key,
                [rows[j] for j in gated],
                drafts[gated, k - 1 :],
                b[gated, k],
                t[gated, k],
                [emitted[j] for j in gated],
                timer,
                bonus_masks,
                None if draws is None else draws.subset(gated),
                None if alone is None else alone[gated, k],
            )
        return [tuple(e) for e in emitted]

    def _gated_bonus(
        self,
        key: tuple,
        rows: list[Row],
        d_k: torch.Tensor,
        b_bonus: torch.Tensor,
        t_bonus: torch.Tensor,
        emitted: list[list],
        timer: Timer,
        masks: dict[int, list[torch.Tensor]] | None = None,
        draws: StepDraws | None = None,
        alone: torch.Tensor | None = None,
    ) -> Generator[Ask, Any, None]:
        """``bonus="gated"`` for the rows with K acceptances: d_K ``[G, 1]`` forwarded for a_{K+1}, gated against
        ``b_bonus`` / ``t_bonus`` ``[G, V]`` in one forward, one gate call and one transfer (``masks``: the
        constrained rows' allowed tokens at the bonus position; ``draws``: these rows' draws, column K; ``alone`` ``[G]``:
        where a cross-family row's verifier decides alone at the bonus position)."""
        cfg = rows[0].config
        k, top = cfg.k, cfg.trace_top
        storage = rows[0].storage["drafter_full"]
        fed = self._fed(rows, "drafter_full", d_k)
        (out,) = yield Ask(BONUS, [Forward(storage, {row.id: fed[j] for j, row in enumerate(rows)})])
        a_last = self._in_loop(rows, "drafter_full", stack_rows([out[r.id] for r in rows])[:, -1:].float())
        a_bonus = self._masked(a_last, masks or {})[:, 0]  # a_{K+1} [G, V]
        d_bonus = a_bonus.argmax(-1) if draws is None else draws.draw(a_bonus, k)
        settings = self._gate_settings(key, rows, 1, a_bonus.device)
        with timer("gate"):
            g = gate_step(a_bonus, b_bonus, t_bonus, d_bonus, gate=cfg.gate, delta=cfg.delta, alone=alone, **settings)
            sampled = None
            if draws is not None:
                sampled = draws.decide(draws.proposals[-1][:, None], g.fused_logits, d_bonus[:, None], k, g, (g.accepted, g.fused))
        with timer("trace"):
            tops = gated_tops(g, top) if top else None
        flat = yield Ask(BONUS_DECIDE, transfer=pack_host(pack_gate(g, d_bonus, sampled), None, tops))  # the bonus decision's one transfer
        hosts = read_host(flat, 1, len(rows), False, 1 if top else 0, top)
        fused = g.fused if sampled is None else sampled.residual
        for j, (row, host, slot) in enumerate(zip(rows, hosts, emitted)):
            bonus_row = host.rows[0]
            row.counters.record_bonus(bonus_row.accepted)
            slot[0].append(gate_event(row.step, k, bonus_row, tops_at(host.tops, 0)))
            slot[1] = d_bonus[j : j + 1] if bonus_row.accepted else fused[j : j + 1]


def _grammar_mask(row: Row, constraint: Constraint) -> torch.Tensor:
    """The tokens ``row``'s grammar allows next, ``[V]`` bool. On a cross-family row the grammar must leave a token
    both models have: otherwise no token could be emitted, so the row fails with a one-line error instead."""
    mask = constraint.mask()
    inside = row.vocab.inside(mask.device) if row.vocab is not None else None
    n = 0 if inside is None else min(mask.numel(), inside.numel())
    if inside is not None and not bool((mask[:n] & inside[:n]).any()):
        raise VocabularyMismatchError(
            "the grammar allows only tokens outside the vocabulary map of this cross-family pair here: no token both "
            "models have can continue the answer; loosen the schema or use method='floor' (the verifier alone)"
        )
    return mask
