"""The results script's per-family tables, on the shipped tiny pair (real forwards)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asymspec_mm.eval import minivista as mv

TINY = Path(__file__).resolve().parents[1] / "asymspec_mm" / "presets_data" / "tiny"
pytestmark = pytest.mark.skipif(not (TINY / "drafter").is_dir(), reason="tiny pair not shipped")


@pytest.fixture(scope="module")
def pipe():
    from asymspec_mm import AsymSpecPipeline

    return AsymSpecPipeline.from_preset("tiny", ocr="none")


def _mixed(n: int) -> list[dict]:
    return [mv.make_problem(mv.HELDOUT_SEED, 3 + 4 * i, "mixed") for i in range(n)]


def test_reading_events_sit_on_the_two_bar_values(pipe):
    from asymspec_mm.tiny import results

    tok = pipe.tokenizer
    seen_ok = 0
    for p in _mixed(6):
        scene = p["scene"]
        values = [scene["values"][scene["colors"].index(c)] for c in scene["asked"]]
        prefix = p["response"].split(";")[0]  # "Red is 7, blue is 3"
        assert prefix.endswith(f" is {values[1]}")
        for method in ("asymspec", "floor"):
            res = pipe.generate(p["decoded_image"], p["query"], caption=p["caption"], ocr=p["ocr"], method=method, max_new_tokens=40)
            events, ok = results.reading_events(res, p, tok)
            if res.text.startswith(prefix + ";"):
                assert ok
            if ok:
                seen_ok += 1
                assert res.text.startswith(prefix)
                assert [e.text for e in events] == [f" {v}" for v in values]
    assert seen_ok >= 1  # the check above ran
    figure = mv.make_problem(mv.HELDOUT_SEED, 0, "figure")
    res = pipe.generate(figure["decoded_image"], figure["query"], caption=figure["caption"], ocr=figure["ocr"], method="asymspec")
    assert results.reading_events(res, figure, tok) is None


def test_tables_cover_every_family_and_split_mixed(pipe):
    from asymspec_mm.tiny import results

    probs = mv.generate(8, seed=mv.HELDOUT_SEED)  # two per family
    res = results.evaluate(pipe, probs, progress=False, ablation_n=0)
    assert len(res) == results.MAIN_ROWS
    for r in res.values():
        assert {f: v["n"] for f, v in r["families"].items()} == {f: 2 for f in mv.FAMILIES}
        assert len(r["correct"]) == 8
        for fam, v in r["families"].items():  # the per-family accuracy is the mean of that family's answers
            assert v["accuracy"] == sum(c for c, p in zip(r["correct"], probs) if mv.family_of(p) == fam) / 2
        mixed = r["families"]["mixed"]
        assert mixed["readings_correct"] is not None
        assert {k: v["readings_correct"] for k, v in r["families"].items() if v["readings_correct"] is not None} == {
            "mixed": mixed["readings_correct"]
        }
        if r["method"] == "asymspec":
            assert abs(sum(mixed["readings_source"].values()) - 1) < 1e-9
    md = results.markdown(res, 8, mv.HELDOUT_SEED, "test", ablation_n=0)
    for fam in mv.FAMILIES:
        assert f"## {fam} ({mv.FAMILY_TASK[fam]}, n=2)" in md
    assert "## mixed: the readings and the arithmetic" in md
    assert md.count("| AsymSpec, bonus=") == 2 * len(mv.FAMILIES) + 2 * len(mv.FAMILIES) + 2  # family tables, decisive table, mixed table


def test_recovery_cell():
    from asymspec_mm.tiny.results import recovery_cell

    assert recovery_cell(0.6, 0.2, 1.0) == "50%"
    assert recovery_cell(1.0, 0.2, 1.0) == "100%"
    assert recovery_cell(0.1, 0.2, 1.0) == "-12%"
    assert recovery_cell(1.0, 0.107, 0.12) == "above both"  # not 6700 %
    assert recovery_cell(1.0, 0.5, 0.5) == "–" and recovery_cell(1.0, 0.6, 0.2) == "–"
