"""MathVista (testmini) harness: data loading, the official query, the compressed view, the runner.

Data
    Problems come from the Hugging Face dataset ``AI4Math/MathVista`` (split ``testmini``; needs
    network and ``pip install datasets``) or from a local folder: a problems JSON keyed by pid
    (MathVista's ``data/testmini.json``) plus the images it references (``"image": "images/1.jpg"``).
    The text parts - official queries, Bard captions, EasyOCR output - come from MathVista's own
    JSON files (``query.json``, ``captions_bard.json``, ``ocrs_easyocr.json``); by default the
    shared copy next to the repository (``<repo>/../shared/mathvista``) or ``$ASYMSPEC_MATHVISTA_DIR``.

Query
    :func:`build_query` reproduces MathVista's ``query.json`` exactly (zero-shot, shot type
    ``solution``, no caption/OCR in the query: hint line, ``Question: ...`` with ``(Unit: u)``,
    then ``Choices:`` with ``(A) ...`` lines, stripped). The pipeline gets this query as the
    question and the compressed view separately.

Compressed view
    ``official``: Bard caption (with MathVista's boilerplate phrases removed) and EasyOCR text in
    MathVista's plain form ``[([x, y], 'text'), ...]``; the pipeline renders them as
    ``Image description: ...`` / ``Image detected text: ...``. ``auto``: the pipeline makes its own
    (``caption=None, ocr=None``). ``none``: no view at all (``caption="", ocr=False``).

Runner
    :func:`run_mathvista` runs method variants (:func:`build_variants`) over problems, appending
    one JSON line per finished (variant, pid) to a records file (flush + fsync), so an interrupt
    loses nothing; ``resume=True`` skips finished pairs and never writes a pair twice.
    :func:`finalize_run` writes the official output/scores JSON per variant plus a report.
"""

from __future__ import annotations

import ast
import datetime as _dt
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..errors import DatasetUnavailableError, MissingCompressedViewError, UnknownOptionError
from .extraction import LLM, extract_answer_detailed
from .scoring import compute_scores, score_problem, write_json

HF_DATASET = "AI4Math/MathVista"
ENV_TEXT_DIR = "ASYMSPEC_MATHVISTA_DIR"

#: Short task names (the paper's) -> MathVista ``metadata.task`` values.
TASK_ALIASES: dict[str, str] = {
    "GPS": "geometry problem solving",
    "VQA": "visual question answering",
    "FQA": "figure question answering",
    "MWP": "math word problem",
    "TQA": "textbook question answering",
}
TASK_SHORT: dict[str, str] = {v: k for k, v in TASK_ALIASES.items()}
#: The paper's tasks (GPS, VQA, FQA): 656 testmini problems, 587 of them with a Bard caption.
DEFAULT_TASKS: tuple[str, ...] = ("GPS", "VQA", "FQA")

#: Problem fields kept in records and official outputs (MathVista's schema, images excluded).
PROBLEM_FIELDS: tuple[str, ...] = (
    "question",
    "image",
    "choices",
    "unit",
    "precision",
    "answer",
    "question_type",
    "answer_type",
    "pid",
    "metadata",
)

HINTS: dict[str, str] = {
    "multi_choice": "Hint: Please answer the question and provide the correct option letter, e.g., A, B, C, D, at the end.",
    "integer": "Hint: Please answer the question requiring an integer answer and provide the final value, e.g., 1, 2, 3, at the end.",
    "float1": "Hint: Please answer the question requiring a floating-point number with one decimal place and provide the final value, e.g., 1.2, 1.3, 1.4, at the end.",
    "float2": "Hint: Please answer the question requiring a floating-point number with two decimal places and provide the final value, e.g., 1.23, 1.34, 1.45, at the end.",
    "list": "Hint: Please answer the question requiring a Python list as an answer and provide the final list, e.g., [1, 2, 3], [1.2, 1.3, 1.4], at the end.",
    "code": "Hint: Please generate a python code to solve the problem",
}

# Boilerplate that MathVista strips from Bard captions before use (build_query.py's list).
CAPTION_BOILERPLATE: tuple[str, ...] = (
    "Sure. ",
    "Sure, I can do that.",
    "Sorry, I can't help with images of people yet.",
    "I can't process this file.",
    "I'm unable to help you with that, as I'm only a language model and don't have the necessary information or abilities.",
    "I'm not programmed to assist with that.",
    "Please let me know if you have any other questions.",
    "I hope this is helpful!",
    "I hope this helps!",
)

COMPRESSED_MODES: tuple[str, ...] = ("official", "auto", "none")
METHODS: tuple[str, ...] = ("asymspec", "floor", "drafter", "sd")


# --------------------------------------------------------------------------- text data


def default_text_dir() -> Path | None:
    """``$ASYMSPEC_MATHVISTA_DIR``, else ``<repo>/../shared/mathvista`` when it exists."""
    env = os.environ.get(ENV_TEXT_DIR)
    if env:
        return Path(env)
    candidate = Path(__file__).resolve().parents[2].parent / "shared" / "mathvista"
    return candidate if candidate.is_dir() else None


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _texts(obj: Any) -> dict[str, str]:
    """``{"texts": {pid: str}}`` (MathVista's caption/OCR files) or a plain ``{pid: str}``."""
    if isinstance(obj, Mapping) and isinstance(obj.get("texts"), Mapping):
        obj = obj["texts"]
    return {str(k): v for k, v in obj.items()} if isinstance(obj, Mapping) else {}


@dataclass
class TextData:
    """MathVista's text files: official queries, Bard captions (raw), EasyOCR output (raw literals)."""

    queries: dict[str, str] = field(default_factory=dict)
    captions: dict[str, str] = field(default_factory=dict)
    ocrs: dict[str, str] = field(default_factory=dict)
    source: Path | None = None

    @classmethod
    def load(
        cls,
        text_dir: str | Path | None = None,
        *,
        query_file: str | Path | None = None,
        caption_file: str | Path | None = None,
        ocr_file: str | Path | None = None,
    ) -> TextData:
        """Read whichever of ``query.json``, ``captions_bard.json``, ``ocrs_easyocr.json`` exist.

        Files are looked up in ``text_dir`` and its ``texts/`` subfolder (MathVista's ``data/`` layout).
        """
        base = Path(text_dir) if text_dir is not None else default_text_dir()

        def find(explicit: str | Path | None, name: str) -> Path | None:
            if explicit is not None:
                p = Path(explicit)
                if not p.is_file():
                    raise DatasetUnavailableError(f"{p} does not exist")
                return p
            if base is None:
                return None
            for p in (base / name, base / "texts" / name, base / "data" / name, base / "data" / "texts" / name):
                if p.is_file():
                    return p
            return None

        data = cls(source=base)
        if (p := find(query_file, "query.json")) is not None:
            data.queries = {str(k): str(v) for k, v in _read_json(p).items()}
        if (p := find(caption_file, "captions_bard.json")) is not None:
            data.captions = _texts(_read_json(p))
        if (p := find(ocr_file, "ocrs_easyocr.json")) is not None:
            data.ocrs = _texts(_read_json(p))
        return data

    def caption(self, pid: str) -> str:
        """The refined Bard caption of ``pid`` (``""`` when there is none)."""
        return refine_caption(self.captions.get(str(pid)))

    def ocr(self, pid: str) -> str:
        """The refined EasyOCR text of ``pid`` (``""`` when there is none)."""
        return refine_ocr(self.ocrs.get(str(pid)))


def refine_caption(caption: Any) -> str:
    """MathVista's caption clean-up: drop Bard's boilerplate phrases and double spaces."""
    if not isinstance(caption, str):
        return ""
    for phrase in CAPTION_BOILERPLATE:
        caption = caption.replace(phrase, "").strip()
    return caption.replace("  ", " ").strip()


def refine_ocr(raw: Any) -> str:
    """EasyOCR output -> MathVista's plain OCR text ``[([x, y], 'text'), ...]`` (top-left corner + text).

    ``raw`` is the stored Python literal (parsed with :func:`ast.literal_eval`, never ``eval``) or
    an already parsed list of ``(box, text, confidence)``. Empty or unparsable input gives ``""``.
    """
    if raw is None:
        return ""
    items = raw
    if isinstance(raw, str):
        if not raw.strip():
            return ""
        try:
            items = ast.literal_eval(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return ""
    try:
        rows = []
        for item in items:
            box = item[0]
            corner = box[0] if isinstance(box[0], (list, tuple)) else box  # a box of 4 points, or a point
            rows.append(([int(corner[0]), int(corner[1])], item[1]))
    except (TypeError, IndexError, ValueError, KeyError):
        return ""
    return str(rows) if rows else ""


# --------------------------------------------------------------------------- query


def hint_text(problem: Mapping[str, Any], shot_type: str = "solution") -> str:
    """MathVista's hint line for a problem (by question/answer type and precision)."""
    if shot_type == "code":
        return HINTS["code"]
    if shot_type != "solution":
        raise UnknownOptionError(f"shot_type={shot_type!r}: expected 'solution' or 'code'")
    if problem.get("question_type") == "multi_choice":
        return HINTS["multi_choice"]
    answer_type = problem.get("answer_type")
    if answer_type == "integer":
        return HINTS["integer"]
    if answer_type == "float":
        precision = problem.get("precision")
        return HINTS["float2"] if precision is not None and int(precision) == 2 else HINTS["float1"]
    if answer_type == "list":
        return HINTS["list"]
    raise UnknownOptionError(f"pid {problem.get('pid')}: no MathVista hint for answer_type={answer_type!r}")


def question_text(problem: Mapping[str, Any]) -> str:
    """``Question: ...`` with `` (Unit: u)`` when the problem has a unit."""
    text = f"Question: {problem['question']}"
    if problem.get("unit"):
        text += f" (Unit: {problem['unit']})"
    return text


def choices_text(choices: Sequence[str] | None) -> str:
    """``Choices:`` followed by one ``(A) text`` line per option (``""`` without choices)."""
    if not choices:
        return ""
    lines = ["Choices:"] + [f"({chr(ord('A') + i)}) {c}" for i, c in enumerate(choices)]
    return "\n".join(lines)


def build_query(
    problem: Mapping[str, Any],
    *,
    layout: str = "query",
    shot_type: str = "solution",
    caption: str = "",
    ocr: str = "",
) -> str:
    """MathVista's query text for one problem.

    ``layout="query"`` (default) reproduces ``query.json`` / the HF ``query`` field: hint,
    question, choices. ``layout="prompt"`` is ``build_query.py``'s zero-shot test prompt:
    question, choices, ``Image description: ...``, ``Image detected text: ...``, hint, then
    ``Solution: `` (or ``Python code: `` for ``shot_type="code"``).
    """
    hint = hint_text(problem, shot_type)
    q = question_text(problem)
    ch = choices_text(problem.get("choices"))
    if layout == "query":
        parts = [hint, q, ch]
    elif layout == "prompt":
        cap = f"Image description: {caption}" if caption else ""
        oc = f"Image detected text: {ocr}" if ocr else ""
        tail = "Solution: " if shot_type == "solution" else "Python code: "
        parts = [q, ch, cap, oc, hint, tail]
    else:
        raise UnknownOptionError(f"layout={layout!r}: expected 'query' or 'prompt'")
    return "\n".join(p for p in parts if p != "").strip()


def official_query(problem: Mapping[str, Any], text: TextData | None = None) -> str:
    """The problem's own ``query``, else ``query.json``'s, else :func:`build_query`."""
    q = problem.get("query")
    if isinstance(q, str) and q:
        return q
    if text is not None and str(problem.get("pid")) in text.queries:
        return text.queries[str(problem["pid"])]
    return build_query(problem)


# --------------------------------------------------------------------------- problems


def _pid_key(pid: Any) -> tuple[int, Any]:
    s = str(pid)
    return (0, int(s)) if s.isdigit() else (1, s)


def sort_problems(problems: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Problems sorted by pid (numeric pids numerically, then the others as strings)."""
    return sorted(problems, key=lambda p: _pid_key(p["pid"]))


def _problems_from_obj(obj: Any) -> list[dict[str, Any]]:
    if isinstance(obj, Mapping):
        out = []
        for pid, prob in obj.items():
            if str(pid).startswith("_") or not isinstance(prob, Mapping):
                continue
            p = dict(prob)
            p.setdefault("pid", str(pid))
            p["pid"] = str(p["pid"])
            out.append(p)
        return out
    if isinstance(obj, list):
        return [dict(p, pid=str(p["pid"])) for p in obj]
    raise DatasetUnavailableError("the problems file must hold a dict keyed by pid or a list of problems")


def _find_problems_file(data_dir: Path, split: str) -> Path:
    if data_dir.is_file():
        return data_dir
    for p in (data_dir / f"{split}.json", data_dir / "data" / f"{split}.json", data_dir / "problems.json"):
        if p.is_file():
            return p
    raise DatasetUnavailableError(
        f"no {split}.json (or data/{split}.json, problems.json) in {data_dir}; "
        "pass --data-dir pointing at MathVista's problems JSON or its folder"
    )


def load_local_problems(
    data_dir: str | Path | None = None,
    images_dir: str | Path | None = None,
    *,
    split: str = "testmini",
    text_dir: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Problems from a local JSON, each with ``_image_path`` resolved (existence not checked here).

    ``data_dir``: a problems JSON file or a folder holding ``<split>.json`` / ``data/<split>.json``;
    without it, the shared text folder's ``testmini.json`` (text only - images must then come
    from ``images_dir``). An image ``images/1.jpg`` is looked up as ``<images_dir>/images/1.jpg``,
    then ``<images_dir>/1.jpg``; ``images_dir`` defaults to the problems file's folder.
    """
    if data_dir is None:
        base = Path(text_dir) if text_dir is not None else default_text_dir()
        if base is None:
            raise DatasetUnavailableError(
                "no MathVista problems found: pass --data-dir (MathVista's data folder or testmini.json) and "
                "--images-dir, or use the Hugging Face dataset (network + `pip install datasets`)"
            )
        data_dir = base
    path = _find_problems_file(Path(data_dir), split)
    problems = _problems_from_obj(_read_json(path))
    root = Path(images_dir) if images_dir is not None else path.parent
    for p in problems:
        rel = p.get("image")
        if isinstance(rel, str) and rel:
            first, flat = root / rel, root / Path(rel).name
            p["_image_path"] = str(flat if not first.exists() and flat.exists() else first)
    return problems


def load_hf_problems(split: str = "testmini", *, dataset: str = HF_DATASET, cache_dir: str | None = None) -> list[dict[str, Any]]:
    """Problems (with ``decoded_image``) from the Hugging Face dataset; needs network and ``datasets``."""
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError as exc:
        raise DatasetUnavailableError(
            f"the Hugging Face `datasets` package is not installed (`pip install datasets`, or "
            f"`pip install asymspec-mm[eval]`); or pass --data-dir/--images-dir for a local copy of {dataset}"
        ) from exc
    try:
        ds = datasets.load_dataset(dataset, split=split, cache_dir=cache_dir)
    except Exception as exc:  # noqa: BLE001 - network / hub errors of any kind
        raise DatasetUnavailableError(
            f"could not load {dataset} (split {split}) from the Hugging Face hub: {exc}. "
            "Provide a local copy with --data-dir (problems JSON) and --images-dir (its images/ folder)"
        ) from exc
    problems = []
    for row in ds:
        p = dict(row)
        p["pid"] = str(p["pid"])
        problems.append(p)
    return problems


def load_minivista_problems(n: int = 100, seed: int = 0) -> list[dict[str, Any]]:
    """Synthetic MiniVista problems from :mod:`asymspec_mm.eval.minivista` (MathVista schema)."""
    try:
        from . import minivista  # type: ignore[attr-defined]
    except ImportError as exc:
        raise DatasetUnavailableError(
            "the MiniVista generator (asymspec_mm.eval.minivista) is not available in this install"
        ) from exc
    generate = getattr(minivista, "generate_problems", None) or getattr(minivista, "generate", None)
    if generate is None:
        raise DatasetUnavailableError("asymspec_mm.eval.minivista has no generate_problems(n, seed)")
    problems = []
    for i, prob in enumerate(generate(n, seed)):
        p = dict(prob)
        p["pid"] = str(p.get("pid", i + 1))
        problems.append(p)
    return problems


def load_problems(
    source: str = "auto",
    *,
    data_dir: str | Path | None = None,
    images_dir: str | Path | None = None,
    text_dir: str | Path | None = None,
    split: str = "testmini",
) -> list[dict[str, Any]]:
    """MathVista problems from ``"hf"``, ``"local"`` or ``"auto"`` (local when a folder is given, else HF).

    ``auto`` without --data-dir/--images-dir tries the hub; when that fails the error says how to
    provide the data (local problems also need their images: see :func:`check_images`).
    """
    if source == "hf":
        return load_hf_problems(split)
    if source == "local" or data_dir is not None or images_dir is not None:
        return load_local_problems(data_dir, images_dir, split=split, text_dir=text_dir)
    if source != "auto":
        raise UnknownOptionError(f"source={source!r}: expected 'auto', 'hf' or 'local'")
    try:
        return load_hf_problems(split)
    except DatasetUnavailableError as exc:
        base = Path(text_dir) if text_dir is not None else default_text_dir()
        if base is None or not (base / f"{split}.json").is_file():
            raise
        # text-only fallback: enough for selection/counting; check_images() then says how to add images
        print(f"note: {exc}\nnote: using the text-only problems in {base / f'{split}.json'}", file=sys.stderr)
        return load_local_problems(base, None, split=split)


def check_images(problems: Sequence[Mapping[str, Any]]) -> None:
    """Raise :class:`DatasetUnavailableError` naming missing images (before any model is loaded)."""
    missing = []
    for p in problems:
        if p.get("decoded_image") is not None:
            continue
        path = p.get("_image_path")
        if not path or not Path(path).is_file():
            missing.append(f"pid {p.get('pid')}: {path or p.get('image') or '(no image field)'}")
    if missing:
        shown = "; ".join(missing[:3]) + (f"; ... ({len(missing)} in all)" if len(missing) > 3 else "")
        raise DatasetUnavailableError(
            f"MathVista images not found ({shown}). The shared JSON files carry no images: pass "
            "--images-dir (the folder holding images/<pid>.jpg) with --data-dir, or load "
            "AI4Math/MathVista from the Hugging Face hub (network + `pip install datasets`)"
        )


def load_image(problem: Mapping[str, Any]) -> Any:
    """The problem's image as an RGB ``PIL.Image`` (``decoded_image``, else ``_image_path``/``image``)."""
    from PIL import Image

    img = problem.get("decoded_image")
    if img is None:
        path = problem.get("_image_path") or problem.get("image")
        if not path or not Path(str(path)).is_file():
            raise DatasetUnavailableError(f"pid {problem.get('pid')}: image {path!r} not found (see --images-dir)")
        with Image.open(str(path)) as im:
            img = im.copy()
    if hasattr(img, "mode") and img.mode != "RGB":
        img = img.convert("RGB")
    return img


def resolve_tasks(spec: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """Task filter -> MathVista task names; ``None``/``"all"`` means no filter.

    Accepts short names (GPS, VQA, FQA, MWP, TQA, any case) and full task names, comma separated.
    """
    if spec is None:
        return None
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s and s.strip()]
    if not items or any(s.lower() == "all" for s in items):
        return None
    out = []
    for s in items:
        if s.upper() in TASK_ALIASES:
            out.append(TASK_ALIASES[s.upper()])
        elif s.lower() in TASK_SHORT:
            out.append(s.lower())
        else:
            raise UnknownOptionError(f"unknown task {s!r}: use {', '.join(TASK_ALIASES)} or 'all'")
    return tuple(dict.fromkeys(out))


def parse_shard(spec: str | None) -> tuple[int, int] | None:
    """``"i/n"`` (0-based ``i``) -> ``(i, n)``."""
    if spec is None or spec == "":
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", spec)
    if not m:
        raise UnknownOptionError(f"--shard {spec!r}: expected i/n, e.g. 0/4")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 0 <= i < n:
        raise UnknownOptionError(f"--shard {spec!r}: need 0 <= i < n")
    return i, n


def problem_caption(problem: Mapping[str, Any], text: TextData | None) -> str:
    """The official caption of a problem: its own ``caption`` field, else the Bard caption."""
    if isinstance(problem.get("caption"), str):
        return refine_caption(problem["caption"])
    return text.caption(str(problem["pid"])) if text is not None else ""


def problem_ocr(problem: Mapping[str, Any], text: TextData | None) -> str:
    """The official OCR text of a problem: its own ``ocr`` field, else EasyOCR's."""
    if "ocr" in problem and problem["ocr"] is not None:
        own = problem["ocr"]
        if isinstance(own, str):
            try:
                parsed = ast.literal_eval(own) if own.strip() else []
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                return own.strip()  # free OCR text
            return refine_ocr(parsed) if isinstance(parsed, (list, tuple)) else own.strip()
        return refine_ocr(own)
    return text.ocr(str(problem["pid"])) if text is not None else ""


def has_bard_caption(problem: Mapping[str, Any], text: TextData | None) -> bool:
    """True when the problem has a caption: its own ``caption`` field, or an entry in captions_bard.json.

    This is the paper's subset (587 GPS/VQA/FQA testmini problems). The entry counts even when
    MathVista's clean-up empties it: 7 of the 587 are Bard refusals ("I can't process this file.").
    """
    own = problem.get("caption")
    if isinstance(own, str):
        return bool(own.strip())
    if text is None:
        return False
    raw = text.captions.get(str(problem["pid"]))
    return isinstance(raw, str) and bool(raw.strip())


def select_problems(
    problems: Iterable[dict[str, Any]],
    *,
    tasks: Sequence[str] | None = None,
    require_caption: bool = False,
    text: TextData | None = None,
    limit: int | None = None,
    shard: tuple[int, int] | None = None,
) -> list[dict[str, Any]]:
    """Filter by ``metadata.task`` and caption availability, sort by pid, cut to ``limit``, take a shard.

    Shards are round-robin over the sorted (and limited) list, so the union of all ``n`` shards is
    exactly the unsharded selection.
    """
    out = []
    for p in problems:
        task = (p.get("metadata") or {}).get("task")
        if tasks is not None and task not in tasks:
            continue
        if require_caption and not has_bard_caption(p, text):
            continue
        out.append(p)
    out = sort_problems(out)
    if limit is not None and limit >= 0:
        out = out[:limit]
    if shard is not None:
        i, n = shard
        out = out[i::n]
    return out


# --------------------------------------------------------------------------- variants


@dataclass(frozen=True)
class Variant:
    """A named method setting: ``method`` for ``pipe.generate`` and ``AsymSpecConfig`` fields."""

    name: str
    method: str
    config: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "method": self.method, "config": dict(self.config)}


#: Variant names -> (method, config fields). Ablations are AsymSpec with one knob changed.
VARIANT_BASES: dict[str, tuple[str, dict[str, Any]]] = {
    "asymspec": ("asymspec", {}),
    "floor": ("floor", {}),
    "drafter": ("drafter", {}),
    "sd": ("sd", {}),
    "fixed": ("asymspec", {"gate": "fixed"}),
    "tuned": ("asymspec", {"gate": "tuned"}),
    "raw": ("asymspec", {"delta": "raw"}),
    "scd": ("asymspec", {"delta": "scd"}),
    "beta0": ("asymspec", {"beta": 0.0}),
}
# Which sweep parameters apply to which variants.
_SWEEP_APPLIES: dict[str, frozenset[str]] = {
    "k": frozenset({"asymspec", "sd", "fixed", "tuned", "raw", "scd", "beta0"}),
    "beta": frozenset({"asymspec", "fixed", "tuned", "raw", "scd"}),
    "gamma": frozenset({"asymspec", "fixed", "tuned", "raw", "scd", "beta0"}),
    "lam": frozenset({"tuned"}),
}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return format(v, "g")
    return str(v)


def parse_list(spec: str | Sequence[Any] | None, cast: Callable[[str], Any]) -> list[Any] | None:
    """``"2,4,8"`` -> ``[2, 4, 8]`` (``None`` stays ``None``)."""
    if spec is None:
        return None
    if isinstance(spec, str):
        items = [s.strip() for s in spec.split(",") if s.strip()]
        if not items:
            return None
        try:
            return [cast(s) for s in items]
        except ValueError as exc:
            raise UnknownOptionError(f"bad list {spec!r}: {exc}") from exc
    return [cast(str(s)) if isinstance(s, str) else s for s in spec]


def build_variants(
    methods: str | Sequence[str],
    *,
    k: Sequence[int] | None = None,
    beta: Sequence[float] | None = None,
    gamma: Sequence[float] | None = None,
    lam: Sequence[float] | None = None,
    common: Mapping[str, Any] | None = None,
) -> list[Variant]:
    """Expand method names and sweep lists into variants.

    ``methods``: any of asymspec, floor, drafter, sd, fixed, tuned, raw, scd, beta0 (list or comma
    string). Each sweep list given (``k``, ``beta``, ``gamma``, ``lam``) multiplies the variants it
    applies to, and its value enters the name, e.g. ``asymspec@k=4,beta=0.5``; parameters not given
    keep the pipeline's defaults and stay out of the name, so names are stable across resumes.
    ``common`` fields (``max_new_tokens``, ``drafter_view``, ``bonus``) go into every config.
    """
    names = [m.strip() for m in (methods.split(",") if isinstance(methods, str) else methods) if m and m.strip()]
    if not names:
        raise UnknownOptionError("no methods given")
    sweeps = {"k": k, "beta": beta, "gamma": gamma, "lam": lam}
    variants: list[Variant] = []
    for name in dict.fromkeys(names):
        if name not in VARIANT_BASES:
            raise UnknownOptionError(f"unknown method/variant {name!r}: use {', '.join(VARIANT_BASES)}")
        method, base_cfg = VARIANT_BASES[name]
        combos: list[dict[str, Any]] = [{}]
        for param, values in sweeps.items():
            if values is None or name not in _SWEEP_APPLIES[param]:
                continue
            combos = [dict(c, **{param: v}) for c in combos for v in values]
        for combo in combos:
            cfg = dict(common or {})
            cfg.update(base_cfg)
            cfg.update(combo)
            suffix = ",".join(f"{p}={_fmt(v)}" for p, v in combo.items())
            variants.append(Variant(f"{name}@{suffix}" if suffix else name, method, cfg))
    return variants


def safe_name(name: str) -> str:
    """A variant name usable in a file name."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", name)


# --------------------------------------------------------------------------- records


def record_key(record: Mapping[str, Any]) -> tuple[str, str]:
    """``(variant, pid)`` of a record."""
    return str(record["variant"]), str(record["pid"])


def read_records(path: str | Path, *, repair: bool = False) -> list[dict[str, Any]]:
    """Records of a JSONL file, first occurrence per (variant, pid); malformed lines skipped.

    ``repair=True`` truncates a partial last line (a write cut short by a crash) so that later
    appends start on a fresh line.
    """
    path = Path(path)
    if not path.exists():
        return []
    raw = path.read_bytes()
    if repair and raw and not raw.endswith(b"\n"):
        cut = raw.rfind(b"\n") + 1
        with open(path, "r+b") as f:
            f.truncate(cut)
            f.flush()
            os.fsync(f.fileno())
        raw = raw[:cut]
    records: dict[tuple[str, str], dict[str, Any]] = {}
    for n, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            key = record_key(rec)
        except (json.JSONDecodeError, KeyError, TypeError):
            print(f"warning: {path}:{n}: skipping a malformed record line", file=sys.stderr)
            continue
        records.setdefault(key, rec)
    return list(records.values())


class RecordStore:
    """Append-only JSONL of records, one line per (variant, pid), durable after each append.

    ``resume=False`` refuses an existing non-empty file unless ``overwrite=True``; ``resume=True``
    loads it (repairing a partial last line). :meth:`append` never writes a key twice.
    """

    def __init__(self, path: str | Path, *, resume: bool = False, overwrite: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        exists = self.path.exists() and self.path.stat().st_size > 0
        if exists and not resume and not overwrite:
            raise FileExistsError(f"{self.path} already holds results: pass --resume to continue it or --overwrite to start over")
        if overwrite and not resume:
            self.path.write_bytes(b"")
        self.records: dict[tuple[str, str], dict[str, Any]] = {
            record_key(r): r for r in (read_records(self.path, repair=True) if resume else [])
        }
        self._file: TextIO | None = None

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self.records

    def __len__(self) -> int:
        return len(self.records)

    def append(self, record: dict[str, Any]) -> bool:
        """Write ``record`` (one line, flushed and fsynced); ``False`` if its key is already stored."""
        key = record_key(record)
        if key in self.records:
            return False
        line = json.dumps(record, ensure_ascii=False, default=_json_default) + "\n"
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(line)
        self._file.flush()
        os.fsync(self._file.fileno())
        self.records[key] = record
        return True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> RecordStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


STATS_KEYS: tuple[str, ...] = (
    "steps",
    "drafted",
    "accepted",
    "acceptance_rate",
    "mean_accepted_length",
    "accepted_per_position",
    "tokens_per_s",
    "new_tokens",
    "wall_s",
)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        value = value.tolist()
    elif hasattr(value, "item") and not isinstance(value, (list, tuple, dict)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and len(value) <= 64 and all(isinstance(v, (bool, int, float)) or v is None for v in value):
        return list(value)
    return None


def stats_subset(stats: Mapping[str, Any] | None) -> dict[str, Any]:
    """The JSON-friendly part of ``res.stats``: the known keys first, then other scalars."""
    if not stats:
        return {}
    out: dict[str, Any] = {}
    for key in list(STATS_KEYS) + [k for k in stats if k not in STATS_KEYS]:
        if key in stats:
            v = _jsonable(stats[key])
            if v is not None or key in STATS_KEYS:
                out[key] = v
    return out


def problem_fields(problem: Mapping[str, Any], query: str) -> dict[str, Any]:
    """The problem's MathVista fields plus ``query`` (no image data, no private keys)."""
    out = {k: problem.get(k) for k in PROBLEM_FIELDS if k in problem}
    out["pid"] = str(problem["pid"])
    out["query"] = query
    return out


# --------------------------------------------------------------------------- runner


class _Progress:
    """tqdm when installed (and enabled), else a line every few percent."""

    def __init__(self, total: int, initial: int, enabled: bool, desc: str = "mathvista") -> None:
        self.total, self.n, self.enabled = total, initial, enabled
        self._bar: Any = None
        self._last_print = 0.0
        if enabled:
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True)
            except ImportError:
                self._bar = None

    def update(self, postfix: str) -> None:
        self.n += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(postfix, refresh=False)
            self._bar.update(1)
            return
        now = time.monotonic()
        step = max(1, self.total // 20)
        if self.n == self.total or self.n % step == 0 or now - self._last_print > 30:
            self._last_print = now
            print(f"[{self.n}/{self.total}] {postfix}", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


@dataclass
class RunSummary:
    """What :func:`run_mathvista` did: new/skipped/failed counts and all records of the run's pairs."""

    records: list[dict[str, Any]]
    new: int = 0
    skipped: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)


def _default_config_factory() -> Callable[..., Any]:
    from .. import AsymSpecConfig  # lazy: imports torch

    return AsymSpecConfig


def view_for(problem: Mapping[str, Any], compressed: str, text: TextData | None, *, dataset: str = "mathvista") -> tuple[str | None, str | bool | None]:
    """``(caption, ocr)`` arguments for ``pipe.generate`` under a compressed-view mode."""
    if compressed == "auto":
        return None, None
    if compressed == "none":
        return "", False
    if compressed != "official":
        raise UnknownOptionError(f"compressed={compressed!r}: expected one of {COMPRESSED_MODES}")
    has_own = isinstance(problem.get("caption"), str) or problem.get("ocr") is not None
    if not has_own and (text is None or (not text.captions and not text.ocrs)):
        raise MissingCompressedViewError(
            f"{dataset} pid {problem.get('pid')}: no official caption/OCR text available "
            "(MathVista: pass --text-dir with captions_bard.json and ocrs_easyocr.json; otherwise use --compressed auto)"
        )
    caption = problem_caption(problem, text)
    ocr = problem_ocr(problem, text)
    return caption, (ocr if ocr else False)


def _check_config_consistency(store: RecordStore, variants: Sequence[Variant]) -> None:
    seen: dict[str, Mapping[str, Any]] = {}
    for (vname, _pid), rec in store.records.items():
        seen.setdefault(vname, rec.get("config") or {})
    for v in variants:
        old = seen.get(v.name)
        if old is not None and dict(old) != json.loads(json.dumps(dict(v.config), default=_json_default)):
            raise UnknownOptionError(
                f"variant {v.name!r} in {store.path} was run with config {dict(old)}, now {dict(v.config)}: "
                "use the same flags to resume, or a new --out"
            )


def run_mathvista(
    pipe: Any,
    problems: Sequence[Mapping[str, Any]],
    variants: Sequence[Variant],
    records_path: str | Path,
    *,
    text: TextData | None = None,
    compressed: str = "official",
    resume: bool = False,
    overwrite: bool = False,
    llm: LLM | None = None,
    extract_mode: str = "rules",
    on_error: str = "skip",
    progress: bool = True,
    config_factory: Callable[..., Any] | None = None,
    dataset: str = "mathvista",
    image_loader: Callable[[Mapping[str, Any]], Any] = load_image,
    log: Callable[[str], None] = print,
) -> RunSummary:
    """Run every variant on every problem, appending one record per finished pair to ``records_path``.

    ``pipe`` needs ``generate(image, question, caption=..., ocr=..., method=..., config=...)``
    returning an object with ``text`` and ``stats`` (and optionally ``token_ids``).
    ``config_factory(**variant.config)`` makes the config (default: ``AsymSpecConfig``).
    Problems are the outer loop, so one image serves all variants. ``on_error="skip"`` logs a
    failed generation to ``errors.jsonl`` next to the records and goes on (the pair stays
    unfinished and a resumed run retries it); ``"raise"`` stops. ``KeyboardInterrupt`` propagates
    after everything finished so far is on disk.
    """
    if on_error not in ("skip", "raise"):
        raise UnknownOptionError(f"on_error={on_error!r}: expected 'skip' or 'raise'")
    make_config = config_factory or _default_config_factory()
    records_path = Path(records_path)
    errors_path = records_path.with_name("errors.jsonl")
    summary = RunSummary(records=[])
    with RecordStore(records_path, resume=resume, overwrite=overwrite) as store:
        _check_config_consistency(store, variants)
        pairs_total = len(problems) * len(variants)
        already = sum(1 for p in problems for v in variants if (v.name, str(p["pid"])) in store)
        summary.skipped = already
        if already:
            log(f"resuming: {already}/{pairs_total} (variant, problem) pairs already in {records_path}")
        bar = _Progress(pairs_total, already, progress)
        correct = done = 0
        acc_sum = acc_n = 0.0
        tok = wall = 0.0
        try:
            for problem in problems:
                pid = str(problem["pid"])
                pending = [v for v in variants if (v.name, pid) not in store]
                if not pending:
                    continue
                query = official_query(problem, text)
                caption, ocr = view_for(problem, compressed, text, dataset=dataset)
                image = image_loader(problem)
                for variant in pending:
                    t0 = time.perf_counter()
                    try:
                        res = pipe.generate(
                            image, query, caption=caption, ocr=ocr, method=variant.method, config=make_config(**dict(variant.config))
                        )
                    except (KeyboardInterrupt, SystemExit, DatasetUnavailableError):
                        raise
                    except Exception as exc:  # noqa: BLE001 - a failed generation must not lose the run
                        if on_error == "raise":
                            raise
                        err = {
                            "pid": pid,
                            "variant": variant.name,
                            "error": f"{type(exc).__name__}: {exc}",
                            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                        }
                        summary.errors.append(err)
                        with open(errors_path, "a", encoding="utf-8") as f:
                            f.write(json.dumps(err, ensure_ascii=False) + "\n")
                        log(f"error: {variant.name} pid {pid}: {err['error']} (logged to {errors_path}; --resume retries it)")
                        bar.update("error")
                        continue
                    wall_s = time.perf_counter() - t0
                    response = str(getattr(res, "text", "") or "")
                    stats = stats_subset(getattr(res, "stats", None))
                    token_ids = getattr(res, "token_ids", None)
                    new_tokens = stats.get("new_tokens")
                    if new_tokens is None and token_ids is not None:
                        try:
                            new_tokens = len(token_ids)
                        except TypeError:
                            new_tokens = None
                    fields = problem_fields(problem, query)
                    ext = extract_answer_detailed(response, fields, llm=llm, mode=extract_mode)
                    prediction, true_false = score_problem(fields, ext.answer)
                    record = {
                        "pid": pid,
                        "variant": variant.name,
                        "method": variant.method,
                        "config": dict(variant.config),
                        "dataset": dataset,
                        "compressed": compressed,
                        "response": response,
                        "extraction": ext.answer,
                        "extraction_rule": ext.rule,
                        "prediction": prediction,
                        "true_false": true_false,
                        "answer": problem.get("answer"),
                        "task": (problem.get("metadata") or {}).get("task"),
                        "new_tokens": new_tokens,
                        "wall_s": round(wall_s, 4),
                        "stats": stats,
                        "problem": fields,
                        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    }
                    if store.append(record):
                        summary.new += 1
                    done += 1
                    correct += bool(true_false)
                    if isinstance(stats.get("acceptance_rate"), (int, float)) and stats.get("drafted") != 0:
                        acc_sum += float(stats["acceptance_rate"])
                        acc_n += 1
                    if new_tokens:
                        tok += float(new_tokens)
                    wall += wall_s
                    parts = [f"acc={100 * correct / done:.1f}%"]
                    if acc_n:
                        parts.append(f"accept={acc_sum / acc_n:.2f}")
                    if wall > 0 and tok:
                        parts.append(f"tok/s={tok / wall:.1f}")
                    bar.update(" ".join(parts))
        except KeyboardInterrupt:
            bar.close()
            log(f"\ninterrupted: {len(store)} records are safe in {records_path}; rerun with --resume to continue")
            raise
        bar.close()
        wanted = {(v.name, str(p["pid"])) for p in problems for v in variants}
        summary.records = [r for k, r in store.records.items() if k in wanted]
    return summary


# --------------------------------------------------------------------------- outputs


def group_by_variant(records: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Records grouped by variant (first-appearance order), each list sorted by pid."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(str(r["variant"]), []).append(dict(r))
    return {k: sorted(v, key=lambda r: _pid_key(r["pid"])) for k, v in groups.items()}


def official_output(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """MathVista's output JSON for one variant: pid -> problem fields + query + response + extraction
    + prediction + true_false (rescored here), plus ``stats``."""
    out: dict[str, dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: _pid_key(r["pid"])):
        entry = dict(r.get("problem") or {})
        entry.setdefault("pid", str(r["pid"]))
        entry["response"] = r.get("response", "")
        entry["extraction"] = r.get("extraction", "")
        entry["prediction"], entry["true_false"] = score_problem(entry, entry["extraction"])
        if r.get("stats"):
            entry["stats"] = r["stats"]
        out[str(r["pid"])] = entry
    return out


def finalize_run(
    records: Iterable[Mapping[str, Any]],
    out_dir: str | Path,
    *,
    variant_order: Sequence[str] | None = None,
    chart: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Write ``output_<variant>.json``, ``scores_<variant>.json``, ``summary.json``, ``report.md`` and
    ``accuracy.png`` (when matplotlib is installed) under ``out_dir``; return the summary."""
    from .report import summarize_variants, write_report

    out_dir = Path(out_dir)
    groups = group_by_variant(records)
    if variant_order:
        order = [v for v in variant_order if v in groups] + [v for v in groups if v not in variant_order]
        groups = {v: groups[v] for v in order}
    files: dict[str, dict[str, str]] = {}
    for name, recs in groups.items():
        output = official_output(recs)
        scores = compute_scores(output)
        o = write_json(output, out_dir / f"output_{safe_name(name)}.json")
        s = write_json(scores, out_dir / f"scores_{safe_name(name)}.json")
        files[name] = {"output": str(o), "scores": str(s)}
    summaries = summarize_variants(groups)
    paths = write_report(summaries, out_dir, chart=chart, log=log)
    summary = {"variants": summaries, "files": files, "report": {k: str(v) for k, v in paths.items()}}
    write_json(summary, out_dir / "summary.json")
    return summary


def _iter_record_files(inputs: Sequence[str | Path]) -> Iterator[Path]:
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            yield from sorted(q for q in p.glob("records*.jsonl") if q.is_file())
        elif p.is_file():
            yield p
        else:
            raise FileNotFoundError(f"{p} does not exist")


def merge_records(inputs: Sequence[str | Path], out_path: str | Path) -> tuple[list[dict[str, Any]], int, int]:
    """Merge shard record files (or folders holding ``records*.jsonl``) into ``out_path``.

    Returns ``(records, duplicates, conflicts)``: a pair present in several inputs is kept once
    (the first); ``conflicts`` counts duplicates whose responses differ.
    """
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    dups = conflicts = 0
    out_path = Path(out_path)
    for path in list(_iter_record_files(inputs)):  # everything is read before out_path is replaced
        for rec in read_records(path):
            key = record_key(rec)
            if key in merged:
                dups += 1
                conflicts += merged[key].get("response") != rec.get("response")
                continue
            merged[key] = rec
    records = sorted(merged.values(), key=lambda r: (str(r["variant"]), _pid_key(r["pid"])))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False, default=_json_default) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(out_path)
    return records, dups, conflicts


def records_filename(shard: tuple[int, int] | None) -> str:
    """``records.jsonl``, or ``records-shard<i>of<n>.jsonl`` for a shard."""
    return "records.jsonl" if shard is None else f"records-shard{shard[0]}of{shard[1]}.jsonl"
