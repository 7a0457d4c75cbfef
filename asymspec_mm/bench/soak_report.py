"""What the soak benchmark (``asymspec_mm.bench.soak``) reports: per phase, requests/s, time to first token and the
gaps between streamed chunks (percentiles), the cached share of each turn's prompt, the failures by outcome (5xx
counted apart), whether each session's turns found the turn before in their replica's cache; per failover event,
the requests it cost and the time until requests succeeded again. Pure functions of the request records."""

from __future__ import annotations

from collections import Counter
from typing import Any

from .soak_session import TURNS, RequestRecord

#: Tokens of the previous turn's prompt a turn on the same replica may still miss: what the chat template writes
#: differently once the answer is history (6 for the tiny pair; a tool call's turn a few more).
TEMPLATE_SLACK = 16
PERCENTILES = (50, 90, 99)


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile of ``values`` (None when empty)."""
    if not values:
        return None
    ranked = sorted(values)
    return ranked[min(len(ranked) - 1, max(0, int(round(q / 100 * len(ranked) + 0.5)) - 1))]


def spread_ms(values: list[float]) -> dict[str, float | None]:
    """``{"p50", "p90", "p99"}`` of seconds ``values``, in milliseconds."""
    return {f"p{q}": (None if (v := percentile(values, q)) is None else round(v * 1000, 1)) for q in PERCENTILES}


def by_session(records: list[RequestRecord]) -> dict[str, list[RequestRecord]]:
    """Records grouped by session, each group in turn order."""
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        groups.setdefault(r.session, []).append(r)
    return {k: sorted(v, key=lambda r: r.turn) for k, v in groups.items()}


def stayed_turns(records: list[RequestRecord]) -> tuple[int, int]:
    """(continuing turns that found the previous turn's prompt in their replica's cache, continuing turns): a turn
    that changed replica misses the whole conversation past what every session shares."""
    stayed = total = 0
    for turns in by_session(records).values():
        for before, after in zip(turns, turns[1:]):
            if before.ok and after.ok:
                total += 1
                stayed += after.cached_tokens >= before.prompt_tokens - TEMPLATE_SLACK
    return stayed, total


def cached_share_by_turn(records: list[RequestRecord]) -> list[float | None]:
    """For turns 1..TURNS, cached tokens over prompt tokens summed over the successful requests of that turn."""
    shares = []
    for turn in range(1, TURNS + 1):
        done = [r for r in records if r.ok and r.turn == turn]
        prompt = sum(r.prompt_tokens for r in done)
        shares.append(round(sum(r.cached_tokens for r in done) / prompt, 3) if prompt else None)
    return shares


def examples(records: list[RequestRecord]) -> dict[str, str]:
    """The first failure's message of each failed outcome."""
    out: dict[str, str] = {}
    for r in sorted(records, key=lambda r: r.end):
        if not r.ok:
            out.setdefault(r.outcome, r.detail)
    return out


def phase_summary(records: list[RequestRecord], seconds: float, served: list[int]) -> dict[str, Any]:
    """One phase's figures: ``records`` its requests, ``seconds`` its wall time, ``served`` each replica's count of
    requests taken in it (from their /metrics)."""
    ok = [r for r in records if r.ok]
    outcomes = Counter(r.outcome for r in records if not r.ok)
    stayed, continuing = stayed_turns(records)
    return {
        "seconds": round(seconds, 1),
        "sessions": len(by_session(records)),
        "requests": len(records),
        "ok": len(ok),
        "failed": len(records) - len(ok),
        "failures": dict(sorted(outcomes.items())),
        "failure_examples": examples(records),
        "five_xx": sum(1 for r in records if (r.status or 0) >= 500),
        "requests_per_s": round(len(ok) / seconds, 3) if seconds > 0 else None,
        "completion_tokens_per_s": round(sum(r.completion_tokens for r in ok) / seconds, 2) if seconds > 0 else None,
        "tool_calls": sum(r.tool_calls for r in ok),
        "ttft_ms": spread_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "itl_ms": spread_ms([gap for r in ok for gap in r.itl_s]),
        "cached_share_by_turn": cached_share_by_turn(records),
        "turns_on_same_replica": [stayed, continuing],
        "replica_requests": served,
    }


def failover_cost(records: list[RequestRecord], signal_at: float, until: float) -> dict[str, Any]:
    """What one signal to a replica at ``signal_at`` cost, from the requests ending before ``until`` (the next event
    or the run's end): the failed requests (in flight at the signal and started after it), and the seconds from the
    signal to the last failure (``recovered_after_s``; None when requests still failed in the last 5 s, so that the
    router had not moved them yet)."""
    window = [r for r in records if signal_at <= r.end < until]
    failed = [r for r in window if not r.ok]
    last = max((r.end for r in failed), default=None)
    still_failing = last is not None and until - last < 5.0
    return {
        "requests": len(window),
        "failed": len(failed),
        "failed_in_flight": sum(1 for r in failed if r.start < signal_at),
        "failures": dict(sorted(Counter(r.outcome for r in failed).items())),
        "failure_examples": examples(failed),
        "recovered_after_s": None if still_failing else round((last - signal_at) if last is not None else 0.0, 2),
        "window_s": round(until - signal_at, 1),
    }


def _ms(spread: dict[str, float | None]) -> str:
    return " / ".join("–" if v is None else f"{v:.0f}" for v in spread.values())


def _shares(shares: list[float | None]) -> str:
    return " / ".join("–" if s is None else f"{s:.2f}" for s in shares)


def markdown(report: dict[str, Any]) -> str:
    """The report as the markdown tables BENCHMARKS.md and docs/deployment.md show."""
    s = report["settings"]
    lines = [
        f"{s['clients']} clients, {s['duration_s']:.0f} s ({s['keyed_s']:.0f} s with session keys, {s['keyless_s']:.0f} s "
        f"without, {s['failover_s']:.0f} s of failover), two `--preset tiny` replicas behind {s['router']}; {s['machine']}.",
        "",
        "| phase | router policy | sessions | requests | req/s | TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms "
        "| cached share, turns 1 / 2 / 3 / 4 | turns on the same replica | requests per replica | failed (5xx) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, label in (("keyed", "with `X-Session-Id`"), ("keyless", "without a key")):
        p = report["phases"].get(name)
        if p is None:
            continue
        stayed, continuing = p["turns_on_same_replica"]
        lines.append(
            f"| {label} | {s['policies'][name]} | {p['sessions']} | {p['requests']} | {p['requests_per_s']} | {_ms(p['ttft_ms'])} "
            f"| {_ms(p['itl_ms'])} | {_shares(p['cached_share_by_turn'])} | {stayed} of {continuing} "
            f"| {' + '.join(map(str, p['replica_requests']))} | {p['failed']} ({p['five_xx']}) |"
        )
    lines += [
        "",
        "| replica | resident memory at start | at the end of the steady load | prefix KV store at start | at the end |",
        "|---|---|---|---|---|",
    ]
    for i, r in enumerate(report["replicas"]):
        kv = [r.get(k) for k in ("prefix_kv_start_mb", "prefix_kv_end_mb")]
        shown = " | ".join("–" if v is None else f"{v:.0f} MB" for v in kv)
        lines.append(f"| {i} | {r['rss_start_mb']:.0f} MB | {r['rss_end_mb']:.0f} MB | {shown} |")
    if report.get("failover"):
        lines += [
            "",
            "| signal to replica 1 | requests in the window | failed (in flight) | failures | recovered after |",
            "|---|---|---|---|---|",
        ]
        for name, f in report["failover"].items():
            shown = ", ".join(f"{k}: {v}" for k, v in f["failures"].items()) or "none"
            recovered = f"{f['recovered_after_s']} s" if f["recovered_after_s"] is not None else f"not within {f['window_s']} s"
            lines.append(f"| {name} | {f['requests']} | {f['failed']} ({f['failed_in_flight']}) | {shown} | {recovered} |")
        term = report["failover"]["SIGTERM"]
        back = term["routed_to_again_after_s"]
        lines += [
            "",
            f"After SIGTERM replica 1 exited in {term['exited_after_s']} s, was restarted and ready {term['ready_again_after_s']} s "
            f"after the signal, and took requests again {back if back is not None else 'never within the phase'}"
            f"{' s' if back is not None else ''} after it; it had taken "
            f"{report['failover']['SIGKILL']['victim_requests_before']} requests when it got SIGKILL.",
        ]
    return "\n".join(lines) + "\n"
