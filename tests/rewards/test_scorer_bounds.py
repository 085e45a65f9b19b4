"""The rule-based scorers on hostile responses: answers are found in one pass, whatever the
response (``"\\boxed{" * 20000`` took 83-117 s in the arithmetic and MATH scorers by
rescanning the rest of the text from every ``\\boxed``), and they never raise."""

from __future__ import annotations

import pytest

from verl.rewards.scorers import arithmetic, code, extract, gsm8k, math_dataset
from verl.rewards.scorers.extract import MAX_SCORED_CHARS, last_boxed

OPEN_BOXES = "\\boxed{" * 20000


@pytest.mark.parametrize("scorer", [arithmetic, math_dataset])
def test_twenty_thousand_unclosed_boxes_score_right(scorer):
    assert last_boxed(OPEN_BOXES) is None
    assert scorer.compute_score(OPEN_BOXES, "5") == {"score": 0.0, "acc": 0.0, "pred": None}
    # an earlier complete box is still the answer, as before (within the tail scorers read)
    result = scorer.compute_score("\\boxed{7} " + OPEN_BOXES[: MAX_SCORED_CHARS // 2], "7")
    assert result["acc"] == 1.0 and result["pred"] == "7"


def test_the_braces_are_matched_once_per_text(monkeypatch):
    """Linear by construction: one pass over the text for every ``\\boxed`` in it."""
    calls: list[int] = []
    matching = extract.matching_braces
    monkeypatch.setattr(
        extract, "matching_braces", lambda text: calls.append(len(text)) or matching(text)
    )
    text = OPEN_BOXES + "\\boxed{1{2}3}" + OPEN_BOXES
    assert last_boxed(text) == "1{2}3"
    assert calls == [len(text)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("x =" + " " * 20000 + "7", ("7", "equals")),  # the blanks made the regex quadratic
        ("so 1 =" + " " * 20000 + "x", ("1", "last_number")),
        ("= $ -1,234.5 $ .", ("-1234.5", "equals")),
        ("the total = 12.", ("12", "equals")),
        ("= 1.2.3", ("3", "last_number")),
    ],
)
def test_a_trailing_equals_is_read_from_the_end(text, expected):
    assert arithmetic.extract_answer(text) == expected


def test_responses_are_read_up_to_a_bounded_tail():
    long = "filler " * (MAX_SCORED_CHARS // 7 + 1000) + "#### 42"
    assert len(long) > MAX_SCORED_CHARS
    assert gsm8k.compute_score(long, "42")["acc"] == 1.0
    assert arithmetic.compute_score(long, "42")["acc"] == 1.0
    assert math_dataset.compute_score(long.replace("#### 42", "\\boxed{42}"), "42")["acc"] == 1.0


def test_a_number_past_pythons_digit_limit_scores_zero_without_raising():
    huge = "\\boxed{" + "5 " * 40000 + "}"  # 40,000 digits once the blanks are dropped
    assert math_dataset.compute_score(huge, "5")["acc"] == 0.0
    assert arithmetic.compute_score(huge, "5")["pred"] == "5"  # its first number


def test_a_code_fence_after_a_long_run_of_blanks_is_read_in_one_pass():
    # "```" + 20,000 blanks took 3 s (two blank runs around an optional language)
    text = ("```" + " " * 20000 + "x\n") * 3 + "```python   \nprint(1)\n```"
    assert code.extract_code(text) == "print(1)\n"
    assert code.extract_code("```" + " \t" * 20000) == "```" + " \t" * 20000  # no block
