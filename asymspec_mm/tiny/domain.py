"""What the bundled tiny pair can answer, and a check that says when a request is outside it.

The tiny pair was trained only on MiniVista (:mod:`asymspec_mm.eval.minivista`): 128x128 renders of bar
charts, coloured shapes and triangles, asked in MathVista's query layout (a hint line, ``Question: ...``,
then ``Choices:`` for multiple choice) with one of eight question forms (and the agent family's two). Anything else gets fluent-looking
but meaningless text, so the CLI and the demo warn before answering. Torch-free: the CLI checks before
loading a model.
"""

from __future__ import annotations

import re

from . import IMAGE_SIZE

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
)
_FORMS = tuple(re.compile(form.replace("{w}", r"[A-Za-z]+")) for form in QUESTION_FORMS)
_HINT = re.compile(r"^Hint: Please answer the question\b[^\n]*\nQuestion: (?P<question>[^\n]+)(?P<rest>\n[\s\S]*)?$")

SCOPE = (
    "the tiny pair answers only MiniVista questions (bar charts, coloured shapes, triangle angles) "
    "in MathVista's layout about 128x128 MiniVista images"
)
HOW_TO = (
    "use a bundled example (asymspec-mm quickstart, asymspec_mm/examples_data), add --choices to a "
    "MiniVista question, or load a real pair (--preset qwen3)"
)


def question_stem(text: str) -> str | None:
    """The ``Question: ...`` line of a MathVista-layout prompt (without the prefix), else ``None``."""
    m = _HINT.match(text.strip())
    return m.group("question").strip() if m else None


def domain_problems(question: str, image_size: tuple[int, int] | None = None) -> list[str]:
    """Why a request is outside what the tiny pair learned (empty when it looks like MiniVista).

    ``question`` is the full prompt text; ``image_size`` is ``(width, height)`` of the image, if known.
    """
    problems = []
    stem = question_stem(question)
    if stem is None:
        problems.append("the question is not in MathVista's layout ('Hint: ...' then 'Question: ...')")
    elif not any(form.fullmatch(re.sub(r"\s*\(Unit: [^)]*\)$", "", stem)) for form in _FORMS):
        problems.append(f"{stem!r} is not one of MiniVista's question forms")
    if image_size is not None and tuple(image_size) != (IMAGE_SIZE, IMAGE_SIZE):
        problems.append(f"the image is {image_size[0]}x{image_size[1]}, not a {IMAGE_SIZE}x{IMAGE_SIZE} MiniVista render")
    return problems


def domain_warning(question: str, image_size: tuple[int, int] | None = None) -> str | None:
    """One line warning that the tiny pair will not understand this request, or ``None``."""
    problems = domain_problems(question, image_size)
    if not problems:
        return None
    return f"{SCOPE}; {'; '.join(problems)}, so expect a meaningless answer: {HOW_TO}"
