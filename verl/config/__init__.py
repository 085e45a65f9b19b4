"""The typed config of verl: schema (dataclasses), loading, overrides and validation.

    from verl.config import load_config, TrainerConfig
    cfg = load_config("my.yaml", ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4"])
    cfg = TrainerConfig(); cfg.actor_rollout_ref.rollout.n = 4; cfg.validate()

The dataclasses hold every default; ``verl/trainer/config/ppo_trainer.yaml`` is generated
from them. This package imports nothing from the rest of verl (and never torch).
See ``docs/config.md``.
"""

from verl.config._fields import EMBEDDED_MODEL
from verl.config.convert import from_dict, to_dict
from verl.config.derived import (
    checkpoint_dir,
    clip_ratio_bounds,
    critic_enabled,
    critic_model_path,
    log_dir,
    ref_enabled,
    rollout_seed,
    tokenizer_path,
    world_size,
)
from verl.config.errors import ConfigError, ConfigProblem
from verl.config.loader import apply_override, load_config
from verl.config.render import to_yaml
from verl.config.schema import (
    ActorConfig,
    ActorRolloutRefConfig,
    AlgorithmConfig,
    ArithmeticConfig,
    CheckpointConfig,
    CriticConfig,
    CriticModelConfig,
    CustomRewardFunctionConfig,
    DataConfig,
    FSDPConfig,
    KLControlConfig,
    MixedPrecisionConfig,
    ModelConfig,
    OptimConfig,
    OverlongBufferConfig,
    RefConfig,
    RefFSDPConfig,
    RewardModelConfig,
    RewardModelModelConfig,
    RolloutConfig,
    RunConfig,
    TrainerConfig,
    ValKwargsConfig,
)
from verl.config.validate import validate

__all__ = [
    "EMBEDDED_MODEL",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "ArithmeticConfig",
    "CheckpointConfig",
    "ConfigError",
    "ConfigProblem",
    "CriticConfig",
    "CriticModelConfig",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "FSDPConfig",
    "KLControlConfig",
    "MixedPrecisionConfig",
    "ModelConfig",
    "OptimConfig",
    "OverlongBufferConfig",
    "RefConfig",
    "RefFSDPConfig",
    "RewardModelConfig",
    "RewardModelModelConfig",
    "RolloutConfig",
    "RunConfig",
    "TrainerConfig",
    "ValKwargsConfig",
    "apply_override",
    "checkpoint_dir",
    "clip_ratio_bounds",
    "critic_enabled",
    "critic_model_path",
    "from_dict",
    "load_config",
    "log_dir",
    "ref_enabled",
    "rollout_seed",
    "to_dict",
    "to_yaml",
    "tokenizer_path",
    "validate",
    "world_size",
]
