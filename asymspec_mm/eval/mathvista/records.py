"""The run's records: one JSON line per finished (variant, pid), durable after each append.

A records file is append-only JSONL (flush + fsync per line), so an interrupt loses nothing and a
resumed run never writes a pair twice; shard files are merged by :func:`merge_records`.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from ...frontend.jsonl import complete_lines
from .problems import pid_key

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


def record_key(record: Mapping[str, Any]) -> tuple[str, str]:
    """``(variant, pid)`` of a record."""
    return str(record["variant"]), str(record["pid"])


def record_line(record: Mapping[str, Any]) -> str:
    """One record as a records-file line (the one format of the run's and the merge's files)."""
    return json.dumps(record, ensure_ascii=False, default=_json_default) + "\n"


def read_records(path: str | Path, *, repair: bool = False) -> list[dict[str, Any]]:
    """Records of a JSONL file, first occurrence per (variant, pid); malformed lines skipped.

    ``repair=True`` truncates a partial last line (a write cut short by a crash) so that later
    appends start on a fresh line.
    """
    path = Path(path)
    text, _ = complete_lines(path, repair=repair)
    records: dict[tuple[str, str], dict[str, Any]] = {}
    for n, line in enumerate(text.splitlines(), 1):
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
        line = record_line(record)
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


def records_filename(shard: tuple[int, int] | None) -> str:
    """``records.jsonl``, or ``records-shard<i>of<n>.jsonl`` for a shard."""
    return "records.jsonl" if shard is None else f"records-shard{shard[0]}of{shard[1]}.jsonl"


def _iter_record_files(inputs: Sequence[str | Path]) -> Iterator[Path]:
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            yield from sorted(q for q in p.glob("records*.jsonl") if q.is_file())
        elif p.is_file():
            yield p
        else:
            raise FileNotFoundError(f"{p} does not exist: give records*.jsonl files or the --out folders of eval mathvista runs")


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
    records = sorted(merged.values(), key=lambda r: (str(r["variant"]), pid_key(r["pid"])))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(record_line(rec))
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(out_path)
    return records, dups, conflicts


def log_failure(records_path: Path, pid: str, variant: str, exc: BaseException, log: Callable[[str], None]) -> dict[str, Any]:
    """Append a failed (variant, pid) to ``errors.jsonl`` beside ``records_path`` and say so in one line; the pair
    stays unfinished, so a resumed run retries it. Returns the error's entry."""
    errors_path = Path(records_path).with_name("errors.jsonl")
    err = {
        "pid": pid,
        "variant": variant,
        "error": f"{type(exc).__name__}: {exc}",
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    with open(errors_path, "a", encoding="utf-8") as f:
        f.write(json.dumps(err, ensure_ascii=False) + "\n")
    log(f"error: {variant} pid {pid}: {err['error']} (logged to {errors_path}; --resume retries it)")
    return err
