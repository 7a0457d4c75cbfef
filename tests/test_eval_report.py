"""The eval report: the recovery rule, accepted length only for speculative methods, the dataset in the titles,
per-cell n and bootstrap confidence intervals, and a chart whose legend covers no bar."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from asymspec_mm.eval.mathvista.run import _Tally
from asymspec_mm.eval.report import (
    bootstrap_ci,
    dataset_label,
    markdown_table,
    recovery,
    summarize_records,
    summarize_variants,
    write_report,
)
from asymspec_mm.eval.report_chart import bar_label, bar_values, build_chart


@pytest.mark.parametrize(
    "acc, floor, drafter, ratio, cell",
    [
        (50.0, 40.0, 60.0, 0.5, "50%"),
        (40.0, 40.0, 60.0, 0.0, "0%"),
        (60.0, 40.0, 60.0, 1.0, "100%"),
        (30.0, 40.0, 60.0, -0.5, "-50%"),
        (42.0, 40.0, 42.0, 1.0, "100%"),  # a 2-point lead is enough
        (90.0, 40.0, 45.0, 10.0, "above drafter"),  # not "1000%"
        (50.0, 40.0, 41.5, None, "gap < 2 pts"),
        (50.0, 40.0, 40.0, None, "drafter not above Floor"),  # not an unexplained "-"
        (50.0, 45.0, 40.0, None, "drafter not above Floor"),
    ],
)
def test_recovery_rule(acc: float, floor: float, drafter: float, ratio: float | None, cell: str) -> None:
    got_ratio, got_cell = recovery(acc, floor, drafter)
    assert got_cell == cell
    assert got_ratio == (None if ratio is None else pytest.approx(ratio))


def test_bootstrap_ci_known_properties() -> None:
    assert bootstrap_ci([True] * 17) == (100.0, 100.0)
    assert bootstrap_ci([False] * 9) == (0.0, 0.0)
    assert bootstrap_ci([]) is None
    rng = random.Random(3)
    for n in (5, 20, 60):
        outcomes = [rng.random() < 0.4 for _ in range(n)]
        lo, hi = bootstrap_ci(outcomes)
        point = 100.0 * sum(outcomes) / n
        assert 0.0 <= lo <= point <= hi <= 100.0
        assert bootstrap_ci(outcomes) == (lo, hi)  # seeded: the same interval every time
        lo90, hi90 = bootstrap_ci(outcomes, level=0.9)
        assert lo <= lo90 <= hi90 <= hi


def test_bootstrap_ci_matches_the_normal_approximation() -> None:
    """For n = 400 at p = 0.3 the percentile bootstrap is close to p +- 1.96 sqrt(p(1-p)/n)."""
    outcomes = [True] * 120 + [False] * 280
    half = 100 * 1.96 * math.sqrt(0.3 * 0.7 / 400)  # 4.49 points
    lo, hi = bootstrap_ci(outcomes, resamples=4000)
    assert lo == pytest.approx(30.0 - half, abs=0.6) and hi == pytest.approx(30.0 + half, abs=0.6)
    other = bootstrap_ci(outcomes, resamples=4000, seed=1)
    assert other != (lo, hi) and other[0] == pytest.approx(lo, abs=0.6)


def records(method: str, outcomes: list[bool], tasks: list[str], dataset: str = "minivista") -> list[dict[str, Any]]:
    drafted = 0 if method in ("floor", "drafter") else 8
    stats = {"steps": 4, "drafted": drafted, "accepted": drafted // 2, "acceptance_rate": 0.5 if drafted else 0.0}
    stats.update(mean_accepted_length=2.0 if drafted else 1.0, new_tokens=8, wall_s=0.5)
    return [
        {
            "pid": str(i),
            "variant": method,
            "method": method,
            "true_false": ok,
            "task": t,
            "dataset": dataset,
            "stats": stats,
            "new_tokens": 8,
        }
        for i, (ok, t) in enumerate(zip(outcomes, tasks), 1)
    ]


TASKS = ["geometry problem solving"] * 4 + ["visual question answering"] * 6


def test_accepted_length_and_acceptance_only_for_speculative_methods() -> None:
    outcomes = [True, False] * 5
    for method in ("floor", "drafter"):  # their stats say 1.00: meaningless, so blank
        s = summarize_records(records(method, outcomes, TASKS))
        assert s["mean_accepted_length"] is None and s["acceptance_rate"] is None
    for method in ("asymspec", "sd"):
        s = summarize_records(records(method, outcomes, TASKS))
        assert s["mean_accepted_length"] == pytest.approx(2.0) and s["acceptance_rate"] == pytest.approx(0.5)
    s = summarize_records(records("asymspec", outcomes, TASKS))
    assert s["tasks"]["GPS"]["total"] == 4 and s["tasks"]["VQA"]["total"] == 6
    assert s["tasks"]["GPS"]["ci95"] == bootstrap_ci(outcomes[:4]) and s["ci95"] == bootstrap_ci(outcomes)


def test_minivista_mixed_family_is_labelled_by_its_name_not_mwp() -> None:
    from asymspec_mm.eval import minivista as mv

    tasks = [mv.FAMILY_TASK[f] for f in mv.FAMILIES]  # figure, visual, geometry, mixed
    s = summarize_records(records("asymspec", [True] * 4, tasks))
    assert list(s["tasks"]) == ["GPS", "VQA", "FQA", "mixed"]
    header = markdown_table({"asymspec": s}).splitlines()[0]
    assert "| mixed (n=1) |" in header and "MWP" not in header
    # MathVista's own math word problems keep the paper's short name
    assert list(summarize_records(records("asymspec", [True], ["math word problem"], dataset="mathvista"))["tasks"]) == ["MWP"]


def test_table_names_n_ci_recovery_and_the_rules(tmp_path: Path) -> None:
    groups = {
        "floor": records("floor", [True] * 4 + [False] * 6, TASKS),
        "drafter": records("drafter", [True] * 9 + [False], TASKS),
        "asymspec": records("asymspec", [True] * 7 + [False] * 3, TASKS),
        "sd": records("sd", [True] * 4, TASKS[:4]),  # GPS only: no VQA problem at all
    }
    summaries = summarize_variants(groups)
    md = markdown_table(summaries)
    header, _, *rows = md.splitlines()
    # a column's n in its header when all variants that have the task agree, else in each cell
    assert header == "| Method | n | GPS (n=4) | VQA (n=6) | All | Recovery | Accept. | Mean acc. len | Tok/s |"
    by_name = {row.split(" | ")[0][2:]: row.split(" | ") for row in rows}
    floor_row = by_name["floor"]
    assert floor_row[2] == "100.0 [100.0, 100.0]" and floor_row[3] == "0.0 [0.0, 0.0]"
    assert floor_row[4] == "40.0 [{:.1f}, {:.1f}] (n=10)".format(*bootstrap_ci([True] * 4 + [False] * 6))
    assert floor_row[5] == "0%" and floor_row[6] == "" and floor_row[7] == ""  # no acceptance, no accepted length
    assert by_name["asymspec"][5] == "60%" and by_name["asymspec"][7] == "2.00"
    assert by_name["sd"][3] == "n/a" and by_name["sd"][5] == "above drafter"
    paths = write_report(summaries, tmp_path, chart=False, dataset=dataset_label(None, groups["floor"]))
    text = paths["markdown"].read_text(encoding="utf-8")
    assert text.startswith("# MiniVista results\n")
    assert "reported only where the drafter leads Floor by at least 2 points" in text and "drafter - Floor = +50.0 points." in text
    assert "95% bootstrap confidence interval" in text and "1000 resamples" in text
    # equal drafter and Floor: every cell says why there is no ratio
    tied = summarize_variants({"floor": groups["floor"], "drafter": records("drafter", [True] * 4 + [False] * 6, TASKS)})
    assert [row.split(" | ")[5] for row in markdown_table(tied).splitlines()[2:]] == ["drafter not above Floor"] * 2
    # no drafter: no recovery column, and the notes say why
    alone = summarize_variants({"asymspec": groups["asymspec"]})
    assert "Recovery" not in markdown_table(alone)


def test_dataset_label() -> None:
    assert dataset_label({"dataset": {"name": "minivista", "seed": 0}}) == "MiniVista"
    assert dataset_label({"dataset": {"name": "mathvista", "split": "testmini"}, "protocol": "mathvista"}) == "MathVista testmini"
    assert (
        dataset_label({"dataset": {"name": "mathvista", "split": "testmini"}, "protocol": "paper"}) == "MathVista testmini (paper protocol)"
    )
    assert dataset_label(None, [{"dataset": "minivista"}]) == "MiniVista"
    assert dataset_label(None, [{"dataset": "minivista"}, {"dataset": "mathvista"}]) == "MathVista-format"


def test_chart_legend_below_the_bars_and_zero_is_not_missing() -> None:
    groups = {name: records(name, [False] * 4, TASKS[:4]) for name in ("floor", "drafter", "asymspec", "sd", "fixed")}
    groups["sd"] = records("sd", [True] * 6, TASKS[4:])  # VQA only: its GPS bar is missing
    summaries = summarize_variants(groups)
    cols, cells = bar_values(summaries)
    assert cols == ["GPS", "VQA", "All"]
    assert [bar_label(c) for c in cells["floor"]] == ["0", "n/a", "0"]
    assert [bar_label(c) for c in cells["sd"]] == ["n/a", None, None]
    fig = build_chart(summaries, title="MiniVista accuracy")
    fig.canvas.draw()
    (ax,) = fig.axes
    assert ax.get_title() == "MiniVista accuracy"
    legend, axes_box = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.y1 <= axes_box.y0  # entirely below the axes: it covers no bar
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts.count("0") == 8 and texts.count("n/a") == 5  # four variants x GPS, All; their VQA and sd's GPS


def test_progress_shows_each_methods_accuracy() -> None:
    tally = _Tally()
    tally.add("floor", True, {"drafted": 0, "accepted": 0, "acceptance_rate": 0.0}, 10, 1.0)
    tally.add("asymspec", False, {"drafted": 8, "accepted": 6, "acceptance_rate": 0.75}, 10, 1.0)
    assert tally.add("floor", False, {"drafted": 0}, 10, 1.0) == "floor 50.0% asymspec 0.0% | accept (pooled) asymspec 0.750 | tok/s=10.0"


def test_progress_shows_the_reports_pooled_acceptance() -> None:
    """A long answer (8 of 8 drafts accepted) and a short one (0 of 2): the per-problem rates average 0.5, the
    pooled rate (the paper's, and the report's) is 8 / 10; the bar ends on the report's number, named as pooled."""
    stats = [{"drafted": 8, "accepted": 8, "acceptance_rate": 1.0}, {"drafted": 2, "accepted": 0, "acceptance_rate": 0.0}]
    sd = [{"drafted": 4, "accepted": 1, "acceptance_rate": 0.25}]
    tally = _Tally()
    for st in stats:
        tally.add("asymspec", True, st, 10, 1.0)
    last = tally.add("sd", True, sd[0], 10, 1.0)
    report = {name: summarize_records([{"method": name, "stats": st, "true_false": True} for st in sts])["acceptance_rate"]
              for name, sts in (("asymspec", stats), ("sd", sd))}  # fmt: skip
    assert report == {"asymspec": 0.8, "sd": 0.25}
    assert last == "asymspec 100.0% sd 100.0% | accept (pooled) asymspec 0.800 sd 0.250 | tok/s=10.0"
