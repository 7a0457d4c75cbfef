"""How one step of a mixed batch makes its model calls: each settings group's step is a coroutine that *asks* for
forwards and host transfers, and :func:`drive` answers every group's asks of one phase with one call per row storage.

A group (rows of one method and one step shape: K, gate, delta source, bonus rule, trace width) walks through the
phases of Algorithm 1 in order: :data:`DRAFT` (one drafting position; the drafter-alone rows' one token rides in the
first), :data:`SCORE` (the compressed and verifier streams score pending + drafts; Floor rows' one token rides
here), :data:`DECIDE` (the gate's packed decision goes to the host), and for ``bonus="gated"`` rows :data:`BONUS`
(d_K forwarded for a_{K+1}) and :data:`BONUS_DECIDE`. :func:`drive` always answers the earliest phase any group
waits in, so a group with K = 2 waits with its scoring until the K = 6 group has drafted: a step makes at most
one call per storage per drafting position plus one per scoring storage, whatever the mix of settings, and one
device-to-host transfer per decision phase.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

DRAFT, SCORE, DECIDE, BONUS, BONUS_DECIDE = range(5)


@dataclass
class Forward:
    """Rows' tokens appended on one row storage: ``ids`` ``{row: [n_r]}``; answered with ``{row: logits [n_r, V]}``.
    ``k`` > 0 asks an engine that drafts by itself for k greedy drafts instead (answered with ``(drafts [R, k],
    logits [R, k, V])`` in ``ids`` order)."""

    storage: str
    ids: dict[int, torch.Tensor]
    k: int = 0


@dataclass
class Ask:
    """What a group's step waits for: ``forwards`` (answered in order) or a host ``transfer`` of a float64 tensor
    (answered with its values as one flat list)."""

    phase: int
    forwards: list[Forward] = field(default_factory=list)
    transfer: torch.Tensor | None = None


#: A group's step: yields :class:`Ask`, receives the answers, returns what it emits for each of its rows.
GroupStep = Generator[Ask, Any, list]


class Storages(Protocol):
    """The row storages by name (each with ``extend`` and, for self-drafting engines, ``draft``)."""

    def __getitem__(self, name: str) -> Any: ...


def drive(groups: Sequence[GroupStep], engines: Storages, rides: dict[str, dict[int, Any]] | None = None) -> list[list]:
    """Run every group's step to its end; returns each group's result, in order. ``rides``: storage -> ``{row:
    PrefillChunk}``, arriving rows' prompt pieces that ride in the first forward the step makes on that storage
    (``extend(ids, prompts=...)``); each storage's pieces are taken out of ``rides`` as they ride, so what is left
    in it are the storages the step did not call."""
    waiting: dict[int, Ask] = {}
    results: list[list] = [[] for _ in groups]

    def resume(i: int, answer: Any) -> None:
        try:
            waiting[i] = groups[i].send(answer)
        except StopIteration as stop:
            waiting.pop(i, None)
            results[i] = stop.value

    for i in range(len(groups)):
        resume(i, None)
    while waiting:
        phase = min(ask.phase for ask in waiting.values())
        ready = [i for i, ask in waiting.items() if ask.phase == phase]
        answers = _answer([waiting[i] for i in ready], engines, rides if rides is not None else {})
        for i, answer in zip(ready, answers):
            resume(i, answer)
    return results


def _answer(asks: list[Ask], engines: Storages, rides: dict[str, dict[int, Any]]) -> list[Any]:
    """One call per storage for every forward of ``asks`` (rows merged; a storage's waiting ``rides`` go with its
    first), one transfer for every tensor."""
    if any(ask.transfer is not None for ask in asks):
        tensors = [ask.transfer.flatten() for ask in asks]
        device = tensors[0].device  # the verifier may live on another device: one gather there, one sync
        flat = tensors[0].tolist() if len(tensors) == 1 else torch.cat([t.to(device, torch.float64) for t in tensors]).tolist()
        out, at = [], 0
        for t in tensors:
            out.append(flat[at : at + t.numel()])
            at += t.numel()
        return out
    merged: dict[tuple[str, int], dict[int, torch.Tensor]] = {}
    for ask in asks:
        for fw in ask.forwards:
            merged.setdefault((fw.storage, fw.k), {}).update(fw.ids)
    outs: dict[tuple[str, int], Any] = {}
    for (storage, k), ids in merged.items():
        if k:
            outs[(storage, k)] = _split_drafts(engines[storage].draft(ids, k), ids)
        elif storage in rides:
            outs[(storage, k)] = engines[storage].extend(ids, prompts=rides.pop(storage))
        else:
            outs[(storage, k)] = engines[storage].extend(ids)
    answers = []
    for ask in asks:
        per = []
        for fw in ask.forwards:
            got = outs[(fw.storage, fw.k)]
            if fw.k == 0:
                per.append({r: got[r] for r in fw.ids})
            else:
                rows = [got[r] for r in fw.ids]
                per.append((torch.stack([d for d, _ in rows]), torch.stack([lg for _, lg in rows])))
        answers.append(per)
    return answers


def _split_drafts(out: tuple[torch.Tensor, torch.Tensor], ids: dict[int, torch.Tensor]) -> dict[int, tuple]:
    """An engine's ``draft`` answer (drafts ``[R, k]``, logits ``[R, k, V]`` in ``ids`` order) per row."""
    drafts, logits = out
    return {r: (drafts[j], logits[j]) for j, r in enumerate(ids)}
