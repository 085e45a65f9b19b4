"""Pure tensor functions of RL post-training: advantages, losses, KL, aggregation.

No models, no I/O, no distributed calls: everything here maps tensors of shape
``(batch, response_len)`` (plus prompt ids) to tensors, and is unit-tested against
hand-computed values. Each extension point is a registry of :mod:`verl.registry` (the
built-ins are declared in ``verl/registry/builtin.py`` with what they need), so the trainer
picks an algorithm from the config by name and a new algorithm is one decorated function:

- advantage estimators (:mod:`.advantages`): ``gae``, ``grpo``, ``rloo``,
  ``reinforce_plus_plus``, ``reinforce_plus_plus_baseline``, ``remax``, ``opo``, ``gpg``,
  ``grpo_passk``; (:mod:`.token_baseline`) ``optimal_token_baseline``;
- policy losses (:mod:`.policy_loss`): ``vanilla`` (PPO, dual clip), ``gspo``, ``cispo``,
  ``reinforce``, ``gpg``, ``sapo``, ``gmpo``; (:mod:`.cov_losses`) ``clip_cov``, ``kl_cov``;
  and (:mod:`.decoupled_ppo`) ``decoupled_ppo``, the proximal policy apart from the behaviour one;
- the clipped value loss (:mod:`.value_loss`);
- the actor's and critic's whole micro-batch losses, ``actor_loss`` / ``critic_loss``
  (:mod:`.losses`): policy loss + IS weights + entropy + KL, and the weighted value loss;
- KL estimators ``k1``/``k2``/``k3``/``abs`` and KL controllers (:mod:`.kl`);
- on-policy distillation's reverse KL to a teacher, ``k1``/``k3``/``topk`` (:mod:`.distill`);
- loss aggregation modes and the entropy loss (:mod:`.loss_agg`);
- masked statistics and entropy from logits (:mod:`.core`);
- reward shaping (:mod:`.reward_shaping`): DAPO's overlong penalty;
- truncated importance weights for the rollout/trainer mismatch (:mod:`.rollout_correction`);
- offline preference losses (:mod:`.preference`): ``dpo``, ``ipo``, ``kto``.
"""

from verl.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_gae_advantages,
    compute_gpg_advantages,
    compute_grpo_advantages,
    compute_grpo_passk_advantages,
    compute_opo_advantages,
    compute_reinforce_plus_plus_advantages,
    compute_reinforce_plus_plus_baseline_advantages,
    compute_remax_advantages,
    compute_rloo_advantages,
    estimator_info,
    estimator_requires_critic,
    get_advantage_estimator,
    group_ids_from_index,
    informative_group_mask,
    register_advantage_estimator,
)
from verl.algorithms.core import (
    entropy_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from verl.algorithms.cov_losses import (
    compute_policy_loss_clip_cov,
    compute_policy_loss_kl_cov,
)
from verl.algorithms.distill import (
    DISTILL_ESTIMATORS,
    distill_loss,
    sampled_token_reverse_kl,
    topk_reverse_kl,
)
from verl.algorithms.kl import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_kl_loss,
    get_kl_controller,
    kl_penalty,
)
from verl.algorithms.loss_agg import (
    LOSS_AGG_MODES,
    agg_loss,
    apply_entropy_bonus,
    compute_entropy_loss,
)
from verl.algorithms.losses import actor_loss, critic_loss
from verl.algorithms.policy_loss import (
    POLICY_LOSSES,
    compute_policy_loss_cispo,
    compute_policy_loss_gmpo,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_reinforce,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    get_policy_loss,
    register_policy_loss,
)
from verl.algorithms.preference import (
    PREFERENCE_LOSSES,
    PreferenceLoss,
    compute_dpo_loss,
    compute_ipo_loss,
    compute_kto_loss,
    get_preference_loss,
    is_paired_loss,
    kto_reference_point,
    preference_metrics,
    register_preference_loss,
    sequence_log_probs,
)
from verl.algorithms.registry import Registry, UnknownNameError
from verl.algorithms.reward_shaping import overlong_penalty
from verl.algorithms.rollout_correction import compute_rollout_is_weights
from verl.algorithms.value_loss import compute_value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "DISTILL_ESTIMATORS",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "PREFERENCE_LOSSES",
    "AdaptiveKLController",
    "FixedKLController",
    "PreferenceLoss",
    "Registry",
    "UnknownNameError",
    "actor_loss",
    "agg_loss",
    "apply_entropy_bonus",
    "apply_kl_penalty",
    "compute_dpo_loss",
    "compute_entropy_loss",
    "compute_gae_advantages",
    "compute_gpg_advantages",
    "compute_grpo_advantages",
    "compute_grpo_passk_advantages",
    "compute_ipo_loss",
    "compute_kl_loss",
    "compute_kto_loss",
    "compute_opo_advantages",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_gmpo",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_advantages",
    "compute_reinforce_plus_plus_baseline_advantages",
    "compute_remax_advantages",
    "compute_rloo_advantages",
    "compute_rollout_is_weights",
    "compute_value_loss",
    "critic_loss",
    "distill_loss",
    "entropy_from_logits",
    "estimator_info",
    "estimator_requires_critic",
    "get_advantage_estimator",
    "get_kl_controller",
    "get_policy_loss",
    "get_preference_loss",
    "group_ids_from_index",
    "informative_group_mask",
    "is_paired_loss",
    "kl_penalty",
    "kto_reference_point",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_penalty",
    "preference_metrics",
    "register_advantage_estimator",
    "register_policy_loss",
    "register_preference_loss",
    "sampled_token_reverse_kl",
    "sequence_log_probs",
    "topk_reverse_kl",
]
