"""The actor's and the critic's training losses for one micro-batch, as pure functions.

:func:`actor_loss` composes the policy-gradient loss (any registered policy loss, called
with its keyword arguments), the truncated rollout importance weights, the entropy bonus
and the KL loss to the reference; :func:`critic_loss` is the clipped value loss times its
coefficient. Both take tensors of one micro-batch and return ``(loss, metrics)``: ``loss``
a differentiable 0-dim tensor, ``metrics`` a dict of detached 0-dim tensors. Nothing here
reads a value back to the host (no ``.item()``), so a micro-batch loop can collect the
metrics of a whole mini-batch and read them with one transfer
(``verl.engine.base.TrainEngine.forward_backward``).

Each term is aggregated over the micro-batch with ``loss_agg_mode``; the caller weights the
micro-batch's loss by its share of the mini-batch (``verl.workers.common.micro_batch_weights``)
so that the accumulated gradient is the gradient of the mini-batch loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from verl.algorithms.core import masked_mean
from verl.algorithms.kl import kl_penalty
from verl.algorithms.loss_agg import agg_loss
from verl.algorithms.rollout_correction import compute_rollout_is_weights
from verl.algorithms.value_loss import compute_value_loss

__all__ = ["actor_loss", "critic_loss"]

# Arguments actor_loss passes to the policy loss itself; policy_loss_kwargs may not set them.
_POLICY_LOSS_INPUTS = frozenset(
    {
        "old_log_prob",
        "log_prob",
        "advantages",
        "response_mask",
        "loss_agg_mode",
        "loss_scale_factor",
        "rollout_is_weights",
        "rollout_log_prob",
    }
)


def actor_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    policy_loss_fn: Callable[..., tuple[torch.Tensor, Mapping[str, Any]]],
    policy_loss_kwargs: Mapping[str, Any] | None = None,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coeff: float = 0.0,
    ref_log_prob: torch.Tensor | None = None,
    kl_loss_coef: float = 0.0,
    kl_loss_type: str = "low_var_kl",
    rollout_log_prob: torch.Tensor | None = None,
    rollout_is_threshold: float | None = None,
    rollout_is_level: str = "token",
    rollout_rs_threshold: float | None = None,
    policy_takes_rollout_log_prob: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The actor's loss on one micro-batch::

        loss = pg_loss - entropy_coeff * agg(entropy) + kl_loss_coef * agg(kl(log_prob, ref))

    Args:
        log_prob: log-probs of the sampled tokens under the current policy,
            ``(batch, response_len)``, differentiable.
        old_log_prob: the same under the policy that the ratio is taken against (the
            trainer's recomputation at rollout time), ``(batch, response_len)``.
        advantages: ``(batch, response_len)``.
        response_mask: 1 on valid response tokens, ``(batch, response_len)``.
        policy_loss_fn: a registered policy loss (``verl.algorithms.get_policy_loss``),
            called as ``policy_loss_fn(old_log_prob=, log_prob=, advantages=,
            response_mask=, loss_agg_mode=, loss_scale_factor=, rollout_is_weights=,
            **policy_loss_kwargs)``.
        policy_loss_kwargs: the loss's own hyperparameters (clip ratios, Clip-Cov ratios...).
        loss_agg_mode / loss_scale_factor: how every term is reduced to a scalar
            (:func:`verl.algorithms.agg_loss`).
        entropy: per-token entropy of the current policy, ``(batch, response_len)``; the
            entropy bonus is applied when given (``None``: no entropy term, no metric).
        entropy_coeff: weight of the entropy bonus.
        ref_log_prob: log-probs under the reference policy, ``(batch, response_len)``; the
            KL loss is added when given.
        kl_loss_coef / kl_loss_type: weight and estimator (``verl.algorithms.kl_penalty``)
            of the KL loss.
        rollout_log_prob: log-probs the rollout engine sampled with,
            ``(batch, response_len)``; when given, each token's policy loss is weighted by
            the rollout-correction weights of
            :func:`verl.algorithms.compute_rollout_is_weights`.
        rollout_is_threshold / rollout_is_level: the truncation ``C`` of the token-level
            (``min(exp(old_log_prob - rollout_log_prob), C)``) or sequence-level IS weights;
            None = no reweighting.
        rollout_rs_threshold: reject (weight 0) sequences whose geometric-mean ratio leaves
            ``[1 / C_rs, C_rs]``; None = no rejection. With ``rollout_log_prob`` one of the
            two thresholds is required, unless the policy loss takes it itself.
        policy_takes_rollout_log_prob: the policy loss corrects for the behaviour policy
            itself (its registry entry's ``needs_rollout_log_prob``: ``decoupled_ppo``): it
            gets ``rollout_log_prob=``, and of the rollout correction only the rejection
            (``rollout_rs_threshold``) applies; ``rollout_is_threshold`` would weight each
            token by the same ratio a second time.

    Returns:
        ``(loss, metrics)``: the 0-dim loss and detached 0-dim tensors ``pg_loss``, the
        policy loss's own metrics (``clipfrac``, ``clipfrac_lower``, ``approx_kl``, ...),
        ``entropy_loss`` (with ``entropy``), ``kl_loss`` (with ``ref_log_prob``),
        ``rollout_is_weight_mean``, ``rollout_is_clipfrac``, ``rollout_is_ess`` and with
        rejection ``rollout_rs_reject_frac`` (with ``rollout_log_prob``).
    """
    kwargs = dict(policy_loss_kwargs or {})
    clash = sorted(_POLICY_LOSS_INPUTS & kwargs.keys())
    if clash:
        raise ValueError(
            f"policy_loss_kwargs sets {clash}, which actor_loss passes itself; "
            "give them as actor_loss arguments instead"
        )
    log_prob = log_prob.float()
    metrics: dict[str, torch.Tensor] = {}
    is_weights = None
    if policy_takes_rollout_log_prob:
        kwargs["rollout_log_prob"] = rollout_log_prob
        rollout_is_threshold = None  # the loss's own truncated weight is that correction
        if rollout_rs_threshold is None:
            rollout_log_prob = None  # nothing left for the rollout correction to do
    if rollout_log_prob is not None:
        if rollout_is_threshold is None and rollout_rs_threshold is None:
            raise ValueError(
                "rollout_log_prob was given without rollout_is_threshold or rollout_rs_threshold"
            )
        # The rollout sampled with slightly different numerics than the old policy the
        # ratio is taken against: reweight (truncated IS) and/or reject drifted sequences.
        is_weights, is_metrics = compute_rollout_is_weights(
            old_log_prob,
            rollout_log_prob,
            response_mask,
            rollout_is_threshold,
            level=rollout_is_level,
            rs_threshold=rollout_rs_threshold,
        )
        metrics.update(is_metrics)
    pg_loss, pg_metrics = policy_loss_fn(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        loss_scale_factor=loss_scale_factor,
        rollout_is_weights=is_weights,
        **kwargs,
    )
    metrics["pg_loss"] = pg_loss
    metrics.update(pg_metrics)
    loss = pg_loss
    if entropy is not None:
        entropy_loss = agg_loss(entropy.float(), response_mask, loss_agg_mode, loss_scale_factor)
        loss = loss - entropy_coeff * entropy_loss
        metrics["entropy_loss"] = entropy_loss
    if ref_log_prob is not None:
        kld = kl_penalty(log_prob, ref_log_prob, kl_loss_type)
        kl_loss = agg_loss(kld, response_mask, loss_agg_mode, loss_scale_factor)
        loss = loss + kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss
    return loss, _detached(metrics, like=pg_loss)


def critic_loss(
    vpreds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    cliprange_value: float | None,
    loss_agg_mode: str = "token-mean",
    loss_coef: float = 1.0,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The critic's loss on one micro-batch: ``loss_coef *`` the clipped value loss.

    Args:
        vpreds: current value predictions, ``(batch, response_len)``, differentiable.
        values: the values recorded at rollout time, ``(batch, response_len)``.
        returns: regression targets, ``(batch, response_len)``.
        response_mask: ``(batch, response_len)``.
        cliprange_value: how far a prediction may move from ``values`` before its loss is
            clipped (``None``: no clipping); see :func:`verl.algorithms.compute_value_loss`.
        loss_agg_mode: aggregation of the per-token loss.
        loss_coef: multiplier of the value loss.
        loss_scale_factor: the constant of ``seq-mean-token-sum-norm`` (``None``: this
            micro-batch's response width, which makes the loss depend on the split).

    Returns:
        ``(loss, metrics)``: the 0-dim loss and detached 0-dim tensors ``vf_loss`` (before
        ``loss_coef``), ``vf_clipfrac`` and ``vpred_mean`` (mean prediction over valid
        tokens).
    """
    vf_loss, vf_clipfrac = compute_value_loss(
        vpreds=vpreds,
        returns=returns,
        values=values,
        response_mask=response_mask,
        cliprange_value=cliprange_value,
        loss_agg_mode=loss_agg_mode,
        loss_scale_factor=loss_scale_factor,
    )
    metrics = {
        "vf_loss": vf_loss,
        "vf_clipfrac": vf_clipfrac,
        "vpred_mean": masked_mean(vpreds.detach(), response_mask),
    }
    return vf_loss * loss_coef, _detached(metrics, like=vf_loss)


def _detached(metrics: Mapping[str, Any], like: torch.Tensor) -> dict[str, torch.Tensor]:
    """Metrics as detached 0-dim tensors; a policy loss may still report Python floats."""
    return {
        key: value.detach() if isinstance(value, torch.Tensor) else like.new_tensor(float(value))
        for key, value in metrics.items()
    }
