"""Policy-gradient losses for the actor, registered by name.

Every loss has the signature::

    loss_fn(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low=0.2,
            clip_ratio_high=0.2, clip_ratio_c=3.0, loss_agg_mode=..., rollout_is_weights=None,
            **kwargs) -> (loss, metrics)

``old_log_prob`` / ``log_prob``: log-probs of the sampled tokens under the rollout-time and
current policy, ``advantages``, ``response_mask``, ``rollout_is_weights`` (optional
importance weights correcting a rollout/training mismatch, multiplied into the per-token
loss): all ``(batch, response_len)``. ``loss`` is a 0-dim tensor to minimise; ``metrics``
holds detached 0-dim tensors or Python floats (the built-in losses return tensors, so a
micro-batch loop reads nothing back to the host until it chooses to): ``clipfrac`` (fraction of valid tokens whose ratio was clipped),
``clipfrac_lower`` (fraction hit by the dual-clip bound) and ``approx_kl``, the k1 estimate
``mean over valid tokens of (old_log_prob - log_prob)`` of ``KL(pi_old || pi)``.

The log-ratio ``log_prob - old_log_prob`` is clamped to [-20, 20] before ``exp``. The
built-in losses are declared in :mod:`verl.registry.builtin`; a new one is one
:func:`register_policy_loss` decorator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from verl.algorithms.core import masked_mean
from verl.algorithms.loss_agg import agg_loss
from verl.registry import POLICY_LOSSES

__all__ = [
    "POLICY_LOSSES",
    "compute_policy_loss_cispo",
    "compute_policy_loss_gmpo",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "get_policy_loss",
    "register_policy_loss",
]

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, Any]]]

_LOG_RATIO_BOUND = 20.0


def register_policy_loss(name: str, *aliases: str, override: bool = False, **needs: Any):
    """Decorator adding a policy loss to :data:`POLICY_LOSSES` under ``name``.

    Keyword parameters with defaults that the actor does not pass itself (see
    ``POLICY_LOSSES.inputs``) are the loss's hyperparameters, settable with
    ``actor_rollout_ref.actor.policy_loss_kwargs``.
    """
    return POLICY_LOSSES.register(name, *aliases, override=override, **needs)


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name`` (raises listing the available names)."""
    return POLICY_LOSSES.get(name)


def _clamped_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    return torch.clamp(log_prob - old_log_prob, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)


def _fraction(flags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(flags.float(), mask).detach()


def _approx_kl(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    return masked_mean((old_log_prob - log_prob).detach(), mask)


def _aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    loss_agg_mode: str,
    rollout_is_weights: torch.Tensor | None,
    kwargs: dict,
) -> torch.Tensor:
    """The scalar loss: per-token loss times the (detached) IS weights, then aggregated."""
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights.detach()
    return agg_loss(
        per_token, mask, loss_agg_mode, loss_scale_factor=kwargs.get("loss_scale_factor")
    )


def _clipped_surrogate(
    advantages: torch.Tensor, ratio: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token ``max(-A r, -A clip(r, 1 - low, 1 + high))`` and where it clipped."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """PPO's clipped surrogate with dual clip (Ye et al. 2020).

    Per token, with ``r = exp(log_prob - old_log_prob)`` and advantage ``A``:
    ``L = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))``; for ``A < 0`` the
    loss is further capped, ``L = min(L, -A clip_ratio_c)``, so a token whose ratio exploded
    cannot dominate the batch (``clip_ratio_c=None`` disables the cap). The gradient is zero
    on tokens where a clipped branch is active. Separate low/high ranges allow DAPO's
    clip-higher.
    """
    per_token, metrics = _dual_clip_per_token(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        clip_ratio_low,
        clip_ratio_high,
        clip_ratio_c,
    )
    loss = _aggregate(per_token, response_mask, loss_agg_mode, rollout_is_weights, kwargs)
    return loss, metrics


def _dual_clip_per_token(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Dual-clip PPO's per-token loss (:func:`compute_policy_loss_vanilla`), before any
    weighting or aggregation, and its ``clipfrac``/``clipfrac_lower``/``approx_kl``."""
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c={clip_ratio_c} must be > 1.0 for dual-clip PPO")
    ratio = torch.exp(_clamped_log_ratio(log_prob, old_log_prob))
    loss_ppo, clipped = _clipped_surrogate(advantages, ratio, clip_ratio_low, clip_ratio_high)
    per_token = loss_ppo
    clipfrac_lower: Any = 0.0
    if clip_ratio_c is not None:
        cap = -advantages * clip_ratio_c
        negative = advantages < 0
        per_token = torch.where(negative, torch.minimum(loss_ppo, cap), loss_ppo)
        clipfrac_lower = _fraction((loss_ppo > cap) & negative, response_mask)
    metrics = {
        "clipfrac": _fraction(clipped, response_mask),
        "clipfrac_lower": clipfrac_lower,
        "approx_kl": _approx_kl(log_prob, old_log_prob, response_mask),
    }
    return per_token, metrics


def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    loss_agg_mode: str | None = "seq-mean-token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """GSPO (Zheng et al. 2025): PPO clipping on a *sequence*-level importance ratio.

    ``s_i = exp(mean over valid tokens of (log_prob - old_log_prob))`` (the geometric mean of
    the token ratios). In the paper's token-wise form each token uses
    ``s_it = sg[s_i] * exp(log_prob_t - sg[log_prob_t])``: its value is ``s_i`` but its
    gradient flows through the token's own log-prob. Per token
    ``L = max(-A s_it, -A clip(s_it, 1 - clip_ratio_low, 1 + clip_ratio_high))``, so a whole
    sequence is clipped or not. ``clip_ratio_c`` is unused (no dual clip). The paper
    aggregates ``seq-mean-token-mean``, the default here (``None`` means that too); GSPO's
    clip ranges are much smaller than PPO's (the paper uses 3e-4 / 4e-4).
    """
    mask = response_mask.to(log_prob.dtype)
    seq_log_ratio = masked_mean(log_prob - old_log_prob, mask, dim=-1).detach()
    seq_log_ratio = torch.clamp(seq_log_ratio, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    log_s = seq_log_ratio.unsqueeze(-1) + log_prob - log_prob.detach()
    ratio = torch.exp(log_s)

    per_token, clipped = _clipped_surrogate(advantages, ratio, clip_ratio_low, clip_ratio_high)

    mode = "seq-mean-token-mean" if loss_agg_mode is None else loss_agg_mode
    loss = _aggregate(per_token, mask, mode, rollout_is_weights, kwargs)
    metrics = {
        "clipfrac": _fraction(clipped, mask),
        "clipfrac_lower": 0.0,
        "approx_kl": _approx_kl(log_prob, old_log_prob, mask),
    }
    return loss, metrics


def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """CISPO (MiniMax-M1, 2025): clip the importance weight, never drop a token's gradient.

    ``L = -sg(min(r, 1 + clip_ratio_high)) * A * log_prob``: a REINFORCE term weighted by the
    truncated, stop-gradient ratio, so every token keeps a gradient (PPO zeroes it on clipped
    tokens). Only the upper bound is applied, as in the paper's setting; ``clip_ratio_low``
    and ``clip_ratio_c`` are unused. ``clipfrac`` is the fraction of valid tokens with
    ``r > 1 + clip_ratio_high``.
    """
    ratio = torch.exp(_clamped_log_ratio(log_prob, old_log_prob)).detach()
    weight = torch.clamp(ratio, max=1.0 + clip_ratio_high)
    per_token = -weight * advantages * log_prob
    loss = _aggregate(per_token, response_mask, loss_agg_mode, rollout_is_weights, kwargs)
    metrics = {
        "clipfrac": _fraction(ratio > 1.0 + clip_ratio_high, response_mask),
        "clipfrac_lower": 0.0,
        "approx_kl": _approx_kl(log_prob, old_log_prob, response_mask),
    }
    return loss, metrics


def compute_policy_loss_reinforce(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Plain REINFORCE (Williams 1992): ``L = -A * log_prob`` per token, no ratio, no clip.

    The gradient is ``-A * grad log_prob``, the vanilla policy gradient; it equals PPO's on
    the first update of a batch (ratio 1, nothing clipped) and keeps following
    ``-A * grad log_prob`` on later updates, where PPO would reweight by the ratio and clip.
    ``old_log_prob`` only feeds the ``approx_kl`` metric; the clip settings are unused
    (``clipfrac`` and ``clipfrac_lower`` are 0).
    """
    per_token = -advantages * log_prob
    loss = _aggregate(per_token, response_mask, loss_agg_mode, rollout_is_weights, kwargs)
    metrics = {
        "clipfrac": 0.0,
        "clipfrac_lower": 0.0,
        "approx_kl": _approx_kl(log_prob, old_log_prob, response_mask),
    }
    return loss, metrics


def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """GPG's loss (Chu et al. 2025): ``-(1 / sum_i |o_i|) sum_{i,t} A_{i,t} log pi(o_{i,t})``.

    The policy-gradient objective itself, no surrogate: :func:`compute_policy_loss_reinforce`
    with the paper's normalisation by the batch's total number of valid tokens
    (``token-mean``, this entry's ``default_loss_agg_mode``). GPG's advantage correction
    lives in the ``gpg`` estimator.
    """
    return compute_policy_loss_reinforce(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode=loss_agg_mode,
        rollout_is_weights=rollout_is_weights,
        **kwargs,
    )


def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    **kwargs,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """SAPO (Gao et al. 2025, Soft Adaptive Policy Optimization): a smooth gate instead of a
    hard clip.

    Per token, with ``r = exp(log_prob - old_log_prob)`` and ``tau = tau_pos`` where
    ``A > 0``, else ``tau_neg``::

        f(r) = (4 / tau) * sigmoid(tau * (r - 1))          L = -A * f(r)

    The gradient is ``-A * w * grad log_prob`` with ``w = 4 sigmoid(x) (1 - sigmoid(x)) r``,
    ``x = tau (r - 1)``: ``w = 1`` on-policy (PPO's gradient) and it decays smoothly as the
    ratio leaves 1, faster for larger ``tau`` (the paper takes ``tau_neg > tau_pos``: updates
    that push a token down are damped sooner). The paper aggregates per sequence
    (``seq-mean-token-mean``, this entry's ``default_loss_agg_mode``). The clip settings are
    unused; ``soft_gate_weight`` is the mean ``w`` over valid tokens.
    """
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(
            f"sapo needs tau_pos > 0 and tau_neg > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}"
        )
    ratio = torch.exp(_clamped_log_ratio(log_prob, old_log_prob))
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0))
    per_token = -advantages * (4.0 / tau) * gate
    loss = _aggregate(per_token, response_mask, loss_agg_mode, rollout_is_weights, kwargs)
    weight = (4.0 * gate * (1.0 - gate) * ratio).detach()
    metrics = {
        "clipfrac": 0.0,
        "clipfrac_lower": 0.0,
        "approx_kl": _approx_kl(log_prob, old_log_prob, response_mask),
        "soft_gate_weight": masked_mean(weight, response_mask),
    }
    return loss, metrics


def compute_policy_loss_gmpo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    loss_agg_mode: str = "seq-mean-token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """GMPO (Zhao et al. 2025, Geometric-Mean Policy Optimization): one ratio per sequence,
    the geometric mean of its token ratios, each clipped in log space.

    With ``l_t = log_prob_t - old_log_prob_t`` and ``A_i`` the mean advantage over the
    sequence's valid tokens, each token's log-ratio is clipped pessimistically for the sign
    of ``A_i`` (PPO's ``min`` taken in log space)::

        l'_t = sgn(A_i) * min(sgn(A_i) * l_t, sgn(A_i) * clip(l_t, -clip_ratio_low, clip_ratio_high))
        L_i  = -A_i * exp(mean over valid t of l'_t)

    A clipped token gets no gradient; the others get ``-A_i exp(mean l') / |y_i|`` each, so
    one outlier token can move the sequence's ratio by at most its ``1/|y_i|`` share. ``L_i``
    is placed on every valid token of its sequence and aggregated; with
    ``seq-mean-token-mean`` (the paper's ``1/G sum_i``, this entry's
    ``default_loss_agg_mode``) the loss is the mean of ``L_i`` over non-empty sequences. The
    paper's clip range is ``(e^-0.4, e^0.4)``, i.e. ``clip_ratio_low = clip_ratio_high = 0.4``
    here. ``rollout_is_weights`` enter as their geometric mean per sequence. ``clipfrac`` is
    the fraction of valid tokens whose clipped log-ratio was taken.
    """
    mask = response_mask.to(log_prob.dtype)
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    seq_adv = masked_mean(advantages, mask, dim=-1)
    sign = torch.where(seq_adv < 0, -1.0, 1.0).to(log_ratio.dtype).unsqueeze(-1)
    clipped_log_ratio = torch.clamp(log_ratio, -clip_ratio_low, clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped_log_ratio)
    seq_ratio = torch.exp(masked_mean(pessimistic, mask, dim=-1))
    seq_loss = -seq_adv * seq_ratio
    if rollout_is_weights is not None:
        log_w = torch.log(rollout_is_weights.detach().clamp(min=1e-30))
        seq_loss = seq_loss * torch.exp(masked_mean(log_w, mask, dim=-1))
    per_token = seq_loss.unsqueeze(-1).expand_as(log_ratio)
    loss = _aggregate(per_token, mask, loss_agg_mode, None, kwargs)
    took_clip = (pessimistic != log_ratio) & (mask > 0)
    metrics = {
        "clipfrac": _fraction(took_clip, mask),
        "clipfrac_lower": 0.0,
        "approx_kl": _approx_kl(log_prob, old_log_prob, mask),
    }
    return loss, metrics
