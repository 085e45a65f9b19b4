"""Clip-Cov and KL-Cov policy losses (Cui et al. 2025, "The Entropy Mechanism of RL for
Reasoning Language Models"), registered as ``clip_cov`` and ``kl_cov``
(:mod:`verl.registry.builtin`).

Policy entropy collapses fastest through tokens where the log-prob and the advantage move
together. Both losses measure that per valid token as the centred cross product
``cov_t = (A_t - mean A) * (log_prob_t - mean log_prob)`` (means over the valid tokens of
the batch, no gradient) and treat a small fraction of high-covariance tokens differently:

- ``clip_cov``: PPO's clipped surrogate, but a random ``clip_cov_ratio`` fraction of the
  valid tokens (at least one) among those PPO did not clip and with
  ``clip_cov_lb < cov < clip_cov_ub`` get no gradient (their loss is detached, so the
  loss value is unchanged).
- ``kl_cov``: the unclipped surrogate ``-A r``, plus ``ppo_kl_coef * |log r|`` on the
  ``kl_cov_ratio`` fraction (at least one) of valid tokens with the largest covariance.

The signature and metrics follow :mod:`verl.algorithms.policy_loss`; both add a metric for
the fraction of valid tokens they treated (``clip_cov_frac`` / ``kl_cov_frac``).
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.core import masked_mean
from verl.algorithms.policy_loss import (
    _aggregate,
    _approx_kl,
    _clamped_log_ratio,
    _clipped_surrogate,
    _fraction,
)

__all__ = ["compute_policy_loss_clip_cov", "compute_policy_loss_kl_cov"]


def _token_covariance(
    advantages: torch.Tensor, log_prob: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    adv, lp = advantages.detach(), log_prob.detach()
    return (adv - masked_mean(adv, valid)) * (lp - masked_mean(lp, valid))


def _num_selected(ratio: float, num_valid: int) -> int:
    if not 0 <= ratio <= 1:
        raise ValueError(f"covariance token ratio={ratio} must be in [0, 1]")
    if num_valid == 0 or ratio == 0:
        return 0
    return max(1, int(ratio * num_valid))


def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
    **kwargs,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Clip-Cov: PPO's clipped loss with the gradient of a few high-covariance tokens cut.

    See the module docstring. ``generator`` seeds the random token choice (tests);
    ``clip_ratio_c`` is unused (no dual clip).
    """
    valid = response_mask != 0
    ratio = torch.exp(_clamped_log_ratio(log_prob, old_log_prob))
    per_token, ppo_clipped = _clipped_surrogate(advantages, ratio, clip_ratio_low, clip_ratio_high)

    cov = _token_covariance(advantages, log_prob, valid)
    candidates = valid & ~ppo_clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    num = _num_selected(clip_cov_ratio, int(valid.sum()))
    flat_idx = torch.nonzero(candidates.reshape(-1)).squeeze(-1)
    order = torch.randperm(flat_idx.numel(), generator=generator).to(flat_idx.device)
    cut = torch.zeros(candidates.numel(), dtype=torch.bool, device=candidates.device)
    cut[flat_idx[order[:num]]] = True
    cut = cut.reshape(candidates.shape)
    per_token = torch.where(cut, per_token.detach(), per_token)

    loss = _aggregate(per_token, response_mask, loss_agg_mode, rollout_is_weights, kwargs)
    metrics = {
        "clipfrac": _fraction(ppo_clipped, response_mask),
        "clipfrac_lower": 0.0,
        "approx_kl": _approx_kl(log_prob, old_log_prob, response_mask),
        "clip_cov_frac": _fraction(cut, response_mask),
    }
    return loss, metrics


def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 1.0,
    **kwargs,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """KL-Cov: unclipped surrogate plus a ``|log r|`` penalty on the top-covariance tokens.

    See the module docstring. The clip arguments are unused (KL-Cov does not clip).
    """
    valid = response_mask != 0
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    per_token = -advantages * torch.exp(log_ratio)

    cov = _token_covariance(advantages, log_prob, valid)
    num = _num_selected(kl_cov_ratio, int(valid.sum()))
    ranked = torch.where(valid, cov, torch.full_like(cov, float("-inf"))).reshape(-1)
    chosen = torch.zeros(ranked.numel(), dtype=torch.bool, device=ranked.device)
    chosen[torch.topk(ranked, num).indices] = True
    chosen = chosen.reshape(cov.shape) & valid
    per_token = per_token + torch.where(chosen, ppo_kl_coef * log_ratio.abs(), 0.0)

    loss = _aggregate(per_token, response_mask, loss_agg_mode, rollout_is_weights, kwargs)
    metrics = {
        "clipfrac": 0.0,
        "clipfrac_lower": 0.0,
        "approx_kl": _approx_kl(log_prob, old_log_prob, response_mask),
        "kl_cov_frac": _fraction(chosen, response_mask),
    }
    return loss, metrics
