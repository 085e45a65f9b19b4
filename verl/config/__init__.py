"""The typed config of verl: schema (dataclasses), loading, overrides and validation.

    from verl.config import load_config, TrainerConfig
    cfg = load_config("my.yaml", ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4"])
    cfg = TrainerConfig(); cfg.actor_rollout_ref.rollout.n = 4; cfg.validate()

The dataclasses hold every default (``verl/trainer/config/*.yaml`` and the key tables of the
docs are generated from them by ``python -m verl.cli.config_gen``). The offline trainers'
configs (``SFTConfig``, ``DPOConfig``, ``RMConfig``, loaded with ``load_sft_config`` /
``load_dpo_config`` / ``load_rm_config``) live in ``schema_offline.py``. This package
imports nothing of verl but ``verl.registry`` and ``verl.utils`` (device probes), and never
torch at import. It reads native spellings; other spellings (upstream verl's keys, the
tutorials' aliases, torch dtypes, flat keywords) are read by the input adapters registered
in ``verl.registry.CONFIG_ADAPTERS``, whose built-in entries live in ``verl.compat``, the
layer above (``verl.config.load``); validation runs the checks registered for the config's
class in ``verl.registry.CONFIG_CHECKS``, which live with the trainers that read the keys
(``verl.config.validate``). Names are imported on first use. See ``docs/config.md``.
"""

from __future__ import annotations

# ``validate`` is also a submodule's name, which the import system would bind over a lazy
# entry: imported eagerly.
from verl.config.validate import validate  # noqa: F401
from verl.utils.lazy import lazy_exports

_MODULES = {
    "_fields": "EMBEDDED_MODEL",
    "device_map": "DataParallelConfig DeviceMap DeviceMapError resolve_device_map set_device_map",
    "load": "ConfigError ConfigProblem apply_override to_dict to_yaml",
    "schema": "AlgorithmConfig ArithmeticConfig CustomRewardFunctionConfig DataConfig "
    "FilterGroupsConfig KLControlConfig RunConfig TrainerConfig from_dict load_config",
    "schema_offline": "DPOConfig OfflineEngineConfig OfflineRunConfig PreferenceDataConfig "
    "PreferenceLossConfig RMConfig RMDataConfig SFTConfig SFTDataConfig load_dpo_config "
    "load_rm_config load_sft_config",
    "schema_roles": "ActorConfig ActorRolloutRefConfig CheckpointConfig CriticConfig "
    "CriticModelConfig FSDPConfig MixedPrecisionConfig ModelConfig OptimConfig "
    "OverlongBufferConfig RefConfig RefFSDPConfig RewardModelConfig RewardModelModelConfig "
    "TrainedRoleConfig",
    "schema_rollout": "MultiTurnConfig RolloutConfig ToolConfig ValKwargsConfig",
}
_LAZY = {name: f"{__name__}.{mod}" for mod, names in _MODULES.items() for name in names.split()}

__all__ = sorted([*_LAZY, "validate"])

__getattr__ = lazy_exports(__name__, _LAZY)
