"""The driver-side algorithm steps on a scored batch: advantages by the configured
estimator, and PF-PPO's redraw of the responses by score. Both are pure tensor work on
the driver (no worker call)."""

from __future__ import annotations

from typing import Any

from verl.algorithms import ADVANTAGE_ESTIMATORS
from verl.algorithms.pf_ppo import pf_ppo_indices
from verl.config import TrainerConfig
from verl.protocol import DataProto

__all__ = ["compute_advantages", "pf_ppo_redraw"]


def compute_advantages(gen: DataProto, cfg: TrainerConfig) -> None:
    """``advantages`` and ``returns`` ``(batch, response_len)`` of ``gen`` by
    ``algorithm.adv_estimator``, written into ``gen.batch``.

    The estimator receives the inputs it declares (``token_level_rewards``,
    ``response_mask``, ``values``, the group ids ``uid``, ...) plus its hyperparameters from
    ``algorithm.adv_estimator_kwargs``.
    """
    acfg, b = cfg.algorithm, gen.batch
    estimator = ADVANTAGE_ESTIMATORS.entry(acfg.adv_estimator)
    inputs = dict(
        token_level_rewards=b["token_level_rewards"],
        response_mask=b["response_mask"],
        values=b.get("values"),
        index=gen.non_tensor_batch["uid"],
        reward_baselines=b.get("reward_baselines"),
        old_log_probs=b.get("old_log_probs"),
        ref_log_probs=b.get("ref_log_probs"),
        sum_pi_squared=b.get("sum_pi_squared"),
        gamma=acfg.gamma,
        lam=acfg.lam,
        norm_adv_by_std=acfg.norm_adv_by_std_in_grpo,
    )
    kwargs = estimator.call_kwargs(
        inputs, acfg.adv_estimator_kwargs, "algorithm.adv_estimator_kwargs"
    )
    advantages, returns = estimator.target(**kwargs)
    b["advantages"] = advantages
    b["returns"] = returns


def pf_ppo_redraw(
    gen: DataProto, cfg: TrainerConfig, step: int
) -> tuple[DataProto, dict[str, Any]]:
    """PF-PPO: the step's responses redrawn with replacement, weighted by score
    (``algorithm.pf_ppo``), with a draw seeded by ``trainer.seed`` and ``step``."""
    pf = cfg.algorithm.pf_ppo
    scores = gen.batch["token_level_scores"].sum(-1)
    seed = cfg.trainer.seed * 1_000_003 + step
    rows, metrics = pf_ppo_indices(scores, pf.reweight_method, pf.weight_pow, seed=seed)
    return gen[rows], metrics
