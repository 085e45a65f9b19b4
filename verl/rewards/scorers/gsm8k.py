"""GSM8K scorer: the number after the last `####` must equal the reference answer.

Methods:

- `"strict"` (default, as in GSM8K training prompts that ask for `#### <answer>`): only the
  first number after the last `####` counts; a response without `####` gets 0.
- `"flexible"`: the `####` answer when present, else the last number in the response.

The ground truth may be the bare answer ("72", "1,234", "-3") or a full GSM8K solution
ending in `#### 72`. Numbers compare exactly as fractions, so "1,234.00" equals "1234".
Score 1.0 when right, `format_score` (default 0.0) when a number was extracted but is
wrong, 0.0 otherwise. An unparseable ground truth scores 0.0 with
`invalid_ground_truth=1.0`; the scorer never raises.
"""

from __future__ import annotations

from typing import Any

from verl.rewards.scorers.extract import (
    bounded,
    first_number,
    last_number,
    parse_number,
    score_number,
)

METHODS = ("strict", "flexible")


def extract_answer(text: str, method: str = "strict") -> str | None:
    """The answer number of a GSM8K-style response, or None (see module docstring)."""
    if method not in METHODS:
        raise ValueError(f"gsm8k method={method!r} is not one of {METHODS}")
    if "####" in text:
        number = first_number(text.rsplit("####", 1)[1].split("\n", 1)[0])
        if number is not None:
            return number
    if method == "flexible":
        return last_number(text)
    return None


def _ground_truth_number(ground_truth: Any):
    if isinstance(ground_truth, str) and "####" in ground_truth:
        ground_truth = ground_truth.rsplit("####", 1)[1]
    return parse_number(ground_truth)


def compute_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    method: str = "strict",
    format_score: float = 0.0,
) -> dict[str, Any]:
    """Score one GSM8K response.

    Returns `{"score": float, "acc": float, "pred": str | None}` and, when the ground
    truth is not a number, `"invalid_ground_truth": 1.0`.

    Raises:
        ValueError: `method` is not "strict" or "flexible" (a configuration error).
    """
    del extra_info  # same signature as every scorer; GSM8K needs no extra context
    if method not in METHODS:
        raise ValueError(f"gsm8k method={method!r} is not one of {METHODS}")
    target = _ground_truth_number(ground_truth)
    if target is None:
        return {"score": 0.0, "acc": 0.0, "pred": None, "invalid_ground_truth": 1.0}
    text = bounded(solution_str) if isinstance(solution_str, str) else ""
    token = extract_answer(text, method)
    return score_number(token, target, format_score)
