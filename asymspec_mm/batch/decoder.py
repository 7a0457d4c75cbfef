"""Many requests decoded together: each step one batched forward per stream and draft position for every row.

A request is set up and prefilled alone (:meth:`AsymSpecPipeline.prepare`: the same prompts, vision cache and
prefix reuse as a single request), then its streams join the decoder's batched engines. Every step runs the
single-row loop's algorithm (:mod:`asymspec_mm.decode.loops`) over all live rows at once: K drafting forwards
of R rows, one scoring forward of R rows on each other stream, the gate over ``[R*K, V]``, and one
device-to-host transfer for the whole batch. Rows accept different numbers of drafts, roll back alone, stop
alone (EOS, budget, stop strings) and leave at once; new rows join between steps.

Rows of one decoder share the method and every decoding setting except :data:`ROW_FIELDS`: K, the gate, the delta
source and the bonus rule shape the step, while gamma, beta and lam enter the gate as per-row values
(``[R*K]`` tensors) and the token budget and stop strings are each row's emitter's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch

from ..config import AsymSpecConfig
from ..decode import Counters, Emitter, Stream, TokenEvent
from ..decode.loops import Timer, bonus_event, gate_event, make_event, no_timer, sd_events, tops_at
from ..decode.transfer import gated_tops, pack_bonus, pack_gate, to_host, trace_tops
from ..errors import UnknownOptionError
from ..gate import gate_step
from .engines import BatchEngine, RowView

if TYPE_CHECKING:
    from ..pipeline import AsymSpecPipeline
    from ..session import MMResult, Session

#: Settings that may differ between the rows of one batch: each row's emitter applies its own budget and stop
#: strings, and the gate takes each row's gamma, beta and lam.
ROW_FIELDS = ("max_new_tokens", "stop_strings", "gamma", "beta", "lam")
#: The per-row gate settings among :data:`ROW_FIELDS`.
GATE_ROW_FIELDS = ("gamma", "beta", "lam")
STREAMS_OF = {
    "asymspec": ("drafter_full", "drafter_comp", "verifier"),
    "sd": ("drafter_comp", "verifier"),
    "floor": ("verifier",),
    "drafter": ("drafter_full",),
}


def batch_engine(model, name: str):
    """The batched engine of one stream: on vLLM when ``model`` is served there, else on transformers."""
    from ..vllm_engine import VLLMModel

    if isinstance(model, VLLMModel):
        from .vllm import VLLMBatchEngine

        return VLLMBatchEngine(model, name)
    return BatchEngine(model, name)


#: Builds the batched engine of one stream: ``(model, stream name) -> engine`` (the default is :func:`batch_engine`).
BatchEngineFactory = Callable[[Any, str], Any]

#: The settings each method's loop reads (the rest cannot change its tokens, so rows may differ there).
_USED_BY = {"asymspec": None, "sd": ("k", "trace_top"), "floor": ("trace_top",), "drafter": ("trace_top",)}


def batch_key(method: str, cfg: AsymSpecConfig) -> tuple:
    """What rows of one batch must share: the method and the settings its loop reads, but :data:`ROW_FIELDS`
    (Floor rows with different K or gates share a batch; AsymSpec rows share every decoding setting)."""
    used = _USED_BY[method]
    names = [f.name for f in fields(AsymSpecConfig) if f.name not in ROW_FIELDS and (used is None or f.name in used)]
    return (method,) + tuple(getattr(cfg, n) for n in names)


def gate_settings(configs: list[AsymSpecConfig], per_row: int, device: torch.device) -> dict[str, float | torch.Tensor]:
    """The gate's ``gamma``/``beta``/``lam`` for rows with ``configs``, each repeated ``per_row`` times (the row's
    positions): a float where every row agrees, else a float32 tensor ``[len(configs) * per_row]``."""
    out: dict[str, float | torch.Tensor] = {}
    for name in GATE_ROW_FIELDS:
        values = [float(getattr(c, name)) for c in configs]
        same = all(v == values[0] for v in values)
        out[name] = values[0] if same else torch.tensor(values, dtype=torch.float32, device=device).repeat_interleave(per_row)
    return out


@dataclass
class Row:
    """One request in a batch: its prepared session, streams (pending tokens), statistics and trace."""

    id: int
    session: Session
    streams: dict[str, Stream]
    counters: Counters
    emitter: Emitter
    trace: list[TokenEvent]
    kv_need: int = 0
    engine_calls: int = 0
    step: int = 0
    max_batch: int = 0
    result: MMResult | None = None


class BatchDecoder:
    """Rows of one method and one batch key, stepped together on one :class:`BatchEngine` per stream."""

    def __init__(self, pipe: AsymSpecPipeline, method: str, config: AsymSpecConfig, *, engines: BatchEngineFactory | None = None):
        self.pipe, self.method, self.cfg = pipe, method, config.validated()
        self.key = batch_key(method, self.cfg)
        models = {
            "drafter_full": pipe.drafter_full or pipe.drafter,
            "drafter_comp": pipe.drafter_comp or pipe.drafter,
            "verifier": pipe.verifier,
        }
        if method == "sd" and getattr(pipe, "sd_drafter", None) is not None:  # SD's own text drafter (see prepare)
            models["drafter_comp"] = pipe.sd_drafter
        make = engines or batch_engine
        self.engines = {name: make(models[name], name) for name in STREAMS_OF[method]}
        self.rows: dict[int, Row] = {}

    def add(self, rid: int, session: Session) -> Row:
        """Let a prepared request join: the batch copies its prefilled single-row streams' KV and releases them.
        All or nothing: if any stream's join fails, the streams it joined already leave again and it raises."""
        if batch_key(session.method, session.config) != self.key:
            raise UnknownOptionError(
                f"request {rid}: method/config differ from this batch's ({self.method}); "
                f"rows of one batch share every setting but {', '.join(ROW_FIELDS)}"
            )
        need = self.kv_need(session)
        joined = []
        try:
            for name, engine in self.engines.items():
                engine.join(rid, session.streams[name])
                joined.append(engine)
        except BaseException:
            for engine in joined:
                engine.leave(rid)
            raise
        for name in self.engines:
            session.streams[name].release()  # the batch holds its own copy of the row's KV now
        views = {name: RowView(engine, rid) for name, engine in self.engines.items()}
        counters = Counters(session.config.k, views)
        emitter = Emitter(counters, session.config.max_new_tokens, session.eos_ids, session.stop_fn)
        streams = {name: Stream(views[name], session.pending[name]) for name in views}
        row = Row(rid, session, streams, counters, emitter, [], kv_need=need)
        self.rows[rid] = row
        return row

    def step(self, timer: Timer | None = None) -> list[tuple[Row, list[TokenEvent]]]:
        """One step of every live row; rows that finish leave (their ``result`` set). Returns (row, committed events)."""
        rows = list(self.rows.values())
        if not rows:
            return []
        for row in rows:
            row.step += 1
            row.max_batch = max(row.max_batch, len(rows))
            for s in row.streams.values():
                s.begin_step()
        calls = self.engine_calls
        with self.pipe._lock:  # the models are shared with single requests
            step = {"asymspec": self._asymspec, "sd": self._sd}.get(self.method, self._greedy)
            emitted = step(rows, timer or no_timer)
        calls = self.engine_calls - calls
        for row in rows:
            row.engine_calls += calls
        out = []
        for row, (events, token, carry) in zip(rows, emitted):
            committed = row.emitter.commit(events)
            for ev in committed:
                ev.text = self.pipe.tokenizer.decode([ev.token_id])
            row.trace.extend(committed)
            if committed:
                token = row.emitter.next_token(committed, events, token)
                for name, s in row.streams.items():
                    s.advance(token, carry if name == self._drafting else None)
            out.append((row, committed))
            if row.emitter.done:
                self._finish(row)
        return out

    @property
    def engine_calls(self) -> int:
        """Model calls made so far by the batch's engines (transformers forwards or ``LLM.generate`` calls)."""
        return sum(engine.engine_calls for engine in self.engines.values())

    @property
    def _drafting(self) -> str:
        return "drafter_comp" if self.method == "sd" else "drafter_full"

    def remove(self, rid: int) -> None:
        """Drop a row before it finishes (a cancelled request): its slots are freed, no result is made."""
        for engine in self.engines.values():
            engine.leave(rid)
        del self.rows[rid]

    def kv_need(self, session: Session) -> int:
        """The most KV bytes ``session`` can hold in this batch: its prompts plus its token budget and one step's
        speculative positions, on every stream (what a memory budget reserves for it)."""
        extra = session.config.max_new_tokens + session.config.k + 2
        return sum(engine.slot_bytes() * (session.streams[name].length + extra) for name, engine in self.engines.items())

    @property
    def kv_reserved(self) -> int:
        """:meth:`kv_need` summed over the live rows (each reserved when it joined)."""
        return sum(row.kv_need for row in self.rows.values())

    def _finish(self, row: Row) -> None:
        row.result = self.pipe.result_of(row.session, row.counters, row.trace)
        row.result.stats["batch_size"] = row.max_batch
        row.result.stats["kv_bytes"] = {name: engine.kv_bytes(row.id) for name, engine in self.engines.items()}
        # the calls of the steps this row took part in, shared with the rows beside it
        row.result.stats["engine_calls"] = row.engine_calls
        row.result.stats["engine_calls_per_step"] = row.engine_calls / row.step if row.step else 0.0
        for engine in self.engines.values():
            engine.leave(row.id)
        del self.rows[row.id]

    def _extend(self, name: str, ids: dict[int, torch.Tensor]) -> torch.Tensor:
        """One batched forward of ``name`` where every row forwards n tokens: logits ``[R, n, V]`` in ``ids`` order."""
        out = self.engines[name].extend(ids)
        return torch.stack([out[r] for r in ids])

    def _draft(self, rows: list[Row], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K greedy drafts of all rows: drafts ``[R, K]`` and their logits ``[R, K, V]`` float32. An engine that
        drafts by itself (vLLM decodes the K tokens in one call) does; else K batched forwards."""
        name = self._drafting
        x = {row.id: row.streams[name].pending for row in rows}
        if hasattr(self.engines[name], "draft"):
            return self.engines[name].draft(x, k)
        drafts, logits = [], []
        for _ in range(k):
            out = self.engines[name].extend(x)
            last = torch.stack([out[r][-1] for r in x])  # [R, V]
            logits.append(last.float())
            d = last.argmax(-1)
            drafts.append(d)
            x = {r: d[j : j + 1] for j, r in enumerate(x)}
        return torch.stack(drafts, dim=1), torch.stack(logits, dim=1)

    def _score(self, name: str, rows: list[Row], drafts: torch.Tensor) -> torch.Tensor:
        """Pending + drafts of every row in one forward: logits ``[R, n + K, V]``."""
        eng = self.engines[name]
        ids = {row.id: torch.cat([row.streams[name].pending.to(drafts.device), drafts[j]]).to(eng.device) for j, row in enumerate(rows)}
        return self._extend(name, ids)

    def _asymspec(self, rows: list[Row], timer: Timer) -> list[tuple[list[TokenEvent], torch.Tensor, Any]]:
        cfg, k, top = self.cfg, self.cfg.k, self.cfg.trace_top
        drafts, a = self._draft(rows, k)  # [R, K], [R, K, V]
        gate_kw = dict(gate=cfg.gate, delta=cfg.delta, **gate_settings([r.session.config for r in rows], k, a.device))
        b = self._score("drafter_comp", rows, drafts)  # [R, K+1, V]
        t = self._score("verifier", rows, drafts).to(a.device)
        with timer("gate"):
            g = gate_step(a.flatten(0, 1), b[:, :k].flatten(0, 1), t[:, :k].flatten(0, 1), drafts.flatten(), **gate_kw)
        bonus_ids, log_t_bonus, bonus = pack_bonus(t[:, k], b[:, k])
        with timer("trace"):
            tops = trace_tops(g, log_t_bonus, top) if top else None
        hosts = to_host(pack_gate(g, drafts.flatten()), bonus, tops, top, rows=len(rows))  # the step's one transfer
        emitted: list[Any] = []
        gated: list[int] = []
        for j, (row, host) in enumerate(zip(rows, hosts)):
            n_acc = host.accepted_prefix()
            row.counters.record_step(k, n_acc)
            events = [gate_event(row.step, i, host.rows[i], tops_at(host.tops, i)) for i in range(min(n_acc + 1, k))]
            carry = None
            if n_acc < k:
                for s in row.streams.values():
                    s.rollback(n_acc)
                token = g.fused[j * k + n_acc : j * k + n_acc + 1]
            elif cfg.bonus == "gated":
                gated.append(j)
                token = None
            else:
                events.append(bonus_event(row.step, k, host.bonus, tops_at(host.tops, k)))
                token, carry = bonus_ids[j : j + 1], drafts[j, k - 1 :]
            row.counters.record_deferred(carry is not None)
            emitted.append([events, token, carry])
        if gated:
            self._gated_bonus(
                [rows[j] for j in gated], drafts[gated, k - 1 :], b[gated, k], t[gated, k], [emitted[j] for j in gated], timer
            )
        return [tuple(e) for e in emitted]

    def _gated_bonus(
        self, rows: list[Row], d_k: torch.Tensor, b_bonus: torch.Tensor, t_bonus: torch.Tensor, emitted: list[list], timer: Timer
    ) -> None:
        """``bonus="gated"`` for the rows with K acceptances: d_K ``[G, 1]`` forwarded for a_{K+1}, gated against
        ``b_bonus`` / ``t_bonus`` ``[G, V]`` in one forward, one gate call and one transfer."""
        cfg = self.cfg
        a_bonus = self._extend("drafter_full", {row.id: d_k[j] for j, row in enumerate(rows)})[:, -1].float()
        d_bonus = a_bonus.argmax(-1)
        settings = gate_settings([r.session.config for r in rows], 1, a_bonus.device)
        with timer("gate"):
            g = gate_step(a_bonus, b_bonus, t_bonus, d_bonus, gate=cfg.gate, delta=cfg.delta, **settings)
        with timer("trace"):
            tops = gated_tops(g, cfg.trace_top) if cfg.trace_top else None
        hosts = to_host(pack_gate(g, d_bonus), None, tops, cfg.trace_top, rows=len(rows))
        for j, (row, host, slot) in enumerate(zip(rows, hosts, emitted)):
            bonus_row = host.rows[0]
            row.counters.record_bonus(bonus_row.accepted)
            slot[0].append(gate_event(row.step, cfg.k, bonus_row, tops_at(host.tops, 0)))
            slot[1] = d_bonus[j : j + 1] if bonus_row.accepted else g.fused[j : j + 1]

    def _sd(self, rows: list[Row], timer: Timer) -> list[tuple[list[TokenEvent], torch.Tensor, Any]]:
        k = self.cfg.k
        drafts, _ = self._draft(rows, k)
        t = self._score("verifier", rows, drafts).float()  # [R, K+1, V]
        v_ids = t.argmax(-1)  # [R, K+1]
        p_v = t.log_softmax(-1).gather(-1, v_ids[..., None])[..., 0].exp()
        drafts_v = drafts.to(v_ids.device)
        padded = torch.cat([drafts_v, drafts_v[:, :1]], dim=1)
        host = torch.stack([v_ids.double(), p_v.double(), padded.double()], dim=2).tolist()  # the step's one transfer
        emitted = []
        for j, (row, h) in enumerate(zip(rows, host)):
            events, n_acc = sd_events(row.step, k, h)
            row.counters.record_step(k, n_acc)
            carry = None
            if n_acc < k:
                for s in row.streams.values():
                    s.rollback(n_acc)
            else:
                carry = drafts[j, k - 1 :]
            row.counters.record_deferred(carry is not None)
            emitted.append((events, v_ids[j, n_acc : n_acc + 1].to(drafts.device), carry))
        return emitted

    def _greedy(self, rows: list[Row], timer: Timer) -> list[tuple[list[TokenEvent], torch.Tensor, Any]]:
        name = "verifier" if self.method == "floor" else "drafter_full"
        logits = self._extend(name, {row.id: row.streams[name].pending for row in rows})[:, -1].float()  # [R, V]
        tokens = logits.argmax(-1)
        p = logits.log_softmax(-1).gather(-1, tokens[:, None])[:, 0].exp()
        host = torch.stack([tokens.double(), p.double()], dim=1).tolist()  # the step's one transfer
        emitted = []
        for j, (row, (tok, p_host)) in enumerate(zip(rows, host)):
            row.counters.record_step(0, 0)
            tok = int(tok)
            verifier = self.method == "floor"
            events = [make_event(row.step, 0, tok, "greedy", p_host if verifier else None, verifier_argmax=tok if verifier else None)]
            emitted.append((events, tokens[j : j + 1], None))
        return emitted
