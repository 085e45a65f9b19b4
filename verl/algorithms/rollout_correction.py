"""Importance weights for the gap between the rollout and the trainer (rollout correction).

The rollout engine samples a token with probability ``pi_rollout`` (its own kernels,
precision, batching), while the PPO ratio is taken against ``pi_old``, the trainer's
recomputation of the same policy (``old_log_probs``). When the two differ the samples are
slightly off-policy for ``pi_old``. With ``d_t = old_log_prob_t - rollout_log_prob_t``
(clamped to [-20, 20]) each token's policy loss is multiplied by a constant weight (no
gradient flows through it):

- token-level TIS (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
  Off-Policy RL Training"): ``w_t = min(exp(d_t), C)``;
- sequence-level IS: ``w_t = min(exp(sum_{valid j} d_j), C)`` on every token of the
  sequence, the importance weight of the whole sequence (unbiased for sequence-level
  rewards, but of high variance for long sequences, hence the truncation);
- masked IS / rejection: a sequence whose geometric-mean ratio
  ``exp(mean_{valid j} d_j)`` leaves the band ``[1 / C_rs, C_rs]`` gets weight 0 on every
  token (on top of the IS weight, or of 1 when IS is off): samples whose numerics drifted
  too far are dropped rather than reweighted.

The truncation bounds the variance a large ratio would add. With identical rollout and
trainer numerics every weight is 1 and the loss is unchanged.
"""

from __future__ import annotations

import torch

from verl.algorithms.core import masked_mean

__all__ = ["ROLLOUT_IS_LEVELS", "compute_rollout_is_weights", "rollout_mismatch_metrics"]

ROLLOUT_IS_LEVELS = ("token", "sequence")

_LOG_RATIO_BOUND = 20.0


@torch.no_grad()
def compute_rollout_is_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    threshold: float | None,
    level: str = "token",
    rs_threshold: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token rollout-correction weights (formulas in the module docstring).

    Args:
        old_log_prob: ``(batch, response_len)`` log-probs of the sampled tokens recomputed by
            the trainer (the PPO "old" policy).
        rollout_log_prob: ``(batch, response_len)`` log-probs the rollout engine sampled them
            with.
        response_mask: ``(batch, response_len)``, nonzero on valid response tokens.
        threshold: the IS truncation ``C`` (> 0), or None for no importance weighting
            (weight 1, only the rejection applies).
        level: ``"token"`` or ``"sequence"``: which ratio ``C`` truncates.
        rs_threshold: the rejection band ``[1 / C_rs, C_rs]`` (``C_rs > 1``) of the
            geometric-mean sequence ratio, or None for no rejection.

    Returns:
        ``weights`` ``(batch, response_len)``, detached, 0 on masked tokens, and metrics
        (0-dim tensors): ``rollout_is_weight_mean`` (mean weight over valid tokens, after
        truncation and rejection), ``rollout_is_clipfrac`` (fraction of valid tokens, or of
        non-empty sequences at ``level="sequence"``, whose ratio exceeded ``C``), with
        ``rs_threshold`` ``rollout_rs_reject_frac`` (fraction of non-empty sequences
        rejected), and ``rollout_is_ess`` (effective sample size fraction
        ``(sum w)^2 / (n sum w^2)`` over the ``n`` valid tokens: 1 when every weight is
        equal, small when a few tokens carry the batch).
    """
    if threshold is None and rs_threshold is None:
        raise ValueError("compute_rollout_is_weights needs a threshold, an rs_threshold or both")
    if threshold is not None and not threshold > 0:
        raise ValueError(f"rollout_is_threshold={threshold} must be > 0")
    if rs_threshold is not None and not rs_threshold > 1:
        raise ValueError(f"rollout_rs_threshold={rs_threshold} must be > 1 (the band is [1/C, C])")
    if level not in ROLLOUT_IS_LEVELS:
        raise ValueError(
            f"rollout_is_level={level!r} must be one of {', '.join(ROLLOUT_IS_LEVELS)}"
        )
    valid = response_mask != 0
    nonempty = valid.any(-1)
    log_ratio = torch.clamp(
        old_log_prob.float() - rollout_log_prob.float(), -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND
    )
    log_ratio = torch.where(valid, log_ratio, 0.0)
    metrics: dict[str, torch.Tensor] = {}
    weights = valid.float()
    if threshold is not None and level == "token":
        ratio = torch.exp(log_ratio)
        weights = torch.clamp(ratio, max=threshold)
        metrics["rollout_is_clipfrac"] = masked_mean((ratio > threshold).float(), valid)
    elif threshold is not None:
        seq_log_ratio = torch.clamp(log_ratio.sum(-1), -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
        seq_ratio = torch.exp(seq_log_ratio)
        weights = torch.clamp(seq_ratio, max=threshold).unsqueeze(-1).expand_as(log_ratio)
        metrics["rollout_is_clipfrac"] = masked_mean((seq_ratio > threshold).float(), nonempty)
    else:
        metrics["rollout_is_clipfrac"] = weights.new_zeros(())
    if rs_threshold is not None:
        geo_log_ratio = masked_mean(log_ratio, valid, dim=-1)
        bound = torch.log(torch.tensor(rs_threshold, dtype=geo_log_ratio.dtype))
        keep = geo_log_ratio.abs() <= bound
        weights = weights * keep.unsqueeze(-1)
        metrics["rollout_rs_reject_frac"] = masked_mean((~keep).float(), nonempty)
    weights = torch.where(valid, weights, 0.0)
    metrics["rollout_is_weight_mean"] = masked_mean(weights, valid)
    total, total_sq = weights.sum(), weights.square().sum()
    n_valid = valid.sum()
    ess = total.square() / (n_valid * total_sq)
    metrics["rollout_is_ess"] = torch.where(total_sq > 0, ess, weights.new_zeros(()))
    return weights, metrics


@torch.no_grad()
def rollout_mismatch_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """Gap between the rollout's sampling log-probs and the trainer's recomputed ones.

    Both are log-probs of the same sampled tokens under the same weights, so any gap is
    numerical (kernels, precision, batching). Reported over valid response tokens: mean and
    max absolute difference, the k1 and k3 estimates of KL(rollout || trainer); over
    non-empty responses: the smallest and largest geometric-mean ratio
    ``exp(mean_t (old - rollout))``, the quantity ``actor.rollout_rs_threshold`` bands.
    All inputs ``(batch, response_len)``; ``{}`` when no token is valid.
    """
    mask = response_mask.bool()
    if not mask.any():
        return {}
    full_diff = torch.where(mask, old_log_prob.float() - rollout_log_prob.float(), 0.0)
    diff = full_diff[mask]
    # k1 and k3 estimators with log-ratio r = log p_train - log p_rollout, samples from the
    # rollout: KL(rollout || train) = E[-r] = E[exp(r) - 1 - r].
    kl = torch.expm1(diff) - diff
    nonempty = mask.any(-1)
    geo = torch.exp(full_diff.sum(-1)[nonempty] / mask.sum(-1)[nonempty])
    values = torch.stack(
        [
            diff.abs().mean(),
            diff.abs().max(),
            (-diff).mean(),
            kl.mean(),
            geo.min(),
            geo.max(),
        ]
    ).tolist()
    names = ("logprob_abs_diff_mean", "logprob_abs_diff_max", "kl_k1", "kl_k3")
    names += ("geo_ratio_min", "geo_ratio_max")
    return {f"rollout/{name}": value for name, value in zip(names, values, strict=True)}
