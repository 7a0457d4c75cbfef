"""MathVista's official answer normalisation and scoring, re-implemented without pandas/Levenshtein.

The rules follow ``evaluation/calculate_score.py`` of lupantech/MathVista:

* multiple choice: a letter in parentheses ``"(B) ..."`` becomes ``"B"``; a bare option letter
  becomes that option's text; anything else becomes the option with the smallest edit distance
  (first one on ties), so a multiple-choice prediction is always one of the choices;
* ``integer``: ``str(int(float(x)))``; ``float``: ``str(round(float(x), precision))``;
  ``list``: ``str(x)``; a failed conversion gives ``None`` (never equal to the answer);
* a prediction is correct when it equals the answer string exactly.

Scores use the published JSON shape: ``{"average": {"accuracy": "34.8", "correct": 348,
"total": 1000}, "<key>": {"<value>": {"accuracy": "48.70", "correct": 263, "total": 540}, ...}}``
where accuracies are percentage strings (``str(round(x, 2))`` for the average, two decimals for
the breakdowns) and each breakdown is sorted by accuracy, highest first. The breakdown keys are
:data:`SCORE_KEYS`; ``skills`` is a list per problem and a problem counts for each of its skills.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: Metadata keys the official ``calculate_score.py`` breaks accuracy down by (in its order).
SCORE_KEYS: tuple[str, ...] = (
    "question_type",
    "answer_type",
    "language",
    "source",
    "category",
    "task",
    "context",
    "grade",
    "skills",
)

_PAREN_LETTER = re.compile(r"\(([a-zA-Z])\)")


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions all cost 1)."""
    if a == b:
        return 0
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return len(a)
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def most_similar_choice(prediction: str, choices: Sequence[str]) -> str:
    """The choice closest to ``prediction`` by edit distance; the earliest one on ties."""
    if not choices:
        raise ValueError("most_similar_choice needs at least one choice")
    distances = [edit_distance(prediction, str(choice)) for choice in choices]
    return choices[distances.index(min(distances))]


def option_letters(n: int) -> list[str]:
    """``["A", "B", ...]`` for ``n`` options."""
    return [chr(ord("A") + i) for i in range(n)]


def normalize_extracted_answer(
    extraction: Any,
    choices: Sequence[str] | None,
    question_type: str,
    answer_type: str,
    precision: Any,
    *,
    ignore_empty: bool = False,
) -> str | None:
    """Map an extracted answer onto the answer's type, as MathVista's scorer does.

    ``ignore_empty=True`` returns ``None`` for an empty multiple-choice extraction instead of the
    official behaviour (which picks the shortest choice, the one closest to ``""``).
    """
    if question_type == "multi_choice":
        choices = list(choices or [])
        if isinstance(extraction, str):
            text = extraction.strip()
        else:
            try:
                text = str(extraction)
            except Exception:  # noqa: BLE001 - mirror the official "anything goes" conversion
                text = ""
        if ignore_empty and not text:
            return None
        if not choices:
            return text
        letters = _PAREN_LETTER.findall(text)
        if letters:
            text = letters[0].upper()
        options = option_letters(len(choices))
        if text in options:
            return choices[options.index(text)]
        return most_similar_choice(text, choices)

    if answer_type == "integer":
        try:
            return str(int(float(extraction)))
        except (TypeError, ValueError, OverflowError):
            return None

    if answer_type == "float":
        try:
            # The HF copy stores precision as a float (1.0); round() needs an int.
            digits = int(precision) if precision is not None else 0
            return str(round(float(extraction), digits))
        except (TypeError, ValueError, OverflowError):
            return None

    if answer_type == "list":
        try:
            return str(extraction)
        except Exception:  # noqa: BLE001
            return None

    return None if extraction is None else str(extraction)


def safe_equal(prediction: Any, answer: Any) -> bool:
    """Exact equality that never raises."""
    try:
        return bool(prediction == answer)
    except Exception:  # noqa: BLE001
        return False


def score_problem(problem: Mapping[str, Any], extraction: Any) -> tuple[str | None, bool]:
    """``(prediction, true_false)`` for one problem (MathVista schema) and its extraction."""
    prediction = normalize_extracted_answer(
        extraction,
        problem.get("choices"),
        str(problem.get("question_type", "")),
        str(problem.get("answer_type", "")),
        problem.get("precision"),
    )
    return prediction, safe_equal(prediction, problem.get("answer"))


def _flat_value(problem: Mapping[str, Any], key: str) -> Any:
    """A breakdown key's value: top-level field first, then ``metadata`` (the official merge)."""
    meta = problem.get("metadata") or {}
    if isinstance(meta, Mapping) and key in meta:
        return meta[key]
    return problem.get(key)


def _percent(correct: int, total: int) -> str:
    return f"{correct / total * 100:.2f}"


def compute_scores(
    results: Mapping[str, Mapping[str, Any]] | Iterable[Mapping[str, Any]], keys: Sequence[str] = SCORE_KEYS
) -> dict[str, Any]:
    """Scores JSON (official shape) from problems that already carry ``true_false``.

    ``results`` is a dict keyed by pid (the official output file) or an iterable of problems.
    Values of a key are listed in first-appearance order before the (stable) sort by accuracy.
    """
    items = list(results.values()) if isinstance(results, Mapping) else list(results)
    total = len(items)
    correct = sum(1 for item in items if item.get("true_false") is True)
    average = str(round(correct / total * 100, 2)) if total else "0.0"
    scores: dict[str, Any] = {"average": {"accuracy": average, "correct": correct, "total": total}}
    for key in keys:
        counts: dict[Any, list[int]] = {}
        for item in items:
            value = _flat_value(item, key)
            if value is None:
                continue
            values = value if isinstance(value, list) else [value]
            for v in dict.fromkeys(values):  # a skill listed twice still counts once
                c = counts.setdefault(v, [0, 0])
                c[0] += 1 if item.get("true_false") is True else 0
                c[1] += 1
        block = {v: {"accuracy": _percent(c, t), "correct": c, "total": t} for v, (c, t) in counts.items() if t > 0}
        scores[key] = dict(sorted(block.items(), key=lambda kv: float(kv[1]["accuracy"]), reverse=True))
    return scores


def score_results(
    results: Mapping[str, dict[str, Any]],
    *,
    ground_truth: Mapping[str, Mapping[str, Any]] | None = None,
    extractor: Any = None,
    rerun: bool = True,
) -> dict[str, Any]:
    """Score an official output dict in place (adds ``prediction`` and ``true_false``) and return scores.

    Each entry needs the problem fields (``choices``, ``question_type``, ``answer_type``,
    ``precision``, ``metadata``) and ``extraction``; without ``extraction`` the ``response`` is
    run through ``extractor(response, problem)`` (default: the rule-based extractor). A missing
    ``answer`` is taken from ``ground_truth[pid]`` like the official script. ``rerun=False`` keeps
    existing ``prediction``/``true_false`` values.
    """
    if extractor is None:
        from .extraction import extract_answer as extractor  # noqa: N813 - local default
    for pid, problem in results.items():
        if ground_truth is not None:
            gt = ground_truth.get(str(pid))
            if gt is not None:
                for field in ("answer", "choices", "question_type", "answer_type", "precision", "metadata"):
                    if field not in problem and field in gt:
                        problem[field] = gt[field]
        if "answer" not in problem:
            raise KeyError(f"pid {pid}: no 'answer' in the output and no ground truth for it (pass the problems file)")
        if not rerun and "true_false" in problem and "prediction" in problem:
            continue
        if "extraction" not in problem or problem["extraction"] is None:
            problem["extraction"] = extractor(str(problem.get("response") or ""), problem)
        problem["prediction"], problem["true_false"] = score_problem(problem, problem["extraction"])
    return compute_scores(results)


def load_output(path: str | Path, variant: str | None = None) -> dict[str, dict[str, Any]]:
    """Read an official output JSON (dict keyed by pid, a list of problems, or a JSONL of records).

    A dict wrapped as ``{"results": {...}}`` (as in the test fixture) is unwrapped. A records JSONL
    holding several variants needs ``variant`` to pick one.
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    if path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                row = _parse_json(line, path, n)
                if not isinstance(row, Mapping) or "pid" not in row:
                    raise ValueError(f"{path}:{n}: not a record (a JSON object with a 'pid'); give a records JSONL or an output JSON")
                rows.append(row)
        names = list(dict.fromkeys(str(r.get("variant")) for r in rows if "variant" in r))
        if variant is not None:
            rows = [r for r in rows if str(r.get("variant")) == variant]
            if not rows:
                raise ValueError(f"{path}: no records of variant {variant!r} (variants: {', '.join(names)})")
        elif len(names) > 1:
            raise ValueError(f"{path} holds several variants ({', '.join(names)}): pick one with --variant")
        out: dict[str, dict[str, Any]] = {}
        for r in rows:
            out.setdefault(str(r["pid"]), r)
        return out
    data = _parse_json(text, path)
    if isinstance(data, Mapping) and "results" in data and isinstance(data["results"], Mapping):
        data = data["results"]
    if isinstance(data, list):
        if not all(isinstance(item, Mapping) and "pid" in item for item in data):
            raise ValueError(f"{path}: a list of problems needs a 'pid' in every item")
        return {str(item["pid"]): dict(item) for item in data}
    if not isinstance(data, Mapping) or not all(isinstance(v, Mapping) for k, v in data.items() if not str(k).startswith("_")):
        raise ValueError(f'{path}: expected an output JSON keyed by pid ({{"1": {{"response": ...}}, ...}}) or a list of problems')
    return {str(k): v for k, v in data.items() if not str(k).startswith("_")}


def _parse_json(text: str, path: Path, line: int | None = None) -> Any:
    """``json.loads(text)``; invalid JSON is a ``ValueError`` naming the file, the line and the column
    (``line``: the JSONL line ``text`` is)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"{path}:{line}" if line is not None else str(path)
        at = f"column {exc.colno}" if line is not None else f"line {exc.lineno}, column {exc.colno}"
        raise ValueError(f"{where}: invalid JSON ({exc.msg} at {at}); fix the file or give MathVista's output JSON") from None


def write_json(obj: Any, path: str | Path) -> Path:
    """Write JSON (UTF-8, indented) atomically: a temporary file renamed over the target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=4, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def format_scores(scores: Mapping[str, Any], keys: Sequence[str] | None = None) -> str:
    """Human-readable summary of a scores dict (average, then each breakdown)."""
    avg = scores["average"]
    lines = [f"Correct: {avg['correct']}/{avg['total']} - Accuracy: {avg['accuracy']}%"]
    for key in keys if keys is not None else [k for k in scores if k != "average"]:
        block = scores.get(key) or {}
        if not block:
            continue
        lines.append(f"[{key}]")
        for value, s in block.items():
            lines.append(f"  {value}: {s['accuracy']}% ({s['correct']}/{s['total']})")
    return "\n".join(lines)
