"""Scorer of the synthetic visual tasks (``data_source="visual_shapes"``,
``verl.data.visual_tasks``): is the colour word or the count the response gives the
ground truth?

The ground truth is a colour word (``"red"``) or a count (``"3"``). The answer is read from
the response's end: the inside of the last ``\\boxed{...}`` when there is one, else the
rest of the line after the last ``answer`` (``answer: red``, ``the answer is 3``), else the
whole response; in that fragment the *last* candidate counts, so "not blue but red" answers
red. Candidates are the words of ``extra_info["choices"]`` when the row lists them (the
generator does), else :data:`COLOURS` for a colour question and the counts 0-20 for a
count; counts may be digits or words (``three``). Case is ignored.

Score: 1.0 when the answer equals the ground truth, 0.0 otherwise (wrong, or no candidate
at all: ``pred`` None). A ground truth that is neither a word nor a count scores 0.0 with
``invalid_ground_truth=1.0``; this scorer never raises.
"""

from __future__ import annotations

import re
from typing import Any

from verl.rewards.scorers.extract import bounded, last_boxed

__all__ = ["COLOURS", "NUMBER_WORDS", "compute_score", "extract_answer"]

# colour words answered when a row lists no choices (British and American grey)
COLOURS = (
    "red",
    "green",
    "blue",
    "yellow",
    "orange",
    "purple",
    "pink",
    "brown",
    "black",
    "white",
    "grey",
    "gray",
    "cyan",
    "magenta",
)
NUMBER_WORDS = (
    *("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
    *("eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen"),
    *("eighteen", "nineteen", "twenty"),
)
_WORD_RE = re.compile(r"[a-z]+|\d+")
_ANSWER_RE = re.compile(r"\banswer\b", re.IGNORECASE)


def _canonical(word: str) -> str:
    """Counts as digits ("three" -> "3", "03" -> "3"), grey as "grey", words lower-case."""
    word = word.lower()
    if word.isdigit():
        return str(int(word))
    if word in NUMBER_WORDS:
        return str(NUMBER_WORDS.index(word))
    return "grey" if word == "gray" else word


def _fragment(text: str) -> str:
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    matches = list(_ANSWER_RE.finditer(text))
    if matches:
        rest = text[matches[-1].end() :].split("\n", 1)[0]
        if _WORD_RE.search(rest.lower()):
            return rest
    return text


def extract_answer(text: str, candidates: set[str]) -> str | None:
    """The last of ``candidates`` (canonical forms) named in the answer fragment of
    ``text``, in canonical form; None when it names none."""
    found = None
    for word in _WORD_RE.findall(_fragment(text).lower()):
        word = _canonical(word)
        if word in candidates:
            found = word
    return found


def _candidates(target: str, extra_info: dict | None) -> set[str]:
    choices = (extra_info or {}).get("choices")
    if isinstance(choices, (list, tuple)) and choices:
        return {_canonical(str(c)) for c in choices} | {target}
    if target.isdigit():
        return {str(i) for i in range(len(NUMBER_WORDS))} | {target}
    return {_canonical(c) for c in COLOURS} | {target}


def compute_score(
    solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict[str, Any]:
    """Score one response. Returns ``{"score", "acc", "pred"}`` (``pred`` the answer read,
    None when there is none) and ``invalid_ground_truth=1.0`` for an unusable ground truth."""
    if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, int)):
        return {"score": 0.0, "acc": 0.0, "pred": None, "invalid_ground_truth": 1.0}
    words = _WORD_RE.findall(str(ground_truth).strip().lower())
    if len(words) != 1 or (isinstance(ground_truth, int) and ground_truth < 0):
        return {"score": 0.0, "acc": 0.0, "pred": None, "invalid_ground_truth": 1.0}
    target = _canonical(words[0])
    text = bounded(solution_str) if isinstance(solution_str, str) else ""
    pred = extract_answer(text, _candidates(target, extra_info))
    correct = pred == target
    return {"score": 1.0 if correct else 0.0, "acc": 1.0 if correct else 0.0, "pred": pred}
