"""What the bundled tiny pair can answer, and a check that says when a request is outside it.

The tiny pair was trained only on MiniVista (:mod:`asymspec_mm.eval.minivista`): 128x128 renders of bar
charts, coloured shapes and triangles, asked in MathVista's query layout (a hint line, ``Question: ...``,
then ``Choices:`` for multiple choice) with one of eight question forms (and the agent family's two, also in
smolagents' ``New task:`` layout; the agent-log family's two, asked plainly). Anything else gets fluent-looking but meaningless text, so every path warns by one
rule, :func:`request_warnings` (only when the loaded pair is the tiny preset): the result's ``warnings``, the
server's ``asymspec.warnings``, a log line per request (:func:`warn_request`), the CLI before loading and the demo
before the run. Torch-free: the CLI checks before loading a model.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

#: the tiny pair's training resolution: the processor resizes any image to about this many pixels a side
IMAGE_SIZE = 128

#: The preset name of the bundled pair: the only pair with a domain to warn about.
TINY = "tiny"
#: Where the per-request warning is logged.
log = logging.getLogger("asymspec_mm.domain")

#: The question forms MiniVista draws (``minivista_scenes``); ``{w}`` is a colour, shape or vertex name.
QUESTION_FORMS: tuple[str, ...] = (
    r"Which bar is the (tallest|shortest)\?",
    r"What is the value of the {w} bar\?",
    r"What is the sum of the {w} bar and the {w} bar\?",
    r"How much taller is the {w} bar than the {w} bar\?",
    r"What color is the {w}\?",
    r"How many shapes are there\?",
    r"Which shape is furthest to the {w}\?",
    r"As shown in the figure, what is the measure of angle {w}\?",
    r"What is the {w} bar's value (plus|minus) the {w} bar's\?",  # the agent family (with its add / subtract tools)
    r"Which of the two bars is taller, the {w} one or the {w} one\?",  # its follow-up
    r"Read the log of bar values\.",  # the agent-log family's task (eval.minivista_log), asked as it is
    r"What is the value of the last bar\?",  # and its question about the log's latest reading
)
_FORMS = tuple(re.compile(form.replace("{w}", r"[A-Za-z]+")) for form in QUESTION_FORMS)
_HINT = re.compile(r"^Hint: Please answer the question\b[^\n]*\nQuestion: (?P<question>[^\n]+)(?P<rest>\n[\s\S]*)?$")
#: smolagents' ToolCallingAgent opens its task so (what the agent family trained on, eval.minivista_agent)
_SMOLAGENTS = re.compile(r"^New task:\n(?P<question>[^\n]+)$")
#: the agent-log family asks plainly, no hint line (eval.minivista_log)
_LOG = re.compile(r"^(?P<question>Read the log of bar values\.|What is the value of the last bar\?)$")

SCOPE = (
    "the tiny pair answers only MiniVista questions (bar charts, coloured shapes, triangle angles) "
    "in MathVista's layout about 128x128 MiniVista images"
)
#: What the warning advises by default: the Python API's means (each front end passes its own through
#: ``advice``, e.g. the CLI its flags and the server the request's fields; the demo words its page's own warning).
HOW_TO = (
    "use a bundled example (asymspec-mm quickstart, asymspec_mm/examples_data), ask a MiniVista question in "
    "MathVista's layout with its choices (asymspec_mm.request.mathvista_query.mathvista_question writes it), or load "
    'a real pair (AsymSpecPipeline.from_preset("qwen3"))'
)


def question_stem(text: str) -> str | None:
    """The ``Question: ...`` line of a MathVista-layout prompt (without the prefix), or the task of smolagents'
    ``New task:`` layout, else ``None``."""
    m = _HINT.match(text.strip()) or _SMOLAGENTS.match(text.strip()) or _LOG.match(text.strip())
    return m.group("question").strip() if m else None


def question_problems(question: str) -> list[str]:
    """Why ``question`` (the full prompt text) is not a MiniVista request (empty when it is one)."""
    stem = question_stem(question)
    if stem is None:
        return ["the question is not in MathVista's layout ('Hint: ...' then 'Question: ...')"]
    if not any(form.fullmatch(re.sub(r"\s*\(Unit: [^)]*\)$", "", stem)) for form in _FORMS):
        return [f"{stem!r} is not one of MiniVista's question forms"]
    return []


def image_problem(image_size: tuple[int, int] | None) -> str | None:
    """Why an image of ``image_size`` (``(width, height)``, ``None`` when unknown) is not a MiniVista render."""
    if image_size is None or tuple(image_size) == (IMAGE_SIZE, IMAGE_SIZE):
        return None
    return f"the image is {image_size[0]}x{image_size[1]}, not a {IMAGE_SIZE}x{IMAGE_SIZE} MiniVista render"


def domain_problems(question: str, image_size: tuple[int, int] | None = None) -> list[str]:
    """Why a request is outside what the tiny pair learned (empty when it looks like MiniVista).

    ``question`` is the full prompt text; ``image_size`` is ``(width, height)`` of the image, if known.
    """
    return request_problems(TINY, question, [image_size])


def domain_warning(question: str, image_size: tuple[int, int] | None = None) -> str | None:
    """One line warning that the tiny pair will not understand this request, or ``None``."""
    return next(iter(request_warnings(TINY, question, [image_size])), None)


def request_problems(pair: str | None, question: str, image_sizes: Iterable[tuple[int, int] | None] = ()) -> list[str]:
    """The one rule of every path: why the loaded ``pair`` (its preset name) cannot answer ``question`` about images
    of ``image_sizes``; empty unless the pair is the tiny preset, the only one with a domain this narrow."""
    if pair != TINY:
        return []
    problems = question_problems(question)
    for problem in map(image_problem, image_sizes):
        if problem is not None and problem not in problems:
            problems.append(problem)
    return problems


def request_warnings(
    pair: str | None, question: str, image_sizes: Iterable[tuple[int, int] | None] = (), advice: str | None = None
) -> list[str]:
    """:func:`request_problems` as the one-line warnings a result carries (``MMResult.warnings``): none, or one,
    ending with ``advice`` (what the user can do, in the front end's words; ``None``: :data:`HOW_TO`)."""
    problems = request_problems(pair, question, image_sizes)
    return [f"{SCOPE}; {'; '.join(problems)}, so expect a meaningless answer: {advice or HOW_TO}"] if problems else []


def warn_request(
    pair: str | None, question: str, image_sizes: Iterable[tuple[int, int] | None] = (), advice: str | None = None
) -> list[str]:
    """:func:`request_warnings`, each also logged once (``logging.warning`` on ``asymspec_mm.domain``): a request
    is set up once, so this is called once per request."""
    warnings = request_warnings(pair, question, image_sizes, advice)
    for warning in warnings:
        log.warning("%s", warning)
    return warnings
