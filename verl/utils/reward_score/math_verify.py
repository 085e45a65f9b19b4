"""Upstream's ``verl.utils.reward_score.math_verify`` (Math-Verify there), backed by
``verl.rewards.scorers.math_dataset`` here: equal normalised answers or equal numbers, no
symbolic equivalence."""

from __future__ import annotations

from typing import Any

from verl.rewards.scorers import math_dataset as _native

__all__ = ["compute_score"]


def compute_score(model_output: str, ground_truth: Any, timeout_score: float = 0) -> float:
    """1.0 when the last boxed answer matches the ground truth, else 0.0 (no timeouts here:
    ``timeout_score`` is not used)."""
    del timeout_score
    truth = ground_truth if "\\boxed" in str(ground_truth) else str(ground_truth)
    return float(_native.compute_score(model_output, truth)["acc"])
