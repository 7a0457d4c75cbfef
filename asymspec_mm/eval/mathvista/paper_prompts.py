"""The paper's MathVista prompts (the authors' released harness, ``--protocol paper``).

The rules (issue #22; Table 3 of the paper was produced with them):

- caption: the raw Bard caption (no "Sure." clean-up) cut to its first 1,600 characters;
- OCR text: the text strings of the EasyOCR entries joined by single spaces, cut to 800 characters
  (an entry list that does not parse gives no OCR text);
- verifier (and the drafter's compressed view): ``Image caption: {caption}``, then, only when the
  OCR text is not blank, ``OCR text from image: {ocr}``, then ``{query}`` plus :data:`COT_SUFFIX`,
  the parts joined by a blank line; the chat template with ``enable_thinking=False``;
- drafter, full view (AsymSpec): the image, then the verifier's text;
- drafter alone (method ``drafter``, Table 3's "VL drafter alone"): the image, then ``{query}`` plus
  :data:`COT_SUFFIX`.

``{query}`` is MathVista's official query (``query.json``). Nothing here loads a model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from captioning.ocr.static import ocr_literal

from ...base.errors import UnknownOptionError
from ...request.prompts import PromptStyle, UserTexts
from .tasks import DEFAULT_TASKS, TASK_ALIASES
from .texts import TextData, has_bard_caption

#: ``--protocol``: MathVista's own (official query, labelled view, extraction prompt) or the paper harness'.
PROTOCOLS: tuple[str, ...] = ("mathvista", "paper")

COT_SUFFIX = "\nLet's think step by step, then give the final answer."
CAPTION_CHARS = 1600
OCR_CHARS = 800
CAPTION_LABEL = "Image caption:"
OCR_LABEL = "OCR text from image:"


def paper_caption(raw: Any) -> str:
    """The raw caption's first :data:`CAPTION_CHARS` characters (``""`` when there is none)."""
    return raw[:CAPTION_CHARS] if isinstance(raw, str) else ""


def paper_ocr_text(raw: Any) -> str:
    """EasyOCR output (its ``str()`` literal, or the parsed list) as the entries' texts joined by spaces,
    cut to :data:`OCR_CHARS`; entries that are not ``(box, text, ...)`` with a string text are skipped."""
    items = ocr_literal(raw) if isinstance(raw, str) and raw.strip() else raw
    if not isinstance(items, (list, tuple)):
        return ""
    texts = [e[1] for e in items if isinstance(e, (list, tuple)) and len(e) >= 2 and isinstance(e[1], str)]
    return " ".join(texts)[:OCR_CHARS]


def verifier_user_text(caption: str, ocr: str, query: str) -> str:
    """The verifier's user message under the paper protocol (see the module docstring)."""
    parts = [f"{CAPTION_LABEL} {caption}"]
    if ocr.strip():
        parts.append(f"{OCR_LABEL} {ocr}")
    parts.append(query + COT_SUFFIX)
    return "\n\n".join(parts)


def drafter_alone_user_text(query: str) -> str:
    """The drafter-alone user text (after the image): the query and the step-by-step suffix."""
    return query + COT_SUFFIX


class PaperPromptStyle(PromptStyle):
    """The paper harness' layout for the pipeline: reads the view's caption and OCR text as given
    (the runner passes :func:`paper_view`'s texts, which the pipeline's budgets leave unchanged)."""

    name = "paper"
    drafter_thinking_off = True

    def user_texts(self, view: Any, question: str, drafter_view: str = "image+text", method: str = "asymspec") -> UserTexts:
        """Verifier and compressed stream: :func:`verifier_user_text`; the full view: the same text, or
        :func:`drafter_alone_user_text` for method ``drafter`` and for ``drafter_view="image"``."""
        text = verifier_user_text(view.caption, view.ocr_text, question)
        alone = method == "drafter" or drafter_view == "image"
        return UserTexts(text, text, drafter_alone_user_text(question) if alone else text)


PAPER_STYLE = PaperPromptStyle()


def paper_view(problem: Mapping[str, Any], text: TextData | None) -> tuple[str, str | bool]:
    """``(caption, ocr)`` for ``pipe.generate`` under the paper protocol: the problem's own ``caption`` /
    ``ocr`` fields when present (an ``ocr`` string that is no entry list is plain text, as MiniVista's),
    else MathVista's Bard caption and EasyOCR output; ``ocr=False`` when empty."""
    pid = str(problem["pid"])
    raw_caption = problem["caption"] if isinstance(problem.get("caption"), str) else (text.captions.get(pid) if text else None)
    own = problem.get("ocr")
    if isinstance(own, str) and not isinstance(ocr_literal(own), (list, tuple)):
        ocr = own[:OCR_CHARS]
    else:
        ocr = paper_ocr_text(own if own is not None else (text.ocrs.get(pid) if text else None))
    return paper_caption(raw_caption), (ocr if ocr else False)


def paper_user_texts(problem: Mapping[str, Any], query: str, text: TextData | None) -> dict[str, str]:
    """The three user texts of one problem (``verifier_user_text``, ``drafter_full_user_text``,
    ``drafter_alone_user_text``) under the paper protocol, with no pipeline."""
    caption, ocr = paper_view(problem, text)
    verifier = verifier_user_text(caption, ocr or "", query)
    return {"verifier_user_text": verifier, "drafter_full_user_text": verifier, "drafter_alone_user_text": drafter_alone_user_text(query)}


def in_paper_subset(problem: Mapping[str, Any], text: TextData | None) -> bool:
    """Whether a problem belongs to the paper's subset: a GPS, VQA or FQA problem with a Bard caption (587 of testmini)."""
    task = (problem.get("metadata") or {}).get("task")
    return task in {TASK_ALIASES[t] for t in DEFAULT_TASKS} and has_bard_caption(problem, text)


def check_protocol(protocol: str, pipe: Any) -> str:
    """``protocol`` itself when it is known and ``pipe``'s prompt style fits it, else a one-line error."""
    if protocol not in PROTOCOLS:
        raise UnknownOptionError(f"protocol={protocol!r} is not valid; choose one of {', '.join(PROTOCOLS)}")
    style = getattr(getattr(pipe, "prompt_style", None), "name", "default")
    if (protocol == "paper") != (style == "paper"):
        raise UnknownOptionError(
            f"protocol={protocol!r} but the pipeline's prompt style is {style!r}: build the pipeline with "
            f"prompt_style={'PAPER_STYLE' if protocol == 'paper' else 'None'} (asymspec_mm.eval.mathvista.paper_prompts)"
        )
    return protocol


def check_records_protocol(records: Iterable[Mapping[str, Any]], protocol: str, path: Any) -> None:
    """Refuse to resume records made under another protocol (records without the field are MathVista's)."""
    other = {str(r.get("protocol", "mathvista")) for r in records} - {protocol}
    if other:
        raise UnknownOptionError(
            f"{path} holds records of --protocol {', '.join(sorted(other))}, now --protocol {protocol}: use the same protocol to resume, or a new --out"
        )


def record_marks(protocol: str, extract_mode: str, problem: Mapping[str, Any], text: TextData | None, dataset: str) -> dict[str, Any]:
    """What a record says about how it was made: ``protocol``, ``scoring`` (``paper`` for the paper's
    extraction, else ``mathvista``) and ``paper_subset`` (one of the paper's 587 problems; Table 3's comparison)."""
    return {
        "protocol": protocol,
        "scoring": "paper" if extract_mode == "paper" else "mathvista",
        "paper_subset": dataset == "mathvista" and in_paper_subset(problem, text),
    }
