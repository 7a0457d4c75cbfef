"""SimpleQA (Wei et al., 2024) as the paper ran it (Appendix B, Table 4): each question through the same smolagents
``CodeAgent`` ReAct loop as GAIA's web tasks (:mod:`.gaia`: the cached ``web_search`` and ``visit_webpage``, per-turn
LLMLingua-2 at 0.3 with the last two messages verbatim, K = 2, beta = 1), at most 6 steps.

The dataset is OpenAI's ``simple_qa_test_set.csv`` (columns ``metadata``, ``problem``, ``answer``; 4,326 questions),
read from a path or from the local Hugging Face cache of the dataset ``basicv8vc/SimpleQA`` (never downloaded here);
the paper ran a random 500 of them (:func:`sample_tasks`).

Grading. The paper grades with the official SimpleQA grader, an LLM judge that reads the question, the gold answer
and the reply and says correct, incorrect or not attempted. This harness does not run that judge: it grades with
:func:`grade`, a lexical stand-in written for it: an empty answer or one that declines (``I don't know``) is *not
attempted*; an answer is *correct* when the gold answer's words, normalised (case, accents, punctuation,
articles and thousands separators dropped), stand in it as one run; anything else is *incorrect*. It credits a
reply that names the gold answer among other words, and misses a paraphrase a judge would accept (``JFK`` for
``John F. Kennedy``); its accuracies are comparable between rows, not to the paper's figures.
"""

from __future__ import annotations

import csv
import json
import random
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.errors import AsymSpecError
from .gaia import HarnessSettings, answered, react_answer, row_body, server_model
from .gaia_data import ToolCache
from .gaia_runs import TaskRecord, results_table

HUB_DATASET = "basicv8vc/SimpleQA"
CSV_NAME = "simple_qa_test_set.csv"
WHERE = (
    f"download {CSV_NAME} from https://openaipublic.blob.core.windows.net/simple-evals/{CSV_NAME} (or `huggingface-cli "
    f"download {HUB_DATASET} {CSV_NAME} --repo-type dataset`) and pass --simpleqa-csv FILE (or --bundled for the bundled protocol check)"
)
#: the paper's bound on ReAct steps for SimpleQA (Table 7)
MAX_STEPS = 6
GRADES = ("correct", "incorrect", "not_attempted")
#: replies that decline to answer: graded not attempted
DECLINES = re.compile(r"\b(i don[’']?t know|i do not know|not sure|cannot (?:be )?determine|unable to (?:find|determine|answer))\b")
ARTICLES = {"a", "an", "the"}
GRADER_NOTE = (
    "Graded by normalized match (the gold answer's words in the reply), a stand-in for the official LLM grader the "
    "paper used: comparable between rows, not to the paper's figures."
)


@dataclass(frozen=True)
class SimpleQATask:
    """One SimpleQA question: ``task_id`` (``simpleqa-N``, its 0-based row in the CSV), ``question``, ``answer``
    (the gold answer) and ``topic`` (from its metadata)."""

    task_id: str
    question: str
    answer: str
    topic: str = ""


def default_csv() -> Path | None:
    """The SimpleQA CSV in the local Hugging Face cache (``basicv8vc/SimpleQA``), or None: nothing is downloaded."""
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(HUB_DATASET, CSV_NAME, repo_type="dataset", local_files_only=True))
    except Exception:  # not cached (or no hub client): the caller says how to get it
        return None


def topic_of(metadata: str) -> str:
    """The ``topic`` of a row's metadata (a dict written as Python text; read by a pattern, never evaluated)."""
    m = re.search(r"""['"]topic['"]\s*:\s*['"]([^'"]*)['"]""", metadata or "")
    return m.group(1) if m else ""


def find_csv(path: str | Path | None) -> Path:
    """The SimpleQA CSV: ``path``, or (None) the one in the local Hugging Face cache; absent, one line saying how to
    get it."""
    found = Path(path) if path is not None else default_csv()
    if found is None or not found.is_file():
        where = f"at {found}" if found is not None else f"in the local Hugging Face cache ({HUB_DATASET})"
        raise AsymSpecError(f"SimpleQA's {CSV_NAME} is not {where}: {WHERE}")
    return found


def load_simpleqa(path: str | Path | None) -> list[SimpleQATask]:
    """The questions of the SimpleQA CSV (:func:`find_csv`), in file order; a file without the ``problem`` and
    ``answer`` columns is one line saying how to get the right one."""
    found = find_csv(path)
    with found.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if not {"problem", "answer"} <= set(reader.fieldnames or ()):
            raise AsymSpecError(f"{found} has no problem and answer columns (it has {reader.fieldnames}): {WHERE}")
        return [SimpleQATask(f"simpleqa-{i}", r["problem"], r["answer"], topic_of(r.get("metadata", ""))) for i, r in enumerate(reader)]


def sample_tasks(tasks: Sequence[SimpleQATask], n: int | None, seed: int = 0) -> list[SimpleQATask]:
    """``n`` of ``tasks`` drawn at random with ``seed`` (the paper's random 500), kept in file order; None: all."""
    if n is None or n >= len(tasks):
        return list(tasks)
    if n < 1:
        raise AsymSpecError(f"--sample {n}: give 1 or more questions")
    keep = set(random.Random(seed).sample(range(len(tasks)), n))
    return [t for i, t in enumerate(tasks) if i in keep]


def answer_words(text: str) -> list[str]:
    """``text`` as the grader compares it: accents and case folded, thousands separators and punctuation dropped,
    articles left out, split into words."""
    text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode().lower()
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    words = re.sub(r"[^\w\s]", " ", text).split()
    return [w for w in words if w not in ARTICLES]


def grade(answer: str | None, truth: str) -> str:
    """``correct``, ``incorrect`` or ``not_attempted`` by the normalized match (see the module)."""
    if answer is None or not str(answer).strip() or DECLINES.search(str(answer).lower()):
        return "not_attempted"
    got, want = answer_words(answer), answer_words(truth)
    if not want:
        return "incorrect"
    n = len(want)
    return "correct" if any(got[i : i + n] == want for i in range(len(got) - n + 1)) else "incorrect"


def run_task(base_url: str, row: str, task: SimpleQATask, cache: ToolCache, settings: HarnessSettings) -> TaskRecord:
    """``task`` under Table 4's ``row`` on the server at ``base_url``: the ReAct loop, then :func:`grade`."""
    model = server_model(base_url, row_body(row, settings, settings.compression), {}, settings)
    record = answered(
        TaskRecord(row, task.task_id, "simpleqa", 0, task.answer), model, lambda: react_answer(model, task.question, cache, settings)
    )
    record.grade = grade(record.answer, task.answer)
    record.correct = record.grade == "correct"
    return record


def table(records: Sequence[TaskRecord]) -> str:
    """Table 4's SimpleQA block: one aggregate line per row (accuracy, compression ratio, AR, MAL)."""
    return results_table(records, (("Aggregate", None),))


def grade_counts(records: Sequence[TaskRecord]) -> dict[str, dict[str, int]]:
    """Per row, how many answers got each grade (:data:`GRADES`)."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        out.setdefault(r.row, dict.fromkeys(GRADES, 0))[r.grade or "incorrect"] += 1
    return out


def _station_page(station: str, year: int, founder: str) -> str:
    lines = [f"Station {station}: history and readings"]
    lines += [f"{1990 + i}: routine maintenance, {20 + (i * 7) % 30} readings a day" for i in range(24)]
    lines.insert(9, f"{year}: the station opened, built by {founder}")
    return "\n".join(lines)


def write_bundled_tasks(folder: str | Path) -> Path:
    """Write three SimpleQA-shaped questions into ``folder``: ``simple_qa_test_set.csv`` (the official columns) and
    ``tool_cache.json`` with the search results and pages that answer them (each answer one line of a 25-line
    page). A protocol check, not a score. Returns the CSV's path."""
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    stations = [("KQ-7", 1998, "Ilse Marlow"), ("RV-2", 2003, "Tomas Ekberg"), ("LN-4", 1994, "Ada Pereira")]
    search, pages, rows = {}, {}, []
    for n, (station, year, founder) in enumerate(stations):
        url = f"https://stations.example/{station.lower()}"
        search[f"{station} weather station history"] = f"1. {station} station history: {url}\n2. Station list: no history"
        pages[url] = _station_page(station, year, founder)
        question, answer = (
            (f"In what year did the {station} weather station open?", str(year))
            if n != 1
            else (f"Who built the {station} weather station?", founder)
        )
        meta = {"topic": "Science and technology", "answer_type": "Date" if n != 1 else "Person", "urls": [url]}
        rows.append({"metadata": repr(meta), "problem": question, "answer": answer})
    path = root / CSV_NAME
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["metadata", "problem", "answer"])
        writer.writeheader()
        writer.writerows(rows)
    (root / "tool_cache.json").write_text(json.dumps({"search": search, "pages": pages}, indent=1), encoding="utf-8")
    return path


def describe(tasks: Sequence[SimpleQATask]) -> dict[str, Any]:
    """The selection's size and topics (for the run's summary)."""
    topics: dict[str, int] = {}
    for t in tasks:
        topics[t.topic] = topics.get(t.topic, 0) + 1
    return {"n": len(tasks), "topics": topics}
