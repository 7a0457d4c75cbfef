"""The examples of the README and the documentation pages run as written, on bundled files, and print what the
library computes.

Blocks are read from the pages themselves (``block_with(page, lang, marker)``, :mod:`docblocks`), so an edit that
breaks an example breaks this test; ``tests/test_docs.py`` checks that every runnable block is run here. Commands run
in a scratch folder that sees the checkout's ``examples/`` and ``asymspec_mm/`` (the paths the README uses),
with the checkout's ``asymspec-mm`` first on PATH; the serving examples run against a live
``asymspec-mm serve --preset tiny`` (on a free port instead of 8000, so parallel runs cannot collide).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from argv_runs import Outcome, run_codes
from conftest import start_serve, stop_serve
from docblocks import REPO, block_with, read_page

TIMEOUT_S = 300
CHART_QUESTION = ("Which bar is the tallest?", ["red", "green", "blue", "yellow"])


def env() -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    pythonpath = os.pathsep.join(p for p in (str(REPO), base.get("PYTHONPATH", "")) if p)
    bindir = str(Path(sys.executable).parent)
    base.update(
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        GRADIO_ANALYTICS_ENABLED="False",
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=pythonpath,
        PATH=bindir + os.pathsep + base.get("PATH", ""),
    )
    return base


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A scratch folder laid out like the checkout for the README's relative paths."""
    d = tmp_path_factory.mktemp("readme")
    for name in ("examples", "asymspec_mm"):
        (d / name).symlink_to(REPO / name)
    return d


@pytest.fixture(scope="module")
def tiny():
    from asymspec_mm import AsymSpecPipeline

    return AsymSpecPipeline.from_preset("tiny", device="cpu")


@pytest.fixture(scope="module")
def chart_answer(tiny) -> str:
    from asymspec_mm import mathvista_question

    return tiny.generate(REPO / "examples" / "chart.png", mathvista_question(CHART_QUESTION[0], choices=CHART_QUESTION[1])).text


def minivista_chart_is_answered(answer: str) -> bool:
    """Whether ``answer`` is right about ``examples/chart.png`` (MiniVista's first bundled problem) and
    reads as MiniVista's reference answer (which bar, not some shape)."""
    from asymspec_mm.eval import minivista as mv

    problem = mv.example_problems()[0]
    from PIL import Image

    with Image.open(REPO / "examples" / "chart.png") as chart:  # chart.png is this problem's image
        assert chart.convert("RGB").tobytes() == problem["decoded_image"].convert("RGB").tobytes()
    assert (problem["question"], problem["choices"]) == CHART_QUESTION
    return mv.is_correct(answer, problem) and answer == problem["response"]


def sh(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, shell=True, cwd=cwd, env=env(), capture_output=True, text=True, timeout=TIMEOUT_S)


def readme_setup() -> str:
    """The README example's set-up lines (``pipe``, ``question``): its block up to the ``generate`` call."""
    return block_with("README.md", "python", 'AsymSpecPipeline.from_preset("tiny")').split("res = pipe.generate")[0]


@pytest.fixture(scope="module")
def page_programs(workdir) -> dict[str, Outcome]:
    """The README's and the documentation pages' Python examples that load the tiny pair themselves, each run as
    ``python -c`` runs it (a namespace of its own) in the scratch folder, all in one process (:mod:`argv_runs`: the
    imports paid once); name -> what it printed and its status."""
    codes = {
        "readme": block_with("README.md", "python", 'AsymSpecPipeline.from_preset("tiny")'),
        "request": readme_setup() + block_with("docs/python-api.md", "python", "req = req.checked()") + "print(repr(res.text))\n",
        "sampling": readme_setup()
        + block_with("docs/algorithm.md", "python", "temperature=0.7")
        + "print(res.stats['seed'], repr(res.text))\n",
        "standin": block_with("docs/qwen-files.md", "python", "build_standin_pair")
        + "print(type(pipe).__name__, pipe.verifier.config.vocab_size)\n",
        "attribution": block_with("docs/attribution.md", "python", "pipe.attribute(res, position, grid=8)"),
    }
    return dict(zip(codes, run_codes(list(codes.values()), cwd=workdir, env=env(), timeout=TIMEOUT_S)))


def test_the_python_example_runs_and_answers_as_the_library(page_programs, chart_answer):
    code = block_with("README.md", "python", 'AsymSpecPipeline.from_preset("tiny")')
    proc = page_programs["readme"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == chart_answer
    assert f"# {chart_answer}" in code  # the comment in the example shows the real answer
    assert minivista_chart_is_answered(chart_answer)  # with the OCR text in the layout the pair was trained on


def test_every_command_line_example_runs(workdir, tiny, chart_answer):
    lines = [ln for ln in block_with("docs/cli.md", "bash", "--choices red green blue yellow --preset tiny\n").splitlines() if ln.strip()]
    assert len(lines) == 3
    assert block_with("README.md", "bash", "asymspec-mm generate").strip() == lines[0]  # the README's one line is the first
    text = sh(lines[0], workdir)
    assert text.returncode == 0, text.stderr[-3000:]
    assert f"answer: {chart_answer}\n" in text.stdout
    assert "warning" not in text.stderr  # a MiniVista question about a MiniVista image
    assert "settings: method=asymspec k=4 beta=1.0 gamma=0.5 gate=cda" in text.stdout
    as_json = sh(lines[1], workdir)
    assert as_json.returncode == 0, as_json.stderr[-3000:]
    result = json.loads(as_json.stdout)
    assert result["method"] == "floor" and result["trace"] and all(e["verifier_text"] == e["text"] for e in result["trace"])
    batch = sh(lines[2], workdir)
    assert batch.returncode == 0, batch.stderr[-3000:]
    answers = {r["id"]: r["answer"] for r in map(json.loads, (workdir / "answers.jsonl").read_text().splitlines())}
    assert answers["tallest"] == chart_answer and set(answers) == {"tallest", "green-value", "angle"}


def test_the_batch_section_example_runs(workdir, chart_answer):
    line = next(ln for ln in block_with("docs/cli.md", "bash", "--batch-size 8 --trace").splitlines() if ln.strip())
    proc = sh(line, workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(r) for r in (workdir / "answers.jsonl").read_text().splitlines()]
    assert {r["id"] for r in rows} == {"tallest", "green-value", "angle"} and all(r["trace"] for r in rows)
    assert next(r for r in rows if r["id"] == "tallest")["answer"] == chart_answer


def test_the_request_object_example_runs(page_programs, tiny):
    """The Python API page's request object, after the README example's set-up lines: set up and run directly, then
    through a scheduler, both answering as ``pipe.generate`` with the same settings."""
    proc = page_programs["request"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    from asymspec_mm import mathvista_question

    question = mathvista_question(CHART_QUESTION[0], choices=CHART_QUESTION[1])
    expected = tiny.generate(REPO / "examples" / "chart.png", question, k=4, max_new_tokens=32)
    assert proc.stdout.endswith(f"{expected.text}\n{expected.text!r}\n")


def test_the_sampling_example_runs_and_repeats_its_seed(page_programs, tiny):
    """The algorithm page's sampled request, after the README example's set-up lines (``pipe``, ``question``): the
    example draws the tokens this process draws for the same seed."""
    proc = page_programs["sampling"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    from asymspec_mm import mathvista_question

    question = mathvista_question(CHART_QUESTION[0], choices=CHART_QUESTION[1])
    expected = tiny.generate(REPO / "examples" / "chart.png", question, temperature=0.7, top_p=0.8, seed=1)
    assert proc.stdout.strip() == f"1 {expected.text!r}"


def test_the_minivista_eval_example_runs(workdir):
    line = next(ln for ln in block_with("docs/mathvista.md", "bash", "--dataset minivista --preset tiny").splitlines() if ln.strip())
    proc = sh(line, workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = workdir / "runs" / "minivista"
    records = [json.loads(r) for r in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 4 * 3 and (out / "report.md").is_file()


def test_the_standin_example_builds_and_loads(page_programs):
    proc = page_programs["standin"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["AsymSpecPipeline", "151936"]  # the real vocabulary's logits


@pytest.fixture(scope="module")
def server(workdir):
    """``asymspec-mm serve --preset tiny`` as the README and the Serving page start it, on a free port; yields its base URL."""
    line = next(ln for ln in block_with("docs/serving.md", "bash", "asymspec-mm serve --preset tiny").splitlines() if "--preset tiny" in ln)
    assert block_with("README.md", "bash", "asymspec-mm serve --preset tiny").strip() == line  # the README starts it the same way
    cmd = shlex.split(line)
    cmd = [c for c in cmd if not c.startswith("#")][: cmd.index("--preset") + 2] + ["--port", "0"]
    proc, url = start_serve(cmd, workdir, env())
    yield url
    stop_serve(proc)


def test_the_openai_client_example_runs(server, workdir, tiny):
    code = block_with("docs/serving.md", "python", 'return_trace": True').replace("http://127.0.0.1:8000", server)
    proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from asymspec_mm import mathvista_question

    expected = tiny.generate(
        REPO / "examples" / "chart.png", mathvista_question(*CHART_QUESTION[:1], choices=CHART_QUESTION[1]), max_new_tokens=64
    )
    assert proc.stdout.startswith(expected.text + " ")
    assert minivista_chart_is_answered(expected.text)


def test_the_responses_example_calls_and_answers(server, workdir):
    """The Serving page's Responses API example: a forced function_call, its output sent back with
    previous_response_id, the answer streamed as Responses events."""
    code = block_with("docs/serving.md", "python", "client.responses.create(").replace("http://127.0.0.1:8000", server)
    proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    kind, name, arguments = lines[0].split(" ", 2)
    assert (kind, name) == ("function_call", "add") and set(json.loads(arguments)) == {"a", "b"}
    status, total = lines[-1].split()
    assert status in ("completed", "incomplete") and int(total) > 0


def test_the_completions_example_answers_and_follows_the_choice(server, workdir):
    """The Serving page's completions example: a text prompt with logprobs, then a streamed answer that the
    structured_outputs choice holds to one of its strings."""
    code = block_with("docs/serving.md", "python", "client.completions.create(").replace("http://127.0.0.1:8000", server)
    proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    finish, total, _ = lines[0].split(" ", 2)
    assert finish in ("stop", "length") and int(total) > 0
    assert lines[-1] in ("7", "9")


def test_the_curl_example_streams_the_answer(server, workdir, tiny):
    command = block_with("docs/serving.md", "bash", "curl -s").replace("http://127.0.0.1:8000", server)
    given = json.loads(re.search(r'"asymspec": (\{.*?\})\}', command).group(1))  # the view the example passes
    proc = sh(command, workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    chunks = [json.loads(ln[6:]) for ln in proc.stdout.splitlines() if ln.startswith("data: {")]
    assert proc.stdout.rstrip().endswith("data: [DONE]") and chunks
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    from asymspec_mm import mathvista_question

    expected = tiny.generate(
        REPO / "examples" / "chart.png",
        mathvista_question(CHART_QUESTION[0], choices=CHART_QUESTION[1]),
        caption=given["caption"],
        ocr=given["ocr"],
        max_new_tokens=64,
    )
    assert text == expected.text
    assert minivista_chart_is_answered(text)  # the text MiniVista renders: the pair reads it right


def test_the_conversation_example_equals_pipe_chat(server, workdir, tiny):
    """The Conversations page's three-turn conversation through the server: each answer and prompt length equal ``pipe.chat`` of
    the same messages, and the later turns reuse the earlier ones' KV (``cached_tokens``)."""
    import ast

    from PIL import Image

    code = block_with("docs/conversations.md", "python", "prompt_tokens_details.cached_tokens").replace("http://127.0.0.1:8000", server)
    proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = [line.rsplit(" ", 2) for line in proc.stdout.splitlines()]
    assert len(printed) == 3
    chart = Image.open(REPO / "examples" / "chart.png")
    messages: list = [{"role": "system", "content": "Answer briefly."}]
    turns = ([{"type": "image", "image": chart}, {"type": "text", "text": "Which bar is the tallest?"}], "And which is the shortest?")
    for turn, (answer, prompt_tokens, _cached) in zip((*turns, "How many bars are there?"), printed):
        messages.append({"role": "user", "content": turn})
        want = tiny.chat(messages, ocr=False, max_new_tokens=24)
        assert ast.literal_eval(answer) == want.text and int(prompt_tokens) == want.prompts.verifier_ids.shape[1]
        messages.append({"role": "assistant", "content": want.text})
    assert int(printed[1][2]) > int(printed[0][2]) and int(printed[2][2]) > int(printed[0][2])


def test_the_smolagents_example_runs(server, workdir):
    pytest.importorskip("smolagents")
    code = block_with("docs/conversations.md", "python", "from smolagents import CodeAgent").replace("http://127.0.0.1:8000", server)
    proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("steps") and int(proc.stdout.split()[-2]) >= 3  # the task and at least two steps


def test_the_tools_example_calls_and_answers(server, workdir):
    """The Conversations page's forced tool call through the server, its result sent back as a tool message, then an answer."""
    code = block_with("docs/conversations.md", "python", 'tool_choice="required",\n').replace("http://127.0.0.1:8000", server)
    proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = proc.stdout.splitlines()[:2]
    reason, name, arguments = first.split(" ", 2)
    assert (reason, name) == ("tool_calls", "add") and set(json.loads(arguments)) == {"a", "b"}
    assert second.split(" ", 1)[0] in ("stop", "length", "tool_calls")


def test_the_openai_agents_example_runs(server, workdir):
    pytest.importorskip("agents")
    code = block_with("docs/conversations.md", "python", "from agents import").replace("http://127.0.0.1:8000", server)
    proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert " items; " in proc.stdout and int(proc.stdout.split()[0]) >= 3  # the call, its output, the answer


def test_the_tiny_agent_example_solves_its_task(server, workdir):
    """The smolagents ToolCallingAgent example (Conversations page and README alike) solves its held-out MiniVista agent
    task through the server: the gold call with the image's values, then final_answer with the tool's result."""
    pytest.importorskip("smolagents")
    from asymspec_mm.eval.minivista_agent import make_agent_problem

    code = block_with("docs/conversations.md", "python", "from smolagents import OpenAIServerModel, ToolCallingAgent")
    assert code in read_page("README.md")  # the README's copy is the same text
    proc = subprocess.run(
        [sys.executable, "-c", code.replace("http://127.0.0.1:8000", server)],
        cwd=workdir,
        env=env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    task = make_agent_problem(1, 2)
    calls = [(task["gold_call"]["name"], task["gold_call"]["arguments"]), ("final_answer", {"answer": task["answer"]})]
    assert proc.stdout.splitlines()[-2:] == [f"{task['question']} {calls}", f"answer {task['answer']} expected {task['answer']}"]


def test_the_attribution_page_runs_and_its_images_are_what_it_writes(workdir, page_programs):
    from PIL import Image

    proc = page_programs["attribution"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "The triangle is yellow, so the answer is (D)." and lines[1] == " yellow accepted delta 4.08"
    assert lines[2] == "(32, 96, 64, 128) +4.23"  # the triangle's cell, as the page's comments say
    for made, committed in (("yellow_image0.png", "attribution_yellow.png"), ("yellow_image0_heat.png", "attribution_yellow_heat.png")):
        assert Image.open(workdir / "heatmaps" / made).tobytes() == Image.open(REPO / "docs" / committed).tobytes()
    command = block_with("docs/attribution.md", "bash", "asymspec-mm explain").strip()
    run = sh(command, workdir)
    assert run.returncode == 0, run.stderr[-3000:]
    trace = json.loads((workdir / "runs" / "explain" / "trace.json").read_text())
    assert [a["position"] for a in trace["attributions"]] == [3]  # the steered " yellow"
    assert (workdir / "runs" / "explain" / "trace_tok3_image0.png").is_file()
