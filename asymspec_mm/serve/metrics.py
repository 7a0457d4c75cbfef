"""The server's counters, rendered in Prometheus' text exposition format (``GET /metrics``): ours (``asymspec_*``) and
the speculative-decoding counters under the names vLLM gives them (``vllm:spec_decode_*``), so that dashboards and
tools written for vLLM read this server's acceptance too."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

#: How a request the scheduler took ended (``asymspec_requests_total{outcome=...}``; docs/serving.md defines each):
#: ``ok`` decoded to its end, ``cancelled`` its client went away (or the server shut down), ``refused`` its set-up
#: found what it asks impossible (a 4xx: a prompt over the context window, a schema that does not compile),
#: ``error`` the server failed it (a 5xx: an internal error, a stopped decode loop).
OUTCOMES = ("ok", "cancelled", "refused", "error")
#: vLLM's ``finished_reason`` label of ``vllm:request_success_total``: an answer's own reason (a tool call ends
#: with ``stop``, as in vLLM's engine), ``abort`` for a cancelled request and ``error`` for a server failure; a
#: refused request is not counted there (vLLM refuses such requests before its engine sees them).
FINISHED_REASONS = ("stop", "length", "abort", "error")


class Metrics:
    """Thread-safe request and token counters; the scheduler's step counts are read when rendered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()  # requests the scheduler took, by outcome (OUTCOMES)
        self.finished_reasons: Counter[str] = Counter()  # the same, by vLLM's finished_reason (FINISHED_REASONS)
        self.http_errors: Counter[int] = Counter()  # refused requests by status
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.drafted = 0
        self.accepted = 0
        self.drafts = 0  # draft rounds (vLLM's num_drafts): steps that put drafts to the gate
        self.accepted_per_pos: Counter[int] = Counter()  # accepted drafts by position (0-based, as vLLM labels them)
        self.in_flight = 0

    def started(self) -> None:
        with self._lock:
            self.in_flight += 1

    def finished(self, outcome: str, result: Any = None) -> None:
        """A submitted request ended: ``outcome`` is one of :data:`OUTCOMES` (``ok`` with its :class:`MMResult`)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
        with self._lock:
            self.in_flight -= 1
            self.requests[outcome] += 1
            reason = finished_reason(outcome, result)
            if reason is not None:
                self.finished_reasons[reason] += 1
            if result is not None:
                self.prompt_tokens += int(result.prompts.verifier_ids.shape[1])
                self.completion_tokens += len(result.token_ids)
                spec = speculative_decoding(result.stats)
                self.drafted += spec["num_draft_tokens"]
                self.accepted += spec["num_accepted_tokens"]
                self.drafts += spec["num_drafts"]
                for pos, n in enumerate(spec["num_accepted_tokens_per_pos"]):
                    self.accepted_per_pos[pos] += n

    def refused(self, status: int) -> None:
        with self._lock:
            self.http_errors[status] += 1

    def render(self, scheduler: Any, model: str) -> str:
        """The Prometheus text of the counters and of ``scheduler``'s steps, rows and queue."""
        with self._lock:
            steps, rows = scheduler.steps, scheduler.rows_stepped
            label = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
            out: list[str] = []

            def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
                out.append(f"# HELP {name} {help_}")
                out.append(f"# TYPE {name} {kind}")
                for labels, value in samples:
                    out.append(f"{name}{{{labels}}} {value:g}" if labels else f"{name} {value:g}")

            metric("asymspec_model_info", "gauge", "The served drafter + verifier pair.", [(f'model="{label}"', 1)])
            metric(
                "asymspec_requests_total",
                "counter",
                "Requests the scheduler took (chat, completions, Responses), by how they ended: ok, cancelled, "
                "refused (a 4xx found at set-up), error (a 5xx).",
                [(f'outcome="{o}"', self.requests[o]) for o in OUTCOMES],
            )
            metric(
                "asymspec_refused_requests_total",
                "counter",
                "Requests answered with an error status, by HTTP status.",
                [(f'status="{s}"', n) for s, n in sorted(self.http_errors.items())],
            )
            metric(
                "asymspec_requests_in_flight",
                "gauge",
                "Requests (chat, completions, Responses) submitted and not yet finished.",
                [("", self.in_flight)],
            )
            metric("asymspec_prompt_tokens_total", "counter", "Verifier prompt tokens of finished requests.", [("", self.prompt_tokens)])
            metric("asymspec_completion_tokens_total", "counter", "Tokens generated for finished requests.", [("", self.completion_tokens)])
            metric("asymspec_drafted_tokens_total", "counter", "Draft tokens put to the gate.", [("", self.drafted)])
            metric("asymspec_accepted_tokens_total", "counter", "Draft tokens the gate accepted.", [("", self.accepted)])
            metric(
                "asymspec_acceptance_rate",
                "gauge",
                "Accepted / drafted tokens over finished requests.",
                [("", self.accepted / self.drafted if self.drafted else 0.0)],
            )
            metric("asymspec_scheduler_steps_total", "counter", "Batched decoding steps.", [("", steps)])
            metric("asymspec_scheduler_rows_stepped_total", "counter", "Rows summed over the batched steps.", [("", rows)])
            metric(
                "asymspec_batch_occupancy",
                "gauge",
                "Mean rows per decoding step (rows_stepped / steps).",
                [("", rows / steps if steps else 0.0)],
            )
            metric("asymspec_live_rows", "gauge", "Rows being decoded now.", [("", scheduler.live_rows)])
            metric("asymspec_preemptions_total", "counter", "Rows preempted to keep within the KV budget.", [("", scheduler.preemptions)])
            metric("asymspec_kv_peak_bytes", "gauge", "The most KV bytes the rows held at once so far.", [("", scheduler.peak_kv_bytes)])
            metric("asymspec_waiting_requests", "gauge", "Requests waiting for a row.", [("", scheduler.waiting)])
            name = f'model_name="{label}"'  # vLLM's label; its counters' samples carry the _total suffix
            metric(
                "vllm:request_success_total",
                "counter",
                "Count of successfully processed requests.",
                [(f'{name},finished_reason="{r}"', self.finished_reasons[r]) for r in FINISHED_REASONS],
            )
            metric("vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", [(name, self.drafts)])
            metric("vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", [(name, self.drafted)])
            metric("vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.", [(name, self.accepted)])
            metric(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                "counter",
                "Accepted tokens per draft position.",
                [(f'{name},position="{pos}"', n) for pos, n in sorted(self.accepted_per_pos.items())],
            )
        return "\n".join(out) + "\n"


def finished_reason(outcome: str, result: Any = None) -> str | None:
    """vLLM's ``finished_reason`` of a request that ended with ``outcome`` (and ``result`` when ``ok``), or ``None``
    for a refused one (see :data:`FINISHED_REASONS`)."""
    if outcome == "ok":
        return "length" if result is not None and result.finish_reason == "length" else "stop"
    return {"cancelled": "abort", "error": "error"}.get(outcome)


def speculative_decoding(stats: dict[str, Any]) -> dict[str, Any]:
    """One answer's acceptance in the shape vLLM reports speculative decoding: draft rounds, draft tokens, accepted
    tokens, accepted tokens per position (0-based), the mean acceptance length (1 + accepted / drafts: each round
    also yields one token of the verifier's) and the draft acceptance rate. A method that drafts nothing (Floor, the
    drafter alone) has zeros."""
    drafted, accepted = int(stats.get("drafted", 0)), int(stats.get("accepted", 0))
    per_pos = [int(n) for n in stats.get("accepted_per_position") or []]
    drafts = int(stats.get("steps", 0)) if drafted else 0
    return {
        "num_drafts": drafts,
        "num_draft_tokens": drafted,
        "num_accepted_tokens": accepted,
        "num_accepted_tokens_per_pos": per_pos if drafted else [],
        "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0,
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
    }
