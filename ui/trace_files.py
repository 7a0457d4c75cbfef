"""The run's trace as downloadable files: JSON (the whole result of each method) and CSV (one row per token).

Pure functions of the results (:class:`~asymspec_mm.request.session.MMResult`-like objects with ``trace``, ``text``,
``stats``, ``view``) plus a tokenizer for the texts of the verifier's argmax and the rejected draft.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import tempfile
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["CSV_COLUMNS", "TraceFolders", "trace_csv", "trace_json", "write_trace_files"]

#: Columns of the CSV, in order (``method`` first: one file holds every output of the run).
CSV_COLUMNS = (
    "method",
    "index",
    "token_id",
    "text",
    "source",
    "step",
    "position",
    "p_verifier",
    "p_base",
    "gamma_eff",
    "jsd",
    "verifier_argmax",
    "verifier_argmax_text",
    "steered",
    "draft_token",
    "draft_text",
    "drafter_token_id",
    "verifier_alone",
)


def _decode(tokenizer: Any, token_id: int | None) -> str:
    if token_id is None or tokenizer is None:
        return ""
    try:
        return tokenizer.decode([int(token_id)])
    except Exception:  # noqa: BLE001 - a bad id must not break the download
        return f"<{token_id}>"


def _event_dict(ev: Any, tokenizer: Any) -> dict:
    d = dict(ev) if isinstance(ev, dict) else ev.as_dict()
    d["verifier_argmax_text"] = _decode(tokenizer, d.get("verifier_argmax"))
    d["draft_text"] = _decode(tokenizer, d.get("draft_token"))
    return d


def trace_json(results: Mapping[str, Any], tokenizer: Any = None, *, question: str = "", settings: Mapping | None = None) -> str:
    """The run as JSON: question, settings, and per method its text, stats, compressed view and trace (each event
    with the texts of its verifier argmax and draft)."""
    out: dict[str, Any] = {"question": question, "settings": dict(settings or {}), "methods": {}}
    for method, res in results.items():
        view = getattr(res, "view", None)
        out["methods"][method] = {
            "text": res.text,
            "stats": res.stats,
            "view": {"caption": view.caption, "ocr": view.ocr_text} if view is not None else None,
            "trace": [_event_dict(ev, tokenizer) for ev in res.trace],
        }
    return json.dumps(out, ensure_ascii=False, indent=1, default=str)


def trace_csv(results: Mapping[str, Any], tokenizer: Any = None) -> str:
    """One row per emitted token of each method (:data:`CSV_COLUMNS`; empty cells where a value is absent)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for method, res in results.items():
        for ev in res.trace:
            d = _event_dict(ev, tokenizer)
            writer.writerow({"method": method, **{k: "" if d.get(k) is None else d[k] for k in CSV_COLUMNS if k != "method"}})
    return buf.getvalue()


def write_trace_files(
    results: Mapping[str, Any], folder: str | Path, tokenizer: Any = None, *, question: str = "", settings: Mapping | None = None
) -> tuple[str, str]:
    """Write ``asymspec_trace.json`` and ``asymspec_trace.csv`` into ``folder`` (which exists); their paths."""
    folder = Path(folder)
    json_path, csv_path = folder / "asymspec_trace.json", folder / "asymspec_trace.csv"
    json_path.write_text(trace_json(results, tokenizer, question=question, settings=settings), encoding="utf-8")
    csv_path.write_text(trace_csv(results, tokenizer), encoding="utf-8")
    return str(json_path), str(csv_path)


class TraceFolders:
    """Where the runs' trace files are written: one temporary folder (``asymspec_trace_*``) that holds a folder per
    run, the last :attr:`keep` of them kept (Gradio copies a returned file into its cache as the run's last update
    goes out, so an older run's files are no longer read), removed by :meth:`close` and, for a process that never
    calls it, when the process exits. A write after :meth:`close` starts a new folder."""

    def __init__(self, keep: int = 16) -> None:
        self.keep = keep
        self._root: Path | None = None
        self._runs: list[Path] = []
        self._count = 0
        self._cleanup: weakref.finalize | None = None
        self._lock = threading.Lock()

    @property
    def root(self) -> Path | None:
        """The folder of the runs' folders (``None`` before the first write and after :meth:`close`)."""
        return self._root

    def write(self, results: Mapping[str, Any], tokenizer: Any = None, **fields: Any) -> tuple[str, str]:
        """:func:`write_trace_files` into a new run folder (``fields``: ``question``, ``settings``); their paths."""
        with self._lock:
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="asymspec_trace_"))
                self._cleanup = weakref.finalize(self, shutil.rmtree, self._root, ignore_errors=True)
            run = self._root / f"run{self._count}"
            self._count += 1
            run.mkdir()
            self._runs.append(run)
            old, self._runs = self._runs[: -self.keep], self._runs[-self.keep :]
        for folder in old:
            shutil.rmtree(folder, ignore_errors=True)
        return write_trace_files(results, run, tokenizer, **fields)

    def close(self) -> None:
        """Remove the folder and every run's files in it."""
        with self._lock:
            cleanup, self._cleanup, self._root, self._runs = self._cleanup, None, None, []
        if cleanup is not None:
            cleanup()
