"""Append-only JSONL files (eval records, batch answers): reading back what a killed run left."""

from __future__ import annotations

import os
from pathlib import Path


def complete_lines(path: Path, *, repair: bool) -> tuple[str, bool]:
    """The text of the file's complete lines, and whether a partial last line was there.

    A write cut short by a kill leaves a last line without its newline; ``repair=True`` truncates it away
    on disk (durably) so that the next append starts on a fresh line. A missing file reads as ``""``.
    """
    if not path.exists():
        return "", False
    raw = path.read_bytes()
    partial = bool(raw) and not raw.endswith(b"\n")
    if partial:
        cut = raw.rfind(b"\n") + 1
        if repair:
            with open(path, "r+b") as f:
                f.truncate(cut)
                f.flush()
                os.fsync(f.fileno())
        raw = raw[:cut] if repair else raw
    return raw.decode("utf-8", errors="replace"), partial
