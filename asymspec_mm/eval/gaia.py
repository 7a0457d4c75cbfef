"""The paper's GAIA harness (Appendix B, Table 4) on an OpenAI-compatible AsymSpec server, through smolagents.

Web tasks (no attachment) run the smolagents ``CodeAgent`` ReAct loop with two cached tools, ``web_search`` and
``visit_webpage`` (:class:`~.gaia_data.ToolCache`: deterministic returns), at most ``max_steps`` steps; every step is
one chat request with the whole history, compressed online for the verifier: LLMLingua-2 at rate 0.3, the two most
recent messages verbatim, everything older (the system prompt included) compressed. Tasks with an attachment run
the single-shot file-QA harness: one request whose file text the verifier reads truncated to 2,000 tokens while the
drafter reads it whole; an image attachment reaches the drafter's vision tower as pixels and the verifier as its
pre-computed caption (``file_harness="react"`` runs them through the agent loop instead). K = 2, beta = 1.

The rows of Table 4: ``asymspec`` (the verifier on the compressed view, steered by the drafter on the full one),
``floor`` (the verifier alone on the compressed view), ``sd`` (speculative decoding on the full context) and
``verifier-full`` (the verifier alone on the full context, the Ceiling). Each answer is scored by GAIA's rules
(:mod:`.gaia_score`); each request's server stats give the compression ratio, acceptance rate and mean accepted
length.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.errors import AsymSpecError
from .gaia_data import GaiaTask, ToolCache, attachment_image
from .gaia_files import MAX_ATTACHMENT_MB, attachment_text
from .gaia_runs import TaskRecord, open_run, results_table, run_rows
from .gaia_score import final_answer_of, gaia_match

#: Table 4's rows: name -> (the server's method, whether the verifier reads the compressed view).
ROWS: dict[str, tuple[str, bool]] = {
    "floor": ("floor", True),
    "verifier-full": ("floor", False),
    "sd": ("sd", False),
    "asymspec": ("asymspec", True),
}
#: the paper's per-turn compression for the ReAct loop (Appendix B)
REACT_COMPRESSION = "llmlingua2,rate=0.3,keep_last_turns=2"
#: the file-QA harness: the verifier reads the file's text truncated to 2,000 tokens (the question stays whole)
FILE_COMPRESSION = {"method": "truncate", "limit": 2000, "keep_last_turns": 0, "roles": ["user"]}
#: a short CodeAgent system prompt for small context windows (the tiny pair's 4,096 tokens); None: smolagents' own
SHORT_SYSTEM_PROMPT = (
    "Solve the task with Python code between <code> and </code>. Tools: web_search(query) returns search results, "
    "visit_webpage(url) returns a page's text. End with final_answer(answer): a number, a few words, or a comma list."
)
FILE_QA_PROMPT = (
    "Answer the question from the attached file. Think briefly, then end with a line 'FINAL ANSWER: ' followed by the "
    "answer alone: a number, a few words, or a comma-separated list."
)


@dataclass(frozen=True)
class HarnessSettings:
    """How the harness runs: the ReAct loop's ``compression`` (a spec ``Compression.of`` reads), the file-QA
    harness' ``file_compression``, ``k`` and ``beta``, ``max_steps`` (8: the paper's GAIA bound), ``max_tokens``
    per request (1,024), ``file_harness`` (``single-shot``: the paper's; ``react``), the CodeAgent's
    ``system_prompt`` (None: smolagents' own), the served ``model_id`` and ``max_attachment_mb`` (the largest
    attachment the harness reads, in MiB)."""

    compression: Any = REACT_COMPRESSION
    file_compression: Any = field(default_factory=lambda: dict(FILE_COMPRESSION))
    k: int = 2
    beta: float = 1.0
    max_steps: int = 8
    max_tokens: int = 1024
    file_harness: str = "single-shot"
    system_prompt: str | None = None
    model_id: str = "tiny"
    max_attachment_mb: float = MAX_ATTACHMENT_MB

    def checked(self) -> HarnessSettings:
        from ..request.compression import Compression

        Compression.of(self.compression, "compression")
        Compression.of(self.file_compression, "file_compression")
        if self.file_harness not in ("single-shot", "react"):
            raise AsymSpecError(f"file_harness={self.file_harness!r}: choose single-shot (the paper's) or react")
        if self.max_steps < 1 or self.max_tokens < 1:
            raise AsymSpecError("max_steps and max_tokens must be 1 or more")
        if not self.max_attachment_mb > 0:
            raise AsymSpecError(f"max_attachment_mb={self.max_attachment_mb!r} must be more than 0 (MiB)")
        return self


def check_rows(rows: Sequence[str]) -> list[str]:
    """``rows`` checked against :data:`ROWS` (a one-line error naming the unknown one)."""
    bad = [r for r in rows if r not in ROWS]
    if bad or not rows:
        raise AsymSpecError(f"unknown GAIA row {bad[0] if bad else '(none)'!r}: choose among {', '.join(ROWS)}")
    return list(rows)


def image_parts(messages: Sequence[Any]) -> list[Any]:
    """The images of a smolagents request, in order (each message's ``{"type": "image", "image": ...}`` parts)."""
    out = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else getattr(m, "content", None)
        if isinstance(content, list):
            out += [p.get("image") for p in content if isinstance(p, dict) and p.get("type") == "image"]
    return out


def server_model(base_url: str, asymspec: dict[str, Any], captions: dict[int, str], settings: HarnessSettings) -> Any:
    """A smolagents ``OpenAIServerModel`` on ``base_url`` whose every request carries ``asymspec`` (the method,
    K, beta, the compression) and one caption per image it sends (``captions`` by the image object's ``id``; the
    verifier reads the caption, no OCR), and which keeps each answer's ``asymspec`` object in ``.answers``."""
    from smolagents import OpenAIServerModel

    class GaiaServerModel(OpenAIServerModel):
        answers: list[dict[str, Any]]

        def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kwargs):
            images = image_parts(messages)
            body = dict(asymspec)
            named = [captions.get(id(img)) for img in images]
            if images and all(named):
                body.update(caption=named, ocr=[False] * len(images))
            out = super().generate(messages, stop_sequences, response_format, tools_to_call_from, extra_body={"asymspec": body}, **kwargs)
            extra = dict(getattr(out.raw, "model_extra", None) or {}).get("asymspec") or {}
            usage = out.raw.usage
            cached = getattr(usage.prompt_tokens_details, "cached_tokens", 0) if usage.prompt_tokens_details else 0
            self.answers.append(
                {
                    "prompt_tokens": usage.prompt_tokens,
                    "cached_tokens": cached or 0,
                    "stats": extra.get("stats", {}),
                    "view": extra.get("view"),
                }
            )
            return out

    model = GaiaServerModel(
        model_id=settings.model_id, api_base=base_url.rstrip("/") + "/v1", api_key="unused", max_tokens=settings.max_tokens
    )
    model.answers = []
    return model


def cached_tools(cache: ToolCache) -> list[Any]:
    """``web_search`` and ``visit_webpage`` as smolagents tools over ``cache``."""
    from smolagents import tool

    @tool
    def web_search(query: str) -> str:
        """Search the web (cached results): the titles and addresses of the matching pages.

        Args:
            query: what to search for
        """
        return cache.search(query)

    @tool
    def visit_webpage(url: str) -> str:
        """Read a web page (cached) as text.

        Args:
            url: the page's address
        """
        return cache.visit(url)

    return [web_search, visit_webpage]


def react_answer(model: Any, question: str, cache: ToolCache, settings: HarnessSettings, image: Any = None) -> str | None:
    """Run the CodeAgent ReAct loop on ``question`` (``image`` attached, when given) with the cached tools; the
    final answer as text, None when there is none."""
    import importlib.resources

    import yaml
    from smolagents import CodeAgent

    templates = yaml.safe_load(importlib.resources.files("smolagents.prompts").joinpath("code_agent.yaml").read_text())
    if settings.system_prompt is not None:
        templates["system_prompt"] = settings.system_prompt
    agent = CodeAgent(tools=cached_tools(cache), model=model, max_steps=settings.max_steps, verbosity_level=-1, prompt_templates=templates)
    answer = agent.run(question, images=[image] if image is not None else None)
    return None if answer is None else str(answer)


def react_question(task: GaiaTask, max_mb: float = MAX_ATTACHMENT_MB) -> str:
    """The ReAct loop's task text: the question, then the attachment's extracted text (when it has one)."""
    text = attachment_text(task, max_mb)
    return task.question if text is None else f"{task.question}\n\nAttached file {task.file.name}:\n{text}"


def file_qa_messages(task: GaiaTask, image: Any, max_mb: float = MAX_ATTACHMENT_MB) -> list[dict[str, Any]]:
    """The single-shot file-QA request: the system prompt, then one user message with the question and the file's
    extracted text as its own part (a document of the user turn: the file compression cuts it for the verifier
    and leaves the question whole) or the image."""
    text = attachment_text(task, max_mb)
    parts: list[dict[str, Any]] = [{"type": "text", "text": task.question}]
    if text is not None:
        parts.append({"type": "text", "text": f"Attached file {task.file.name}:\n{text}"})
    if image is not None:
        parts.append({"type": "image", "image": image})
    return [{"role": "system", "content": [{"type": "text", "text": FILE_QA_PROMPT}]}, {"role": "user", "content": parts}]


def file_answer(model: Any, task: GaiaTask, image: Any, max_mb: float = MAX_ATTACHMENT_MB) -> str | None:
    """The single-shot file-QA harness: one request (:func:`file_qa_messages`), its ``FINAL ANSWER``."""
    return final_answer_of(model.generate(file_qa_messages(task, image, max_mb)).content)


def row_body(row: str, settings: HarnessSettings, compression: Any) -> dict[str, Any]:
    """The ``asymspec`` object every request of Table 4's ``row`` carries: its method, K, beta, and ``compression``
    when the row's verifier reads the compressed view (else none)."""
    method, compressed = ROWS[row]
    return {"method": method, "k": settings.k, "beta": settings.beta, "compression": compression if compressed else False}


def answered(record: TaskRecord, model: Any, answer: Callable[[], str | None]) -> TaskRecord:
    """``record`` with ``answer()``'s answer (its exception, as one line, the record's error: the run goes on), the
    seconds it took and the requests ``model`` (:func:`server_model`) made."""
    t0 = time.perf_counter()
    try:
        record.answer = answer()
    except Exception as exc:  # one task's failure is its record; the run goes on
        record.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    record.wall_s = time.perf_counter() - t0
    record.requests = model.answers
    return record


def run_task(base_url: str, row: str, task: GaiaTask, cache: ToolCache, settings: HarnessSettings) -> TaskRecord:
    """``task`` under Table 4's ``row`` on the server at ``base_url``; an attachment the harness cannot read fails
    the task (its record's error names the file and the fix)."""
    single_shot = task.subset == "file" and settings.file_harness == "single-shot"
    captions: dict[int, str] = {}  # filled once the image is read: the model looks its captions up per request
    model = server_model(
        base_url, row_body(row, settings, settings.file_compression if single_shot else settings.compression), captions, settings
    )

    def answer() -> str | None:
        image = attachment_image(task)
        if image is not None and task.caption:
            captions[id(image)] = task.caption
        if single_shot:
            return file_answer(model, task, image, settings.max_attachment_mb)
        return react_answer(model, react_question(task, settings.max_attachment_mb), cache, settings, image)

    record = answered(TaskRecord(row, task.task_id, task.subset, task.level, task.answer), model, answer)
    record.correct = gaia_match(record.answer, task.answer)
    return record


def served_model(base_url: str) -> str:
    """The model name the server at ``base_url`` answers to (its ``/v1/models``' first entry)."""
    import httpx

    return httpx.get(base_url.rstrip("/") + "/v1/models", timeout=30).json()["data"][0]["id"]


def run_identity(benchmark: str, data_files: Sequence[str | Path], settings: HarnessSettings) -> dict[str, Any]:
    """What a harness run's records depend on (:mod:`.gaia_runs`): the benchmark, a hash of its data files (tasks,
    captions, tool cache), the settings and the served model (``model_id``)."""
    from dataclasses import asdict

    from .gaia_runs import files_sha256

    return {"benchmark": benchmark, "data": files_sha256(data_files), "settings": asdict(settings)}


def run_gaia(
    base_url: str,
    tasks: Sequence[GaiaTask],
    rows: Sequence[str],
    settings: HarnessSettings,
    cache: ToolCache,
    out: str | Path,
    log: Any = print,
    note: str = "",
    identity: dict[str, Any] | None = None,
    resume: bool = False,
) -> list[TaskRecord]:
    """Every task under every row (row by row) into the run folder ``out`` (:func:`~.gaia_runs.run_rows`): each
    record appended to ``records.jsonl`` as it finishes and ``table4.md`` (``note``, then :func:`table4`) rewritten,
    so a run cut short keeps its table; ``resume`` continues the records of the same run (``identity``)."""
    settings = settings.checked()
    rows = check_rows(rows)
    folder = Path(out)
    done = open_run(folder, identity or run_identity("gaia", [], settings), resume)

    def write_table(records: Sequence[TaskRecord]) -> None:
        (folder / "table4.md").write_text(note + table4(records) + "\n", encoding="utf-8")

    return run_rows(tasks, rows, lambda row, task: run_task(base_url, row, task, cache, settings), folder, done, write_table, log)


SUBSETS = (("Web-only", "web"), ("File-attach", "file"), ("Full", None))


def table4(records: Sequence[TaskRecord]) -> str:
    """Table 4's layout: per subset (web-only, file-attachment, all) and row, accuracy, compression ratio, AR, MAL."""
    return results_table(records, SUBSETS)
