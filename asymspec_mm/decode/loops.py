"""The AsymSpec loop (Algorithm 1, greedy) and its baselines, over engines that only return logits.

Terms, as in the paper: ``a`` the drafter's logits on the full view (image), ``b`` the same drafter's on
the compressed view (caption + OCR), ``t`` the verifier's on the compressed view; ``d_1..d_K`` the drafts.
Each step forwards K tokens one at a time on the drafting stream and K+1 in one forward on each scoring
stream; rejections roll caches back by cropping (see :mod:`.streams` for the pending-token convention).

Every loop is a generator of the :class:`TokenEvent` lists committed at each step; the caller keeps the
statistics (``counters``) and may time the gate and the trace through ``timer(name)`` (names ``"gate"``
and ``"trace"``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import torch

from ..config import AsymSpecConfig, check_method
from ..engines import Engine
from ..gate import gate_step
from .events import TokenEvent
from .stats import Counters
from .streams import Emitter, StopFn, Stream, draft_greedy
from .transfer import BonusRow, GateRow, TopPairs, gated_tops, pack_bonus, pack_gate, to_host, trace_tops

Timer = Callable[[str], AbstractContextManager]
Tops = list[tuple[TopPairs, TopPairs]] | None


def no_timer(name: str) -> AbstractContextManager:
    return contextlib.nullcontext()


def make_event(
    step: int,
    i: int,
    token: int,
    source: str,
    p_verifier: float | None,
    p_base: float | None = None,
    gamma_eff: float | None = None,
    jsd: float | None = None,
    verifier_argmax: int | None = None,
    draft: int | None = None,
    tops: tuple[TopPairs, TopPairs] | None = None,
    draft_p: tuple[float, float] | None = None,
) -> TokenEvent:
    ev = TokenEvent(
        index=0,
        token_id=token,
        text="",
        source=source,
        step=step,
        position=i + 1,
        p_verifier=p_verifier,
        p_base=p_base,
        gamma_eff=gamma_eff,
        jsd=jsd,
        verifier_argmax=verifier_argmax,
        steered=verifier_argmax is not None and token != verifier_argmax,
        draft_token=draft,
        draft_p_verifier=None if draft_p is None else draft_p[0],
        draft_p_base=None if draft_p is None else draft_p[1],
    )
    if tops is not None:
        ev.top_verifier, ev.top_fused = tops
    return ev


def tops_at(tops: Tops, i: int) -> tuple[TopPairs, TopPairs] | None:
    return None if tops is None else tops[i]


def gate_event(step: int, i: int, row: GateRow, tops: tuple[TopPairs, TopPairs] | None) -> TokenEvent:
    """What the gate emits at position i+1: the draft when accepted, else the fused token (replacing it)."""
    if row.accepted:
        return make_event(
            step, i, row.draft, "accepted", row.p_verifier, row.p_base, row.gamma_eff, row.jsd, row.verifier_argmax, tops=tops
        )
    return make_event(
        step,
        i,
        row.fused,
        "fused",
        row.p_verifier_fused,
        row.p_base_fused,
        row.gamma_eff,
        row.jsd,
        row.verifier_argmax,
        draft=row.draft,
        tops=tops,
        draft_p=(row.p_verifier, row.p_base),
    )


def bonus_event(step: int, k: int, bonus: BonusRow, tops: tuple[TopPairs, TopPairs] | None) -> TokenEvent:
    """The verifier's own token at position K+1 (``bonus="verifier"``)."""
    return make_event(step, k, bonus.token, "bonus", bonus.p_verifier, bonus.p_base, verifier_argmax=bonus.token, tops=tops)


def sd_events(step: int, k: int, host: list[list[float]]) -> tuple[list[TokenEvent], int]:
    """SD's decision on the host: ``host`` ``[K+1]`` rows (verifier argmax, its probability, draft; the last draft
    is padding) -> the accepted drafts that match the verifier, then its own token (``corrected`` at the first
    mismatch, ``bonus`` after K matches), and the number accepted."""
    n_acc = 0
    while n_acc < k and host[n_acc][0] == host[n_acc][2]:
        n_acc += 1
    events = [make_event(step, i, int(r[0]), "accepted", r[1], verifier_argmax=int(r[0])) for i, r in enumerate(host[:n_acc])]
    r = host[n_acc]
    source, draft = ("bonus", None) if n_acc == k else ("corrected", int(r[2]))
    events.append(make_event(step, n_acc, int(r[0]), source, r[1], verifier_argmax=int(r[0]), draft=draft))
    return events, n_acc


def asymspec_steps(
    drafter_full: Engine,
    drafter_comp: Engine,
    verifier: Engine,
    pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    cfg: AsymSpecConfig,
    eos_ids: set[int],
    stop_fn: StopFn | None = None,
    counters: Counters | None = None,
    timer: Timer | None = None,
) -> Iterator[list[TokenEvent]]:
    """Algorithm 1, greedy. ``pending``: each stream's last prompt token ``[1]`` (full, comp, verifier)."""
    k, top, timer = cfg.k, cfg.trace_top, timer or no_timer
    counters = counters or Counters(k, {"drafter_full": drafter_full, "drafter_comp": drafter_comp, "verifier": verifier})
    out = Emitter(counters, cfg.max_new_tokens, eos_ids, stop_fn)
    full, comp, ver = (Stream(e, p) for e, p in zip((drafter_full, drafter_comp, verifier), pending))
    gate_kw = dict(gamma=cfg.gamma, beta=cfg.beta, gate=cfg.gate, delta=cfg.delta, lam=cfg.lam)
    step, a = 0, None
    while not out.done:
        step += 1
        for s in (full, comp, ver):
            s.begin_step()
        drafts, a = draft_greedy(full, k, rows_out=a)  # d_1..d_K [K], a_1..a_K [K, V]
        b = comp.score(drafts)  # b_1..b_{K+1} [K+1, V]
        t = ver.score(drafts).to(a.device)  # t_1..t_{K+1} [K+1, V]
        with timer("gate"):
            g = gate_step(a, b[:k], t[:k], drafts, **gate_kw)
        bonus_id, log_t_bonus, bonus = pack_bonus(t[k:], b[k:])
        with timer("trace"):
            tops = trace_tops(g, log_t_bonus, top) if top else None
        host = to_host(pack_gate(g, drafts), bonus, tops, top)[0]  # the step's one device-to-host transfer
        n_acc = host.accepted_prefix()
        counters.record_step(k, n_acc)
        events = [gate_event(step, i, host.rows[i], tops_at(host.tops, i)) for i in range(min(n_acc + 1, k))]
        carry = None
        if n_acc < k:  # pending + the accepted drafts stay cached; the fused token comes next
            for s in (full, comp, ver):
                s.rollback(n_acc)
            token = g.fused[n_acc : n_acc + 1]
        elif cfg.bonus == "gated":  # a_{K+1} is needed now, so d_K is forwarded now
            ev, token = gated_bonus(drafter_full, drafts[k - 1 :], b[k:], t[k:], step, cfg, counters, timer)
            events.append(ev)
        else:  # d_K rides in the next step's first drafting forward
            events.append(bonus_event(step, k, host.bonus, tops_at(host.tops, k)))
            token, carry = bonus_id, drafts[k - 1 :]
        counters.record_deferred(carry is not None)
        committed = out.commit(events)
        if committed:
            token = out.next_token(committed, events, token)
            comp.advance(token)
            ver.advance(token)
            full.advance(token, carry)
        yield committed


def gated_bonus(
    drafter_full: Engine,
    d_k: torch.Tensor,
    b_bonus: torch.Tensor,
    t_bonus: torch.Tensor,
    step: int,
    cfg: AsymSpecConfig,
    counters: Counters,
    timer: Timer,
) -> tuple[TokenEvent, torch.Tensor]:
    """``bonus="gated"``: forward d_K ``[1]`` for a_{K+1}, put its argmax to the gate against ``b_bonus`` /
    ``t_bonus`` ``[1, V]``; returns the event and the emitted token ``[1]`` on the device."""
    a_bonus = drafter_full.extend(d_k)[-1:]  # a_{K+1} [1, V]
    d_bonus = a_bonus.argmax(-1)
    with timer("gate"):
        g = gate_step(a_bonus, b_bonus, t_bonus, d_bonus, gamma=cfg.gamma, beta=cfg.beta, gate=cfg.gate, delta=cfg.delta, lam=cfg.lam)
    with timer("trace"):
        tops = gated_tops(g, cfg.trace_top) if cfg.trace_top else None
    host = to_host(pack_gate(g, d_bonus), None, tops, cfg.trace_top)[0]  # the bonus decision's one transfer
    row = host.rows[0]
    counters.record_bonus(row.accepted)
    ev = gate_event(step, cfg.k, row, tops_at(host.tops, 0))
    return ev, (d_bonus if row.accepted else g.fused[:1])


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
    out = Emitter(counters, cfg.max_new_tokens, eos_ids, stop_fn)
    x, step = pending, 0
    while not out.done:
        logits = engine.extend(x)[-1].float()
        token = logits.argmax(-1, keepdim=True)
        p = logits.log_softmax(-1)[token].exp()
        tok, p_host = torch.cat([token.double(), p.double()]).tolist()  # the step's one transfer
        step += 1
        counters.record_step(0, 0)
        tok = int(tok)
        committed = out.commit(
            [make_event(step, 0, tok, "greedy", p_host if is_verifier else None, verifier_argmax=tok if is_verifier else None)]
        )
        x = token
        yield committed


def sd_steps(
    drafter_comp: Engine,
    verifier: Engine,
    pending: tuple[torch.Tensor, torch.Tensor],
    cfg: AsymSpecConfig,
    eos_ids: set[int],
    stop_fn: StopFn | None = None,
    counters: Counters | None = None,
) -> Iterator[list[TokenEvent]]:
    """Symmetric greedy speculative decoding: the drafter on the compressed view drafts, the verifier keeps the
    longest prefix that matches its own argmax and corrects the first mismatch. Lossless: equals Floor."""
    k = cfg.k
    counters = counters or Counters(k, {"drafter_comp": drafter_comp, "verifier": verifier})
    out = Emitter(counters, cfg.max_new_tokens, eos_ids, stop_fn)
    comp, ver = Stream(drafter_comp, pending[0]), Stream(verifier, pending[1])
    step = 0
    while not out.done:
        step += 1
        comp.begin_step()
        ver.begin_step()
        drafts, _ = draft_greedy(comp, k, keep_rows=False)
        t = ver.score(drafts).float()  # [K+1, V]
        v_ids = t.argmax(-1)  # [K+1]
        p_v = t.log_softmax(-1).gather(-1, v_ids[:, None])[:, 0].exp()
        drafts_v = drafts.to(v_ids.device)  # the verifier may live on another GPU
        host = torch.stack([v_ids.double(), p_v.double(), torch.cat([drafts_v, drafts_v[:1]]).double()], dim=1).tolist()
        events, n_acc = sd_events(step, k, host)
        counters.record_step(k, n_acc)
        carry = None
        if n_acc < k:
            comp.rollback(n_acc)
            ver.rollback(n_acc)
        else:
            carry = drafts[k - 1 :]  # d_K rides in the next step's first drafting forward
        counters.record_deferred(carry is not None)
        committed = out.commit(events)
        if committed:
            token = out.next_token(committed, events, v_ids[n_acc : n_acc + 1].to(drafts.device))
            ver.advance(token)
            comp.advance(token, carry)
        yield committed


def steps_for(
    method: str,
    streams: dict[str, Engine],
    pending: dict[str, torch.Tensor],
    cfg: AsymSpecConfig,
    eos_ids: set[int],
    stop_fn: StopFn | None = None,
    counters: Counters | None = None,
    timer: Timer | None = None,
) -> Iterator[list[TokenEvent]]:
    """The step iterator of ``method`` over prefilled ``streams`` (keyed drafter_full / drafter_comp / verifier)."""
    check_method(method)
    if method == "asymspec":
        names = ("drafter_full", "drafter_comp", "verifier")
        return asymspec_steps(*(streams[n] for n in names), tuple(pending[n] for n in names), cfg, eos_ids, stop_fn, counters, timer)
    if method == "sd":
        return sd_steps(
            streams["drafter_comp"], streams["verifier"], (pending["drafter_comp"], pending["verifier"]), cfg, eos_ids, stop_fn, counters
        )
    name = "verifier" if method == "floor" else "drafter_full"
    return greedy_steps(streams[name], pending[name], cfg, eos_ids, stop_fn, counters, is_verifier=method == "floor")
