"""The typed config of verl: schema (dataclasses), loading, overrides and validation.

    from verl.config import load_config, TrainerConfig
    cfg = load_config("my.yaml", ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4"])
    cfg = TrainerConfig(); cfg.actor_rollout_ref.rollout.n = 4; cfg.validate()

The dataclasses hold every default (``verl/trainer/config/*.yaml`` and the key tables of the
docs are generated from them by ``python -m verl.config.gen``). The offline trainers'
configs (``SFTConfig``, ``DPOConfig``, loaded with ``load_sft_config`` /
``load_dpo_config``) live in ``schema_offline.py``. This package imports nothing from the
rest of verl but ``verl.registry`` and the alias tables of ``verl.compat.aliases`` (which
import nothing of verl), and never torch at import. See ``docs/config.md``.
"""

from verl.config._fields import EMBEDDED_MODEL
from verl.config.device_map import (
    DataParallelConfig,
    DeviceMap,
    DeviceMapError,
    resolve_device_map,
    set_device_map,
)
from verl.config.load import ConfigError, ConfigProblem, apply_override, to_dict, to_yaml
from verl.config.schema import (
    AlgorithmConfig,
    ArithmeticConfig,
    CustomRewardFunctionConfig,
    DataConfig,
    FilterGroupsConfig,
    KLControlConfig,
    RunConfig,
    TrainerConfig,
    from_dict,
    load_config,
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
from verl.config.schema_roles import (
    ActorConfig,
    ActorRolloutRefConfig,
    CheckpointConfig,
    CriticConfig,
    CriticModelConfig,
    FSDPConfig,
    MixedPrecisionConfig,
    ModelConfig,
    OptimConfig,
    OverlongBufferConfig,
    RefConfig,
    RefFSDPConfig,
    RewardModelConfig,
    RewardModelModelConfig,
    RolloutConfig,
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
