"""Which optional forward passes a step runs: the old-log-prob pass.

PPO's ratio ``exp(log_prob - old_log_prob)`` is taken against the policy that sampled the
batch. When the actor takes exactly one optimizer step per batch (``ppo_epochs=1`` and one
mini-batch holds the whole batch), the update's first and only forward runs on exactly
those weights, in the same engine and precision as the separate pass would: its log-probs,
detached, *are* the old log-probs, and the ratio is 1 by construction. The separate pass
then only costs a forward over the whole batch (a fifth of a step on SmolLM2), so it is
skipped in the training loop (``RLTrainer.collect_data``, the public step-by-step API,
still returns them) and the actor worker uses the detached log-probs (``update_actor`` without
``old_log_probs``); the entropy and rollout-mismatch metrics the pass fed are computed
from the update's forward instead.

The pass stays when something reads ``old_log_probs`` before the update: the KL penalty
in the reward (``algorithm.use_kl_in_reward``) or an advantage estimator that takes them
(its function names an ``old_log_probs`` parameter, e.g. ``optimal_token_baseline``). Models with
active dropout differ between the pass (eval mode) and the update (train mode); force the
pass with ``actor_rollout_ref.actor.recompute_old_log_prob=true`` for those.
"""

from __future__ import annotations

import inspect

from verl.algorithms import ADVANTAGE_ESTIMATORS
from verl.config import TrainerConfig

_KEY = "actor_rollout_ref.actor.recompute_old_log_prob"


def old_log_prob_readers(cfg: TrainerConfig) -> list[str]:
    """What reads ``old_log_probs`` between the rollout and the update (config keys)."""
    readers = []
    if cfg.algorithm.use_kl_in_reward:
        readers.append("algorithm.use_kl_in_reward=true")
    estimator = cfg.algorithm.adv_estimator
    if estimator in ADVANTAGE_ESTIMATORS and (
        _names_parameter(ADVANTAGE_ESTIMATORS.entry(estimator).target, "old_log_probs")
        or ADVANTAGE_ESTIMATORS.needs(estimator, "needs_sum_pi_squared")
    ):
        readers.append(f"algorithm.adv_estimator={estimator} (it takes old_log_probs)")
    return readers


def _names_parameter(fn: object, name: str) -> bool:
    """Whether ``fn`` declares parameter ``name`` itself (a ``**kwargs`` catch-all that
    drops the inputs an estimator does not use does not count)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature: assume it reads everything
        return True


def multi_step_update(cfg: TrainerConfig) -> list[str]:
    """Why the actor's update takes more than one optimizer step per batch (config keys)."""
    actor = cfg.actor_rollout_ref.actor
    reasons = []
    if actor.ppo_epochs != 1:
        reasons.append(f"actor.ppo_epochs={actor.ppo_epochs}")
    if actor.ppo_mini_batch_size < cfg.data.train_batch_size:
        reasons.append(
            f"actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} < "
            f"data.train_batch_size={cfg.data.train_batch_size}"
        )
    return reasons


def old_log_prob_pass(cfg: TrainerConfig) -> bool:
    """Whether each step runs the separate old-log-prob pass (see the module docstring).

    ``recompute_old_log_prob``: ``true`` always runs it; ``null`` (auto) skips it when it is
    safe; ``false`` skips it and raises ``ValueError`` naming the settings that make
    skipping wrong.
    """
    forced = cfg.actor_rollout_ref.actor.recompute_old_log_prob
    if forced:
        return True
    blockers = old_log_prob_readers(cfg) + multi_step_update(cfg)
    if forced is False and blockers:
        raise ValueError(
            f"{_KEY}=false: the old-log-prob pass can only be skipped when the update is "
            f"one optimizer step per batch and nothing reads old_log_probs before it, but "
            f"{'; '.join(blockers)}. Set {_KEY}=null (auto) or true, or change those keys"
        )
    return bool(blockers)
