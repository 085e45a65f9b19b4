"""The typed config of verl: schema (dataclasses), loading, overrides and validation.

    from verl.config import load_config, TrainerConfig
    cfg = load_config("my.yaml", ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4"])
    cfg = TrainerConfig(); cfg.actor_rollout_ref.rollout.n = 4; cfg.validate()

The dataclasses hold every default; ``verl/trainer/config/ppo_trainer.yaml`` is generated
from them. The offline trainers' configs (``SFTConfig``, ``DPOConfig``, loaded with
``load_sft_config`` / ``load_dpo_config``) live in ``schema_offline.py``. This package
imports nothing from the rest of verl (and never torch).
See ``docs/config.md``.
"""

from verl.config._fields import EMBEDDED_MODEL
from verl.config.device_map import (
    DataParallelConfig,
    DeviceMap,
    DeviceMapError,
    resolve_device_map,
    set_device_map,
)
from verl.config.errors import ConfigError, ConfigProblem
from verl.config.gen import to_yaml
from verl.config.loader import apply_override, from_dict, load_config, to_dict
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
    FilterGroupsConfig,
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
from verl.config.schema_offline import (
    DPOConfig,
    OfflineEngineConfig,
    OfflineRunConfig,
    PreferenceDataConfig,
    PreferenceLossConfig,
    SFTConfig,
    SFTDataConfig,
    load_dpo_config,
    load_sft_config,
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
    "DPOConfig",
    "DataConfig",
    "DataParallelConfig",
    "DeviceMap",
    "DeviceMapError",
    "FSDPConfig",
    "FilterGroupsConfig",
    "KLControlConfig",
    "MixedPrecisionConfig",
    "ModelConfig",
    "OfflineEngineConfig",
    "OfflineRunConfig",
    "OptimConfig",
    "OverlongBufferConfig",
    "PreferenceDataConfig",
    "PreferenceLossConfig",
    "RefConfig",
    "RefFSDPConfig",
    "RewardModelConfig",
    "RewardModelModelConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "SFTDataConfig",
    "TrainerConfig",
    "ValKwargsConfig",
    "apply_override",
    "from_dict",
    "load_config",
    "load_dpo_config",
    "load_sft_config",
    "resolve_device_map",
    "set_device_map",
    "to_dict",
    "to_yaml",
    "validate",
]
