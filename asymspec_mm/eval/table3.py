"""The paper's Table 3 (MathVista, Qwen3-VL-2B drafter + Qwen3-32B verifier) beside a run's accuracies.

Shown only when the run reproduces the table's setting: every compared variant ran the paper protocol
(``--protocol paper``, the official texts, scored by the paper's rules) on exactly the paper's subset - the 587 GPS, VQA and
FQA testmini problems that have a Bard caption. A variant is matched to a row by its method (``drafter``:
"VL drafter alone", ``floor``, ``sd``, ``asymspec``); a variant whose decoding settings are not the
table's (K=4, beta=1, gamma=0.5, CDA, 1,024 new tokens) is listed with the settings that differ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .mathvista.tasks import DEFAULT_TASKS

#: Table 3 accuracies (%) per task and overall, by method.
PAPER_TABLE3: dict[str, dict[str, float]] = {
    "drafter": {"GPS": 53.4, "VQA": 56.4, "FQA": 67.7, "All": 60.5},
    "floor": {"GPS": 62.0, "VQA": 49.1, "FQA": 29.0, "All": 44.5},
    "sd": {"GPS": 62.0, "VQA": 46.4, "FQA": 28.6, "All": 43.8},
    "asymspec": {"GPS": 62.1, "VQA": 59.1, "FQA": 45.7, "All": 53.9},
}
TABLE3_ROW_NAMES: dict[str, str] = {"drafter": "VL drafter alone", "floor": "Floor", "sd": "SD", "asymspec": "AsymSpec"}
#: The decoding settings of Table 3 (the fields a variant's config may set).
PAPER_SETTINGS: dict[str, Any] = {
    "k": 4,
    "beta": 1.0,
    "gamma": 0.5,
    "gate": "cda",
    "delta": "contrast",
    "bonus": "verifier",
    "drafter_view": "image+text",
    "max_new_tokens": 1024,
}
PAPER_SUBSET_SIZE = 587
COLUMNS: tuple[str, ...] = (*DEFAULT_TASKS, "All")


def is_paper_run(records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether one variant's records are the paper's setting: paper protocol and scoring on the official
    texts (Bard captions, EasyOCR), and the 587 problems of the paper's subset, each once."""
    pids = {str(r.get("pid")) for r in records}
    return (
        len(records) == PAPER_SUBSET_SIZE
        and len(pids) == PAPER_SUBSET_SIZE
        and all(
            r.get("protocol") == "paper"
            and r.get("scoring") == "paper"
            and r.get("compressed") == "official"
            and r.get("paper_subset") is True
            for r in records
        )
    )


#: The settings each method reads (the drafter and the floor draft nothing; SD has no fusion or gate).
_READS: dict[str, tuple[str, ...]] = {
    "drafter": ("max_new_tokens",),
    "floor": ("max_new_tokens",),
    "sd": ("k", "max_new_tokens"),
    "asymspec": tuple(PAPER_SETTINGS),
}


def settings_differing(method: str, config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The fields of a variant's ``config`` that ``method`` reads and that are not Table 3's."""
    config = dict(config or {})
    return {k: config[k] for k in _READS.get(method, ()) if k in config and config[k] != PAPER_SETTINGS[k]}


def table3_rows(
    groups: Mapping[str, Sequence[Mapping[str, Any]]], summaries: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]] | None:
    """One row per compared variant (``variant``, ``method``, ``paper``, ``run``, ``diff`` per column, ``settings``),
    or ``None`` when no variant of a Table 3 method ran the paper's setting."""
    rows = []
    for name, recs in groups.items():
        s = summaries.get(name) or {}
        method = s.get("method")
        if method not in PAPER_TABLE3 or not is_paper_run(recs):
            continue
        run = {t: float(s["tasks"][t]["accuracy"]) for t in DEFAULT_TASKS if t in s.get("tasks", {})}
        run["All"] = float(s["accuracy"])
        paper = PAPER_TABLE3[method]
        rows.append(
            {
                "variant": name,
                "method": method,
                "paper": dict(paper),
                "run": run,
                "diff": {c: run[c] - paper[c] for c in COLUMNS if c in run},
                "settings": settings_differing(method, s.get("config")),
            }
        )
    return rows or None


def _cell(run: float | None, paper: float, diff: float | None) -> str:
    if run is None or diff is None:
        return f"— / {paper:.1f}"
    return f"{run:.1f} / {paper:.1f} ({round(diff, 1) + 0.0:+.1f})"  # + 0.0: no "-0.0"


def table3_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The comparison section: a table of ``run / paper (difference)`` per task and overall."""
    header = ["Method", "Variant", *COLUMNS]
    lines = [
        "## Against the paper's Table 3",
        "",
        "Accuracy (%) as `this run / paper (difference)`, the paper protocol on the paper's 587 problems "
        "(GPS, VQA, FQA with a Bard caption). The paper's SD uses a separate Qwen3-1.7B text drafter.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join([":---", ":---"] + ["---:"] * len(COLUMNS)) + "|",
    ]
    for r in rows:
        cells = [_cell(r["run"].get(c), r["paper"][c], r["diff"].get(c)) for c in COLUMNS]
        lines.append("| " + " | ".join([TABLE3_ROW_NAMES[r["method"]], r["variant"].replace("|", "\\|"), *cells]) + " |")
    notes = [
        f"- {r['variant']}: settings differ from Table 3's ({', '.join(f'{k}={v}' for k, v in r['settings'].items())})"
        for r in rows
        if r["settings"]
    ]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def table3_section(
    groups: Mapping[str, Sequence[Mapping[str, Any]]], summaries: Mapping[str, Mapping[str, Any]]
) -> tuple[str, list[dict[str, Any]] | None]:
    """``(markdown, rows)`` of the comparison; ``("", None)`` when the run is not the paper's setting."""
    rows = table3_rows(groups, summaries)
    return (table3_markdown(rows), rows) if rows else ("", None)
