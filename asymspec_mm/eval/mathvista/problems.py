"""MathVista problems: loading (Hugging Face hub, a local copy, or MiniVista), images, and the selection.

Problems come from the Hugging Face dataset ``AI4Math/MathVista`` (split ``testmini``; needs network
and ``pip install datasets``) or from a local folder: a problems JSON keyed by pid (MathVista's
``data/testmini.json``) plus the images it references (``"image": "images/1.jpg"``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...base.errors import DatasetUnavailableError, UnknownOptionError
from .texts import ENV_TEXT_DIR, TextData, _read_json, has_bard_caption, origin_of, text_base

HF_DATASET = "AI4Math/MathVista"


def pid_key(pid: Any) -> tuple[int, Any]:
    """Sort key of a pid: numeric pids numerically, before the others; those by their text with a trailing number
    compared as a number (``agent-2`` before ``agent-10``)."""
    s = str(pid)
    if s.isdigit():
        return (0, int(s))
    head, tail = re.match(r"(.*?)(\d*)$", s).groups()
    return (1, (head, int(tail) if tail else -1))


def sort_problems(problems: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Problems sorted by pid (numeric pids numerically, then the others as strings)."""
    return sorted(problems, key=lambda p: pid_key(p["pid"]))


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


def _find_problems_file(data_dir: Path, split: str, origin: str = "") -> Path:
    """The problems JSON ``data_dir`` names (the file itself, or ``<split>.json`` in it or its ``data/``)."""
    if data_dir.is_file():
        return data_dir
    for p in (data_dir / f"{split}.json", data_dir / "data" / f"{split}.json", data_dir / "problems.json"):
        if p.is_file():
            return p
    where = "not found" if not data_dir.exists() else f"holds no {split}.json (nor data/{split}.json, problems.json)"
    raise DatasetUnavailableError(
        f"MathVista problems: {data_dir}{origin} {where}; pass --data-dir MathVista's {split}.json or the folder holding it "
        f"(or --text-dir / ${ENV_TEXT_DIR} a folder holding {split}.json); with none of them, eval reads the testmini "
        "copy shipped with the package"
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
    without it, the text folder's ``testmini.json`` (``text_dir``, default :func:`.texts.default_text_dir`:
    text only - images must then come from ``images_dir``). An image ``images/1.jpg`` is looked up as ``<images_dir>/images/1.jpg``,
    then ``<images_dir>/1.jpg``; ``images_dir`` defaults to the problems file's folder.
    """
    origin = ""
    if data_dir is None:
        data_dir, origin = text_base(text_dir), origin_of(text_dir)
    path = _find_problems_file(Path(data_dir), split, origin)
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


def load_minivista_problems(n: int = 100, seed: int = 0, families: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Synthetic MiniVista problems from :mod:`asymspec_mm.eval.minivista` (MathVista schema): the first ``n`` of
    ``seed``, kept to ``families`` (None: all four); ``["agent"]`` / ``["agent-log"]``: the first ``n`` tasks of that family instead."""
    if families is not None and list(families) == ["agent"]:
        from ..minivista_agent import agent_problems

        return agent_problems(n, seed)
    if families is not None and list(families) == ["agent-log"]:
        from ..minivista_log import log_problems

        return log_problems(n, seed)
    try:
        from .. import minivista  # type: ignore[attr-defined]
    except ImportError as exc:
        raise DatasetUnavailableError("the MiniVista generator (asymspec_mm.eval.minivista) is not available in this install") from exc
    generate = getattr(minivista, "generate_problems", None) or getattr(minivista, "generate", None)
    if generate is None:
        raise DatasetUnavailableError("asymspec_mm.eval.minivista has no generate_problems(n, seed)")
    problems = []
    for i, prob in enumerate(generate(n, seed)):
        p = dict(prob)
        p["pid"] = str(p.get("pid", i + 1))
        if families is None or minivista.family_of(p) in families:
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
        base = text_base(text_dir)
        if not (base / f"{split}.json").is_file():
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
            f"MathVista images not found ({shown}). The problems JSON carries no images: pass "
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


def write_problem_images(problems: Iterable[Mapping[str, Any]], out_dir: str | Path) -> list[Path]:
    """Save each problem's in-memory image (``decoded_image``) under ``out_dir`` at the relative path its ``image``
    field names (MiniVista's ``images/<pid>.png``), so the path the run's output JSON records exists in the run
    folder; returns the paths written. An image already there (a resumed run, another shard) is kept."""
    from PIL import Image

    out_dir = Path(out_dir)
    written = []
    for p in problems:
        img, rel = p.get("decoded_image"), Path(str(p.get("image") or ""))
        if img is None or not rel.parts or rel.is_absolute() or ".." in rel.parts:
            continue  # an image on disk already (MathVista's folder) or no path of its own to write
        path = out_dir / rel
        if path.is_file():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        img.save(partial, format=Image.registered_extensions().get(path.suffix.lower(), "PNG"))
        partial.replace(path)  # a crash mid-write leaves no truncated image under the final name
        written.append(path)
    return written


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
