"""The losses of the trained roles, bound once at worker set-up.

A worker turns its spec's loss settings (:class:`~verl.workers.specs.ActorLossSpec`,
:class:`~verl.workers.specs.ValueLossSpec`) into one callable when it builds its engine:
:func:`bind_actor_loss` looks the policy loss up in the registry and checks its
hyperparameters there, :func:`bind_value_loss` fixes the critic's clip and aggregation.
The update loop then calls the binding with one micro-batch's tensors only; the
computation is :func:`verl.algorithms.actor_loss` (plus :func:`verl.algorithms.distill_loss`
with on-policy distillation) and :func:`verl.algorithms.critic_loss`, the same operations in
the same order as a direct call with the settings.

Every tensor is ``(batch, response_len)`` unless stated; ``batch`` is the micro-batch's
tensor dict (``DataProto.batch``): ``advantages`` and ``response_mask`` always, and when the
update selected them ``ref_log_probs``, ``rollout_log_probs``, ``teacher_log_probs``,
``teacher_topk_log_probs`` (``(batch, response_len, k)``); for the critic ``values``,
``returns`` and ``response_mask``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from verl.algorithms.distill import distill_loss
from verl.algorithms.losses import actor_loss, critic_loss
from verl.registry import POLICY_LOSSES
from verl.workers.specs import ActorLossSpec, ValueLossSpec

logger = logging.getLogger(__name__)

__all__ = ["ActorLoss", "ValueLoss", "bind_actor_loss", "bind_value_loss"]

# The key named when the registry refuses a policy loss's hyperparameters.
POLICY_LOSS_KWARGS_KEY = "actor_rollout_ref.actor.policy_loss_kwargs"


@dataclass(frozen=True)
class _MetricsOnly:
    """A policy loss computed for its metrics only (distillation without the task reward):
    its value is detached, so no gradient flows from it."""

    fn: Callable[..., tuple[torch.Tensor, Any]]

    def __call__(self, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        pg_loss, pg_metrics = self.fn(**kwargs)
        return pg_loss.detach(), pg_metrics


@dataclass(frozen=True)
class ActorLoss:
    """The actor's loss with every setting bound: call it with one micro-batch's tensors.

    ``spec`` is what it was bound from; ``policy_loss_fn`` the registered policy loss
    (wrapped by ``_MetricsOnly`` for distillation without the task reward) and
    ``policy_loss_kwargs`` its clip settings and checked hyperparameters;
    ``takes_rollout_log_prob``: the policy loss weighs by the behaviour policy itself
    (``decoupled_ppo``), so the update selects ``rollout_log_probs`` for it
    (``verl.workers.actor_update.prepare_update``).
    """

    spec: ActorLossSpec
    policy_loss_fn: Callable[..., tuple[torch.Tensor, Any]]
    policy_loss_kwargs: Mapping[str, Any]
    takes_rollout_log_prob: bool = False

    def __call__(
        self,
        log_prob: torch.Tensor,
        old_log_prob: torch.Tensor,
        batch: Mapping[str, torch.Tensor],
        *,
        entropy: torch.Tensor | None = None,
        student_topk: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """``(loss, metrics)`` of one micro-batch.

        Args:
            log_prob: the current policy's log-probs of the sampled tokens (differentiable).
            old_log_prob: the sampling policy's (detached).
            batch: the micro-batch's tensors (see the module docstring).
            entropy: per-token entropy when ``entropy_coeff`` weighs it, else ``None``.
            student_topk: with a top-k distillation estimator, the student's log-probs at
                ``distill_topk_ids``, ``(batch, response_len, k)``.
        """
        spec = self.spec
        # forward_backward runs this under the engine's autocast; the loss terms use no op
        # autocast lowers (no matmul), so they stay float32.
        loss, metrics = actor_loss(
            log_prob,
            old_log_prob,
            batch["advantages"],
            batch["response_mask"],
            policy_loss_fn=self.policy_loss_fn,
            policy_loss_kwargs=self.policy_loss_kwargs,
            loss_agg_mode=spec.loss_agg_mode,
            loss_scale_factor=spec.loss_scale_factor,
            entropy=entropy,
            entropy_coeff=spec.entropy_coeff,
            ref_log_prob=batch.get("ref_log_probs"),
            kl_loss_coef=spec.kl_loss_coef,
            kl_loss_type=spec.kl_loss_type,
            rollout_log_prob=batch.get("rollout_log_probs"),
            rollout_is_threshold=spec.rollout_is_threshold,
            rollout_is_level=spec.rollout_is_level,
            rollout_rs_threshold=spec.rollout_rs_threshold,
            policy_takes_rollout_log_prob=self.takes_rollout_log_prob,
        )
        distill = spec.distill
        if distill is not None:
            if not distill.mix_task_reward:  # the (detached) policy loss leaves the value
                loss = loss - metrics["pg_loss"]
            kl, kl_metrics = distill_loss(
                log_prob.float(),
                batch["teacher_log_probs"],
                batch["response_mask"],
                estimator=distill.estimator,
                loss_agg_mode=spec.loss_agg_mode,
                loss_scale_factor=spec.loss_scale_factor,
                student_topk_log_probs=student_topk,
                teacher_topk_log_probs=batch.get("teacher_topk_log_probs"),
                topk_tail=distill.topk_tail,
            )
            loss = loss + distill.coef * kl
            metrics |= kl_metrics
        return loss, metrics


def bind_actor_loss(spec: ActorLossSpec) -> ActorLoss:
    """The actor's loss of ``spec``: the registered ``policy_loss`` with its clip settings
    and ``policy_loss_kwargs`` (checked against the loss's registry entry, which raises
    naming ``actor_rollout_ref.actor.policy_loss_kwargs``)."""
    entry = POLICY_LOSSES.entry(spec.policy_loss)
    kwargs = entry.call_kwargs(
        {
            "clip_ratio_low": spec.clip_ratio_low,
            "clip_ratio_high": spec.clip_ratio_high,
            "clip_ratio_c": spec.clip_ratio_c,
        },
        spec.policy_loss_kwargs,
        POLICY_LOSS_KWARGS_KEY,
    )
    fn = entry.target
    if spec.distill is not None and not spec.distill.mix_task_reward:
        fn = _MetricsOnly(fn)  # distillation alone: the policy loss for its metrics only
    takes = bool(entry.info.get("needs_rollout_log_prob", False))
    if takes and spec.rollout_is_threshold is not None:
        logger.info(
            "actor.policy_loss=%s weighs each token by its own truncated behaviour weight; "
            "actor.rollout_is_threshold=%s is not applied on top of it",
            spec.policy_loss,
            spec.rollout_is_threshold,
        )
    return ActorLoss(spec, fn, kwargs, takes)


@dataclass(frozen=True)
class ValueLoss:
    """The critic's clipped value loss with every setting bound."""

    spec: ValueLossSpec

    def __call__(
        self, vpreds: torch.Tensor, batch: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """``(loss, metrics)`` of one micro-batch: ``vpreds`` (differentiable) regressed
        onto ``batch["returns"]``, clipped around ``batch["values"]``."""
        spec = self.spec
        return critic_loss(
            vpreds,
            batch["values"],
            batch["returns"],
            batch["response_mask"],
            cliprange_value=spec.cliprange_value,
            loss_agg_mode=spec.loss_agg_mode,
            loss_coef=spec.loss_coef,
            loss_scale_factor=spec.loss_scale_factor,
        )


def bind_value_loss(spec: ValueLossSpec) -> ValueLoss:
    """The critic's loss of ``spec``."""
    return ValueLoss(spec)
