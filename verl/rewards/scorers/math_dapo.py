"""DAPO-style math scorer: the response's final answer against the ground truth, scored
1 (correct) or -1 (wrong), as DAPO's math recipe (data sources ``math_dapo``, ``aime*``).

The final answer is read from the end of the response (its last 300 characters, where a
DAPO prompt asks for it):

1. default: the last ``Answer: X`` line (case-insensitive; the DAPO prompt ends with
   "Answer: $Answer"), else the last complete ``\\boxed{X}``;
2. ``strict_box_verify=True``: only the last ``\\boxed{X}`` within the last 100 characters,
   compared with the ground truth as written (no normalisation).

Both sides are normalised by :func:`normalize_final_answer`: the text after the last ``=``,
without ``$``, ``\\boxed{}``/``\\text{}`` wrappers and the MATH normalisation of
:mod:`verl.rewards.scorers.math_dataset` (spacing, ``\\dfrac``, units in ``\\text``, degrees,
``a/b`` -> ``\\frac{a}{b}``, thousands separators); two answers match when the normalised
strings are equal or both are the same number (``0.5`` = ``\\frac{1}{2}``).

Returns ``{"score": 1.0 | -1.0, "acc": 1.0 | 0.0, "pred": str | None}``; never raises (an
empty or non-text ground truth scores -1 with ``invalid_ground_truth=1.0``).
"""

from __future__ import annotations

import re
from typing import Any

from verl.rewards.scorers.extract import bounded, last_boxed
from verl.rewards.scorers.math_dataset import is_equiv, normalize_answer

TAIL_CHARS = 300  # of the response, where the final answer is read
STRICT_TAIL_CHARS = 100  # of the response, for strict_box_verify
_ANSWER_RE = re.compile(r"(?i)answer\s*:\s*([^\n]+)")
_DOLLARS_RE = re.compile(r"^\$+|\$+$")


def extract_answer(solution_str: str) -> str | None:
    """The final answer of a response: its last ``Answer: X`` line, else its last
    ``\\boxed{X}`` (both within the last :data:`TAIL_CHARS` characters); ``None`` if neither."""
    tail = solution_str[-TAIL_CHARS:]
    lines = _ANSWER_RE.findall(tail)
    if lines:
        return lines[-1].strip()
    return last_boxed(tail)


def normalize_final_answer(answer: str) -> str:
    """``answer`` normalised for comparison (see the module docstring)."""
    text = answer.strip()
    boxed = last_boxed(text) if "\\boxed" in text else None
    if boxed is not None:
        text = boxed
    text = text.split("=")[-1] if "=" in text and "==" not in text else text
    text = _DOLLARS_RE.sub("", text.strip()).strip()
    return normalize_answer(text)


def compute_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    strict_box_verify: bool = False,
    pause_tokens_index: list[int] | None = None,
) -> dict[str, Any]:
    """Score one response 1.0 (correct) or -1.0 (see the module docstring).

    ``pause_tokens_index`` (upstream's, for strict verification after pause tokens): the
    strict window then starts 100 characters before its last index.
    """
    del extra_info  # the same signature as every scorer
    if isinstance(ground_truth, (int, float)) and not isinstance(ground_truth, bool):
        ground_truth = str(ground_truth)
    if not isinstance(ground_truth, str) or not ground_truth.strip():
        return {"score": -1.0, "acc": 0.0, "pred": None, "invalid_ground_truth": 1.0}
    text = bounded(solution_str) if isinstance(solution_str, str) else ""
    if strict_box_verify:
        start = pause_tokens_index[-1] - STRICT_TAIL_CHARS if pause_tokens_index else None
        window = text[start:] if start is not None else text[-STRICT_TAIL_CHARS:]
        pred = last_boxed(window)
        correct = pred is not None and pred == ground_truth
        return {"score": 1.0 if correct else -1.0, "acc": float(correct), "pred": pred}
    raw = extract_answer(text)
    if raw is None:
        return {"score": -1.0, "acc": 0.0, "pred": None}
    pred = normalize_final_answer(raw)
    correct = bool(pred) and is_equiv(pred, normalize_final_answer(bounded(ground_truth)))
    return {"score": 1.0 if correct else -1.0, "acc": float(correct), "pred": pred}
