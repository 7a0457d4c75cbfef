"""What a decoding step emits: the :class:`TokenEvent` of each committed position, built from the host rows.

``Timer`` is the optional context-manager factory the decoder enters around the gate and the trace's
top-k (names ``"gate"`` and ``"trace"``), for the benchmark's breakdown.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

from .events import TokenEvent
from .transfer import BonusRow, GateRow, TopPairs

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
    accept_prob: float | None = None,
    gate_excess: float | None = None,
    residual: bool = False,
    p_fused: float | None = None,
    alone: bool = False,
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
        accept_prob=accept_prob,
        residual=residual,
        gate_excess=gate_excess,
        p_fused=p_fused,
        verifier_alone=alone,
    )
    if tops is not None:
        ev.top_verifier, ev.top_fused = tops
    return ev


def tops_at(tops: Tops, i: int) -> tuple[TopPairs, TopPairs] | None:
    return None if tops is None else tops[i]


def gate_event(step: int, i: int, row: GateRow, tops: tuple[TopPairs, TopPairs] | None) -> TokenEvent:
    """What the gate emits at position i+1: the draft when accepted, else the fused token (replacing it; for a
    sampled row, a draw of the residual)."""
    extra = dict(accept_prob=row.accept_prob, gate_excess=row.gate_excess, alone=row.alone)
    if row.accepted:
        return make_event(
            step,
            i,
            row.draft,
            "accepted",
            row.p_verifier,
            row.p_base,
            row.gamma_eff,
            row.jsd,
            row.verifier_argmax,
            tops=tops,
            p_fused=row.p_fused_draft,
            **extra,
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
        residual=row.accept_prob is not None,
        p_fused=row.p_fused_fused,
        **extra,
    )


def bonus_event(step: int, k: int, bonus: BonusRow, tops: tuple[TopPairs, TopPairs] | None) -> TokenEvent:
    """The verifier's own token at position K+1 (``bonus="verifier"``; a sampled row's is a draw)."""
    return make_event(
        step,
        k,
        bonus.token,
        "bonus",
        bonus.p_verifier,
        bonus.p_base,
        verifier_argmax=bonus.argmax,
        tops=tops,
        p_fused=bonus.p_verifier,
        alone=bonus.alone,
    )


def _tops_of(row: list[float], top: int) -> tuple[TopPairs, TopPairs] | None:
    """The verifier's top pairs packed after a row's first six columns (as before and after fusion: nothing is
    fused where they are used), or None without any."""
    if not top:
        return None
    pairs = [(int(row[6 + j]), float(row[6 + top + j])) for j in range(top)]
    return pairs, list(pairs)


def sd_events(step: int, k: int, host: list[list[float]], top: int = 0) -> tuple[list[TokenEvent], int]:
    """SD's decision on the host: ``host`` ``[K+1]`` rows (the verifier's token where the step would stop there,
    softmax(t) at it, the draft, whether the draft is accepted, the verifier's argmax, softmax(t) at the draft; the
    last draft is padding) -> the accepted drafts, then the verifier's token (``corrected`` at the first rejection,
    ``bonus`` after K acceptances), and the number accepted. Greedy: a draft is accepted when it matches the
    argmax; sampled: by the lossless rule, and the verifier's token is then a draw. ``top`` > 0: each row then holds the
    verifier's top pairs."""
    n_acc = 0
    while n_acc < k and host[n_acc][3] > 0.5:
        n_acc += 1
    events = [
        make_event(step, i, int(r[2]), "accepted", r[5], verifier_argmax=int(r[4]), tops=_tops_of(r, top), p_fused=r[5])
        for i, r in enumerate(host[:n_acc])
    ]
    r = host[n_acc]
    source, draft = ("bonus", None) if n_acc == k else ("corrected", int(r[2]))
    events.append(
        make_event(step, n_acc, int(r[0]), source, r[1], verifier_argmax=int(r[4]), draft=draft, tops=_tops_of(r, top), p_fused=r[1])
    )
    return events, n_acc
