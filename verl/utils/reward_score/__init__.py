"""Upstream verl's scorer module paths, backed by this build's scorers (``verl.rewards.scorers``).

A custom reward function written for upstream verl imports its scorers from here::

    from verl.utils.reward_score import default_compute_score, gsm8k, math_dapo

and calls them with upstream's signatures; each module is a thin adapter over the native
scorer of the same task (the grading rules are this build's, documented in each native
module):

| module | upstream call | native scorer |
|---|---|---|
| ``gsm8k`` | ``compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0) -> float`` | ``scorers.gsm8k`` |
| ``math``, ``math_reward`` | ``compute_score(solution_str, ground_truth) -> float`` (1.0 / 0.0) | ``scorers.math_dataset`` |
| ``math_dapo`` | ``compute_score(solution_str, ground_truth, strict_box_verify=False, pause_tokens_index=None) -> dict`` (score 1 / -1) | ``scorers.math_dapo`` |
| ``math_verify`` | ``compute_score(model_output, ground_truth, timeout_score=0) -> float`` | ``scorers.math_dataset`` |
| ``prime_math`` | ``compute_score(model_output, ground_truth) -> (correct, format_ok, answer)`` | ``scorers.math_dataset`` |
| ``prime_code`` | ``compute_score(completion, test_cases, continuous=False) -> (score, metadata)`` | ``scorers.code`` |

:func:`default_compute_score` picks the scorer by data source through the native registry
(``verl.rewards.scorers``: gsm8k, MATH, ``math_dapo``, ``aime*``, code, ``arithmetic``, and
any registered with ``register_scorer``); a source with no scorer raises
``UnknownDataSourceError`` (a ``NotImplementedError`` upstream) naming the known ones.
"""

from __future__ import annotations

from typing import Any

from verl.rewards.scorers.registry import get_scorer

__all__ = ["default_compute_score"]


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    sandbox_fusion_url: str | None = None,
    concurrent_semaphore: Any = None,
    memory_limit_mb: int | None = None,
    **kwargs: Any,
) -> float | dict[str, Any]:
    """Score one response by its data source, with upstream's signature and return values:
    the scorer's dict when it returns one (``score`` and its details), else a float.

    ``sandbox_fusion_url``, ``concurrent_semaphore`` and ``memory_limit_mb`` are upstream's
    remote code sandbox; code here runs in the local sandbox (``verl.rewards.sandbox``), so
    they are accepted and not used. Raises ``UnknownDataSourceError`` for a data source with
    no scorer.
    """
    del sandbox_fusion_url, concurrent_semaphore, memory_limit_mb, kwargs
    result = get_scorer(data_source)(solution_str, ground_truth, extra_info)
    if isinstance(result, dict):
        return result
    if isinstance(result, (tuple, list)):
        return float(result[0])
    return float(result)
