"""MathVista's tasks: the paper's short names (GPS, VQA, FQA, MWP, TQA) and the task filter."""

from __future__ import annotations

from collections.abc import Sequence

from ...base.errors import UnknownOptionError

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
