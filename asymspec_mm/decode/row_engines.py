"""Where a decoder's rows live: the :class:`RowEngine` interface the decoder steps, :class:`SoloEngine` (one request on
its own prefilled engine: a batch of one), and the per-row gate settings of a step."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from ..base.config import AsymSpecConfig
from ..engines import Engine

#: The per-row gate settings.
GATE_ROW_FIELDS = ("gamma", "beta", "lam")


#: The per-row counters a row storage keeps in dicts by row id. They outlive ``leave`` (a preempted row that joins
#: again counts on from them), so whoever ends a row for good drops them with :func:`forget_row`.
ROW_COUNTERS = ("tokens_forwarded", "forward_calls", "tokens_computed")


def forget_row(storage: Any, row: int) -> None:
    """Drop ``row``'s counters (:data:`ROW_COUNTERS`) from ``storage``, once the row has left it for good (finished,
    cancelled, failed) and its statistics are made: without this a serving storage keeps an entry per request."""
    for name in ROW_COUNTERS:
        counts = getattr(storage, name, None)
        if isinstance(counts, dict):
            counts.pop(row, None)


class RowEngine(Protocol):
    """Rows of one model, each an independent KV-cached context (the one interface the decoder steps).

    ``join(row, engine)`` adds a row with the context of a prefilled single-row :class:`~asymspec_mm.engines.Engine`
    (copied, so the caller may release it, unless the storage ``adopts`` it); ``leave(row)`` frees it;
    ``extend({row: ids [n_r]}) -> {row: logits [n_r, V]}`` appends tokens to the given rows in one call;
    ``truncate(row, length)`` rolls a row back; ``length(row)`` its cached tokens; ``view(row)`` the row as a
    single-row engine (``name``, ``length``, ``tokens_forwarded``, ``forward_calls``, ``device``, ``extend``,
    ``truncate``) for the statistics; ``engine_calls`` the model calls made. Capabilities are declared, never
    probed: ``adopts`` (the row's engine itself is the storage, no copy), ``drafts_itself`` (``draft({row:
    pending}, k) -> (drafts [R, k], logits [R, k, V] float32)`` drafts k greedy tokens per row in one call).
    """

    name: str
    device: torch.device
    adopts: bool
    drafts_itself: bool

    def join(self, row: int, engine: Engine) -> None: ...

    def leave(self, row: int) -> None: ...

    def extend(self, ids: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]: ...

    def truncate(self, row: int, length: int) -> None: ...

    def length(self, row: int) -> int: ...

    def view(self, row: int) -> Any: ...

    @property
    def engine_calls(self) -> int: ...


class RowStorage(RowEngine, Protocol):
    """A :class:`RowEngine` that holds many rows and accounts for its memory (what the batch decoder and the
    scheduler's KV budget use): ``kv_bytes(row=None)`` held now (``None``: the whole storage, padding and holes
    included), ``kv_bound(lengths, step_tokens)`` the most it can hold for rows reaching ``lengths``,
    ``step_bytes(grow, join)`` the most it holds while its rows (and a row of ``join`` tokens joining) append up to
    ``grow`` slots, ``peak_kv_bytes`` the most it held since the caller last set it, ``slot_bytes()`` one token of
    one row. Declared capabilities: ``rebuilds`` (a row may leave and join again on a context prefilled anew:
    preemption frees memory), ``hands_out_rows`` (``row_kv(row, start, stop)`` gathers a row's KV, which
    conversations store for their next turn)."""

    rebuilds: bool
    hands_out_rows: bool
    peak_kv_bytes: int

    def kv_bytes(self, row: int | None = None) -> int: ...

    def kv_bound(self, lengths: list[int], step_tokens: int) -> int: ...

    def step_bytes(self, grow: int, join: int | None = None) -> int: ...

    def slot_bytes(self) -> int: ...


class SoloEngine:
    """Row storage of one row: it adopts the prefilled single-row engine itself (no copy), so a single request
    runs on exactly the engine it was prefilled on (dynamic or static cache, transformers or vLLM)."""

    adopts = True

    def __init__(self, name: str):
        self.name = name
        self.row: int | None = None
        self.engine: Engine | None = None

    def _engine(self, row: int) -> Engine:
        if row != self.row or self.engine is None:
            raise KeyError(f"{self.name}: no live row {row}")
        return self.engine

    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def rows(self) -> list[int]:
        return [] if self.row is None else [self.row]

    def join(self, row: int, engine: Engine) -> None:
        if self.row is not None:
            raise ValueError(f"{self.name}: a SoloEngine holds one row (row {self.row} is live)")
        self.row, self.engine = row, engine

    def leave(self, row: int) -> None:
        self._engine(row)
        self.row = self.engine = None

    def extend(self, ids: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        return {row: self._engine(row).extend(x) for row, x in ids.items()}

    def truncate(self, row: int, length: int) -> None:
        self._engine(row).truncate(length)

    def length(self, row: int) -> int:
        return self._engine(row).length

    def view(self, row: int) -> Engine:
        return self._engine(row)

    @property
    def drafts_itself(self) -> bool:
        """Whether the adopted engine decodes K drafts in one call (``draft(pending, k)``: vLLM's engines)."""
        return hasattr(self.engine, "draft")

    def draft(self, ids: dict[int, torch.Tensor], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The adopted engine's ``draft`` for the one row: drafts ``[1, k]``, logits ``[1, k, V]`` float32."""
        ((row, pending),) = ids.items()
        drafts, logits = self._engine(row).draft(pending, k)
        return drafts.unsqueeze(0), logits.float().unsqueeze(0)

    @property
    def engine_calls(self) -> int:
        return 0 if self.engine is None else self.engine.forward_calls


def gate_settings(configs: list[AsymSpecConfig], per_row: int, device: torch.device | str) -> dict[str, float | torch.Tensor]:
    """The gate's ``gamma``/``beta``/``lam`` for rows with ``configs``, each repeated ``per_row`` times (the row's
    positions): a float where every row agrees, else a float32 tensor ``[len(configs) * per_row]``."""
    out: dict[str, float | torch.Tensor] = {}
    for name in GATE_ROW_FIELDS:
        values = [float(getattr(c, name)) for c in configs]
        same = all(v == values[0] for v in values)
        out[name] = values[0] if same else torch.tensor(values, dtype=torch.float32, device=device).repeat_interleave(per_row)
    return out


def stack_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """``rows`` stacked on a new first dim; one row is a view (a single request copies no logits)."""
    return rows[0].unsqueeze(0) if len(rows) == 1 else torch.stack(rows)
