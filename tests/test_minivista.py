"""MiniVista generator, the bundled examples and the shipped tiny pair."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from asymspec_mm.eval import minivista as mv
from asymspec_mm.eval.mathvista import SHIPPED_DIR

ROOT = Path(__file__).resolve().parents[1]
MATHVISTA = SHIPPED_DIR  # the MathVista text data shipped with the package
EXAMPLES = ROOT / "asymspec_mm" / "examples_data"
TINY = ROOT / "asymspec_mm" / "presets_data" / "tiny"


def _png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


# ----------------------------------------------------------------------------- generator


def test_same_seed_same_problems_and_image_bytes():
    a, b = mv.generate(18, seed=7), mv.generate(18, seed=7)
    assert [mv.to_record(p) for p in a] == [mv.to_record(p) for p in b]
    for p, q in zip(a, b):
        assert p["decoded_image"].tobytes() == q["decoded_image"].tobytes()
        assert _png(p["decoded_image"]) == _png(q["decoded_image"])


def test_problem_is_independent_of_the_set_it_is_drawn_in():
    whole = mv.generate(12, seed=3)
    part = mv.generate(4, seed=3, start=8)
    assert [mv.to_record(p) for p in whole[8:]] == [mv.to_record(p) for p in part]


def test_different_seeds_differ():
    a = [mv.to_record(p) for p in mv.generate(30, seed=mv.TRAIN_SEED)]
    b = [mv.to_record(p) for p in mv.generate(30, seed=mv.HELDOUT_SEED)]
    assert a != b
    assert sum(x["response"] == y["response"] and x["caption"] == y["caption"] for x, y in zip(a, b)) < 15


def test_records_follow_mathvista_schema():
    probs = mv.generate(60, seed=mv.HELDOUT_SEED)
    assert {mv.family_of(p) for p in probs} == set(mv.FAMILIES)
    for p in probs:
        mv.validate(p)
        assert isinstance(p["pid"], str) and p["image"].endswith(".png")
        assert p["decoded_image"].size == (128, 128) and p["decoded_image"].mode == "RGB"
        assert p["metadata"]["task"] in (
            "figure question answering",
            "visual question answering",
            "geometry problem solving",
            "math word problem",
        )
        q = p["query"]
        if p["question_type"] == "multi_choice":
            assert q.startswith(mv.HINT_CHOICE + "\nQuestion: " + p["question"] + "\nChoices:\n(A) ")
            assert q.endswith("\n".join(f"({mv.LETTERS[i]}) {c}" for i, c in enumerate(p["choices"])))
            assert p["answer_type"] == "text"
        else:
            assert p["answer_type"] == "integer"
            assert q == mv.HINT_INT + "\nQuestion: " + p["question"]
        json.dumps(mv.to_record(p))  # serialisable


def test_validate_rejects_broken_records():
    p = mv.generate(1, seed=1)[0]
    with pytest.raises(ValueError):
        mv.validate({**p, "query": p["query"] + " "})
    with pytest.raises(ValueError):
        mv.validate({k: v for k, v in p.items() if k != "answer_type"})


def test_build_query_matches_mathvista_official_queries():
    data = json.loads((MATHVISTA / "testmini.json").read_text())
    queries = json.loads((MATHVISTA / "query.json").read_text())
    checked = 0
    for pid, prob in data.items():
        if prob["question_type"] == "free_form" and prob["answer_type"] == "float" and prob["precision"] not in (1, 2):
            continue  # MathVista's other precisions are not produced here
        assert mv.build_query(prob) == queries[pid], pid
        checked += 1
    assert checked > 900


def test_reference_responses_parse_and_score():
    for p in mv.generate(90, seed=mv.HELDOUT_SEED):
        assert mv.is_correct(p["response"], p)
        if p["question_type"] == "free_form":
            assert re.findall(r"\d+", p["response"])[-1] == p["answer"]
        assert len(re.findall(r"\w+|[^\w\s]", p["response"])) >= 4  # several tokens ("Red is 7."): speculation matters
        if p["question_type"] == "multi_choice":
            wrong = next(mv.LETTERS[i] for i, c in enumerate(p["choices"]) if c != p["answer"])
            assert not mv.is_correct(re.sub(r"\(([A-H])\)\.$", f"({wrong}).", p["response"]), p)
        else:
            assert not mv.is_correct(f"so the answer is {int(p['answer']) + 1}.", p)
    assert mv.extract_answer("no idea", mv.generate(1, seed=1)[0]) is None


def test_compressed_views_lose_what_each_family_should_lose():
    for p in mv.generate(150, seed=mv.HELDOUT_SEED):
        fam, kind, scene = mv.family_of(p), p["metadata"]["kind"], p["scene"]
        view = mv.view_text(p)
        if fam in ("figure", "mixed"):
            assert p["ocr"] == "10 8 6 4 2 0"  # axis labels, top to bottom
            assert all(c in p["caption"] for c in scene["colors"])  # names the bars...
            assert not re.search(r"\d", p["caption"])  # ...but no value
            if fam == "mixed":  # the two readings from the pixels, then arithmetic on them
                m = re.fullmatch(
                    r"([A-Z][a-z]+) is (\d), ([a-z]+) is (\d); (\d) ([+-]) (\d) = (\d+), so the answer is (\d+)\.", p["response"]
                )
                assert m, p["response"]
                c1, x, c2, y = m.group(1).lower(), int(m.group(2)), m.group(3), int(m.group(4))
                vals = dict(zip(scene["colors"], scene["values"]))
                assert (vals[c1], vals[c2]) == (x, y) and c1 != c2 and f"the {c1} bar" in p["question"] and f"the {c2} bar" in p["question"]
                assert (int(m.group(5)), int(m.group(7))) == (x, y) and m.group(8) == m.group(9) == p["answer"]
                assert int(p["answer"]) == (x + y if kind == "sum" else x - y) > 0
                assert (m.group(6) == "+") == (kind == "sum") and ("sum" in p["question"]) == (kind == "sum")
        elif fam == "visual":
            assert p["ocr"] == ""
            assert not any(re.search(rf"\b{c}\b", p["caption"]) for c in mv.COLORS)
            assert not re.search(r"\d|left|right|two|three|four|five", p["caption"])
        else:
            assert fam == "geometry"
            known = [v for v in "ABC" if v != scene["unknown"]]
            for v in known:  # OCR carries both printed angles: the view is nearly lossless
                assert f"{scene['angles'][v]}°" in p["ocr"]
            assert p["answer"] == str(180 - sum(scene["angles"][v] for v in known))
            nums = re.findall(r"(\d+)°", p["ocr"])
            assert p["response"].startswith(f"Angle {scene['unknown']} = 180 - {nums[0]} - {nums[1]} = ")
        assert view.startswith("Image description: ")


def test_decisive_word_comes_early_in_the_response():
    for p in mv.generate(60, seed=mv.HELDOUT_SEED):
        words = re.sub(r"[,.;]", " ", p["response"]).split()
        if mv.family_of(p) == "mixed":  # the readings come early; the decisive token is the computed answer
            assert words[2].isdigit() and words[5].isdigit() and p["decisive"] == p["answer"]
        elif mv.family_of(p) != "geometry":
            assert p["decisive"] in words[:4]


# ----------------------------------------------------------------------------- bundled examples


def test_bundled_examples_are_the_generators_output():
    items = json.loads((EXAMPLES / "examples.json").read_text())
    probs = mv.example_problems(len(items), seed=mv.EXAMPLES_SEED)
    assert len(items) >= 6 and {it["family"] for it in items} == set(mv.FAMILIES)
    for it, p in zip(items, probs):
        assert it["question"] == p["query"] and it["caption"] == p["caption"] and it["ocr"] == p["ocr"]
        assert it["answer"] == p["answer"]
        from PIL import Image

        with Image.open(EXAMPLES / it["image"]) as im:
            assert im.convert("RGB").tobytes() == p["decoded_image"].tobytes()


# ----------------------------------------------------------------------------- shipped tiny pair


needs_tiny = pytest.mark.skipif(not (TINY / "drafter").is_dir(), reason="tiny pair not shipped")


@needs_tiny
def test_tiny_pair_size_and_single_token_vocabulary():
    total = sum(f.stat().st_size for f in TINY.rglob("*") if f.is_file())
    assert total <= 30 * 2**20
    from transformers import AutoTokenizer

    from asymspec_mm.tiny.models import check_single_tokens

    for sub in ("drafter", "verifier"):
        check_single_tokens(AutoTokenizer.from_pretrained(TINY / sub))


# Regression guard: accuracies (correct answers out of REG_N) of the shipped pair on a fixed slice
# of the held-out seed, recorded when the pair was trained. Greedy decoding is deterministic; the
# tolerance (2 points of the slice, at least one problem) absorbs float differences across CPUs.
REG_N = 32
REG_EXPECTED = {
    "floor": {"figure": 2, "visual": 3, "geometry": 8, "mixed": 0},
    "drafter": {"figure": 8, "visual": 8, "geometry": 8, "mixed": 1},
    "asymspec": {"figure": 8, "visual": 8, "geometry": 8, "mixed": 8},
}


def _tolerance() -> int:
    return max(1, round(0.02 * REG_N))  # 32 problems: one problem either way


@needs_tiny
@pytest.mark.slow
def test_tiny_pair_regression_guard():
    pytest.importorskip("asymspec_mm.pipeline.facade")
    from asymspec_mm import AsymSpecConfig, AsymSpecPipeline

    pipe = AsymSpecPipeline.from_preset("tiny", ocr="none")
    probs = mv.generate(REG_N, seed=mv.HELDOUT_SEED)
    got: dict[str, dict[str, int]] = {}
    for method in ("floor", "drafter", "asymspec"):
        cfg = AsymSpecConfig(max_new_tokens=40, trace_top=0)
        counts = {f: 0 for f in mv.FAMILIES}
        for p in probs:
            res = pipe.generate(p["decoded_image"], p["query"], caption=p["caption"], ocr=p["ocr"], method=method, config=cfg)
            counts[mv.family_of(p)] += int(mv.is_correct(res.text, p))
        got[method] = counts
    tol = _tolerance()
    for method, fams in REG_EXPECTED.items():
        for fam, expected in fams.items():
            assert abs(got[method][fam] - expected) <= tol, (method, fam, got[method][fam], expected)
    visual_tasks = ("figure", "visual")
    assert sum(got["asymspec"][f] for f in visual_tasks) > sum(got["floor"][f] for f in visual_tasks), got
    for f in visual_tasks:
        assert got["asymspec"][f] >= got["floor"][f], (f, got)
    assert got["asymspec"]["geometry"] >= got["floor"]["geometry"] - tol, got
    # the stretch: on the family that needs the pixels and the arithmetic, above both models alone
    assert got["asymspec"]["mixed"] > max(got["drafter"]["mixed"], got["floor"]["mixed"]) + tol, got


@needs_tiny
def test_decisive_token_index_points_at_the_decisive_word_before_so():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TINY / "drafter")
    for p in mv.generate(40, seed=mv.HELDOUT_SEED):
        ref = tok(p["response"], add_special_tokens=False)["input_ids"]
        i = mv.decisive_token_index(p, tok)
        assert i is not None and tok.decode([ref[i]]) == " " + p["decisive"], p["response"]
        before = tok.decode(ref[:i])
        assert " so " not in before and p["response"].startswith(before)
        if mv.family_of(p) == "mixed":  # the result after "=", not the final answer after "so"
            assert tok.decode(ref[: i + 1]).endswith(f"= {p['answer']}")
    bad = dict(mv.generate(1, seed=mv.HELDOUT_SEED)[0], decisive="not a single token")
    assert mv.decisive_token_index(bad, tok) is None
