"""What the benchmark scripts (``python -m asymspec_mm.bench.<name>``) share: a parser whose description is the first
paragraph of the script's docstring, the options of a script that repeats its runs, and the JSON of its figures."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..frontend.help import terminal_text


def script_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of ``python -m <module>``: the first paragraph of ``doc`` (the module's docstring) as its
    description, and ``--preset`` (the pair to load, default ``tiny``)."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=terminal_text((doc or "").split("\n\n")[0]))
    ap.add_argument("--preset", default="tiny")
    return ap


def add_repetition_options(ap: argparse.ArgumentParser, *, reps: int = 3, max_new_tokens: int = 16) -> None:
    """``--reps`` (repetitions of the whole run), ``--max-new-tokens`` (each answer's length) and ``--json`` (where
    every repetition's figures go)."""
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    ap.add_argument("--json", default=None, help="write every repetition's figures here")


def write_json(path: str | None, figures: Any) -> None:
    """``figures`` as indented JSON at ``path`` (nothing when ``path`` is ``None``: ``--json`` not given)."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1)
