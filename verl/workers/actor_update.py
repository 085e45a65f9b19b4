"""The actor's update pass: which keys it reads, the per-micro-batch forward, the PPO loop.

Contract:

- :func:`prepare_update` checks the batch (no ``old_log_probs`` is only right for one
  optimizer step per batch) and selects the keys the bound loss reads: the sequence,
  ``advantages``, ``old_log_probs`` (or the rows' indices, when the update's own detached
  log-probs stand in for them), ``ref_log_probs`` with a KL loss, the teacher's scores with
  distillation, ``rollout_log_probs`` with a rollout correction. It raises before the
  worker counts the call.
- :func:`run_update` runs :func:`verl.workers.common.run_ppo_update` with
  :func:`micro_batch_loss`: the micro-batch's log-probs (and entropy, or the full
  distribution for a top-k distillation estimator) from the module, then the
  :class:`~verl.workers.losses.ActorLoss` bound at set-up, called with the micro-batch's
  tensors only. Returns the metrics reduced over the data-parallel ranks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from verl.kernels.torch_functional import compute_response_log_probs
from verl.protocol import DataProto
from verl.utils.memory import release_memory
from verl.workers.common import (
    own_old_log_prob_metrics,
    run_ppo_update,
    sequence_group_batch,
    sequence_parallel_size,
)
from verl.workers.losses import ActorLoss
from verl.workers.micro_batching import MicroBatch
from verl.workers.specs import ActorSpec
from verl.workers.teacher import response_log_softmax
from verl.workers.vision_inputs import check_image_batching, forward_inputs, image_keys

logger = logging.getLogger(__name__)

__all__ = ["SEQUENCE_KEYS", "UpdateBatch", "micro_batch_loss", "prepare_update", "run_update"]

SEQUENCE_KEYS = ("input_ids", "attention_mask", "position_ids", "response_mask")


@dataclass
class UpdateBatch:
    """One update call's batch: the sequence group's rows (``data``), the selected keys
    (``update``), samples per mini-batch on this rank, and, when the batch has no
    ``old_log_probs``, the list the update records its own detached log-probs in."""

    data: DataProto
    update: DataProto
    mini_batch_size: int
    recorded: list | None


def prepare_update(
    engine: Any,
    data: DataProto,
    actor: ActorSpec,
    world_size: int,
    first_call: bool,
    *,
    takes_rollout_log_prob: bool,
) -> UpdateBatch:
    """The :class:`UpdateBatch` of ``data`` (see the module docstring).
    ``takes_rollout_log_prob``: the bound policy loss weighs by the behaviour policy itself
    (:class:`verl.workers.losses.ActorLoss`), so ``rollout_log_probs`` are selected for it.

    Raises:
        ValueError: no ``old_log_probs`` while the update takes several optimizer steps.
    """
    spec = actor.loss
    # the rows of this rank's sequence group (its own rows without sequence parallelism)
    data, _ = sequence_group_batch(engine, data)
    # ppo_mini_batch_size counts prompts over all data-parallel ranks (sequence groups)
    mini_batch_size = actor.batching.mini_batch_size(
        getattr(engine, "data_parallel_size", world_size)
    )
    keys = [*SEQUENCE_KEYS, *image_keys(data), "advantages"]
    check_image_batching(data, actor.batching, sequence_parallel_size(engine))
    if spec.distill is not None and image_keys(data):
        raise ValueError(
            "algorithm.distill does not take image prompts (a vision-language model) yet"
        )
    own_old = "old_log_probs" not in data.batch
    if own_old:
        epochs = actor.batching.ppo_epochs
        if epochs != 1 or len(data) > mini_batch_size:
            raise ValueError(
                f"update_actor: the batch has no old_log_probs, which is only right for "
                f"one optimizer step per batch, but ppo_epochs={epochs} and "
                f"{len(data)} rows > a mini-batch of {mini_batch_size}; run "
                "compute_log_prob first (actor_rollout_ref.actor.recompute_old_log_prob)"
            )
    else:
        keys.append("old_log_probs")
    if spec.use_kl_loss:
        keys.append("ref_log_probs")  # select() names it if the batch lacks it
    if spec.distill is not None:  # select() names a missing one: the teacher pass did not run
        keys.append("teacher_log_probs")
        if spec.distill.needs_topk:
            keys += ["teacher_topk_log_probs", "distill_topk_ids"]
    behaviour = takes_rollout_log_prob  # decoupled_ppo
    if behaviour or spec.rollout_is_threshold is not None or spec.rollout_rs_threshold is not None:
        if "rollout_log_probs" in data.batch:
            keys.append("rollout_log_probs")
        elif first_call and not behaviour:  # without them, decoupled_ppo raises naming them
            logger.warning(
                "actor.rollout_is_threshold=%s, rollout_rs_threshold=%s but the batch has "
                "no rollout_log_probs (the rollout backend did not return them): no "
                "rollout correction",
                spec.rollout_is_threshold,
                spec.rollout_rs_threshold,
            )
    update = data.select(batch_keys=keys)
    recorded = None
    if own_old:  # the update's detached log-probs and entropies, by batch row
        update.batch["row_index"] = torch.arange(len(data))
        recorded = []
    return UpdateBatch(data, update, mini_batch_size, recorded)


def micro_batch_loss(
    loss: ActorLoss, actor: ActorSpec, temperature: float, recorded: list | None = None
) -> Callable[..., Any]:
    """``loss_fn(module, micro_batch)`` of the actor: log-probs (and entropy, when it is
    weighted) of the micro-batch, then the bound ``loss``.

    ``recorded`` (a list): the micro-batches carry no ``old_log_probs``; the detached
    log-probs stand in for them, and ``(row_index, log_probs, entropy)`` of each
    micro-batch is appended (entropy computed, detached, for the metric)."""
    spec, batching = loss.spec, actor.batching
    distill_topk = spec.distill is not None and spec.distill.needs_topk

    def loss_fn(module: torch.nn.Module, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
        b = mb.data.batch
        with_entropy = spec.entropy_coeff != 0 or recorded is not None
        student_topk = None
        if distill_topk:
            # the full distribution: the sampled tokens', the top-k ids' and the entropy
            full = response_log_softmax(
                module,
                b["input_ids"],
                b["attention_mask"],
                b["position_ids"],
                mb.response_len,
                temperature,
            )
            labels = b["input_ids"][:, -mb.response_len :, None]
            log_prob = full.gather(-1, labels)[..., 0]
            student_topk = full.gather(-1, b["distill_topk_ids"])
            entropy = -(full.exp() * full).sum(-1) if with_entropy else None
        else:
            position_ids, model_inputs = forward_inputs(mb.data)  # images: vision_inputs
            log_prob, entropy = compute_response_log_probs(
                module,
                b["input_ids"],
                b["attention_mask"],
                position_ids,
                response_len=mb.response_len,
                temperature=temperature,
                chunk_size=actor.logprob_chunk_size,
                calculate_entropy=with_entropy,
                pack=batching.pack_sequences,
                share_prefix=batching.share_prompt_prefix,
                model_inputs=model_inputs,
            )
        old_log_prob = b.get("old_log_probs")
        if recorded is not None:
            old_log_prob = log_prob.detach()
            recorded.append((b["row_index"], old_log_prob, entropy.detach()))
            if spec.entropy_coeff == 0:
                entropy = None  # computed for the metric only
        return loss(log_prob, old_log_prob, b, entropy=entropy, student_topk=student_topk)

    return loss_fn


def run_update(
    engine: Any,
    batch: UpdateBatch,
    loss: ActorLoss,
    actor: ActorSpec,
    *,
    seed: int,
    device: torch.device,
) -> dict[str, float]:
    """The PPO epochs of :func:`prepare_update`'s batch through ``engine``; the metrics
    (reduced over the data-parallel ranks: a collective)."""
    spec = loss.spec
    acc = run_ppo_update(
        engine,
        batch.update,
        micro_batch_loss(loss, actor, batch.data.meta_info.get("temperature", 1.0), batch.recorded),
        batching=actor.batching,
        mini_batch_size=batch.mini_batch_size,
        seed=seed,
        device=device,
        prefix="actor",
    )
    if spec.use_kl_loss:
        acc.add("actor/kl_coef", spec.kl_loss_coef)
    if spec.distill is not None:
        acc.add("actor/distill_coef", spec.distill.coef)
    if batch.recorded is not None:
        for key, value in own_old_log_prob_metrics(batch.data, batch.recorded).items():
            acc.add(key, value)
    release_memory()  # activations and gradients, before the next rollout
    return acc.result()
