"""The paper's answer extraction and scoring (``--extract paper``): every anchor rule, every answer rule and
fallback, and the score of each case, worked out by hand from the rules in issue #22."""

from __future__ import annotations

import pytest

from asymspec_mm.eval.paper_extraction import find_anchor, paper_extract, paper_is_correct, paper_normalize, paper_score


def mc(choices: list[str], answer: str) -> dict:
    return {"question_type": "multi_choice", "choices": choices, "answer": answer, "answer_type": "text"}


def ff(answer: str) -> dict:
    return {"question_type": "free_form", "choices": None, "answer": answer, "answer_type": "integer"}


MC4 = mc(["33", "38", "52", "87"], "52")  # gold letter C
YES_NO = mc(["Yes", "No"], "No")  # gold letter B
SHAPES = mc(["triangle ABC", "square", "circle", "rectangle"], "circle")  # gold letter C
ODD = mc(["1", "2"], "3")  # gold not among the choices: compared as text
SEVEN, ONE_AND_HALF, MINUS_THREE, SEVENTY, ZERO = ff("7"), ff("1.5"), ff("-3"), ff("70"), ff("0")

# (response, problem, prediction, rule, correct)
CASES = [
    # \boxed{...}: the last one, no nested braces
    ("So the answer is \\boxed{C}.", MC4, "C", "boxed/letter", True),
    ("First \\boxed{A}, then corrected: \\boxed{C}", MC4, "C", "boxed/letter", True),
    ("\\boxed{52}", MC4, "C", "boxed/choice_text", True),
    ("The value is \\boxed{7}.", SEVEN, "7", "boxed/number_anchor", True),
    ("\\boxed{\\frac{3}{2}}", ONE_AND_HALF, "2", "last_line/number_anchor", False),  # nested braces: no boxed anchor
    ("\\boxed{1.50}", ONE_AND_HALF, "1.5", "boxed/number_anchor", True),
    ("\\boxed{x = -3}", MINUS_THREE, "-3", "boxed/number_anchor", True),
    # "final answer"
    ("Step 1: add.\nFinal answer: 7", SEVEN, "7", "final_answer/number_anchor", True),
    ("**Final Answer:** C", MC4, "C", "final_answer/letter", True),
    ("Final answer - B.", YES_NO, "B", "final_answer/letter", True),
    ("The final answer is 52.", MC4, "is 52", "final_answer/anchor_prefix", False),  # "is 52" matches no choice
    ("final answer: -2.5 meters", ff("-2.5"), "-2.5", "final_answer/number_anchor", True),
    ("Final answer\n\n7", SEVEN, "7", "final_answer/number_anchor", True),  # the spaces after it may span lines
    ("**Final Answer**\nThe answer is 7.", SEVEN, "7", "answer_is/number_anchor", True),  # nothing after the heading
    ("The total is 3 + 4.\nFinal answer: seven\nThat is 7 apples", SEVEN, "7", "final_answer/number_last_line", True),
    ("Final answer: seven\nThe count was 7 from 3 + 4\nDone.", SEVEN, "4", "final_answer/number_anywhere", False),
    ("Final answer: 3.14159", ff("3.14159"), "3.14159", "final_answer/number_anchor", True),
    ("Final answer: 2.718281828", ff("2.718281828"), "2.71828", "final_answer/number_anchor", False),  # %g keeps 6 digits
    ("Final answer: -0", ZERO, "0", "final_answer/number_anchor", True),
    # "answer is" / "answer:": the first line where it runs to the line's end without a "*"
    ("The answer is B", YES_NO, "B", "answer_is/letter", True),
    ("Answer: (C) 52", MC4, "C", "answer_is/letter", True),
    ("So the answer is **No**.", YES_NO, "So the answer is **N", "last_line/anchor_prefix", False),  # "." after "**"
    ("The answer is 1.5 cm.", ONE_AND_HALF, "1.5", "answer_is/number_anchor", True),
    ("I think the answer: 70°", SEVENTY, "70", "answer_is/number_anchor", True),
    ("The answer is 7.0", SEVEN, "7", "answer_is/number_anchor", True),  # a whole number loses its ".0"
    ("The answer is 3.\nWait, the answer is 7.", SEVEN, "3", "answer_is/number_anchor", False),  # the first such line
    ("The answer is -3.", MINUS_THREE, "-3", "answer_is/number_anchor", True),
    ("The answer is 1,000", ff("1000"), "0", "answer_is/number_anchor", False),  # "1", "000": the last is 0
    ("The answer is .5", ff("0.5"), "5", "answer_is/number_anchor", False),  # no leading digit: "5"
    ("The answer is 1.50", ONE_AND_HALF, "1.5", "answer_is/number_anchor", True),
    ("the answer is c", MC4, "c", "answer_is/anchor_prefix", True),  # no capital letter; scored upper-cased
    ("The answer is G", MC4, "G", "answer_is/anchor_prefix", False),  # G is not A-F
    ("Answer: 3", ODD, "3", "answer_is/anchor_prefix", True),  # gold not a choice: text equality
    # the last non-empty line
    ("Let me compute.\n\nIt is 7\n\n", SEVEN, "7", "last_line/number_anchor", True),
    ("The bars are 3, 5 and 7.\nSo the smallest is 3", SEVEN, "3", "last_line/number_anchor", False),
    ("Looking at the image.\n\n(B)", YES_NO, "B", "last_line/letter", True),
    ("circle", SHAPES, "C", "last_line/choice_text", True),
    ("Circle.", SHAPES, "C", "last_line/choice_text", True),  # normalised: lower case, trailing "." dropped
    ("Triangle ABC is the answer", SHAPES, "A", "last_line/choice_text", False),  # starts with choice A's text
    ("The shape is a circle.", SHAPES, "The shape is a circl", "last_line/anchor_prefix", False),
    ("I compared (A) and (D).\nThe angle is fifty-two degrees", MC4, "D", "last_line/last_letter", False),
    ("A rectangle has equal diagonals, so C", MC4, "A", "last_line/letter", False),  # the first capital: the article
    ("The temperature fell 3 degrees, so the change is -3", MINUS_THREE, "-3", "last_line/number_anchor", True),
    ("5 - 8 = -3", MINUS_THREE, "-3", "last_line/number_anchor", True),  # "- 8" is no negative number
    ("x=2-5", MINUS_THREE, "-5", "last_line/number_anchor", False),
    # nothing found
    ("", SEVEN, "", "last_line/anchor_prefix", False),
    ("", MC4, "", "last_line/anchor_prefix", False),
    ("I cannot determine the value.", SEVEN, "I cannot determine the value.", "last_line/anchor_prefix", False),
    ("I cannot determine the value from this figure alone.", SEVEN, "I cannot determine the value f", "last_line/anchor_prefix", False),
    ("Neither option fits here, sorry.", YES_NO, "Neither option fits ", "last_line/anchor_prefix", False),
]


def test_the_table_covers_every_rule() -> None:
    assert len(CASES) >= 40
    anchors = {c[3].split("/")[0] for c in CASES}
    answers = {c[3].split("/")[1] for c in CASES}
    assert anchors == {"boxed", "final_answer", "answer_is", "last_line"}
    assert answers == {"letter", "choice_text", "last_letter", "anchor_prefix", "number_anchor", "number_last_line", "number_anywhere"}
    assert {c[4] for c in CASES} == {True, False}


@pytest.mark.parametrize(("response", "problem", "prediction", "rule", "correct"), CASES)
def test_extraction_and_score(response: str, problem: dict, prediction: str, rule: str, correct: bool) -> None:
    ext = paper_extract(response, problem)
    assert (ext.answer, ext.rule) == (prediction, rule)
    assert paper_is_correct(ext.answer, problem) is correct
    assert paper_score(response, problem) == (ext, correct)


def test_anchor_clean_up() -> None:
    assert find_anchor("Final Answer: **42**.") == ("42", "final_answer")
    assert find_anchor("The final answer: 12.") == ("12", "final_answer")
    assert find_anchor("  \n") == ("", "last_line")
    assert find_anchor("line one\n  line two  \n\n") == ("line two", "last_line")


def test_normalize() -> None:
    assert paper_normalize("  70 ° ") == "70"
    assert paper_normalize("3..") == "3"
    assert paper_normalize("Triangle ABC") == "triangleabc"
    assert paper_normalize(1.5) == "1.5"


def test_scoring_letters_and_text() -> None:
    assert paper_is_correct("C", MC4) and paper_is_correct("c", MC4) and not paper_is_correct("52", MC4)
    assert paper_is_correct("B", YES_NO) and not paper_is_correct("No", YES_NO)  # a letter, not the choice text
    assert paper_is_correct("70.", SEVENTY) and paper_is_correct("70°", SEVENTY)
    assert not paper_is_correct("7.0", SEVEN)  # no numeric comparison: the extraction writes whole numbers plainly
