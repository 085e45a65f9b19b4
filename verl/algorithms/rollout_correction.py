"""Truncated importance sampling (TIS) for the gap between the rollout and the trainer.

The rollout engine samples a token with probability ``pi_rollout`` (its own kernels,
precision, batching), while the PPO ratio is taken against ``pi_old``, the trainer's
recomputation of the same policy (``old_log_probs``). When the two differ the samples are
slightly off-policy for ``pi_old``. TIS (Yao et al. 2025, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training") reweights each token's policy loss by the
truncated ratio

    w_t = min(exp(old_log_prob_t - rollout_log_prob_t), threshold)

used as a constant (no gradient flows through it). The truncation bounds the variance a
token with a large ratio would add. With identical rollout and trainer numerics every
``w_t = 1`` and the loss is unchanged.
"""

from __future__ import annotations

import torch

from verl.algorithms.core import masked_mean

__all__ = ["compute_rollout_is_weights"]

_LOG_RATIO_BOUND = 20.0


@torch.no_grad()
def compute_rollout_is_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    threshold: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token truncated importance weights ``min(exp(old - rollout), threshold)``.

    Args:
        old_log_prob: ``(batch, response_len)`` log-probs of the sampled tokens recomputed by
            the trainer (the PPO "old" policy).
        rollout_log_prob: ``(batch, response_len)`` log-probs the rollout engine sampled them
            with.
        response_mask: ``(batch, response_len)``, nonzero on valid response tokens.
        threshold: the truncation ``C`` (> 0).

    Returns:
        ``weights`` ``(batch, response_len)``, detached, 0 on masked tokens (the log-ratio is
        clamped to [-20, 20] before ``exp``), and metrics (0-dim tensors) over the valid
        tokens:
        ``rollout_is_weight_mean`` (mean weight after truncation) and
        ``rollout_is_clipfrac`` (fraction of tokens whose ratio exceeded ``threshold``).
    """
    if not threshold > 0:
        raise ValueError(f"rollout_is_threshold={threshold} must be > 0")
    valid = response_mask != 0
    log_ratio = torch.clamp(
        old_log_prob.float() - rollout_log_prob.float(), -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND
    )
    ratio = torch.exp(log_ratio)
    weights = torch.where(valid, torch.clamp(ratio, max=threshold), 0.0)
    metrics = {
        "rollout_is_weight_mean": masked_mean(weights, valid),
        "rollout_is_clipfrac": masked_mean((ratio > threshold).float(), valid),
    }
    return weights, metrics
