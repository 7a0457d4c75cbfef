"""The tiny pair's out-of-domain warning (#41): one rule (:func:`asymspec_mm.request.domain.request_warnings`, only for
the tiny preset) in every path: ``res.warnings`` of ``pipe.generate`` / ``pipe.chat`` / ``generate_batch``, a log
line per request, the server's ``asymspec.warnings`` (streamed and not), the CLI. An out-of-domain request warns,
a MiniVista one does not."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asymspec_mm.eval.minivista import make_problem
from asymspec_mm.eval.minivista_agent import data_url, smolagents_requests

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""}
STORY = "Tell me a story about this picture"
MINI = make_problem(0, 0)  # a MiniVista chart and its MathVista-layout question
AGENT = make_problem(0, 0, "agent")
OPTS = {"caption": MINI["caption"], "ocr": False, "max_new_tokens": 4}


def _logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "asymspec_mm.domain" and r.levelno == logging.WARNING]


def _check(res, warned: bool) -> None:
    if warned:
        assert len(res.warnings) == 1 and "the tiny pair answers only MiniVista" in res.warnings[0], res.warnings
    else:
        assert res.warnings == []


def test_the_rule_applies_to_the_tiny_preset_only():
    from asymspec_mm.request.domain import request_warnings

    assert request_warnings("tiny", STORY, [(128, 128)]) and not request_warnings("qwen3", STORY, [(640, 480)])
    assert request_warnings("tiny", MINI["query"], [(128, 128)]) == [] and request_warnings("tiny", MINI["query"], [(64, 64)])
    smol = smolagents_requests(AGENT)[0][0][1]["content"][0]["text"]  # "New task:\n..." as smolagents sends it
    assert request_warnings("tiny", smol, [(128, 128)]) == []


def test_pipe_generate_warns_once_out_of_domain(shipped_tiny, caplog):
    caplog.set_level(logging.WARNING, logger="asymspec_mm.domain")
    res = shipped_tiny.generate(MINI["decoded_image"], STORY, **OPTS)
    _check(res, True)
    assert _logged(caplog) == res.warnings and res.as_dict()["warnings"] == res.warnings
    caplog.clear()
    _check(shipped_tiny.generate(MINI["decoded_image"], MINI["query"], **OPTS), False)
    assert _logged(caplog) == []


def test_a_custom_pair_never_warns(tiny_pipe, caplog):
    caplog.set_level(logging.WARNING, logger="asymspec_mm.domain")
    _check(tiny_pipe.generate(MINI["decoded_image"], STORY, caption="", ocr=False, max_new_tokens=2), False)
    assert _logged(caplog) == []


def test_pipe_chat_warns_out_of_domain(shipped_tiny, caplog):
    caplog.set_level(logging.WARNING, logger="asymspec_mm.domain")
    image = {"type": "image_url", "image_url": {"url": data_url(MINI["decoded_image"])}}
    story = [{"role": "user", "content": [image, {"type": "text", "text": STORY}]}]
    _check(shipped_tiny.chat(story, **OPTS), True)
    assert len(_logged(caplog)) == 1
    caplog.clear()
    _check(shipped_tiny.chat(AGENT["messages"], tools=AGENT["tools"], **OPTS), False)  # the agent family: in the domain
    smol = smolagents_requests(AGENT)[1][0]  # the task's image twice, the tool's result in a later user message
    _check(shipped_tiny.chat(smol, tools=AGENT["tools"], **{**OPTS, "caption": [MINI["caption"]] * 2}), False)
    assert _logged(caplog) == []


def test_generate_batch_warns_per_request(shipped_tiny):
    results = shipped_tiny.generate_batch(
        [{"image": MINI["decoded_image"], "question": q, "caption": MINI["caption"], "ocr": False} for q in (STORY, MINI["query"])],
        max_new_tokens=4,
    )
    _check(results[0], True)
    _check(results[1], False)


@pytest.fixture(scope="module")
def served_shipped(shipped_tiny):
    """The shipped tiny preset (what ``serve --preset tiny`` loads: ``from_preset("tiny")``, OCR off) served in a
    thread: the pair this module already loaded, instead of a second process loading it again."""
    pytest.importorskip("fastapi")
    from asymspec_mm.serve import ServerThread, create_app

    with ServerThread(create_app(shipped_tiny)) as srv:
        yield srv.url


def test_server_says_so_in_the_asymspec_object(served_shipped):
    pytest.importorskip("openai")
    from openai import OpenAI

    client = OpenAI(base_url=served_shipped + "/v1", api_key="none")
    image = {"type": "image_url", "image_url": {"url": data_url(MINI["decoded_image"])}}
    for text, warned in ((STORY, True), (MINI["query"], False)):
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": [image, {"type": "text", "text": text}]}],
            "max_tokens": 4,
            "extra_body": {"asymspec": {"caption": MINI["caption"], "ocr": False}},
        }
        got = client.chat.completions.create(**body).model_extra["asymspec"]["warnings"]
        chunks = list(client.chat.completions.create(**body, stream=True))
        streamed = [c.model_extra["asymspec"]["warnings"] for c in chunks if "warnings" in (c.model_extra.get("asymspec") or {})]
        assert streamed == [got]
        assert (len(got) == 1 and "the tiny pair answers only MiniVista" in got[0]) if warned else got == []


def _generate(image: Path, question: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "asymspec_mm.cli", "generate", "--preset", "tiny", "--ocr", "", "--max-new-tokens", "4"]
    return subprocess.run(
        [*cmd, "--image", str(image), "--question", question], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300
    )


def test_cli_warns_once_out_of_domain_and_not_in_it(tmp_path):
    image = tmp_path / "chart.png"
    MINI["decoded_image"].save(image)
    out = _generate(image, STORY)
    assert out.returncode == 0 and out.stderr.count("warning: the tiny pair answers only MiniVista") == 1, out.stderr
    out = _generate(image, MINI["query"])
    assert out.returncode == 0 and "warning" not in out.stderr, out.stderr
