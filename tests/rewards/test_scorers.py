"""Rule-based scorers on hand-written responses: arithmetic, GSM8K, MATH and the helpers."""

from __future__ import annotations

import pytest

from verl.rewards.scorers import arithmetic, gsm8k, math_dataset
from verl.rewards.scorers.extract import find_numbers, last_boxed, parse_number


# ---------------------------------------------------------------------- helpers
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I had 1,234 apples, ate -5.5 and 7-3 = 4.", ["1234", "-5.5", "7", "3", "4"]),
        ("x = -3", ["-3"]),
        ("(-2) and [-4]", ["-2", "-4"]),
        ("a-1", ["1"]),
        ("total 1,234,567.", ["1234567"]),
        ("12,34 is not grouped", ["12", "34"]),
        ("1,2345", ["1", "2345"]),
        ("\u22127 degrees", ["-7"]),
        ("no digits here", []),
    ],
)
def test_find_numbers(text, expected):
    assert find_numbers(text) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [("72", 72), (" -5 ", -5), ("1,234", 1234), ("$1,234.50", 1234.5), ("42.", 42), (7, 7)],
)
def test_parse_number_accepts(value, expected):
    assert parse_number(value) == expected


@pytest.mark.parametrize("value", ["seventy", "", "1 2", None, True, float("nan"), [1], "1,23"])
def test_parse_number_rejects(value):
    assert parse_number(value) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{42}", "42"),
        (r"\boxed{\frac{1}{2}} then \boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}"),
        (r"\boxed{a{b{c}}d} and a truncated \boxed{12", "a{b{c}}d"),
        (r"\fbox{7}", "7"),
        (r"the answer is \boxed 5$.", "5"),
        ("no box", None),
        (r"\boxed{never closed", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


# ---------------------------------------------------------------------- arithmetic
@pytest.mark.parametrize(
    ("response", "truth", "score", "pred"),
    [
        ("12 + 30 = 42", "42", 1.0, "42"),
        ("The answer is 42.", "42", 1.0, "42"),
        ("First 3, then 4, so 7", "7", 1.0, "7"),
        ("Answer: -15", "-15", 1.0, "-15"),
        ("answer is 1,234 dollars", "1234", 1.0, "1234"),
        ("Total: 1,234", "1,234", 1.0, "1234"),
        (r"\boxed{-8}", "-8", 1.0, "-8"),
        (r"I think 3. Final: \boxed{2+3=5} ... wait 9", "5", 1.0, "5"),
        ("#### 72\nextra note 5", "72", 1.0, "72"),
        ("answer: 12 apples, 3 bags", "12", 1.0, "12"),
        ("answer: 3, no wait, the answer is 5", "5", 1.0, "5"),  # the last marker counts
        ("5 - 8 = -3", "-3", 1.0, "-3"),
        ("It is 12.0", "12", 1.0, "12"),
        ("The answer is 41.", "42", 0.0, "41"),
        ("7-3", "-3", 0.0, "3"),  # binary minus, not a negative number
        ("I don't know.", "42", 0.0, None),
        ("", "42", 0.0, None),
        ("It is 12.5", "12", 0.0, "12.5"),
    ],
)
def test_arithmetic(response, truth, score, pred):
    out = arithmetic.compute_score(response, truth)
    assert out["score"] == score
    assert out["acc"] == score
    assert out["pred"] == pred
    assert "invalid_ground_truth" not in out


def test_arithmetic_explicit_form_wins_over_last_number():
    # The boxed answer is 10; the trailing "step 3" would be the last-number answer.
    assert arithmetic.extract_answer(r"\boxed{10} (see step 3)") == ("10", "boxed")
    assert arithmetic.extract_answer("The answer is 6, from 2*3") == ("6", "answer")
    assert arithmetic.extract_answer("so 2 * 3 = 6") == ("6", "equals")
    assert arithmetic.extract_answer("maybe 4 or 5") == ("5", "last_number")
    assert arithmetic.extract_answer("none") == (None, "none")


def test_arithmetic_format_score():
    assert arithmetic.compute_score("It is 5", "6", format_score=0.1)["score"] == 0.1
    assert arithmetic.compute_score("It is 6", "6", format_score=0.1)["score"] == 1.0
    assert arithmetic.compute_score("no number", "6", format_score=0.1)["score"] == 0.0


@pytest.mark.parametrize("truth", ["forty-two", "", None, "1 2"])
def test_arithmetic_invalid_ground_truth_is_flagged_not_raised(truth):
    out = arithmetic.compute_score("42", truth)
    assert out == {"score": 0.0, "acc": 0.0, "pred": None, "invalid_ground_truth": 1.0}


def test_arithmetic_non_string_response_scores_zero():
    assert arithmetic.compute_score(None, "1")["score"] == 0.0


# ---------------------------------------------------------------------- gsm8k
@pytest.mark.parametrize(
    ("response", "truth", "strict", "flexible"),
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7", 1.0, 1.0),
        ("#### 1,234", "1,234", 1.0, 1.0),
        ("#### $1,234.00", "1234", 1.0, 1.0),
        ("#### -5", "-5", 1.0, 1.0),
        ("#### 72 apples", "72", 1.0, 1.0),
        ("first #### 3 then #### 72", "72", 1.0, 1.0),
        ("So the total is 72.", "72", 0.0, 1.0),  # no #### : strict fails
        ("So the total is 1,234.", "1,234", 0.0, 1.0),
        ("#### 71", "72", 0.0, 0.0),
        ("#### none", "72", 0.0, 0.0),
        ("nothing", "72", 0.0, 0.0),
        ("Natalia sold 48/2 = 24 clips... #### 72", "Natalia ... 48+24 = 72\n#### 72", 1.0, 1.0),
    ],
)
def test_gsm8k(response, truth, strict, flexible):
    assert gsm8k.compute_score(response, truth)["score"] == strict  # default is strict
    assert gsm8k.compute_score(response, truth, method="strict")["acc"] == strict
    assert gsm8k.compute_score(response, truth, method="flexible")["score"] == flexible


def test_gsm8k_pred_and_format_score():
    out = gsm8k.compute_score("#### 1,000", "999", format_score=0.2)
    assert out == {"score": 0.2, "acc": 0.0, "pred": "1000"}


def test_gsm8k_invalid_ground_truth_and_method():
    assert gsm8k.compute_score("#### 5", "five")["invalid_ground_truth"] == 1.0
    with pytest.raises(ValueError, match="method='loose'"):
        gsm8k.compute_score("#### 5", "5", method="loose")


# ---------------------------------------------------------------------- math
@pytest.mark.parametrize(
    ("response", "truth"),
    [
        (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"\boxed{\dfrac{1}{2}}", r"\frac12"),
        (r"\boxed{0.5}", r"\frac{1}{2}"),
        (r"\boxed{1/2}", r"\frac{1}{2}"),
        (r"\boxed{.5}", "0.5"),
        (r"\boxed{-\frac{3}{4}}", "-0.75"),
        (r"\boxed{\left( 1, 2 \right)}", "(1,2)"),
        (r"\boxed{90^\circ}", "90"),
        (r"\boxed{90^{\circ}}", "90"),
        (r"\boxed{5\text{ cm}}", "5"),
        (r"\boxed{12\text{ inches}^2}", "12"),
        (r"\boxed{\text{(A)}}", "(A)"),
        (r"\boxed{x = 3}", "3"),
        (r"\boxed{10\%}", "10"),
        (r"\boxed{\$18.90}", "18.9"),
        (r"\boxed{1,000}", "1000"),
        (r"\boxed{\sqrt2}", r"\sqrt{2}"),
        (r"\boxed{2\!\sqrt{3}}", r"2\sqrt{3}"),
        (r"\boxed{\frac{\sqrt{3}}{2}.}", r"\dfrac{\sqrt3}{2}"),
        (r"\boxed{\{1,2\}}", r"\{1, 2\}"),
        (r"first \boxed{3}, finally \boxed{\frac{a}{b}}", r"\frac{a}{b}"),
        ("final: \\boxed{7}", "The solution ... so the answer is $\\boxed{7}$."),
    ],
)
def test_math_equivalent(response, truth):
    out = math_dataset.compute_score(response, truth)
    assert out["score"] == 1.0, (out, math_dataset.normalize_answer(truth))
    assert out["acc"] == 1.0


@pytest.mark.parametrize(
    ("response", "truth"),
    [
        (r"\boxed{\frac{1}{3}}", r"\frac{1}{2}"),
        (r"\boxed{(1,2)}", r"(2,1)"),
        (r"\boxed{2}", "-2"),
        (r"\boxed{3} and then \boxed{4}", "3"),  # the last boxed answer counts
        ("the answer is 5", "5"),  # no boxed answer
        (r"\boxed{5", "5"),  # truncated
        (r"\boxed{\sqrt{8}}", r"2\sqrt{2}"),  # symbolic equivalence is out of scope
    ],
)
def test_math_not_equivalent(response, truth):
    assert math_dataset.compute_score(response, truth)["score"] == 0.0


def test_math_normalize_answer_examples():
    norm = math_dataset.normalize_answer
    assert norm(r" \left[ \dfrac{1}{2}, 3 \right) ") == r"[\frac{1}{2},3)"
    assert norm(r"\tfrac34") == r"\frac{3}{4}"
    assert norm(r"\frac{1}2") == r"\frac{1}{2}"
    assert norm("k = 7.") == "7"
    assert norm(r"\rightarrow") == r"\rightarrow"  # \right inside \rightarrow is kept
    assert norm("(1,000, 2)") == "(1,000,2)"  # a tuple keeps its commas


def test_math_pred_and_invalid_truth():
    assert math_dataset.compute_score(r"\boxed{ 3 }", "4")["pred"] == "3"
    assert math_dataset.compute_score("no box", "4")["pred"] is None
    for truth in ["", "  ", None, r"\boxed{}"]:
        assert math_dataset.compute_score(r"\boxed{1}", truth)["invalid_ground_truth"] == 1.0
    assert math_dataset.compute_score(r"\boxed{4}", 4)["score"] == 1.0  # numeric truth


@pytest.mark.parametrize(
    "response",
    [
        "95 96 97 98 99 100",  # the truth listed, but not last
        "95, 94, 93",
        "It is 95 or 94 or 96",
        r"95 \boxed{94}",  # an explicit form wins over every listed number
        "answer: 94 95",  # inside the form: the first number only
        "answer: 95\nanswer: 96",  # the last marker only
        "= 95 = 96",
    ],
)
def test_arithmetic_listing_candidates_scores_one_guess_only(response):
    # the reward the main job trains on must not be gamed by listing many numbers: exactly
    # one number per response is compared, so a list that contains the truth elsewhere scores 0
    out = arithmetic.compute_score(response, "95")
    assert out["score"] == 0.0 and out["pred"] != "95", out
