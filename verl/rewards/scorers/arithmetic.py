"""Arithmetic scorer: is the model's final number equal to the integer ground truth?

The final answer is taken from the first explicit form found, in this order of preference:

1. the last `\\boxed{...}` (nested braces allowed);
2. the last `#### ...` (GSM8K style);
3. the last `answer: ...` / `answer is ...` (case-insensitive);
4. `= N` at the very end of the text.

Inside an explicit form the answer is the first number after its last "=" (so
`\\boxed{2+3=5}` gives 5 and `answer: 12 apples` gives 12). When no explicit form holds a
number, the last number anywhere in the text is used. Numbers may be negative, use comma
thousands separators, and end a sentence with a period (see `extract.find_numbers`).

Score: 1.0 when the answer equals the ground truth, `format_score` (default 0.0) when a
number was found but is wrong, 0.0 when the text has no number. A ground truth that is not
a number scores 0.0 and is flagged with `invalid_ground_truth=1.0` so the reward manager
counts it; this scorer never raises.
"""

from __future__ import annotations

import re
from typing import Any

from verl.rewards.scorers.extract import (
    bounded,
    find_numbers,
    first_number,
    last_boxed,
    last_number,
    parse_number,
    score_number,
)

_HASHES_RE = re.compile(r"####")
_ANSWER_RE = re.compile(r"answer\b\s*(?:is\b)?\s*[:=]?", re.IGNORECASE)
_END_NUMBER_RE = re.compile(r"[\d,]+(?:\.\d+)?")


def last_marker_line(pattern: re.Pattern[str], text: str) -> str | None:
    """The rest of the line after the last match of `pattern`, or None if it never matches."""
    matches = list(pattern.finditer(text))
    return text[matches[-1].end() :].split("\n", 1)[0] if matches else None


def _strip_end(text: str, char: str) -> str:
    """``text`` without one trailing ``char`` and the whitespace before it."""
    return text[:-1].rstrip() if text.endswith(char) else text


def _trailing_equals(text: str) -> str | None:
    """The number of an ``= N`` that ends ``text`` (``= $-1,234.5$.``), else None.

    Read from the end, without a search: the optional blanks around an optional ``$``
    made a regex search quadratic on a long run of blanks. The number is the whole run of
    digits, commas and points before the end (nothing else may precede it but ``-``,
    blanks, ``$`` and the ``=``)."""
    tail = _strip_end(_strip_end(text.rstrip(), "."), "$")
    start = len(tail)
    while start > 0 and (tail[start - 1].isdigit() or tail[start - 1] in ",."):
        start -= 1
    number = tail[start:]
    if not _END_NUMBER_RE.fullmatch(number):
        return None
    if start > 0 and tail[start - 1] == "-":
        start -= 1
    head = _strip_end(tail[:start].rstrip(), "$")
    return tail[start:] if head.endswith("=") else None


def _number_in_form(fragment: str) -> str | None:
    """First number after the last '=' of an explicit answer fragment."""
    if "=" in fragment:
        tail = fragment.rsplit("=", 1)[1]
        if find_numbers(tail):
            fragment = tail
    return first_number(fragment)


def extract_answer(text: str) -> tuple[str | None, str]:
    """Final answer number of `text` and where it came from.

    Returns `(number or None, source)` with source one of "boxed", "hashes", "answer",
    "equals", "last_number", "none".
    """
    boxed = last_boxed(text)
    if boxed is not None:
        number = _number_in_form(boxed)
        if number is not None:
            return number, "boxed"
    for source, pattern in (("hashes", _HASHES_RE), ("answer", _ANSWER_RE)):
        fragment = last_marker_line(pattern, text)
        if fragment is not None:
            number = _number_in_form(fragment)
            if number is not None:
                return number, source
    trailing = _trailing_equals(text)
    if trailing is not None:
        number = first_number(trailing)
        if number is not None:
            return number, "equals"
    number = last_number(text)
    return (number, "last_number") if number is not None else (None, "none")


def compute_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    format_score: float = 0.0,
) -> dict[str, Any]:
    """Score one arithmetic response.

    Returns `{"score": float, "acc": float, "pred": str | None}` and, when the ground
    truth is not a number, `"invalid_ground_truth": 1.0`.
    """
    del extra_info  # same signature as every scorer; arithmetic needs no extra context
    target = parse_number(ground_truth)
    if target is None:
        return {"score": 0.0, "acc": 0.0, "pred": None, "invalid_ground_truth": 1.0}
    token, _ = extract_answer(bounded(solution_str) if isinstance(solution_str, str) else "")
    return score_number(token, target, format_score)
