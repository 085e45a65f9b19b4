"""Upstream's ``verl.utils.reward_score.math_dapo``, backed by
``verl.rewards.scorers.math_dapo``: the final answer (``Answer: X`` or ``\\boxed{X}``)
scored 1.0 / -1.0."""

from __future__ import annotations

from typing import Any

from verl.rewards.scorers import math_dapo as _native
from verl.utils.reward_score.math_reward import last_boxed_only_string, remove_boxed

__all__ = ["compute_score", "last_boxed_only_string", "normalize_final_answer", "remove_boxed"]

normalize_final_answer = _native.normalize_final_answer


def compute_score(
    solution_str: str,
    ground_truth: Any,
    strict_box_verify: bool = False,
    pause_tokens_index: list[int] | None = None,
) -> dict[str, Any]:
    """``{"score": 1.0 | -1.0, "acc": bool, "pred": str | None}``, as upstream returns."""
    result = _native.compute_score(
        solution_str,
        ground_truth,
        strict_box_verify=strict_box_verify,
        pause_tokens_index=pause_tokens_index,
    )
    return {"score": result["score"], "acc": bool(result["acc"]), "pred": result["pred"]}
