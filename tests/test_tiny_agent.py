"""The tiny agent: the shipped pair calls MiniVista's agent tools with the image's values, end to end.

- the tokens added for tool calls change nothing of the four families' prompts, and the training requests are
  exactly what ``pipe.chat`` renders (both formats: the OpenAI tools loop and smolagents' ToolCallingAgent);
- ``eval mathvista --dataset minivista --families agent`` runs tasks as agent loops: records, resume, report;
- a smolagents ``ToolCallingAgent`` against ``serve --preset tiny`` solves tasks, and what it sends is what the pair
  was trained on.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import start_serve, stop_serve

from asymspec_mm.eval import minivista as mv
from asymspec_mm.eval.minivista_agent import SMOLAGENTS_TOOLS, make_agent_problem, openai_requests, smolagents_requests
from asymspec_mm.pipeline.presets import TINY_DIR
from asymspec_mm.tiny.agent_data import TOOL_TOKENS, agent_requests

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def shipped():
    from asymspec_mm import AsymSpecPipeline

    return AsymSpecPipeline.from_preset("tiny", ocr="none")


@pytest.fixture(scope="module")
def tiny_tokenizers():
    from transformers import AutoProcessor, AutoTokenizer

    return AutoProcessor.from_pretrained(TINY_DIR / "drafter"), AutoTokenizer.from_pretrained(TINY_DIR / "verifier")


def test_tool_tokens_are_in_the_shipped_vocabulary_and_never_fire_on_the_four_families(tiny_tokenizers):
    from asymspec_mm.request.prompts import build_prompts

    proc, tok = tiny_tokenizers
    ids = {tok.convert_tokens_to_ids(t) for t in TOOL_TOKENS}
    assert len(ids) == len(TOOL_TOKENS) and all(i >= 728 for i in ids)  # added after the corpus-built 728
    assert proc.tokenizer.get_vocab() == tok.get_vocab()
    for p in mv.generate(24, mv.HELDOUT_SEED):  # added tokens split only text that holds them: these prompts stay as they were
        pr = build_prompts(proc, tok, p["decoded_image"], mv.view_text(p), p["query"])
        seen = set(pr.verifier_ids[0].tolist()) | set(pr.drafter_full_ids[0].tolist()) | set(tok(p["response"])["input_ids"])
        assert not seen & ids, p["query"]
    request = agent_requests(make_agent_problem(1, 0), proc, tok)[0]
    assert len(request["ver"]) < 400  # the tools block: 788 tokens with the corpus BPE alone


def test_training_requests_are_what_pipe_chat_renders(shipped):
    pipe = shipped
    problem = make_agent_problem(1, 3)
    encoded = agent_requests(problem, pipe.processor, pipe.verifier_tokenizer)
    sent = [(m, problem["tools"]) for m, _ in openai_requests(problem)] + [(m, SMOLAGENTS_TOOLS) for m, _ in smolagents_requests(problem)]
    assert len(encoded) == len(sent)
    for e, (messages, tools) in zip(encoded, sent):
        n = sum(isinstance(m["content"], list) and any(p["type"] == "image_url" for p in m["content"]) for m in messages)
        view = {"caption": [problem["caption"]] * n, "ocr": [problem["ocr"]] * n}
        res = pipe.chat(messages, tools=tools, max_new_tokens=1, method="floor", **view)
        assert res.prompts.verifier_ids[0].tolist() == e["ver"].tolist(), e["family"]
        assert res.prompts.drafter_full_ids[0].tolist() == e["full"].tolist(), e["family"]
        assert res.prompts.drafter_comp_ids[0].tolist() == e["comp"].tolist(), e["family"]


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """The command in this process (its imports are paid once): (exit status, stdout, stderr)."""
    from asymspec_mm.cli.main import main

    status = main(list(args))
    seen = capsys.readouterr()
    return status, seen.out, seen.err


def test_eval_runs_agent_tasks_as_agent_loops_and_resumes(tmp_path, capsys):
    out = tmp_path / "agent"
    args = ["eval", "mathvista", "--dataset", "minivista", "--families", "agent", "--seed", "1", "--limit", "3"]
    args += ["--methods", "asymspec,floor", "--preset", "tiny", "--ocr-engine", "none", "--out", str(out), "--no-progress"]
    status, _, err = run_cli(capsys, *args)
    assert status == 0, err[-2000:]
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert sorted((r["variant"], r["pid"]) for r in records) == sorted((v, f"agent-{i}") for v in ("asymspec", "floor") for i in (1, 2, 3))
    by = {(r["variant"], r["pid"]): r for r in records}
    for i in (1, 2, 3):
        task = make_agent_problem(1, i - 1)
        mine = by["asymspec", f"agent-{i}"]
        assert mine["calls"][0] == task["gold_call"] and mine["call_valid"] and mine["arguments_correct"]
        assert mine["correct"] and mine["final"].rstrip(".").endswith(task["answer"])
        assert mine["turns"] == 2 + (task["followup"] is not None)
        if task["followup"] is not None:  # asked after the final answer, and scored by the colour it names
            named = mine["followup"].startswith(task["followup"]["response"].split(" bar")[0])  # "The yellow"
            assert mine["followup_correct"] == named, mine["followup"]
        else:
            assert mine["followup"] is None and not mine["followup_correct"]
        assert mine["cached_tokens"][1] > mine["cached_tokens"][0]  # the second request reuses the first's KV
    summary = json.loads((out / "summary.json").read_text())["variants"]
    assert summary["asymspec"]["accuracy"] == 100.0 and summary["asymspec"]["arguments_correct"] == 100.0
    assert summary["floor"]["arguments_correct"] < 100.0  # blind, the verifier guesses the values
    assert "| asymspec | 3 | 100.0 |" in (out / "report.md").read_text()
    status, said, _ = run_cli(capsys, *args, "--resume")
    assert status == 0 and "0 to run, 6 already done" in said, said[-1000:]
    assert len((out / "records.jsonl").read_text().splitlines()) == 6
    status, _, err = run_cli(capsys, *[a if a != "1" else "2" for a in args], "--resume")  # another seed: another run, refused
    assert status != 0 and "dataset.seed" in err, err[-500:]


def test_a_failing_agent_task_is_logged_and_retried_on_resume(shipped, tmp_path):
    """A task whose image does not decode fails alone: the error goes to errors.jsonl in one line, the other task's
    records are kept, a resumed run retries only the failed pair, and on_error="raise" stops at it."""
    import copy

    from asymspec_mm.base.errors import AsymSpecError
    from asymspec_mm.eval.agent_eval import run_agent_eval
    from asymspec_mm.frontend.variants import Variant

    good, broken = make_agent_problem(1, 0), copy.deepcopy(make_agent_problem(1, 1))
    for part in broken["messages"][-1]["content"]:
        if part["type"] == "image_url":
            part["image_url"]["url"] = "data:image/png;base64,iVBORw0KGgo="  # a PNG signature and nothing after it
    variants = [Variant("floor", "floor", {"max_new_tokens": 48})]
    records, logged = tmp_path / "records.jsonl", []
    done = run_agent_eval(shipped, [good, broken], variants, records, identity={"run": 1}, log=logged.append)
    assert [r["pid"] for r in done] == [good["pid"]]
    errors = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert [(e["pid"], e["variant"]) for e in errors] == [(broken["pid"], "floor")] and "image" in errors[0]["error"].lower()
    assert any(line.startswith(f"error: floor pid {broken['pid']}: ") and "--resume retries it" in line for line in logged)
    again = run_agent_eval(shipped, [good, broken], variants, records, identity={"run": 1}, resume=True, log=logged.append)
    assert "1 to run, 1 already done" in logged and [r["pid"] for r in again] == [good["pid"]]
    with pytest.raises(AsymSpecError):
        run_agent_eval(shipped, [broken], variants, tmp_path / "b" / "records.jsonl", identity={"run": 2}, on_error="raise")


@pytest.fixture(scope="module")
def served_tiny():
    """``serve --preset tiny`` as a user starts it (the drafter captions each image, RapidOCR reads it)."""
    cmd = [sys.executable, "-m", "asymspec_mm.cli", "serve", "--preset", "tiny", "--port", "0", "--log-level", "warning"]
    proc, url = start_serve(cmd, ROOT, ENV)
    try:
        yield url
    finally:
        stop_serve(proc)


def _pixels(messages: list[dict]) -> list[dict]:
    """``messages`` with each data-URL image replaced by its decoded pixels' bytes (two PNG writers may differ)."""
    import base64
    import io

    from PIL import Image

    def part(p: dict) -> dict:
        if p.get("type") != "image_url":
            return p
        raw = base64.b64decode(p["image_url"]["url"].split(",", 1)[1])
        return {"type": "image", "pixels": Image.open(io.BytesIO(raw)).convert("RGB").tobytes()}

    return [{**m, "content": [part(p) for p in m["content"]]} if isinstance(m["content"], list) else m for m in messages]


def test_smolagents_tool_calling_agent_solves_agent_tasks_as_trained(served_tiny):
    """A smolagents ToolCallingAgent with the family's tools solves held-out tasks through the server: it calls the
    right tool with the image's values, gets the result, and calls final_answer with it. What it sends is exactly
    what the pair was trained on (smolagents_requests)."""
    pytest.importorskip("smolagents")
    import httpx

    from asymspec_mm.eval.agent_smolagents import make_agent, solve

    for i in (1, 3):  # a two-digit result (10, copied as two tokens) and a one-digit one (17 of the first 20: RESULTS.md)
        problem = make_agent_problem(mv.HELDOUT_SEED, i)
        bodies: list[dict] = []
        http = httpx.Client(event_hooks={"request": [lambda r, sent=bodies: sent.append(json.loads(r.read()))]})
        row = solve(make_agent(served_tiny, client_kwargs={"http_client": http}), problem)
        assert row["correct"] and row["arguments_correct"], row
        assert row["calls"] == [problem["gold_call"], {"name": "final_answer", "arguments": {"answer": problem["answer"]}}]
        assert len(bodies) == 2 and all(b["tool_choice"] == "required" and b["tools"] == SMOLAGENTS_TOOLS for b in bodies)
        made = bodies[1]["messages"][2]["content"][0]["text"]
        call_id = made.split("'id': '", 1)[1].split("'", 1)[0]
        trained = smolagents_requests(problem, call_id)
        for body, (messages, _) in zip(bodies, trained):
            assert _pixels(body["messages"]) == _pixels(messages)


def test_copy_positions_are_the_final_answers_copy_of_the_tool_result(tiny_tokenizers):
    """Every digit of the result is a copy: a two-digit result after a quote is two tokens (``"``, ``1``, ``3``),
    after "the answer is" one (`` 13``)."""
    proc, tok = tiny_tokenizers
    problems = [make_agent_problem(1, i) for i in range(5, 40)]
    problems = [next(p for p in problems if len(str(p["tool_result"])) == n) for n in (1, 2)]
    for problem in problems:
        for e in agent_requests(problem, proc, tok):
            copied = [tok.decode(e["ans"][j]) for j in e["copy_idx"]]
            want = [str(problem["tool_result"])] if e["family"] in ("agent-final", "smol-final") else []
            assert (["".join(copied).strip()] if copied else []) == want, (e["family"], copied)
            if e["family"] == "smol-final":
                assert len(copied) == len(want[0]), copied
            if e["family"].endswith("-call"):  # the call's two values are the drafter's weighted readings
                got = [tok.decode(e["ans"][j]).strip() for j in e["read_idx"]]
                assert got == [str(v) for v in problem["gold_call"]["arguments"].values()]


def test_adding_the_tool_tokens_resizes_both_models(tmp_path, tiny_dirs):
    """On a pair without them (the random tiny pair): every tool token added to both tokenizers, both models' input and
    output embeddings grown to the new vocabulary, the old rows kept."""
    from asymspec_mm import AsymSpecPipeline
    from asymspec_mm.tiny.finetune import add_tokens_and_resize

    src = tiny_dirs[0].parent
    assert tiny_dirs == (src / "drafter", src / "verifier")
    sizes = add_tokens_and_resize(src, tmp_path)
    assert sizes["after"] == sizes["before"] + len(TOOL_TOKENS)
    old = AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none").models.verifier.get_input_embeddings().weight
    for role in ("drafter", "verifier"):  # the run's copy of each model, as the workers load it
        (tmp_path / role / "tokenizer.json").write_bytes((tmp_path / "tokenizer" / "tokenizer.json").read_bytes())
    from transformers import Qwen3ForCausalLM

    verifier = Qwen3ForCausalLM.from_pretrained(tmp_path / "verifier")
    assert verifier.get_input_embeddings().weight.shape[0] == sizes["after"] == verifier.get_output_embeddings().weight.shape[0]
    assert verifier.get_input_embeddings().weight[: sizes["before"]].equal(old)


def test_finetune_command_runs_its_phases_and_exports_a_loadable_pair(tmp_path):
    """The recipe's command end to end at two one-step phases from the shipped pair (its tokens are there already: none
    added), after a two-step agent-log warm-up of the drafter (one step on one-line tables, one on the family's), the
    pair exported and loaded by the pipeline."""
    from asymspec_mm.tiny.finetune import main

    out = tmp_path / "ft"
    argv = ["--from", str(TINY_DIR), "--out", str(out), "--phases", "1:1e-4:1;1:1e-4:4:2", "--log-warmup", "1,1"]
    argv += ["--eval-n", "0", "--batch", "4", "--eval-every", "1000"]
    argv += ["--monitor-n", "4", "--monitor-tasks", "1"]  # the EVAL lines: one held-out problem of each family, one task
    assert main(argv) == 0
    log = (out / "_work" / "finetune.log").read_text()
    assert f'"before": {728 + len(TOOL_TOKENS)}, "after": {728 + len(TOOL_TOKENS)}' in log
    for role in ("verifier", "drafter"):
        assert f"[{role}] EVAL step 1 " in log and f"[{role}] EVAL step 2 " in log  # one line per phase's end
    warmup = [line for line in log.splitlines() if line.startswith("[warmup]")]
    assert [line.split(" t=")[0] for line in warmup if "EVAL" in line] == ["[warmup] EVAL step 2"] * 2  # full and comp
    assert log.index("[warmup] done") < log.index("[drafter] step 0 ")  # before the phases
    from asymspec_mm import AsymSpecPipeline

    pipe = AsymSpecPipeline.from_pretrained(out / "drafter", out / "verifier", ocr="none")
    assert len(pipe.verifier_tokenizer) == 728 + len(TOOL_TOKENS)


@pytest.mark.parametrize("value", ["5", "1,x", "1,-1", "1,2,3"])
def test_a_bad_log_warmup_is_refused_in_one_line(value, capsys, tmp_path):
    from asymspec_mm.tiny.finetune import main

    with pytest.raises(SystemExit) as exc:
        main(["--from", str(TINY_DIR), "--out", str(tmp_path / "ft"), "--log-warmup", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and err[-1].endswith(f"--log-warmup {value!r}: expected SHORT,FULL (two step counts, 0 or more)")
    assert not (tmp_path / "ft").exists()  # refused before anything is written


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--families", "agent,figure"], "run the agent family on its own"),
        (["--families", "agent", "--shard", "0/2"], "--shard does not apply to --families agent"),
        (["--families", "charts"], "choose among figure, visual, geometry, mixed, or agent alone"),
        (["--dataset", "mathvista", "--families", "figure"], "needs --dataset minivista"),
    ],
)
def test_bad_families_are_refused_in_one_line(extra, words, capsys):
    from asymspec_mm.cli.main import main

    args = ["eval", "mathvista", "--dataset", "minivista", "--dry-run", *extra]
    assert main(args) != 0
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1, err


def test_families_keep_the_problems_of_those_families(capsys):
    from asymspec_mm.cli.main import main

    assert main(["eval", "mathvista", "--dataset", "minivista", "--minivista-n", "12", "--families", "figure,mixed", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("6 problems (minivista")  # 12 drawn in rotation: 3 of each family
    assert main(["eval", "mathvista", "--dataset", "minivista", "--minivista-n", "5", "--families", "agent", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("5 agent tasks (minivista seed 0) x 4 variants")
