"""The bundled examples of the steering inspector (``asymspec_mm/examples_data/examples.json``).

Only the examples whose outcome with the shipped tiny pair is recorded in :data:`TINY_PAIR_ANSWERS` are shown,
each labelled with its expected answer; a table under them says what AsymSpec, Floor and the drafter alone
answer (tests/test_ui_examples.py runs each one and checks these answers).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = [
    "EXAMPLES_DIR",
    "EXAMPLE_FIELDS",
    "TINY_PAIR_ANSWERS",
    "TINY_PAIR_MAX_NEW_TOKENS",
    "example_label",
    "example_row",
    "load_agent_examples",
    "load_examples",
    "outcome_text",
    "render_examples_table",
    "tiny_pair_warning",
]

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "asymspec_mm" / "examples_data"

#: The max new tokens the recorded answers were decoded with (the demo's default).
TINY_PAIR_MAX_NEW_TOKENS = 64
#: pid -> the answer each method gives with the shipped tiny pair (default settings, the example's caption and
#: OCR as the compressed view), after MiniVista's answer extraction. Examples the tiny pair gets wrong with
#: every method, or whose view the demo would fill from the image (no OCR text), are not listed.
TINY_PAIR_ANSWERS: dict[str, dict[str, str]] = {
    "4": {"asymspec": "5", "floor": "8", "drafter": "4"},
    "12": {"asymspec": "4", "floor": "7", "drafter": "1"},
    "1": {"asymspec": "green", "floor": "yellow", "drafter": "green"},
    "13": {"asymspec": "blue", "floor": "yellow", "drafter": "blue"},
    "3": {"asymspec": "30", "floor": "30", "drafter": "30"},
    "17": {"asymspec": "2", "floor": "2", "drafter": "2"},
}
_NAMES = {"asymspec": "AsymSpec", "floor": "Floor", "drafter": "the drafter"}


def outcome_text(answer: str, answers: dict[str, str]) -> str:
    """What the methods' ``answers`` do with the expected ``answer``, e.g. ``only AsymSpec answers it (Floor: 11,
    the drafter: 14)``."""
    right = [m for m in ("asymspec", "floor", "drafter") if answers.get(m) == answer]
    wrong = [m for m in ("asymspec", "floor", "drafter") if m in answers and answers[m] != answer]
    missed = ", ".join(f"{_NAMES[m]}: {answers[m]}" for m in wrong)
    if not wrong:
        return "all three answer it"
    if not right:
        return f"all three miss it ({missed})"
    names = " and ".join(_NAMES[m] for m in right)
    if len(right) == 1:
        names = "only " + names
    return f"{names} {'answers' if len(right) == 1 else 'answer'} it ({missed})"


def _entries_with_images(index: Path) -> list[tuple[dict, Path]]:
    """The entries of an examples JSON list (``index``) whose ``image`` (relative to its folder) is a file, each with
    that file's path; [] when the file is missing or not a JSON list."""
    try:
        raw = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    out = []
    for ex in raw if isinstance(raw, list) else []:
        if isinstance(ex, dict) and ex.get("image"):
            img = (index.parent / str(ex["image"])).resolve()
            if img.is_file():
                out.append((ex, img))
    return out


def load_examples(path: str | Path | None = None) -> list[dict]:
    """Examples from ``examples.json`` (a list of {image, question, caption, ocr, answer, ...}; ``image`` relative
    to the JSON's folder). Entries whose image is missing are skipped; no file (or a bad one) gives [].
    The bundled file (``path=None``) gives only the examples of :data:`TINY_PAIR_ANSWERS`, in its order, each with
    ``tiny_pair`` (those answers)."""
    bundled = path is None
    index = Path(path) if path is not None else EXAMPLES_DIR / "examples.json"
    if index.is_dir():
        index = index / "examples.json"
    out = []
    for ex, img in _entries_with_images(index):
        if not ex.get("question"):
            continue
        claims = TINY_PAIR_ANSWERS.get(str(ex.get("pid"))) if bundled else None
        if bundled and claims is None:
            continue
        item = {
            "image": str(img),
            "question": str(ex["question"]),
            "caption": str(ex.get("caption") or ""),
            "ocr": str(ex.get("ocr") or ""),
        }
        for key in ("answer", "pid", "family", "seed"):
            if ex.get(key) is not None:
                item[key] = ex[key]
        if claims is not None:
            item["tiny_pair"] = dict(claims)
        item["label"] = example_label(item)
        out.append(item)
    if bundled:
        order = list(TINY_PAIR_ANSWERS)
        out.sort(key=lambda e: order.index(str(e["pid"])))
    return out


def load_agent_examples(path: str | Path | None = None) -> list[dict]:
    """The agent examples (``agent_examples.json``: MiniVista agent tasks): dicts with ``image`` (a path), ``question``,
    ``caption``, ``ocr``, ``tools`` (the tools field's JSON text), ``tool_choice``, ``call`` (the gold call's text),
    ``answer``, ``seed`` and ``index`` (``make_problem(seed, index, "agent")``) and ``label``; [] when the file (or an
    image) is missing."""
    index = Path(path) if path is not None else EXAMPLES_DIR / "agent_examples.json"
    out = []
    for ex, img in _entries_with_images(index):
        call = ex["gold_call"]
        args = ", ".join(f"{k}={v}" for k, v in call["arguments"].items())
        out.append(
            {
                "image": str(img),
                "question": ex["query"],
                "caption": ex["caption"],
                "ocr": ex["ocr"],
                "tools": json.dumps(ex["tools"], indent=2),
                "tool_choice": "auto",
                "call": f"{call['name']}({args})",
                "answer": ex["answer"],
                "seed": ex["seed"],
                "index": ex["index"],
                "label": example_label({"question": ex["query"], "family": "agent", "answer": f"{call['name']}({args})"}),
            }
        )
    return out


#: The page's inputs an example sets, in the order of :func:`example_row`: every example sets all of them, so that a
#: click never leaves another example's value (an agent example's tools) in a field it does not use.
EXAMPLE_FIELDS = ("image", "question", "caption", "ocr", "tools", "tool_choice")
#: What a field holds for an example that does not use it: no tools, the tool choice's default.
_UNUSED = {"caption": "", "ocr": "", "tools": "", "tool_choice": "auto"}


def example_row(example: dict) -> list:
    """An example's values of :data:`EXAMPLE_FIELDS`: its own where it has them, else the field's empty value (no
    tools, tool choice auto)."""
    return [example.get(f) or _UNUSED.get(f, "") for f in EXAMPLE_FIELDS]


#: Gradio cuts an example's label after this many characters.
LABEL_CHARS = 60


def example_label(ex: dict) -> str:
    """A button label of at most :data:`LABEL_CHARS` characters: the family and the question line of a MiniVista
    prompt, then the expected answer (``figure: Which bar is the tallest? -> green``), the question cut to fit."""
    q = str(ex.get("question", ""))
    for line in q.splitlines():
        if line.lower().startswith("question:"):
            q = line.split(":", 1)[1].strip()
            break
    fam = ex.get("family")
    head = f"{fam}: " if fam else ""
    tail = f" \u2192 {ex['answer']}" if ex.get("answer") is not None else ""
    room = LABEL_CHARS - len(head) - len(tail)
    if len(q) > room:
        q = q[: max(0, room - 3)].rstrip() + "..."
    return head + q + tail


def render_examples_table(examples: list[dict]) -> str:
    """The examples' expected answers and what the shipped tiny pair answers with each method, as an HTML table
    (``data-pid`` per row; "" when no example has recorded answers)."""
    import html

    rows = []
    for ex in examples:
        claims = ex.get("tiny_pair")
        if not claims or ex.get("answer") is None:
            continue
        answer = str(ex["answer"])
        cells = "".join(
            f'<td class="{"ex-right" if claims[m] == answer else "ex-wrong"}">{html.escape(claims[m])}</td>'
            for m in ("asymspec", "floor", "drafter")
        )
        rows.append(
            f'<tr data-pid="{html.escape(str(ex.get("pid", "")))}"><td>{html.escape(example_label(ex))}</td>'
            f"<td>{html.escape(answer)}</td>{cells}<td>{html.escape(outcome_text(answer, claims))}</td></tr>"
        )
    if not rows:
        return ""
    return (
        '<div class="asym-examples"><table><thead><tr><th>example</th><th>expected</th><th>AsymSpec</th><th>Floor</th>'
        f"<th>drafter</th><th>with the shipped tiny pair</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def tiny_pair_warning(question: str, image_size: tuple[int, int] | None = None) -> str | None:
    """What the page says before the tiny pair answers a request outside MiniVista (None inside it): why, in the
    page's own terms (the bundled examples, the question box), where the command line names its flags."""
    from asymspec_mm.request.domain import domain_problems

    problems = domain_problems(question, image_size)
    if not problems:
        return None
    return (
        "Expect a meaningless answer: the tiny models of this demo learned only MiniVista (128x128 bar charts, coloured "
        "shapes and triangles, asked one of eight questions in MathVista's layout), and "
        + "; ".join(problems)
        + ". Pick one of the bundled examples on this page, or ask one of their questions in the same layout; other "
        "questions need the full-size models."
    )
