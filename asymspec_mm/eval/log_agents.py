"""MiniVista's ``agent-log`` tasks through a real agent framework: the openai-agents SDK (Chat Completions, which sends
the whole history in every request) against ``asymspec-mm serve``.

A ``reader`` agent with the ``read_log`` function tool is asked to read the log: it calls the tool, the SDK runs it and
sends the output back, the agent says it is done. Then an ``answerer`` agent (no tools) gets that whole run's history
and the question about one line. The server compresses the verifier's view of every request (per request:
``extra_body={"asymspec": {"compression": ...}}``): by the question the tool output is older than the last two
messages, so the verifier reads it compressed, while the drafter reads it whole.

    python -m asymspec_mm.eval.log_agents --url http://127.0.0.1:8000 --n 10 --seed 1 --compression truncate
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..base.errors import UnknownOptionError
from ..frontend.help import terminal_text
from ..frontend.variants import parse_variants
from .agent_loop import final_number
from .minivista_log import TASK, make_log_problem


def solve(
    base_url: str,
    problem: dict[str, Any],
    asymspec: dict[str, Any],
    model_id: str = "tiny",
    http_client: Any = None,
    reader_tool_choice: str | None = None,
) -> dict[str, Any]:
    """Run one task with the two agents; ``asymspec``: the request's ``asymspec`` object (``method``,
    ``compression``, ...); ``reader_tool_choice``: the reader's first request's ``tool_choice`` (``"required"``:
    the server's grammar makes it a call; the SDK sends ``auto`` after it). Returns ``answer`` (the answerer's
    text), ``correct``, ``called`` (the reader called ``read_log``) and ``history`` (the items the answerer was
    sent, the question last)."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="unused", http_client=http_client)
    model = OpenAIChatCompletionsModel(model=model_id, openai_client=client)
    settings = ModelSettings(max_tokens=32, extra_body={"asymspec": asymspec})
    called: list[str] = []

    @function_tool
    def read_log() -> str:
        """Read the log of bar values."""
        called.append("read_log")
        return problem["table"]

    reader_settings = settings.resolve(ModelSettings(tool_choice=reader_tool_choice)) if reader_tool_choice else settings
    reader = Agent(name="reader", model=model, tools=[read_log], model_settings=reader_settings)
    answerer = Agent(name="answerer", model=model, model_settings=settings)
    config = RunConfig(tracing_disabled=True)
    first = Runner.run_sync(reader, TASK, max_turns=3, run_config=config)
    history = first.to_input_list() + [{"role": "user", "content": problem["question"]}]
    second = Runner.run_sync(answerer, history, max_turns=1, run_config=config)
    answer = str(second.final_output)
    return {
        "pid": problem["pid"],
        "answer": answer,
        "correct": final_number(answer) == problem["answer"],
        "called": called == ["read_log"],
        "history": history,
    }


def main(argv: list[str] | None = None) -> int:
    """Solve ``--n`` tasks of ``--seed`` per method; one JSON line per task, then each method's solved count."""
    from .log_eval import log_compression

    ap = argparse.ArgumentParser(description=terminal_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the server [default: %(default)s]")
    ap.add_argument("--model", default="tiny", help="the model name the server answers to [default: %(default)s]")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1, help="MiniVista seed (1: held out) [default: %(default)s]")
    ap.add_argument("--compression", default="truncate", help="truncate, llmlingua2, question-only or a spec [default: %(default)s]")
    ap.add_argument(
        "--methods",
        default="floor,drafter,asymspec",
        help="comma list of methods or variants, as the evaluation's (asymspec@bonus=gated) [default: %(default)s]",
    )
    ap.add_argument(
        "--reader-tool-choice",
        choices=("auto", "required"),
        default="required",
        help="the reader's first request (required: the server's grammar makes it a read_log call) [default: %(default)s]",
    )
    args = ap.parse_args(argv)
    compression = log_compression(args.compression)
    try:
        variants = parse_variants(args.methods)
    except UnknownOptionError as e:
        ap.error(f"--methods: {e}")
    for variant in variants:
        solved = 0
        asymspec = {"method": variant.method, **variant.config, "compression": compression}
        for i in range(args.n):
            row = solve(args.url, make_log_problem(args.seed, i), asymspec, args.model, reader_tool_choice=args.reader_tool_choice)
            solved += row["correct"]
            print(json.dumps({"method": variant.name, **{k: v for k, v in row.items() if k != "history"}}), flush=True)
        print(f"{variant.name}: solved {solved} of {args.n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
