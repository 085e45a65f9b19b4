"""Config checks of one-step-off asynchronous training (``trainer.async_rollout``): what the
asynchronous pipeline supports today, each refusal naming the key and the way out.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_async_rollout"]

_BACKENDS = ("native", "hf")


def check_async_rollout(c: Any, cfg: Any) -> None:
    """Errors on ``c`` (a :class:`verl.config.validate.Checks`) for settings the
    asynchronous pipeline does not support; nothing when ``trainer.async_rollout`` is off."""
    t, d = cfg.trainer, cfg.data
    if d.rollout_batch_size is not None and d.rollout_batch_size != d.train_batch_size:
        c.error(
            ("data.rollout_batch_size", "data.train_batch_size"),
            f"data.rollout_batch_size={d.rollout_batch_size}: a generation batch is one "
            f"training batch here; set it to data.train_batch_size={d.train_batch_size} or "
            "leave it null",
        )
    if not t.async_rollout:
        return
    key = "trainer.async_rollout"
    actor = cfg.actor_rollout_ref.actor
    if actor.rollout_is_threshold is None and actor.rollout_rs_threshold is None:
        c.error(
            (key, "actor_rollout_ref.actor.rollout_is_threshold"),
            f"{key}=true trains on samples of an older policy, which the loss corrects with "
            "truncated importance sampling against the rollout's log-probs: set "
            "actor_rollout_ref.actor.rollout_is_threshold (e.g. 2.0) or rollout_rs_threshold",
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
    if rollout.name not in _BACKENDS:
        c.error(
            (key, "actor_rollout_ref.rollout.name"),
            f"{key}=true: rollout.name={rollout.name} is not supported with it yet (the "
            f"rollout copy is built for {', '.join(_BACKENDS)}); use one of them",
        )
    if rollout.multi_turn.enable:
        c.error(
            (key, "actor_rollout_ref.rollout.multi_turn.enable"),
            f"{key}=true: multi-turn rollouts are not supported with it yet",
        )
    if d.rollout_files:
        c.error(
            (key, "data.rollout_files"),
            f"{key}=true: data.rollout_files trains from stored rollouts, which generates "
            "nothing to overlap; disable one of them",
        )
    if cfg.algorithm.filter_groups.enable:
        c.error(
            (key, "algorithm.filter_groups.enable"),
            f"{key}=true: dynamic sampling draws a varying number of generation batches per "
            "step, which the fixed pipeline does not; disable one of them",
        )
    if cfg.estimator_needs("needs_baseline"):
        c.error(
            (key, "algorithm.adv_estimator"),
            f"{key}=true: algorithm.adv_estimator={cfg.algorithm.adv_estimator} generates a "
            "greedy baseline with the current policy each step; not supported with it",
        )
