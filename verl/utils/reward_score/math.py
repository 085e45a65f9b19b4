"""Upstream's ``verl.utils.reward_score.math`` (before v0.6; ``math_reward`` since)."""

from verl.utils.reward_score.math_reward import (
    compute_score,
    is_equiv,
    last_boxed_only_string,
    remove_boxed,
)

__all__ = ["compute_score", "is_equiv", "last_boxed_only_string", "remove_boxed"]
