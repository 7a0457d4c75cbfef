"""GAIA's tasks as the harness reads them, the deterministic tools the agent calls, and a few bundled GAIA-shaped
tasks for a protocol check.

A GAIA split is a folder holding ``metadata.jsonl`` (one task a line: ``task_id``, ``Question``, ``Level``,
``Final answer``, ``file_name``) and the attached files next to it; :func:`load_gaia` reads it. The dataset is gated
on the Hugging Face hub (``gaia-benchmark/GAIA``): when the folder is not there the error says how to get it.
Attachments: an image goes to the drafter as pixels and to the verifier as its pre-computed caption (``captions.json``
beside ``metadata.jsonl``, ``{file_name: caption}``; a missing caption is the pipeline's own); any other file is
turned into text by :mod:`.gaia_files` (text files, spreadsheets, PDFs, Word documents).

The paper's agent calls web search and page visits from a cache so that tool returns are deterministic
(Appendix B). :class:`ToolCache` is that cache: ``tool_cache.json`` beside ``metadata.jsonl`` (or any file),
``{"search": {query: results}, "pages": {url: text}}``; it never fetches: a query or page it does not hold raises
:class:`ToolCacheMiss`, one line the agent reads as the tool's error.

:func:`write_bundled_tasks` writes three GAIA-shaped tasks (a web task whose answer sits in a long cached page, a
MiniVista chart attached as an image, a CSV attached as text) in that layout: a check of the protocol, not a score.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.errors import AsymSpecError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp")
GATED = (
    "GAIA is gated on the Hugging Face hub: accept its terms for the dataset gaia-benchmark/GAIA, then "
    "`huggingface-cli download gaia-benchmark/GAIA --repo-type dataset --local-dir DIR` and pass --gaia-dir "
    "DIR/2023/validation (or --bundled for the bundled protocol check)"
)


@dataclass(frozen=True)
class GaiaTask:
    """One GAIA task: ``task_id``, ``question``, ``level``, ``answer`` (the ground truth), ``file`` (the attached
    file's path, or None) and ``caption`` (the attachment's pre-computed caption, when it is an image and one is
    given)."""

    task_id: str
    question: str
    level: int
    answer: str
    file: Path | None = None
    caption: str | None = None

    @property
    def subset(self) -> str:
        """``file`` (an attachment: the single-shot file-QA harness) or ``web`` (the ReAct loop)."""
        return "file" if self.file is not None else "web"

    @property
    def has_image(self) -> bool:
        return self.file is not None and self.file.suffix.lower() in IMAGE_SUFFIXES


def load_gaia(folder: str | Path, limit: int | None = None, level: int | None = None) -> list[GaiaTask]:
    """The tasks of the GAIA split in ``folder`` (``metadata.jsonl`` and its files), in file order (``level``:
    those of that level only; ``limit``: the first ones). A missing folder or file is one line saying how to get it."""
    root = Path(folder)
    meta = root / "metadata.jsonl" if root.suffix != ".jsonl" else root
    root = meta.parent
    if not meta.is_file():
        raise AsymSpecError(f"GAIA's metadata.jsonl is not at {meta}: {GATED}")
    captions_file = root / "captions.json"
    captions = json.loads(captions_file.read_text(encoding="utf-8")) if captions_file.is_file() else {}
    tasks = []
    for n, line in enumerate(meta.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            name = row.get("file_name") or ""
            task = GaiaTask(
                task_id=str(row["task_id"]),
                question=str(row["Question"]),
                level=int(row.get("Level", 0)),
                answer=str(row["Final answer"]),
                file=(root / name) if name else None,
                caption=captions.get(name) if name else None,
            )
        except (json.JSONDecodeError, KeyError, ValueError) as exc:
            raise AsymSpecError(f"{meta} line {n} is not a GAIA task ({type(exc).__name__}: {exc}): {GATED}") from None
        if task.file is not None and not task.file.is_file():
            raise AsymSpecError(f"{meta} line {n}: its attachment {task.file} is missing: download the split's files with it")
        if level is None or task.level == level:
            tasks.append(task)
    return tasks[:limit] if limit is not None else tasks


def attachment_image(task: GaiaTask) -> Any:
    """The attached image as an RGB ``PIL.Image`` (None when the attachment is not an image)."""
    if not task.has_image:
        return None
    from PIL import Image

    with Image.open(task.file) as img:
        return img.convert("RGB")


class ToolCacheMiss(AsymSpecError):
    """A web search or page the tool cache does not hold (the harness never fetches)."""


class ToolCache:
    """Cached web search and page visits: ``search(query)`` returns the cached results of the query (matched
    case-insensitively, else the cached query sharing the most words with it), ``visit(url)`` the cached page;
    a miss raises :class:`ToolCacheMiss`."""

    def __init__(self, search: dict[str, str] | None = None, pages: dict[str, str] | None = None):
        self.searches = {self._key(q): text for q, text in (search or {}).items()}
        self.pages = dict(pages or {})

    @classmethod
    def load(cls, path: str | Path | None) -> ToolCache:
        """The cache in ``path`` (``{"search": {...}, "pages": {...}}``); None or a missing file: an empty cache."""
        if path is None or not Path(path).is_file():
            return cls()
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(data.get("search"), data.get("pages"))

    @staticmethod
    def _key(query: str) -> str:
        return " ".join(re.findall(r"\w+", query.lower()))

    def search(self, query: str) -> str:
        key = self._key(query)
        if key in self.searches:
            return self.searches[key]
        words = set(key.split())
        scored = sorted(((len(words & set(k.split())), k) for k in self.searches), reverse=True)
        if scored and scored[0][0] > 0:
            return self.searches[scored[0][1]]
        raise ToolCacheMiss(
            f"web_search({query!r}): not in the tool cache ({len(self.searches)} cached queries share no word with it); "
            "this harness reads its cache and never searches the web"
        )

    def visit(self, url: str) -> str:
        key = str(url).strip()
        if key not in self.pages:
            raise ToolCacheMiss(
                f"visit_webpage({key!r}): not in the tool cache ({len(self.pages)} cached pages); this harness reads its cache and never fetches"
            )
        return self.pages[key]


def _long_log(rows: int = 40) -> tuple[str, str]:
    """A cached page: a station log of ``rows`` lines and its one line whose value the web task asks for."""
    lines = ["Weather station log, December 2026 (hourly readings, station KQ-7)", "hour | temperature C | wind km/h | note"]
    for h in range(rows):
        note = "calibration check" if h == 23 else "routine"
        lines.append(f"{h:02d}:00 | {(h * 7) % 19 - 4} | {(h * 11) % 37} | {note}")
    return "\n".join(lines), str((23 * 11) % 37)


def write_bundled_tasks(folder: str | Path, seed: int = 1) -> Path:
    """Write three GAIA-shaped tasks into ``folder`` (``metadata.jsonl``, the attachments, ``captions.json`` and
    ``tool_cache.json``): a web task whose answer is one row of a 42-line cached page, a MiniVista chart (seed
    ``seed``, held out) attached as an image with its caption, and a CSV attached as text. Returns the folder."""
    from .minivista import make_problem

    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    page, wind = _long_log()
    url = "https://weather.example/kq7/2026-12"
    cache = {
        "search": {"KQ-7 weather station log December 2026": f"1. KQ-7 station log, December 2026: {url}\n2. Station list: no log"},
        "pages": {url: page},
    }
    chart = make_problem(seed, 0, "figure")
    chart["decoded_image"].save(root / "chart.png")
    table = "item,count\n" + "\n".join(f"crate {i},{(i * 13) % 50}" for i in range(30))
    (root / "inventory.csv").write_text(table + "\n", encoding="utf-8")
    rows = [
        {
            "task_id": "bundled-web-1",
            "Question": "The KQ-7 weather station's December 2026 log has one reading marked 'calibration check'. "
            "What wind speed in km/h does that reading show?",
            "Level": 1,
            "Final answer": wind,
            "file_name": "",
        },
        {
            "task_id": "bundled-image-1",
            "Question": chart["question"],
            "Level": 1,
            "Final answer": chart["answer"],
            "file_name": "chart.png",
        },
        {
            "task_id": "bundled-file-1",
            "Question": "The attached inventory lists crates and their counts. How many items does crate 17 hold?",
            "Level": 1,
            "Final answer": str((17 * 13) % 50),
            "file_name": "inventory.csv",
        },
    ]
    (root / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (root / "captions.json").write_text(json.dumps({"chart.png": chart["caption"]}), encoding="utf-8")
    (root / "tool_cache.json").write_text(json.dumps(cache, indent=1), encoding="utf-8")
    return root
