"""The AsymSpec decoding loop (Algorithm 1) and its baselines, over engines that only return logits.

Cache convention shared by every loop here: a stream's cache holds its prompt and all committed
tokens except the newest one, which is *pending* and is forwarded first in the next step. So the
prefill caches ``prompt[:-1]`` and the first step forwards the prompt's last token: every step has
the same shape and nothing is forwarded twice. Each step forwards K tokens on the drafter's full
stream (one at a time) and K+1 tokens in one forward on the drafter's compressed stream and on the
verifier; rejections roll caches back by cropping. After K acceptances the drafting stream has not
yet forwarded d_K. When the step does not need d_K's logits (the verifier's bonus token, and SD),
d_K stays pending beside the bonus token and rides in the next step's first forward (two tokens, one
call) instead of costing a forward of its own; ``bonus="gated"`` forwards it at once for a_{K+1}.

Every loop is a generator of per-step :class:`TokenEvent` lists, so callers can stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import torch

from .engines import Engine
from .config import BONUS_RULES, METHODS, AsymSpecConfig  # noqa: F401 - re-exported
from .gate import gate_step

@dataclass
class TokenEvent:
    """Why one token was emitted.

    source: ``accepted`` (a draft passed the gate), ``fused`` (emitted at a rejection: argmax of
    t + beta*delta), ``bonus`` (the verifier's own token after K acceptances), ``greedy`` (a baseline).
    p_verifier / p_base: softmax(t)[token] and softmax(b)[token] (None where that stream did not run).
    steered: the emitted token differs from ``verifier_argmax``, what the verifier alone would emit here.
    """

    index: int
    token_id: int
    text: str
    source: str
    step: int
    position: int
    p_verifier: float | None = None
    p_base: float | None = None
    gamma_eff: float | None = None
    jsd: float | None = None
    verifier_argmax: int | None = None
    steered: bool = False
    draft_token: int | None = None
    top_verifier: list[tuple[int, float]] = field(default_factory=list)
    top_fused: list[tuple[int, float]] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


class Counters:
    """Step statistics, acceptance counted per draft position (as vLLM's spec-decode metrics do)."""

    def __init__(self, k: int, streams: dict[str, Engine]):
        self.k = k
        self.streams = streams
        self.steps = 0
        self.drafted = 0
        self.accepted = 0
        self.accepted_per_position = [0] * k
        self.bonus_drafted = 0
        self.bonus_accepted = 0
        self.deferred_draft = 0  # 1 while a step's d_K waits for the next step's first forward
        self.new_tokens = 0
        self.prefill_tokens = {name: e.tokens_forwarded for name, e in streams.items()}
        self.t0 = time.perf_counter()

    def record_step(self, drafted: int, n_accepted: int) -> None:
        """One verification step: ``drafted`` drafts gated, the first ``n_accepted`` of them accepted."""
        self.steps += 1
        self.drafted += drafted
        self.accepted += n_accepted
        for i in range(n_accepted):
            self.accepted_per_position[i] += 1

    def as_dict(self) -> dict:
        wall = time.perf_counter() - self.t0
        drafted = self.drafted + self.bonus_drafted
        return {
            "steps": self.steps,
            "drafted": drafted,
            "accepted": self.accepted + self.bonus_accepted,
            "acceptance_rate": (self.accepted + self.bonus_accepted) / drafted if drafted else 0.0,
            "mean_accepted_length": self.new_tokens / self.steps if self.steps else 0.0,
            "accepted_per_position": list(self.accepted_per_position),
            "bonus_drafted": self.bonus_drafted,
            "bonus_accepted": self.bonus_accepted,
            # 1: the last step's d_K was never forwarded (no next step carried it); forwarded counts are one lower
            "deferred_draft_at_end": self.deferred_draft,
            "tokens_forwarded": {n: e.tokens_forwarded for n, e in self.streams.items()},
            "prefill_tokens": dict(self.prefill_tokens),
            "forward_calls": {n: e.forward_calls for n, e in self.streams.items()},
            "new_tokens": self.new_tokens,
            "decode_wall_s": wall,
            "tokens_per_s": self.new_tokens / wall if wall > 0 else 0.0,
        }


StopFn = Callable[[list[int]], bool]


class _Emitter:
    """Commits tokens, enforcing EOS, the token budget and stop strings; tells the loop when to stop."""

    def __init__(self, counters: Counters, max_new_tokens: int, eos_ids: set[int], stop_fn: StopFn | None):
        self.counters = counters
        self.max_new = max_new_tokens
        self.eos_ids = eos_ids
        self.stop_fn = stop_fn
        self.tokens: list[int] = []
        self.done = False
        self.stopped_by = "max_new_tokens"

    def commit(self, events: list[TokenEvent]) -> list[TokenEvent]:
        kept: list[TokenEvent] = []
        for ev in events:
            if len(self.tokens) >= self.max_new:
                self.done = True
                break
            ev.index = len(self.tokens)
            self.tokens.append(ev.token_id)
            kept.append(ev)
            if ev.token_id in self.eos_ids:
                self.done, self.stopped_by = True, "eos"
                break
        if len(self.tokens) >= self.max_new:
            self.done = True
        if not self.done and self.stop_fn is not None and self.stop_fn(self.tokens):
            self.done, self.stopped_by = True, "stop_string"
        self.counters.new_tokens = len(self.tokens)
        return kept


def _draft_greedy(engine: Engine, pending: torch.Tensor, k: int, rows_out: torch.Tensor | None = None,
                  keep_rows: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Forward ``pending`` then k-1 own drafts one at a time: drafts ``[k]`` and their logits ``[k, V]``.

    Drafts stay on the device: no host sync while drafting. The rows are written into a float32
    ``[k, V]`` buffer (what the gate reads; ``rows_out`` reuses the previous step's, so a request
    allocates it once) instead of being stacked and converted again; ``keep_rows=False`` keeps none.
    """
    drafts = []
    rows = rows_out
    x = pending
    for i in range(k):
        logits = engine.extend(x)[-1]
        if keep_rows:
            if rows is None or rows.shape != (k, logits.shape[-1]) or rows.device != logits.device:
                rows = torch.empty(k, logits.shape[-1], dtype=torch.float32, device=logits.device)
            rows[i].copy_(logits)
        x = logits.argmax(-1, keepdim=True)
        drafts.append(x)
    return torch.cat(drafts), (rows if keep_rows else None)


def _pack(g, drafts: torch.Tensor) -> torch.Tensor:
    """``[P, 10]`` float64 rows (accepted, gamma_eff, jsd, p_verifier, p_base, fused, verifier_argmax,
    p_verifier(fused), p_base(fused), draft) so a step's decision crosses to the host in one transfer.
    Token ids are exact in float64."""
    cols = (g.accepted, g.gamma_eff, g.jsd, g.p_verifier, g.p_base, g.fused, g.verifier_argmax,
            g.p_verifier_fused, g.p_base_fused, drafts)
    return torch.stack([c.double() for c in cols], dim=1)


def _topk(logits: torch.Tensor, k: int) -> torch.Tensor:
    """``[P, 2k]``: the top-k token ids then their probabilities, as float64 for one packed transfer."""
    probs, ids = logits.float().softmax(-1).topk(k, dim=-1)
    return torch.cat([ids.double(), probs.double()], dim=-1)


def _topk_logp(log_probs: torch.Tensor, k: int) -> torch.Tensor:
    """As :func:`_topk` for rows that are already log-probabilities (no second softmax)."""
    logp, ids = log_probs.topk(k, dim=-1)
    return torch.cat([ids.double(), logp.exp().double()], dim=-1)


def _pairs(row: list[float], k: int) -> list[tuple[int, float]]:
    return [(int(row[j]), float(row[k + j])) for j in range(k)]


def asymspec_steps(
    drafter_full: Engine,
    drafter_comp: Engine,
    verifier: Engine,
    pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    cfg: AsymSpecConfig,
    eos_ids: set[int],
    stop_fn: StopFn | None = None,
    counters: Counters | None = None,
    observer: Callable[[int, list[int]], None] | None = None,
) -> Iterator[list[TokenEvent]]:
    """Algorithm 1, greedy. ``pending``: the last prompt token ``[1]`` of each stream (full, comp, verifier).

    Yields the events committed at each step. ``observer(step, tokens)`` runs after each step with
    the streams in their post-step state (tests compare caches against no-cache forwards there).
    """
    k = cfg.k
    counters = counters or Counters(k, {"drafter_full": drafter_full, "drafter_comp": drafter_comp, "verifier": verifier})
    out = _Emitter(counters, cfg.max_new_tokens, eos_ids, stop_fn)
    p_full, p_comp, p_ver = pending
    gate_kw = dict(gamma=cfg.gamma, beta=cfg.beta, gate=cfg.gate, delta=cfg.delta, lam=cfg.lam)
    top = cfg.trace_top
    step = 0
    a = None
    while not out.done:
        base_full, base_comp, base_ver = drafter_full.length, drafter_comp.length, verifier.length
        drafts, a = _draft_greedy(drafter_full, p_full, k, rows_out=a)  # d_1..d_K, a_1..a_K (float32, reused)
        counters.deferred_draft = 0
        b = drafter_comp.extend(torch.cat([p_comp.to(drafts.device), drafts]))  # b_1..b_{K+1}
        t = verifier.extend(torch.cat([p_ver.to(drafts.device), drafts]).to(verifier.device)).to(a.device)
        g = gate_step(a, b[:k], t[:k], drafts, **gate_kw)
        t_last = t[k:].float().log_softmax(-1)  # [1, V]: the bonus position
        bonus_id = t_last[0].argmax()
        extra = [bonus_id.double(), t_last[0, bonus_id].exp().double(), b[k].float().log_softmax(-1)[bonus_id].exp().double()]
        parts = [_pack(g, drafts).flatten(), torch.stack(extra)]  # [K*10], [3]
        if top:
            parts.append(_trace_tops(g, t_last, top).flatten())  # [(K+1) * 4*top]
        # The one device-to-host transfer of the step: the decision, every token it may emit, the trace.
        flat = torch.cat(parts).tolist()
        host = [flat[10 * i:10 * i + 10] for i in range(k)]
        host_extra = flat[10 * k:10 * k + 3]
        w, o = 4 * top, 10 * k + 3
        host_tops = [flat[o + w * i:o + w * i + w] for i in range(k + 1)] if top else None
        n_acc = 0
        while n_acc < k and host[n_acc][0] > 0.5:
            n_acc += 1
        step += 1
        counters.record_step(k, n_acc)

        def event(i: int, token: int, source: str, pv, pb, ge, js, vmax, draft=None) -> TokenEvent:
            ev = TokenEvent(index=0, token_id=token, text="", source=source, step=step, position=i + 1,
                            p_verifier=pv, p_base=pb, gamma_eff=ge, jsd=js, verifier_argmax=vmax,
                            steered=(vmax is not None and token != vmax), draft_token=draft)
            if host_tops is not None:
                ev.top_verifier = _pairs(host_tops[i][: 2 * top], top)
                ev.top_fused = _pairs(host_tops[i][2 * top:], top)
            return ev

        events = [event(i, int(r[9]), "accepted", r[3], r[4], r[1], r[2], int(r[6])) for i, r in enumerate(host[:n_acc])]
        if n_acc < k:
            r = host[n_acc]
            events.append(event(n_acc, int(r[5]), "fused", r[7], r[8], r[1], r[2], int(r[6]), draft=int(r[9])))
            # pending + accepted drafts stay cached; the fused token becomes pending
            drafter_full.truncate(base_full + len(p_full) + n_acc)
            drafter_comp.truncate(base_comp + 1 + n_acc)
            verifier.truncate(base_ver + 1 + n_acc)
            last_dev = g.fused[n_acc:n_acc + 1]  # the fused token, already on the device
            carry = None
        else:
            carry = drafts[k - 1:]  # d_K, pending on the full stream until it is forwarded
            if cfg.bonus == "gated":
                a_bonus = drafter_full.extend(carry)[-1]  # a_{K+1}, needed now
                carry = None
                d_bonus = a_bonus.argmax(-1, keepdim=True)
                gb = gate_step(a_bonus[None], b[k:], t[k:], d_bonus, **gate_kw)
                bparts = [_pack(gb, d_bonus)[0]]
                if top:
                    bparts += [_topk_logp(gb.log_verifier, top)[0], _topk(gb.fused_logits, top)[0]]
                bflat = torch.cat(bparts).tolist()  # the bonus decision's one transfer
                hb = bflat[:10]
                counters.bonus_drafted += 1
                if top:
                    host_tops[k] = bflat[10:]
                if hb[0] > 0.5:
                    counters.bonus_accepted += 1
                    events.append(event(k, int(hb[9]), "accepted", hb[3], hb[4], hb[1], hb[2], int(hb[6])))
                    last_dev = d_bonus
                else:
                    events.append(event(k, int(hb[5]), "fused", hb[7], hb[8], hb[1], hb[2], int(hb[6]), draft=int(hb[9])))
                    last_dev = gb.fused[:1]
            else:
                vid = int(host_extra[0])
                events.append(event(k, vid, "bonus", host_extra[1], host_extra[2], None, None, vid))
                last_dev = bonus_id.view(1)
                counters.deferred_draft = 1
        committed = out.commit(events)
        if committed:
            # All events kept (the usual case): the pending token is the device copy, no host-to-device copy.
            last = last_dev if len(committed) == len(events) else torch.tensor([committed[-1].token_id], device=drafts.device)
            p_comp = p_ver = last
            p_full = last if carry is None else torch.cat([carry, last])
        if observer is not None:
            observer(step, list(out.tokens))
        yield committed
    counters.stopped_by = out.stopped_by  # type: ignore[attr-defined]


def _trace_tops(g, log_t_bonus: torch.Tensor, top: int) -> torch.Tensor:
    """``[K+1, 4*top]``: per position, the verifier's then the fused distribution's top tokens, read from
    the rows the gate already computed. At the bonus position delta is 0, so its fused row *is* the
    verifier's row (``log_t_bonus`` ``[1, V]``)."""
    top_ver = _topk_logp(torch.cat([g.log_verifier, log_t_bonus]), top)
    return torch.cat([top_ver, torch.cat([_topk(g.fused_logits, top), top_ver[-1:]])], dim=1)


def greedy_steps(
    engine: Engine,
    pending: torch.Tensor,
    cfg: AsymSpecConfig,
    eos_ids: set[int],
    stop_fn: StopFn | None = None,
    counters: Counters | None = None,
    is_verifier: bool = True,
) -> Iterator[list[TokenEvent]]:
    """Plain greedy decoding of one stream (Floor: the verifier; "drafter": the drafter on the full view)."""
    counters = counters or Counters(1, {engine.name: engine})
    out = _Emitter(counters, cfg.max_new_tokens, eos_ids, stop_fn)
    x, step = pending, 0
    while not out.done:
        logits = engine.extend(x)[-1].float()
        token = logits.argmax(-1, keepdim=True)
        p = logits.log_softmax(-1)[token].exp()
        host = torch.cat([token.double(), p.double()]).tolist()
        step += 1
        counters.steps += 1
        tok = int(host[0])
        ev = TokenEvent(index=0, token_id=tok, text="", source="greedy", step=step, position=1,
                        p_verifier=host[1] if is_verifier else None, verifier_argmax=tok if is_verifier else None)
        committed = out.commit([ev])
        x = token
        yield committed
    counters.stopped_by = out.stopped_by  # type: ignore[attr-defined]


def sd_steps(
    drafter_comp: Engine,
    verifier: Engine,
    pending: tuple[torch.Tensor, torch.Tensor],
    cfg: AsymSpecConfig,
    eos_ids: set[int],
    stop_fn: StopFn | None = None,
    counters: Counters | None = None,
) -> Iterator[list[TokenEvent]]:
    """Symmetric greedy speculative decoding: the drafter on the compressed view drafts, the verifier keeps
    the longest prefix that matches its own argmax. Lossless: the output equals Floor's token for token."""
    k = cfg.k
    counters = counters or Counters(k, {"drafter_comp": drafter_comp, "verifier": verifier})
    out = _Emitter(counters, cfg.max_new_tokens, eos_ids, stop_fn)
    p_comp, p_ver = pending
    step = 0
    while not out.done:
        base_comp, base_ver = drafter_comp.length, verifier.length
        drafts, _ = _draft_greedy(drafter_comp, p_comp, k, keep_rows=False)
        counters.deferred_draft = 0
        t = verifier.extend(torch.cat([p_ver.to(drafts.device), drafts]).to(verifier.device)).float()
        v_ids = t.argmax(-1)  # [K+1]
        p_v = t.log_softmax(-1).gather(-1, v_ids[:, None])[:, 0].exp()
        drafts_v = drafts.to(v_ids.device)  # the verifier may live on another GPU
        matches = v_ids[:k] == drafts_v
        host = torch.stack([v_ids.double(), p_v.double(), torch.cat([matches, matches.new_zeros(1)]).double(),
                            torch.cat([drafts_v, drafts_v[:1]]).double()], dim=1).tolist()  # the step's one transfer
        n_acc = 0
        while n_acc < k and host[n_acc][2] > 0.5:
            n_acc += 1
        step += 1
        counters.record_step(k, n_acc)
        events = [TokenEvent(index=0, token_id=int(r[0]), text="", source="accepted", step=step, position=i + 1,
                             p_verifier=r[1], verifier_argmax=int(r[0])) for i, r in enumerate(host[:n_acc])]
        r = host[n_acc]
        events.append(TokenEvent(index=0, token_id=int(r[0]), text="", source="bonus" if n_acc == k else "fused",
                                 step=step, position=n_acc + 1, p_verifier=r[1], verifier_argmax=int(r[0]),
                                 draft_token=None if n_acc == k else int(r[3])))
        carry = None
        if n_acc < k:
            drafter_comp.truncate(base_comp + len(p_comp) + n_acc)
            verifier.truncate(base_ver + 1 + n_acc)
        else:
            carry = drafts[k - 1:]  # d_K rides in the next step's first drafting forward
            counters.deferred_draft = 1
        committed = out.commit(events)
        if committed:  # all events kept: the last token is v_ids[n_acc], already on the device
            p_ver = (v_ids[n_acc:n_acc + 1].to(drafts.device) if len(committed) == len(events)
                     else torch.tensor([committed[-1].token_id], device=drafts.device))
            p_comp = p_ver if carry is None else torch.cat([carry, p_ver])
        yield committed
    counters.stopped_by = out.stopped_by  # type: ignore[attr-defined]
