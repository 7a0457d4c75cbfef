"""MiniVista's agent tasks through a real agent framework: a smolagents ``ToolCallingAgent`` against
``asymspec-mm serve``.

:func:`smolagents_tools` are the family's ``add`` / ``subtract`` as smolagents tools (the schemas it sends are
:data:`~.minivista_agent.SMOLAGENTS_TOOLS`); :func:`make_agent` builds the agent on an OpenAI-compatible server with
:data:`~.minivista_agent.SMOLAGENTS_SYSTEM_PROMPT`; :func:`solve` runs one task and scores it. smolagents forces a
call on every step (``tool_choice="required"``), so the server's grammar keeps each answer a call; which tool and
which values are the models' (the values are the image's: the drafter reads them, the verifier cannot).

    python -m asymspec_mm.eval.agent_smolagents --url http://127.0.0.1:8000 --n 20 --seed 1
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..frontend.help import terminal_text
from .minivista_agent import SMOLAGENTS_SYSTEM_PROMPT, make_agent_problem, run_tool


def smolagents_tools() -> list[Any]:
    """The family's tools as smolagents ``Tool`` objects (their descriptions are :data:`~.minivista_agent.TOOLS`')."""
    from smolagents import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two whole numbers: a + b.

        Args:
            a: the first number
            b: the second number
        """
        return int(run_tool("add", {"a": a, "b": b}))

    @tool
    def subtract(a: int, b: int) -> int:
        """Subtract two whole numbers: a - b.

        Args:
            a: the first number
            b: the second number
        """
        return int(run_tool("subtract", {"a": a, "b": b}))

    return [add, subtract]


def make_agent(
    base_url: str,
    *,
    model_id: str = "tiny",
    max_steps: int = 4,
    max_tokens: int = 64,
    extra_body: dict | None = None,
    client_kwargs: dict | None = None,
) -> Any:
    """A ``ToolCallingAgent`` with :func:`smolagents_tools` on the server at ``base_url`` (``http://host:port``), its
    system prompt :data:`~.minivista_agent.SMOLAGENTS_SYSTEM_PROMPT` (the rest of its prompts are smolagents' own);
    ``client_kwargs`` go to the ``openai`` client (e.g. an ``http_client``)."""
    import importlib.resources

    import yaml
    from smolagents import OpenAIServerModel, ToolCallingAgent

    model = OpenAIServerModel(
        model_id=model_id,
        api_base=base_url.rstrip("/") + "/v1",
        api_key="unused",
        max_tokens=max_tokens,
        extra_body=extra_body or {},
        client_kwargs=client_kwargs,
    )
    templates = yaml.safe_load(importlib.resources.files("smolagents.prompts").joinpath("toolcalling_agent.yaml").read_text())
    templates["system_prompt"] = SMOLAGENTS_SYSTEM_PROMPT
    return ToolCallingAgent(tools=smolagents_tools(), model=model, max_steps=max_steps, verbosity_level=0, prompt_templates=templates)


def solve(agent: Any, problem: dict[str, Any]) -> dict[str, Any]:
    """Run ``agent`` on one task (its question and image): ``answer`` (what ``final_answer`` got, as text),
    ``correct``, ``calls`` (each step's calls, ``{"name", "arguments"}``), ``arguments_correct`` (the first call is
    the gold call) and ``steps``."""
    from smolagents.memory import ActionStep

    answer = agent.run(problem["question"], images=[problem["image"]])
    steps = [s for s in agent.memory.steps if isinstance(s, ActionStep)]
    calls = [{"name": c.name, "arguments": c.arguments} for s in steps for c in (s.tool_calls or [])]
    first = calls[0] if calls else None
    return {
        "pid": problem["pid"],
        "answer": None if answer is None else str(answer),
        "correct": answer is not None and str(answer).strip() == problem["answer"],
        "calls": calls,
        "arguments_correct": first == problem["gold_call"],
        "steps": len(steps),
    }


def main(argv: list[str] | None = None) -> int:
    """Solve ``--n`` tasks of ``--seed`` with a fresh agent each; print one JSON line per task, then the solved count."""
    ap = argparse.ArgumentParser(description=terminal_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the server [default: %(default)s]")
    ap.add_argument("--model", default="tiny", help="the model name the server answers to [default: %(default)s]")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1, help="MiniVista seed (1: held out) [default: %(default)s]")
    ap.add_argument("--start", type=int, default=0, help="first task index [default: %(default)s]")
    args = ap.parse_args(argv)
    solved = 0
    for i in range(args.start, args.start + args.n):
        row = solve(make_agent(args.url, model_id=args.model), make_agent_problem(args.seed, i))
        solved += row["correct"]
        print(json.dumps(row), flush=True)
    print(f"solved {solved} of {args.n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
