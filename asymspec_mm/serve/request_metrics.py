"""vLLM's per-request ``metrics`` object of an answer: ``metrics.speculative_decoding``, the shape vLLM sends with
``--per-request-spec-decode-metrics summary`` and that AIPerf reads into its Spec Decode table.

Where it goes, as vLLM places it: at the root of a non-streamed chat completion, text completion and Responses
answer; in a stream, on the last chunk only (the usage chunk of chat and text completions, sent when the request
has ``stream_options.include_usage``; the ``response`` of the Responses API's final ``response.completed`` or
``response.incomplete`` event). It describes one generation, so a request with several choices (``n > 1``) gets
``{"speculative_decoding": null}``. This server always sends it (no flag): every answer is a speculative one.

The ``asymspec.speculative_decoding`` object (:func:`~asymspec_mm.serve.metrics.speculative_decoding`, the names of
vLLM's Prometheus counters) stays as it was; both are computed from the same step counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..request.session import MMResult


def acceptance_histogram(accepted_per_position: list[int], steps: int, k: int) -> list[int]:
    """``h`` of length ``k + 1``: ``h[j]`` is the number of steps that accepted exactly ``j`` of their ``k`` drafts.

    A step accepts a prefix of its drafts, so ``accepted_per_position[i]`` (steps whose draft ``i + 1`` was accepted)
    counts the steps that accepted more than ``i``; the steps that accepted exactly ``j`` are those that accepted at
    least ``j`` less those that accepted at least ``j + 1``."""
    per_pos = list(accepted_per_position) + [0] * (k - len(accepted_per_position))
    at_least = [steps, *per_pos, 0]  # at_least[j]: steps that accepted j drafts or more
    return [at_least[j] - at_least[j + 1] for j in range(k + 1)]


def vllm_speculative_decoding(stats: dict[str, Any], k: int) -> dict[str, Any]:
    """One answer's acceptance as vLLM's per-request ``speculative_decoding`` object (the ``summary`` level).

    ``stats`` is the answer's :class:`~asymspec_mm.decode.stats.Counters` dict and ``k`` its draft length. Steps that
    put no draft to the gate (Floor, the drafter alone) are not speculative steps, as in vLLM, so such an answer has
    zero steps and an all-zero histogram. ``mean_acceptance_length`` is ``1 + accepted / steps`` (1.0 without steps)
    and ``draft_acceptance_rate`` ``accepted / drafted`` (0.0 without drafts); ``acceptance_histogram_by_draft_length``
    maps each draft length seen (every step here drafts ``k``) to its histogram, its keys strings as in JSON."""
    drafted, accepted = int(stats.get("drafted", 0)), int(stats.get("accepted", 0))
    steps = int(stats.get("steps", 0)) if drafted else 0
    per_pos = [int(n) for n in stats.get("accepted_per_position") or []] if drafted else []
    histogram = acceptance_histogram(per_pos, steps, k)
    return {
        "mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_histogram": histogram,
        "acceptance_histogram_by_draft_length": {str(k): histogram} if steps else {},
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_tokens": k,
    }


def answer_metrics(results: list[MMResult]) -> dict[str, Any]:
    """The ``metrics`` object of an answer made of ``results`` (one per choice): the acceptance of its one choice,
    ``null`` when it has several (vLLM reports one generation stream only)."""
    if len(results) != 1:
        return {"speculative_decoding": None}
    res = results[0]
    return {"speculative_decoding": vllm_speculative_decoding(res.stats, int(res.config.k))}
