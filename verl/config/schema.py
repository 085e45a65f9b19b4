"""The typed config schema: one dataclass per section, ``TrainerConfig`` at the top.

The tree mirrors upstream verl's ``ppo_trainer.yaml`` (``data``, ``actor_rollout_ref``,
``critic``, ``reward_model``, ``custom_reward_function``, ``algorithm``, ``trainer``).
These dataclasses hold every default; ``verl/trainer/config/ppo_trainer.yaml`` is
generated from them (``python -m verl.config.gen yaml``). Constructing a config does not
validate it: call ``cfg.validate()`` (``load_config`` does).
"""

# `entry(...)` returns a dataclasses.Field (default_factory for mutables), which RUF009 cannot see.
# ruff: noqa: RUF009

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from verl.config._fields import (
    ArithmeticOp,
    Backend,
    BuiltinDataset,
    Device,
    FilterGroupsMetric,
    GradientPrecision,
    Logger,
    Precision,
    ResumeMode,
    Truncation,
    entry,
)
from verl.config.device_map import DataParallelConfig
from verl.config.flat_keys import FLAT_KEYS, apply_flat_keys
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
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "ArithmeticConfig",
    "CheckpointConfig",
    "CriticConfig",
    "CriticModelConfig",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "DataParallelConfig",
    "FSDPConfig",
    "FilterGroupsConfig",
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
]


@dataclass
class ArithmeticConfig:
    """The built-in arithmetic task: "a op b" questions with integer answers."""

    digits: int = entry(1, "digits per operand")
    ops: list[ArithmeticOp] = entry(["+"], "operators drawn from: +, -, *")
    train_size: int = entry(1024, "generated training prompts")
    val_size: int = entry(64, "generated validation prompts")


@dataclass
class DataConfig:
    """Prompt datasets and their batching."""

    train_files: list[str] = entry([], "training files (parquet/jsonl); a single string is ok")
    val_files: list[str] = entry([], "validation files; empty = no file-based validation")
    prompt_key: str = entry("prompt", "column holding the prompt (text or chat messages)")
    max_prompt_length: int = entry(128, "max prompt tokens (see truncation)")
    max_response_length: int = entry(64, "max generated tokens per response")
    train_batch_size: int = entry(8, "prompts per training step")
    val_batch_size: int | None = entry(None, "prompts per validation batch; null = all at once")
    truncation: Truncation = entry(
        "error",
        "prompt longer than max_prompt_length: error, drop it, or keep its end (truncate; "
        "older spelling: left)",
    )
    shuffle: bool = entry(True, "shuffle training prompts each epoch")
    seed: int = entry(1, "seed of the shuffling sampler")
    apply_chat_template: bool = entry(True, "wrap prompts with the tokenizer's chat template")
    builtin: BuiltinDataset | None = entry(
        "arithmetic",
        "built-in dataset generated into a cache dir when train_files is empty: arithmetic, or null",
    )
    arithmetic: ArithmeticConfig = entry(ArithmeticConfig, "built-in arithmetic task")


@dataclass
class CustomRewardFunctionConfig:
    """A user scoring function loaded from a Python file."""

    path: str | None = entry(None, "Python file defining the function; null = built-in scorers")
    name: str = entry("compute_score", "function name in that file")


@dataclass
class KLControlConfig:
    """Controller of the in-reward KL coefficient."""

    type: str = entry("fixed", "fixed, or adaptive (moves the coefficient toward target_kl)")
    kl_coef: float = entry(0.001, "(initial) KL coefficient")
    horizon: int = entry(10000, "adaptive controller horizon in samples")
    target_kl: float = entry(0.1, "adaptive controller target KL")


@dataclass
class FilterGroupsConfig:
    """DAPO dynamic sampling: drop prompt groups whose responses all got the same metric."""

    enable: bool = entry(
        False,
        "drop groups with identical metric values and generate more prompt batches until "
        "data.train_batch_size informative prompts are collected",
    )
    metric: FilterGroupsMetric = entry(
        "acc",
        "per-response value compared within a group: acc (scorer accuracy), score (raw "
        "scorer score) or seq_reward (sum of the shaped token-level scores)",
    )
    max_num_gen_batches: int = entry(
        10, "generation batches one step may draw before failing; 0 = unbounded"
    )


@dataclass
class AlgorithmConfig:
    """Advantage estimation, the in-reward KL penalty and dynamic sampling."""

    gamma: float = entry(1.0, "discount factor")
    lam: float = entry(1.0, "GAE lambda")
    adv_estimator: str = entry(
        "grpo", "advantage-estimator name in the verl.algorithms registry (gae, grpo, ...)"
    )
    adv_estimator_kwargs: dict[str, Any] = entry(
        {},
        "hyperparameters of the estimator by name, e.g. reward_to_go (remax), epsilon "
        "(grpo); checked against the estimator's registry entry",
    )
    norm_adv_by_std_in_grpo: bool = entry(True, "GRPO: divide by the group's std")
    use_kl_in_reward: bool = entry(False, "subtract a KL(actor || ref) penalty from rewards")
    kl_penalty: str = entry(
        "kl", "KL estimator of the in-reward penalty: k1 (kl), abs, k2 (mse), k3 (low_var_kl)"
    )
    kl_ctrl: KLControlConfig = entry(KLControlConfig, "in-reward KL coefficient")
    filter_groups: FilterGroupsConfig = entry(
        FilterGroupsConfig, "DAPO dynamic sampling of informative prompt groups"
    )


@dataclass
class RunConfig:
    """The ``trainer:`` section: run identity, resources, schedule, logging, checkpoints."""

    project_name: str = entry("verl", "project name (trackers, default directories)")
    experiment_name: str = entry("default", "run name (trackers, default directories)")
    logger: list[Logger] = entry(["console"], "metric sinks: console, jsonl, tensorboard, wandb")
    log_dir: str = entry(
        "runs/{project_name}/{experiment_name}", "directory of jsonl/tensorboard logs"
    )
    nnodes: int = entry(1, "machines")
    n_gpus_per_node: int = entry(1, "devices (GPUs, or CPU processes) per machine")
    device: Device = entry("auto", "auto = cuda when available, else cpu")
    backend: Backend = entry(
        "auto", "worker groups: local (in-process), ray, or auto (local for one process)"
    )
    ray_address: str | None = entry(
        None, "Ray cluster to join (e.g. auto); null = RAY_ADDRESS or a new local cluster"
    )
    ray_dashboard: bool = entry(False, "start the Ray dashboard (bound to 127.0.0.1)")
    worker_heartbeat_timeout: float | None = entry(
        60.0,
        "seconds a Ray worker may leave its heartbeat unanswered (stopped, frozen) before "
        "the run fails naming its role and rank; null = no heartbeat",
    )
    total_epochs: int = entry(1, "passes over the training prompts")
    total_training_steps: int | None = entry(None, "null = total_epochs x batches per epoch")
    save_freq: int = entry(-1, "checkpoint every N steps and after the last step; -1 = never")
    test_freq: int = entry(-1, "validate every N steps; -1 = never")
    val_before_train: bool = entry(True, "validate once before the first step")
    default_local_dir: str = entry(
        "checkpoints/{project_name}/{experiment_name}",
        "checkpoint directory (global_step_N/ subdirectories; the final HF model in huggingface/)",
    )
    resume_mode: ResumeMode = entry(
        "auto",
        "auto = the newest complete checkpoint in default_local_dir, if any; disable = start "
        "fresh; resume_path = trainer.resume_from_path",
    )
    resume_from_path: str | None = entry(
        None, "checkpoint (a global_step_N directory) to resume when resume_mode=resume_path"
    )
    resume_force: bool = entry(
        False,
        "resume even though the checkpoint's model, tokenizer or training data settings "
        "differ from this config (docs/checkpoints.md lists the keys)",
    )
    max_ckpt_to_keep: int | None = entry(
        None, "keep only the newest N complete checkpoints; null = keep all"
    )
    seed: int = entry(42, "global seed (model init, dropout, sampling)")
    profile_steps: list[int] = entry(
        [],
        "training steps (1-based) to record with the torch profiler; each writes a "
        "Chrome trace profile_step_N.json into log_dir",
    )
    num_threads: int | None = entry(None, "torch intra-op threads; null = torch default")
    mixed_precision: Precision = entry(
        "none",
        "default compute precision of every role: none (the model dtype, no autocast), fp32, "
        "bf16, fp16, fp8 (inference roles only; trainable roles then use bf16) or auto (per "
        "device, see docs/precision.md)",
    )
    model_precision_map: dict[str, Precision] = entry(
        {},
        "per-role override of mixed_precision, keys actor, critic, reference, reward "
        "(e.g. {actor: bf16, reference: fp8})",
    )
    gradient_precision: GradientPrecision = entry(
        "fp32", "dtype of master weights, gradients, their reduction and optimizer state"
    )
    use_gradient_scaling: bool | None = entry(
        None, "dynamic loss scaling; null = on iff a trainable role computes in fp16"
    )
    max_consecutive_nonfinite_steps: int = entry(
        3,
        "stop with an error after this many optimizer steps in a row skipped for a non-finite "
        "loss or grad norm; 0 = never stop",
    )
    use_flash_attention: bool = entry(
        False, "flash attention where installed and supported, else SDPA (logged once)"
    )
    dynamic_precision: bool = entry(
        False,
        "reference and reward model switch to fp8 weights before an inference phase when free "
        "memory is below dynamic_precision_min_free_gb, and back when it allows (logged)",
    )
    dynamic_precision_min_free_gb: float = entry(
        2.0, "free device memory (GiB) below which dynamic_precision switches to fp8"
    )


@dataclass
class TrainerConfig:
    """Everything a PPO/GRPO run needs. Build from YAML with ``load_config`` or in Python."""

    data: DataConfig = entry(DataConfig, "prompt data")
    actor_rollout_ref: ActorRolloutRefConfig = entry(
        ActorRolloutRefConfig, "policy, generation and reference"
    )
    critic: CriticConfig = entry(CriticConfig, "value function")
    reward_model: RewardModelConfig = entry(RewardModelConfig, "reward computation")
    custom_reward_function: CustomRewardFunctionConfig = entry(
        CustomRewardFunctionConfig, "user scoring function"
    )
    algorithm: AlgorithmConfig = entry(AlgorithmConfig, "advantages and KL penalty")
    trainer: RunConfig = entry(RunConfig, "run settings")
    resource_pool: DataParallelConfig = entry(
        DataParallelConfig, "device ids per role (the device map)"
    )

    def validate(self, registries: Mapping[str, Iterable[str]] | None = None) -> list[str]:
        """Check the whole config; raise ``ConfigError`` listing every problem.

        Returns the warnings (also logged). See :func:`verl.config.validate.validate`.
        """
        return validate(self, registries=registries)


_dataclass_init = TrainerConfig.__init__


@functools.wraps(_dataclass_init)
def _init_with_flat_keys(self: TrainerConfig, *args: Any, **kwargs: Any) -> None:
    """The dataclass ``__init__``, plus the flat keys of ``verl.config.flat_keys.FLAT_KEYS``.

    ``TrainerConfig(mixed_precision="bf16", max_grad_norm=0.5)`` sets the nested twins of
    those keys; a flat key contradicting its twin raises ``ConfigError``.
    """
    flat = {key: kwargs.pop(key) for key in list(kwargs) if key in FLAT_KEYS}
    _dataclass_init(self, *args, **kwargs)
    if flat:
        apply_flat_keys(self, flat)


TrainerConfig.__init__ = _init_with_flat_keys
