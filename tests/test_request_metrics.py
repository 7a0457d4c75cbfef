"""vLLM's per-request speculative-decoding metrics (issue #49, item 11): every answer carries
``metrics.speculative_decoding`` at its root in the shape vLLM sends with ``--per-request-spec-decode-metrics
summary`` (and AIPerf reads), beside our own ``asymspec.speculative_decoding``.

Against ``asymspec-mm serve --preset tiny`` through the ``openai`` client, for chat completions, text completions
and the Responses API, streamed and not: each answer's object equals ours field by field (steps, drafts, accepted
drafts; the histogram's tails are our accepted-per-position counts), and the objects summed over the requests
equal the growth of the server's ``vllm:spec_decode_*`` counters. In a stream exactly one chunk carries it, the
last (the usage chunk; the Responses API's final event), as vLLM sends it. With AIPerf installed (``$AIPERF``,
``.venv-aiperf`` or ``aiperf`` on PATH; skipped otherwise) AIPerf's own parsing turns a real answer into its acceptance record.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from asymspec_mm.bench.serving import chat_content
from asymspec_mm.eval.minivista import make_problem
from asymspec_mm.frontend.prometheus import parse_prometheus
from asymspec_mm.serve.request_metrics import acceptance_histogram, vllm_speculative_decoding

openai = pytest.importorskip("openai")

#: The fields and JSON types of vLLM's summary-level object (vLLM's docs, "Per-Request Acceptance Metrics").
VLLM_FIELDS = {
    "mean_acceptance_length": float,
    "draft_acceptance_rate": float,
    "acceptance_histogram": list,
    "acceptance_histogram_by_draft_length": dict,
    "num_spec_steps": int,
    "num_accepted_draft_tokens": int,
    "num_draft_tokens": int,
    "num_spec_tokens": int,
}


# ---------------------------------------------------------------------------------------------- the object
def test_vllms_documented_example_is_reproduced_from_our_counts():
    """vLLM's example answer: 43 steps of 3 drafts, 39 accepting none, 1 one, 3 all three (10 accepted of 129)."""
    stats = {"steps": 43, "drafted": 129, "accepted": 10, "accepted_per_position": [4, 3, 3]}
    assert vllm_speculative_decoding(stats, 3) == {
        "mean_acceptance_length": 1.2325581395348837,
        "draft_acceptance_rate": 0.07751937984496124,
        "acceptance_histogram": [39, 1, 0, 3],
        "acceptance_histogram_by_draft_length": {"3": [39, 1, 0, 3]},
        "num_spec_steps": 43,
        "num_accepted_draft_tokens": 10,
        "num_draft_tokens": 129,
        "num_spec_tokens": 3,
    }
    assert acceptance_histogram([2, 2], 2, 2) == [0, 0, 2] and acceptance_histogram([], 0, 4) == [0] * 5


def test_an_answer_that_drafts_nothing_has_zero_steps():
    """Floor's steps put no draft to the gate: not speculative steps (vLLM omits them), an all-zero histogram."""
    floor = {"steps": 12, "drafted": 0, "accepted": 0, "accepted_per_position": [0, 0, 0, 0]}
    obj = vllm_speculative_decoding(floor, 4)
    assert obj["acceptance_histogram"] == [0] * 5 and obj["num_spec_steps"] == 0 and obj["num_draft_tokens"] == 0
    assert (obj["mean_acceptance_length"], obj["draft_acceptance_rate"], obj["acceptance_histogram_by_draft_length"]) == (1.0, 0.0, {})


# ---------------------------------------------------------------------------------------------- a live server
def check_against_ours(vllm: dict, ours: dict, k: int) -> None:
    """vLLM's object of one answer against ``asymspec.speculative_decoding`` of the same answer."""
    assert {name: type(value) for name, value in vllm.items()} == VLLM_FIELDS, vllm
    hist = vllm["acceptance_histogram"]
    assert len(hist) == k + 1 == vllm["num_spec_tokens"] + 1 and all(isinstance(n, int) and n >= 0 for n in hist)
    assert vllm["num_spec_steps"] == ours["num_drafts"] == sum(hist)
    assert vllm["num_draft_tokens"] == ours["num_draft_tokens"] == k * vllm["num_spec_steps"]
    assert vllm["num_accepted_draft_tokens"] == ours["num_accepted_tokens"] == sum(j * n for j, n in enumerate(hist))
    tails = [sum(hist[j + 1 :]) for j in range(k)]  # steps that accepted more than j drafts
    assert tails == (ours["num_accepted_tokens_per_pos"] or [0] * k)
    assert vllm["mean_acceptance_length"] == ours["mean_acceptance_length"]
    assert vllm["draft_acceptance_rate"] == ours["draft_acceptance_rate"]
    assert vllm["acceptance_histogram_by_draft_length"] == ({str(k): hist} if vllm["num_spec_steps"] else {})


def spec_counters(url: str) -> dict[str, float]:
    return parse_prometheus(httpx.get(url + "/metrics", timeout=30).text)


def counter(values: dict[str, float], name: str, extra: str = "") -> float:
    return values.get(f'vllm:spec_decode_{name}_total{{model_name="tiny"{extra}}}', 0.0)


def image_message(i: int) -> list[dict]:
    query, url = chat_content(make_problem(0, i))
    return [{"role": "user", "content": [{"type": "text", "text": query}, {"type": "image_url", "image_url": {"url": url}}]}]


def chat(client, i: int, settings: dict, stream: bool) -> tuple[dict, dict, int]:
    """(vLLM's object, ours, K) of a chat answer; streamed: exactly one chunk, the last, carries ``metrics``."""
    fields = {"model": "tiny", "messages": image_message(i), "max_tokens": 40, "extra_body": {"asymspec": settings, "ignore_eos": True}}
    if not stream:
        resp = client.chat.completions.create(**fields)
        info = resp.model_extra["asymspec"]
        return resp.model_extra["metrics"]["speculative_decoding"], info["speculative_decoding"], info["config"]["k"]
    chunks = list(client.chat.completions.create(**fields, stream=True, stream_options={"include_usage": True}))
    carriers = [c for c in chunks if (c.model_extra or {}).get("metrics") is not None]
    assert carriers == [chunks[-1]] and chunks[-1].usage is not None and chunks[-1].choices == []
    info = next(c.model_extra["asymspec"] for c in chunks if c.choices and c.choices[0].finish_reason)
    return chunks[-1].model_extra["metrics"]["speculative_decoding"], info["speculative_decoding"], info["config"]["k"]


def completion(client, settings: dict, stream: bool) -> tuple[dict, dict, int]:
    fields = {"model": "tiny", "prompt": "Which bar is the tallest?", "max_tokens": 24, "extra_body": {"asymspec": settings}}
    if not stream:
        resp = client.completions.create(**fields)
        info = resp.model_extra["asymspec"]
        return resp.model_extra["metrics"]["speculative_decoding"], info["speculative_decoding"], info["config"]["k"]
    chunks = list(client.completions.create(**fields, stream=True, stream_options={"include_usage": True}))
    carriers = [c for c in chunks if (c.model_extra or {}).get("metrics") is not None]
    assert carriers == [chunks[-1]] and chunks[-1].usage is not None and chunks[-1].choices == []
    info = next(c.model_extra["asymspec"] for c in chunks if c.choices and c.choices[0].finish_reason)
    return chunks[-1].model_extra["metrics"]["speculative_decoding"], info["speculative_decoding"], info["config"]["k"]


def response(client, i: int, settings: dict, stream: bool) -> tuple[dict, dict, int]:
    query, url = chat_content(make_problem(0, i))
    content = [{"type": "input_text", "text": query}, {"type": "input_image", "image_url": url}]
    fields = {
        "model": "tiny",
        "input": [{"role": "user", "content": content}],
        "max_output_tokens": 32,
        "extra_body": {"asymspec": settings},
    }
    if not stream:
        resp = client.responses.create(**fields)
    else:
        events = list(client.responses.create(**fields, stream=True))
        carriers = [e for e in events if getattr(e, "response", None) is not None and e.response.model_extra.get("metrics")]
        assert carriers == [events[-1]] and events[-1].type in ("response.completed", "response.incomplete")
        resp = events[-1].response
    info = resp.model_extra["asymspec"]
    return resp.model_extra["metrics"]["speculative_decoding"], info["speculative_decoding"], info["config"]["k"]


def test_every_answer_carries_vllms_object_equal_to_ours_and_to_the_counters(served_tiny):
    client = openai.OpenAI(base_url=served_tiny + "/v1", api_key="unused", max_retries=0)
    before = spec_counters(served_tiny)
    asym = {"method": "asymspec", "ocr": False}
    answers = [
        chat(client, 0, {**asym, "k": 3}, stream=False),
        chat(client, 1, {**asym, "k": 4}, stream=True),
        chat(client, 2, {"method": "sd", "k": 2, "ocr": False}, stream=True),
        chat(client, 3, {"method": "floor", "ocr": False}, stream=False),
        completion(client, {"method": "asymspec", "k": 5}, stream=False),
        completion(client, {"method": "sd", "k": 3}, stream=True),
        response(client, 4, asym, stream=False),
        response(client, 5, {**asym, "k": 2}, stream=True),
    ]
    after = spec_counters(served_tiny)
    for vllm, ours, k in answers:
        check_against_ours(vllm, ours, k)
    assert answers[3][0]["num_spec_steps"] == 0 and all(a[0]["num_spec_steps"] > 0 for a in answers if a is not answers[3])
    assert any(a[0]["num_accepted_draft_tokens"] > 0 for a in answers)  # the tiny pair accepts on MiniVista problems
    # summed over the answers: the growth of vLLM's counters, which count the same steps server-wide
    for field, name in [("num_spec_steps", "num_drafts"), ("num_draft_tokens", "num_draft_tokens")] + [
        ("num_accepted_draft_tokens", "num_accepted_tokens")
    ]:
        assert sum(a[0][field] for a in answers) == counter(after, name) - counter(before, name), name
    for pos in range(max(k for *_, k in answers)):
        summed = sum(sum(v["acceptance_histogram"][pos + 1 :]) for v, _, _ in answers)
        extra = f',position="{pos}"'
        assert summed == counter(after, "num_accepted_tokens_per_pos", extra) - counter(before, "num_accepted_tokens_per_pos", extra)


def test_the_object_is_null_for_several_choices_and_absent_from_a_stream_without_usage(served_tiny):
    """vLLM reports one generation stream: ``n > 1`` gets ``null``; without ``include_usage`` no chunk carries it."""
    client = openai.OpenAI(base_url=served_tiny + "/v1", api_key="unused", max_retries=0)
    fields = {"model": "tiny", "messages": [{"role": "user", "content": "Which bar is the tallest?"}], "max_tokens": 6}
    resp = client.chat.completions.create(**fields, n=2)
    assert resp.model_extra["metrics"] == {"speculative_decoding": None}
    resp = client.completions.create(model="tiny", prompt="Which bar?", max_tokens=4, n=2)
    assert resp.model_extra["metrics"] == {"speculative_decoding": None}
    chunks = list(client.chat.completions.create(**fields, stream=True))
    assert chunks and not any("metrics" in (c.model_extra or {}) for c in chunks)


# ---------------------------------------------------------------------------------------------- AIPerf reads it
def aiperf_python() -> Path | None:
    """The interpreter AIPerf is installed in: ``$AIPERF_PYTHON``, else the one beside the ``aiperf`` command that
    scripts/aiperf_bench.sh would run (``$AIPERF``, ``.venv-aiperf/bin/aiperf`` or ``aiperf`` on PATH)."""
    if os.environ.get("AIPERF_PYTHON"):
        return Path(os.environ["AIPERF_PYTHON"])
    local = Path(__file__).resolve().parents[1] / ".venv-aiperf" / "bin" / "aiperf"
    found = os.environ.get("AIPERF") or (str(local) if local.exists() else shutil.which("aiperf"))
    return Path(shutil.which(found) or found).parent / "python" if found else None


_AIPERF = aiperf_python()
needs_aiperf = pytest.mark.skipif(
    _AIPERF is None or not _AIPERF.exists(), reason="AIPerf is not installed (pip install aiperf into .venv-aiperf, or set AIPERF)"
)

#: Run in AIPerf's interpreter: its chat endpoint's capture of the payload, then its record parser (adapter
#: auto-detection and the record's own validators), over the answer's JSON objects read from stdin.
AIPERF_READS = """
import json, sys
from aiperf.common.models import ParsedResponse
from aiperf.endpoints.base_endpoint import BaseEndpoint
from aiperf.records.inference_result_parser import InferenceResultParser
parsed = []
for i, obj in enumerate(json.loads(sys.stdin.read())):
    stats = BaseEndpoint.extract_spec_decode_stats(obj)
    parsed.append(ParsedResponse(perf_ns=i, data=None, usage=obj.get("usage"), spec_decode_stats=stats))
record = InferenceResultParser._extract_spec_decode_acceptance(parsed)
print(json.dumps(None if record is None else record.model_dump(mode="json")))
"""


def aiperf_record(objects: list[dict]) -> dict | None:
    proc = subprocess.run([str(_AIPERF), "-c", AIPERF_READS], input=json.dumps(objects), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_aiperf
def test_aiperf_parses_a_real_answer_into_its_acceptance_record(served_tiny):
    body = {"model": "tiny", "messages": image_message(6), "max_tokens": 40, "asymspec": {"method": "asymspec", "k": 4, "ocr": False}}
    whole = httpx.post(served_tiny + "/v1/chat/completions", json=body, timeout=300).json()
    streamed = httpx.post(
        served_tiny + "/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}, timeout=300
    )
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    for objects in ([whole], chunks):
        record = aiperf_record(objects)
        ours = objects[-1]["metrics"]["speculative_decoding"]
        assert record is not None, "AIPerf found no acceptance record"
        assert record["engine"] == "vllm" and record["num_spec_tokens"] == 4
        for name in ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens", "mean_acceptance_length", "draft_acceptance_rate"):
            assert record[name] == ours[name], name
        assert record["acceptance_histogram"] == {str(j): n for j, n in enumerate(ours["acceptance_histogram"]) if n}
        assert record["completion_tokens"] == objects[-1]["usage"]["completion_tokens"]
    # before this server sent vLLM's object, AIPerf found nothing to read in the same answer
    assert aiperf_record([{k: v for k, v in whole.items() if k != "metrics"}]) is None
