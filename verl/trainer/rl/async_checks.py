"""Config checks of one-step-off asynchronous training (``trainer.async_rollout``): what the
asynchronous pipeline supports today, each refusal naming the key and the way out.

Two settings are resolved rather than refused (:func:`resolve_async_rollout`, each with a
log line; tutorial 001 section 7.3 writes ``async_rollout: true`` and
``rollout_batch_size: 64`` and nothing else):

- the rollout correction the stale samples need: with neither
  ``actor_rollout_ref.actor.rollout_is_threshold`` nor ``rollout_rs_threshold`` set,
  ``rollout_is_threshold`` becomes :data:`DEFAULT_IS_THRESHOLD` (truncated importance
  sampling against the rollout's log-probs, ``docs/algorithms/rollout_is.md``);
- ``data.rollout_batch_size`` larger than ``data.train_batch_size`` (a multiple of it): the
  prompts the pipeline keeps generating ahead of training, ``rollout_batch_size /
  train_batch_size`` training batches, so ``trainer.max_staleness`` becomes at least that.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["DEFAULT_IS_THRESHOLD", "check_async_rollout", "resolve_async_rollout"]

logger = logging.getLogger(__name__)

DEFAULT_IS_THRESHOLD = 2.0  # the truncation C of docs/algorithms/rollout_is.md's example


def resolve_async_rollout(cfg: Any) -> None:
    """In place, with one log line each: the rollout correction and the pipeline depth that
    ``trainer.async_rollout=true`` needs and the config leaves unsaid (module docstring).
    Nothing when ``trainer.async_rollout`` is off; idempotent."""
    t, d = cfg.trainer, cfg.data
    if t.async_rollout is not True:
        return
    actor = cfg.actor_rollout_ref.actor
    fresh = t.rollout_mode == "streaming" and t.max_staleness == 0  # never an older policy
    if actor.rollout_is_threshold is None and actor.rollout_rs_threshold is None and not fresh:
        actor.rollout_is_threshold = DEFAULT_IS_THRESHOLD
        logger.warning(
            "trainer.async_rollout=true trains on samples of an older policy: rollout "
            "correction switched on, actor_rollout_ref.actor.rollout_is_threshold=%s "
            "(truncated importance sampling against the rollout's log-probs, "
            "docs/algorithms/rollout_is.md); set it, or rollout_rs_threshold, to choose",
            DEFAULT_IS_THRESHOLD,
        )
    size, train = d.rollout_batch_size, d.train_batch_size
    if not isinstance(size, int) or not isinstance(train, int) or train < 1:
        return
    if size > train and size % train == 0 and t.max_staleness < size // train:
        logger.warning(
            "data.rollout_batch_size=%d with data.train_batch_size=%d and "
            "trainer.async_rollout=true: the pipeline keeps %d prompts (%d training batches) "
            "generating ahead of training, so trainer.max_staleness=%d (was %d): a sample "
            "trains up to %d actor updates after it was drawn, corrected by the rollout "
            "correction",
            size,
            train,
            size,
            size // train,
            size // train,
            t.max_staleness,
            size // train,
        )
        t.max_staleness = size // train


def check_async_rollout(c: Any, cfg: Any) -> None:
    """Errors on ``c`` (a :class:`verl.trainer.config_checks.Checks`) for settings the
    asynchronous pipeline does not support; nothing when ``trainer.async_rollout`` is off."""
    resolve_async_rollout(cfg)
    t, d = cfg.trainer, cfg.data
    size, train = d.rollout_batch_size, d.train_batch_size
    if size is not None and size != train and not (t.async_rollout and size % train == 0):
        why = (
            f"with trainer.async_rollout=true it is the prompts generated ahead of training, "
            f"a multiple of data.train_batch_size={train}"
            if t.async_rollout
            else "without trainer.async_rollout a generation batch is one training batch"
        )
        c.error(
            ("data.rollout_batch_size", "data.train_batch_size"),
            f"data.rollout_batch_size={size}: {why}; set it to a multiple of {train} with "
            "trainer.async_rollout=true, or leave it null",
        )
    _check_partial_rollout(c, cfg)
    _check_rollout_copies(c, cfg)
    if not t.async_rollout:
        return
    key = "trainer.async_rollout"
    if t.rollout_mode == "one_step_off" and t.max_staleness < 1:
        c.error(
            ("trainer.max_staleness", key),
            f"trainer.max_staleness={t.max_staleness}: one-step-off training generates at "
            "least one batch ahead (>= 1); trainer.rollout_mode=streaming takes 0 "
            "(synchronous samples through the streaming buffer)",
        )
    try:
        backend, dp = cfg.worker_backend, cfg.dp_size("actor_rollout_ref")
    except Exception:  # a bad device map is reported by its own check
        return
    if backend == "local" and dp != 1:
        c.error(
            (key, "trainer.backend"),
            f"{key}=true on the local backend takes one actor rank (this run has {dp}); "
            "use trainer.backend=ray for several",
        )
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.multi_turn.enable and t.rollout_mode != "streaming":
        c.error(
            (key, "actor_rollout_ref.rollout.multi_turn.enable"),
            f"{key}=true: multi-turn rollouts are supported by trainer.rollout_mode=streaming "
            "(each trajectory generated by one policy version), not by one_step_off",
        )
    if d.rollout_files:
        c.error(
            (key, "data.rollout_files"),
            f"{key}=true: data.rollout_files trains from stored rollouts, which generates "
            "nothing to overlap; disable one of them",
        )
    streaming = t.rollout_mode == "streaming"  # takes groups: filters them, scores ReMax
    if cfg.algorithm.filter_groups.enable and not streaming:
        c.error(
            (key, "algorithm.filter_groups.enable"),
            f"{key}=true: dynamic sampling draws a varying number of generation batches per "
            "step, which the fixed one-step-off pipeline does not; use "
            "trainer.rollout_mode=streaming (filters the groups as it takes them), or "
            "disable one of them",
        )
    if cfg.estimator_needs("needs_baseline") and not streaming:
        c.error(
            (key, "algorithm.adv_estimator"),
            f"{key}=true: algorithm.adv_estimator={cfg.algorithm.adv_estimator} generates a "
            "greedy baseline with the current policy each step; not supported by the "
            "one-step-off pipeline: use trainer.rollout_mode=streaming",
        )


def _check_partial_rollout(c: Any, cfg: Any) -> None:
    """``trainer.partial_rollout``: the streaming pipeline, the native engine's continuous
    loop or the rollout copy's vLLM engine (stepped by hand: weights pushed between two
    engine steps, ``verl.rollout.vllm_partial``; without LoRA, whose adapters only the
    push between calls folds in). A copy in the driver process shares the trainer's mailbox;
    a copy in a Ray actor owns one in its own process, posted into beside its running call
    (``verl.trainer.rl.ray_copy_link``). The multi-turn agent loop (``verl.rollout.agent_turns``) and agent
    programs (the endpoint's records, ``verl.rollout.agent_trajectory``) keep each token's
    version."""
    t, rollout = cfg.trainer, cfg.actor_rollout_ref.rollout
    mode = t.partial_rollout
    if mode == "off":
        return
    key = "trainer.partial_rollout"
    if not t.async_rollout or t.rollout_mode != "streaming":
        c.error(
            (key, "trainer.rollout_mode"),
            f"{key}={mode} loads new weights into a running generation of the streaming "
            "rollout: set trainer.async_rollout=true trainer.rollout_mode=streaming, or "
            f"{key}=off",
        )
    lora_rank = cfg.actor_rollout_ref.model.lora_rank
    if rollout.name == "vllm" and lora_rank:
        c.error(
            (key, "actor_rollout_ref.model.lora_rank"),
            f"{key}={mode} with rollout.name=vllm pushes the copy's module into the engine "
            "between two engine steps as it is, while LoRA adapters are folded in by the "
            f"push between calls only (actor_rollout_ref.model.lora_rank={lora_rank}); use "
            f"rollout.name=native or set {key}=off",
        )
    elif rollout.name != "vllm" and (
        rollout.name != "native" or not rollout.continuous_batching or rollout.compile_decode
    ):
        c.error(
            (key, "actor_rollout_ref.rollout.name"),
            f"{key}={mode} needs the native engine's continuous loop (rollout.name=native, "
            "continuous_batching=true, compile_decode=false) or the vLLM engine "
            f"(rollout.name=vllm); this run has name={rollout.name}, continuous_batching="
            f"{rollout.continuous_batching}, compile_decode={rollout.compile_decode}; change "
            f"them or set {key}=off",
        )


def _check_rollout_copies(c: Any, cfg: Any) -> None:
    """``trainer.rollout_copies`` > 1: a pool of rollout copies, one Ray actor each, each
    generation batch's prompts split across them (``verl.trainer.rl.ray_copy_link``).
    Refused where the pool cannot be: without the asynchronous pipeline, on the local backend
    (one process), with a batch that does not split into whole, equal shares of prompts, with
    the vLLM or SGLang engine (the copies would share one engine in lock step, not one
    engine each). Partial rollouts are taken: each copy owns its mailbox, every post goes
    to every copy and each swaps at its own decode step, its tokens recording the version
    that sampled them; the driver mirrors the oldest version held and the summed counters."""
    t, rollout = cfg.trainer, cfg.actor_rollout_ref.rollout
    k = t.rollout_copies
    if not isinstance(k, int) or k <= 1:  # below 1: the key's own range check reports it
        return
    key = "trainer.rollout_copies"
    if not t.async_rollout:
        c.error(
            (key, "trainer.async_rollout"),
            f"{key}={k} splits the generation of the asynchronous rollout: set "
            f"trainer.async_rollout=true, or {key}=1",
        )
        return
    try:
        backend = cfg.worker_backend
    except Exception:  # a bad device map is reported by its own check
        return
    if backend != "ray":
        c.error(
            (key, "trainer.backend"),
            f"{key}={k} starts one process per copy; the {backend} backend runs one process: "
            f"set trainer.backend=ray, or {key}=1",
        )
    size = cfg.data.train_batch_size
    if isinstance(size, int) and size % k:
        c.error(
            (key, "data.train_batch_size"),
            f"{key}={k}: each copy generates an equal share of whole prompts (a GRPO group "
            f"never straddles two copies), so it must divide data.train_batch_size={size}",
        )
    if rollout.name in ("vllm", "sglang"):
        c.error(
            (key, "actor_rollout_ref.rollout.name"),
            f"{key}={k} with rollout.name={rollout.name} would serve every copy from one "
            f"{rollout.name} engine in lock step (the several-rank serving-engine path), not "
            f"one engine per copy; use rollout.name=native, or {key}=1",
        )
