"""Upstream's ``verl.utils.reward_score.prime_code``, backed by ``verl.rewards.scorers.code``
(tests run in the local sandbox, ``verl.rewards.sandbox``)."""

from __future__ import annotations

from typing import Any

from verl.rewards.scorers import code as _native

__all__ = ["compute_score"]


def compute_score(
    completion: str, test_cases: Any, continuous: bool = False
) -> tuple[float | bool, dict[str, Any]]:
    """``(score, metadata)``: with ``continuous`` the fraction of tests passed, else whether
    all passed; the metadata is the native scorer's result (passed, total, timeouts)."""
    result = _native.compute_score(completion, test_cases)
    if continuous:
        return float(result["score"]), result
    return bool(result.get("acc")), result
