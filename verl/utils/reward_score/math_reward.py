"""Upstream's ``verl.utils.reward_score.math_reward`` (``math`` before v0.6), backed by
``verl.rewards.scorers.math_dataset``: the last ``\\boxed{}`` answer, 1.0 if it matches."""

from __future__ import annotations

from typing import Any

from verl.rewards.scorers import math_dataset as _native
from verl.rewards.scorers.extract import last_boxed

__all__ = ["compute_score", "is_equiv", "last_boxed_only_string", "remove_boxed"]


def compute_score(solution_str: str, ground_truth: Any) -> float:
    """1.0 when the response's last boxed answer equals the ground truth, else 0.0."""
    return float(_native.compute_score(solution_str, ground_truth)["acc"])


def last_boxed_only_string(string: str) -> str | None:
    """``\\boxed{X}`` of the last complete boxed answer, or ``None``."""
    inner = last_boxed(string)
    return None if inner is None else "\\boxed{" + inner + "}"


def remove_boxed(s: str) -> str:
    """``X`` of ``\\boxed{X}`` (``s`` unchanged when it is not boxed)."""
    inner = last_boxed(s) if s.startswith("\\boxed") else None
    return s if inner is None else inner


def is_equiv(str1: str | None, str2: str | None, verbose: bool = False) -> bool:
    """Two answers equal after the MATH normalisation (``verbose`` is not used)."""
    del verbose
    if str1 is None or str2 is None:
        return str1 is None and str2 is None
    return _native.is_equiv(_native.normalize_answer(str1), _native.normalize_answer(str2))
