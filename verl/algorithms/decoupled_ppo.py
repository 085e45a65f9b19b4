"""Decoupled PPO: the proximal policy separate from the behaviour policy (Hilton et al. 2022,
"Batch size-invariance for policy optimization"; the objective of AReaL's asynchronous RL),
registered as the policy loss ``decoupled_ppo`` (:mod:`verl.registry.builtin`).

Asynchronous training samples a response with an older policy, the *behaviour* policy
``pi_behav`` (the rollout's own per-token log-probs, ``rollout_log_probs``), and trains it
some updates later. Standard PPO takes its ratio against the sampling policy, so the trust
region is centred on a policy that may be several updates old. Decoupled PPO centres it on
the *proximal* policy ``pi_prox``, the trainer's recomputation of the log-probs with the
weights the update starts from (``old_log_probs``), and corrects for the gap between the
sampling and the proximal policy with an importance weight. Per valid token ``t``, with
advantage ``A_t``::

    r_t = exp(log_prob_t - prox_t)                       (ratio to the proximal policy)
    w_t = min(exp(prox_t - behav_t), behaviour_weight_cap)       (no gradient)
    L_t = w_t * max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))
    L_t = w_t * min(that max, -A_t clip_ratio_c)         for A_t < 0 (dual clip, as vanilla)

and the loss is ``L_t`` aggregated with ``loss_agg_mode``. Log-ratios are clamped to
[-20, 20] before ``exp``; masked tokens have weight 0. When the behaviour and the proximal
policy agree (a fresh sample: ``behav == prox``) every ``w_t`` is 1 and the loss is
``vanilla``'s. ``behaviour_weight_cap`` (> 0, default 2.0; set it with
``actor_rollout_ref.actor.policy_loss_kwargs.behaviour_weight_cap``) bounds the variance a
large weight adds; the truncation biases towards the proximal policy instead.

``rollout_is_weights`` (the actor's rollout correction) are multiplied in on top: the
actor passes only the rejection (``rollout_rs_threshold``) to this loss, never the
truncated IS weights of ``rollout_is_threshold``, which would weight each token by the
same ratio twice (:func:`verl.algorithms.actor_loss`).

Metrics, besides vanilla's ``clipfrac``, ``clipfrac_lower`` and ``approx_kl`` (against the
proximal policy): ``behaviour_weight_mean`` (mean ``w_t`` over valid tokens, after the
truncation), ``behaviour_weight_clipfrac`` (fraction of valid tokens whose weight was
truncated) and ``behaviour_approx_kl`` (``mean(behav - prox)`` over valid tokens, the k1
estimate of ``KL(pi_behav || pi_prox)``: how far the stale samples' policy is from the
proximal one).
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.core import masked_mean
from verl.algorithms.policy_loss import _LOG_RATIO_BOUND, _aggregate, _dual_clip_per_token

__all__ = ["DEFAULT_BEHAVIOUR_WEIGHT_CAP", "behaviour_weights", "compute_policy_loss_decoupled"]

DEFAULT_BEHAVIOUR_WEIGHT_CAP = 2.0


@torch.no_grad()
def behaviour_weights(
    proximal_log_prob: torch.Tensor,
    behaviour_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    cap: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``w = min(exp(prox - behav), cap)`` per token, 0 on masked tokens, all
    ``(batch, response_len)``, detached; with the ``behaviour_*`` metrics (module
    docstring)."""
    if not cap > 0:
        raise ValueError(
            f"decoupled_ppo: behaviour_weight_cap={cap} must be > 0 "
            "(actor_rollout_ref.actor.policy_loss_kwargs.behaviour_weight_cap)"
        )
    valid = response_mask != 0
    log_ratio = torch.clamp(
        proximal_log_prob.float() - behaviour_log_prob.float(), -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND
    )
    ratio = torch.exp(torch.where(valid, log_ratio, 0.0))
    weights = torch.where(valid, torch.clamp(ratio, max=cap), 0.0)
    metrics = {
        "behaviour_weight_mean": masked_mean(weights, valid),
        "behaviour_weight_clipfrac": masked_mean((ratio > cap).float(), valid),
        "behaviour_approx_kl": masked_mean(-log_ratio, valid),
    }
    return weights, metrics


def compute_policy_loss_decoupled(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    rollout_log_prob: torch.Tensor | None = None,
    behaviour_weight_cap: float = DEFAULT_BEHAVIOUR_WEIGHT_CAP,
    **kwargs,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Decoupled PPO's loss (module docstring).

    Args:
        old_log_prob: the proximal policy's log-probs of the sampled tokens (the trainer's
            recomputation), ``(batch, response_len)``.
        log_prob: the current policy's, differentiable.
        rollout_log_prob: the behaviour policy's (the rollout's ``rollout_log_probs``);
            required.
        behaviour_weight_cap: the truncation of ``exp(prox - behav)``.

    Raises:
        ValueError: no ``rollout_log_prob`` (the rollout backend returned none), or a
            ``behaviour_weight_cap`` that is not > 0.
    """
    if rollout_log_prob is None:
        raise ValueError(
            "policy_loss=decoupled_ppo needs the behaviour policy's per-token log-probs "
            "(the batch's rollout_log_probs), and this batch has none: use a rollout "
            "backend that returns them (native, hf, vllm, sglang) or "
            "actor_rollout_ref.actor.policy_loss=vanilla"
        )
    weights, behaviour_metrics = behaviour_weights(
        old_log_prob, rollout_log_prob, response_mask, behaviour_weight_cap
    )
    if rollout_is_weights is not None:
        weights = weights * rollout_is_weights.detach()
    per_token, metrics = _dual_clip_per_token(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        clip_ratio_low,
        clip_ratio_high,
        clip_ratio_c,
    )
    loss = _aggregate(per_token, response_mask, loss_agg_mode, weights, kwargs)
    return loss, metrics | behaviour_metrics
