"""Upstream's ``verl.utils.reward_score.prime_math``, backed by
``verl.rewards.scorers.math_dataset`` (the last boxed answer, MATH normalisation)."""

from __future__ import annotations

from typing import Any

from verl.rewards.scorers import math_dataset as _native

__all__ = ["compute_score"]


def compute_score(model_output: str, ground_truth: Any) -> tuple[bool, bool, str | None]:
    """``(correct, format_ok, extracted answer)`` as upstream returns: ``format_ok`` is True
    when the response holds a boxed answer."""
    result = _native.compute_score(str(model_output), str(ground_truth))
    pred = result.get("pred")
    return bool(result["acc"]), pred is not None, pred
