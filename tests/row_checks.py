"""What the row-storage tests (padded, paged, static slots) share: which model runs a stream, and when two logits
tensors count as the same answer."""

from __future__ import annotations

import torch


def stream_model(pipe, name: str):
    """The model behind stream ``name`` of ``pipe`` (both drafter views run the drafter)."""
    return pipe.verifier if name == "verifier" else pipe.drafter


def assert_logits_close(got: torch.Tensor, want: torch.Tensor, what) -> None:
    """Same shape, within 1e-5, and the same argmax at every position: the same tokens would be chosen."""
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert torch.allclose(got, want, atol=1e-5), (what, (got - want).abs().max())
    assert torch.equal(got.argmax(-1), want.argmax(-1)), what


def rows_counted(sched) -> dict[str, list[int]]:
    """The rows each row storage of scheduler ``sched`` (its decode storages and its prefill's staging ones) still
    keeps counters of (``tokens_forwarded``, ``forward_calls``): none once every request has ended."""
    decoder = sched._decoder
    storages = {**decoder.engines, **{f"{name} (prefill)": e for name, e in decoder.arriving._staging.items()}}
    return {name: sorted({*e.tokens_forwarded, *e.forward_calls}) for name, e in storages.items() if e.tokens_forwarded or e.forward_calls}
