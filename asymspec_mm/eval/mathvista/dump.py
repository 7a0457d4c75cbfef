"""``eval mathvista --dump-prompts FILE``: each selected problem's prompt texts under a protocol, no model loaded.

One JSON line per problem: ``pid``, ``verifier_user_text``, ``drafter_full_user_text`` (AsymSpec's full
view), ``drafter_alone_user_text`` (method ``drafter``) - the user messages before any chat template -
and ``verifier_prompt``, the verifier's user text through its chat template (``enable_thinking=False``); the
command adds each prompt's token lengths (:mod:`.prompt_lengths`). Only a tokenizer is read (for its chat template); the texts come from MathVista's text data
(by default the copy shipped with the package, :mod:`.shipped`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ...base.errors import AsymSpecError
from ...request.prompts import DEFAULT_STYLE, PromptStyle, verifier_chat_text
from .paper_prompts import PAPER_STYLE, paper_view
from .texts import TextData, official_query, view_for


def style_for(protocol: str) -> PromptStyle:
    """The pipeline's prompt style of a protocol: :data:`PAPER_STYLE` for ``paper``, else the default layout."""
    return PAPER_STYLE if protocol == "paper" else DEFAULT_STYLE


def problem_view(problem: Mapping[str, Any], protocol: str, compressed: str, text: TextData | None, dataset: str = "mathvista"):
    """The :class:`~captioning.CompressedView` the pipeline builds for ``problem`` from the given texts
    (its caption/OCR budgets applied), without a model: ``compressed="auto"`` needs one and is refused."""
    from captioning.captioner import compress

    if compressed == "auto":
        raise AsymSpecError("--dump-prompts needs the given texts: use --compressed official or none (auto captions with the models)")
    if protocol == "paper" and compressed == "official":
        caption, ocr = paper_view(problem, text)
    else:
        caption, ocr = view_for(problem, compressed, text, dataset=dataset)
    return compress(None, caption=caption, ocr=ocr)


def prompt_rows(
    problems: Iterable[Mapping[str, Any]],
    verifier_tokenizer: Any,
    *,
    protocol: str = "mathvista",
    compressed: str = "official",
    text: TextData | None = None,
    drafter_view: str = "image+text",
    dataset: str = "mathvista",
) -> Iterator[dict[str, str]]:
    """The dump's rows, one per problem, with exactly the texts the pipeline would build."""
    style = style_for(protocol)
    for problem in problems:
        query = official_query(problem, text)
        view = problem_view(problem, protocol, compressed, text, dataset)
        full = style.user_texts(view, query.strip(), drafter_view, "asymspec")
        alone = style.user_texts(view, query.strip(), drafter_view, "drafter")
        yield {
            "pid": str(problem["pid"]),
            "verifier_user_text": full.verifier,
            "drafter_full_user_text": full.drafter_full,
            "drafter_alone_user_text": alone.drafter_full,
            "verifier_prompt": verifier_chat_text(verifier_tokenizer, full.verifier),
        }


def write_prompt_rows(rows: Iterable[Mapping[str, str]], path: str | Path) -> int:
    """Write ``rows`` as JSON lines to ``path`` (its folder created); returns how many."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def load_verifier_tokenizer(preset: str | None, verifier: str | None) -> Any:
    """The verifier's tokenizer only (``--verifier``, else the preset's verifier): no model weights are read."""
    from transformers import AutoTokenizer

    from ...pipeline.presets import resolve_preset

    source = verifier or resolve_preset(preset or "auto").verifier
    try:
        return AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError) as exc:
        raise AsymSpecError(f"cannot load the verifier tokenizer {source}: {exc}".splitlines()[0]) from None
