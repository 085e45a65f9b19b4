"""Upstream's ``verl.utils.reward_score.gsm8k``, backed by ``verl.rewards.scorers.gsm8k``:
the number after ``####`` (``method="strict"``) or the last number (``"flexible"``)."""

from __future__ import annotations

from typing import Any

from verl.rewards.scorers import gsm8k as _native

__all__ = ["compute_score", "extract_solution"]


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The response's answer number as text, or ``None``."""
    return _native.extract_answer(solution_str, method)


def compute_score(
    solution_str: str,
    ground_truth: Any,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """``score`` for a correct answer, ``format_score`` for a wrong one, 0 for none."""
    result = _native.compute_score(solution_str, ground_truth, method=method)
    if result.get("acc"):
        return float(score)
    return float(format_score) if result.get("pred") is not None else 0.0
