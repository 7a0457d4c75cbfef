"""The ``/metrics`` series a load- or cache-aware router reads, under vLLM's names where vLLM has one: running and
waiting requests, KV use, and the prefix cache's queried and hit tokens (from the pipeline's
:class:`~asymspec_mm.engines.prefix_kv.PrefixKV`, over all its streams: drafter and verifier)."""

from __future__ import annotations

from typing import Any


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def load_series(scheduler: Any, prefix_kv: Any, model: str) -> str:
    """Prometheus text of the load series: ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` (gauges),
    ``vllm:kv_cache_usage_perc`` (a fraction of ``max_kv_bytes``; only with a KV bound: without one nothing is
    full), ``asymspec_kv_bytes`` (bytes held now), ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``
    (counters, in tokens) and ``asymspec_prefix_cache_bytes``."""
    label = f'model_name="{_escape(model)}"'
    out: list[str] = []

    def metric(name: str, kind: str, help_: str, value: float) -> None:  # a fraction in full: a share of GBs moves late
        sample = f"{name}_total" if kind == "counter" else name  # a counter's sample carries _total, as vLLM's
        out.extend(
            [
                f"# HELP {name} {help_}",
                f"# TYPE {name} {kind}",
                f"{sample}{{{label}}} {value if isinstance(value, int) else repr(float(value))}",
            ]
        )

    metric("vllm:num_requests_running", "gauge", "Requests holding a row (prefilling or decoding).", scheduler.live_rows)
    metric("vllm:num_requests_waiting", "gauge", "Requests waiting for a row (queued or being set up).", scheduler.waiting)
    kv_bytes, bound = int(getattr(scheduler, "kv_bytes", 0)), getattr(scheduler, "max_kv_bytes", None)
    if bound:
        metric("vllm:kv_cache_usage_perc", "gauge", "KV bytes held / --max-kv-bytes (1 = full).", min(kv_bytes / bound, 1.0))
    metric("asymspec_kv_bytes", "gauge", "KV bytes the rows and the prefill staging hold now.", kv_bytes)
    if prefix_kv is not None:
        metric("vllm:prefix_cache_queries", "counter", "Prompt tokens looked up in the prefix KV store.", prefix_kv.queried_tokens)
        metric("vllm:prefix_cache_hits", "counter", "Prompt tokens served from the prefix KV store.", prefix_kv.matched_tokens)
        metric("asymspec_prefix_cache_bytes", "gauge", "Bytes the prefix KV store holds.", prefix_kv.nbytes)
    return "\n".join(out) + "\n"
