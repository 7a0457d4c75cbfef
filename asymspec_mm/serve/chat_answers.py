"""The OpenAI-shaped parts of a chat answer (the Responses API's answers reuse them): finish reason, usage, logprobs,
the ``asymspec`` object with the trace, and the streamed text deltas (held back where a stop string or an unfinished
character may still be forming)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..request.session import MMResult


def logprobs_of(trace: list[Any], tokenizer: Any, top: int, special_ids: frozenset[int] = frozenset()) -> dict[str, Any]:
    """OpenAI's ``logprobs`` object of the emitted tokens: each token's log-probability under the fused target at
    temperature 1 without filtering, ``softmax(t + beta * delta)`` (``TokenEvent.p_fused``; where nothing is fused, the
    emitting model's own softmax), and its ``top`` most likely tokens there (``TokenEvent.top_fused``; none for the
    drafter alone). Special tokens (the end of the answer) are left out, as from the message's text."""
    content = []
    for ev in trace:
        if ev.token_id in special_ids:
            continue
        content.append(
            {
                **_logprob_entry(ev.text, ev.p_fused),
                "top_logprobs": [_logprob_entry(tokenizer.decode([i]), p) for i, p in ev.top_fused[:top]],
            }
        )
    return {"content": content, "refusal": None}


def _logprob_entry(text: str, p: float | None) -> dict[str, Any]:
    import math

    logprob = math.log(p) if p is not None and p > 0 else -9999.0  # OpenAI's value for "effectively zero"
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def finish_reason(res: MMResult) -> str:
    """``tool_calls`` when the answer calls tools, ``length`` when the token budget ended decoding, else ``stop``
    (:attr:`MMResult.finish_reason`)."""
    return res.finish_reason


def message_of(res: MMResult, cid: str) -> dict[str, Any]:
    """The answer as OpenAI's assistant message: its text, or with tool calls its content (the text before the first
    call, ``None`` when empty) and the calls, their ids drawn from the completion's id ``cid`` (as streamed)."""
    if not res.tool_calls:
        return {"role": "assistant", "content": res.text}
    from ..request.tools import parse_tool_calls

    parsed = parse_tool_calls(res.text, cid, finished=not res.cut_by_budget)
    return {"role": "assistant", "content": parsed.content, "tool_calls": parsed.tool_calls}


def usage(res: MMResult) -> dict[str, int]:
    """OpenAI's usage object; ``prompt_tokens`` is the length of the verifier's prompt, ``prompt_tokens_details.
    cached_tokens`` how many of them the verifier reused from earlier requests (a conversation's earlier turns)."""
    prompt = int(res.prompts.verifier_ids.shape[1])
    cached = int(res.stats.get("cached_tokens", {}).get("verifier", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": len(res.token_ids),
        "total_tokens": prompt + len(res.token_ids),
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def total_usage(results: list[MMResult]) -> dict[str, int]:
    """The usage of a request's choices together: the prompt once, every choice's completion tokens."""
    total = usage(results[0])
    extra = sum(usage(res)["completion_tokens"] for res in results[1:])
    return {**total, "completion_tokens": total["completion_tokens"] + extra, "total_tokens": total["total_tokens"] + extra}


def trace_entry(ev: Any, tokenizer: Any) -> dict[str, Any]:
    """One token's provenance; ``verifier_argmax`` is the verifier's own token as text. A cross-family pair's entry
    also has the token's ``drafter_token_id`` (``token_id`` is the verifier's) and ``verifier_alone``."""
    argmax = ev.verifier_argmax
    two_vocab = {} if ev.drafter_token_id is None else {"drafter_token_id": ev.drafter_token_id, "verifier_alone": ev.verifier_alone}
    return {
        "index": ev.index,
        "token_id": ev.token_id,
        "text": ev.text,
        "source": ev.source,
        "step": ev.step,
        "position": ev.position,
        "p_verifier": ev.p_verifier,
        "p_base": ev.p_base,
        "jsd": ev.jsd,
        "gamma_eff": ev.gamma_eff,
        "verifier_argmax": None if argmax is None else tokenizer.decode([argmax]),
        "verifier_argmax_id": argmax,
        "steered": ev.steered,
        **two_vocab,
    }


def asymspec_object(res: MMResult, tokenizer: Any, return_trace: bool) -> dict[str, Any]:
    """The ``"asymspec"`` object of a response: method, settings, stats, the acceptance in vLLM's speculative-decoding
    shape (:func:`~asymspec_mm.serve.metrics.speculative_decoding`), the compressed view, the request's ``warnings``
    (:attr:`MMResult.warnings`), the trace."""
    from .metrics import speculative_decoding

    out = {
        "warnings": res.warnings,
        "method": res.method,
        "config": res.config.as_dict(),
        "stats": {k: v for k, v in res.stats.items() if k != "compressed_view"},
        "speculative_decoding": speculative_decoding(res.stats),
        "view": {"caption": res.view.caption, "ocr_text": res.view.ocr_text},
    }
    if "compressed_view" in res.stats:  # per-turn compression: each compressed message as the verifier read it
        out["view"]["messages"] = res.stats["compressed_view"]
    if return_trace:
        out["trace"] = [trace_entry(ev, tokenizer) for ev in res.trace]
    return out


def _stop_truncated(text: str, stop_strings: tuple[str, ...]) -> str:
    """``text`` cut at its stop strings exactly as :func:`~asymspec_mm.request.session.session_result` cuts the answer."""
    for s in stop_strings:
        if s and s in text:
            text = text[: text.index(s)]
    return text


class TextDeltas:
    """The answer's text as it grows, in pieces whose concatenation is the final ``MMResult.text``: the
    committed tokens are decoded as a whole (special tokens skipped, cut at stop strings), and an unfinished
    UTF-8 character or a possible start of a stop string is held back until the next step tells."""

    def __init__(self, tokenizer: Any, stop_strings: tuple[str, ...] = ()):
        self.tokenizer, self.stop_strings = tokenizer, stop_strings
        self.ids: list[int] = []
        self.sent = ""

    def push(self, token_ids: list[int]) -> str:
        self.ids.extend(token_ids)
        text = _stop_truncated(self.tokenizer.decode(self.ids, skip_special_tokens=True), self.stop_strings)
        text = text.rstrip("\ufffd")
        hold = max((n for s in self.stop_strings for n in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:n])), default=0)
        return self._advance(text[: len(text) - hold])

    def finish(self, final_text: str) -> str:
        return self._advance(final_text)

    def _advance(self, text: str) -> str:
        if not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta
