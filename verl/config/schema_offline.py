"""Typed configs of the offline trainers, ``SFTConfig`` (supervised fine-tuning),
``DPOConfig`` (DPO / IPO / KTO) and ``RMConfig`` (reward models), and their loaders (their
checks: ``verl.trainer.offline.config_checks``, run by ``validate``).

They follow the PPO schema's conventions and reuse its shared sections (``ModelConfig``,
``OptimConfig``, ``ArithmeticConfig``); ``verl/trainer/config/{sft,dpo,rm}_trainer.yaml`` and
the tables of ``docs/sft_dpo.md`` and ``docs/reward_model.md`` are generated from them
(``python -m verl.cli.config_gen``).
"""

# `entry(...)` returns a dataclasses.Field (default_factory for mutables), which RUF009 cannot see.
# ruff: noqa: RUF009

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from verl.config._fields import Strategy, entry
from verl.config.schema import ArithmeticConfig, ClusterRunConfig
from verl.config.schema_roles import ModelConfig, OptimConfig
from verl.config.validate import Validated, load_checked

SFTTruncation = Literal["error", "right", "drop", "truncate"]  # right: older name of truncate
PreferenceTruncation = Literal["error", "truncate", "drop"]
OfflineBuiltin = Literal["arithmetic"]
RMPrecision = Literal["none", "bf16", "fp16", "auto"]


# --------------------------------------------------------------------------- sections


@dataclass
class SFTDataConfig:
    """Chat / prompt-response rows for SFT, their tokenisation and batching."""

    train_files: list[str] = entry([], "training files (parquet/jsonl); a single string is ok")
    val_files: list[str] = entry([], "validation files (validation loss); empty = none")
    messages_key: str = entry(
        "messages",
        "column of chat messages; rows without it use prompt_key + response_key",
        nonempty=True,
    )
    prompt_key: str = entry("prompt", "column of the prompt (text or chat messages)", nonempty=True)
    response_key: str = entry("response", "column of the response text", nonempty=True)
    prompt_dict_keys: list[str] = entry(
        [],
        "keys leading into the prompt column's value when it is a mapping (e.g. prompt_key="
        "extra_info with [question]); empty = the column is the prompt",
    )
    response_dict_keys: list[str] = entry([], "the same for the response column (e.g. [answer])")
    apply_chat_template: bool = entry(
        True, "render with the tokenizer's chat template; false = prompt + response + eos"
    )
    max_length: int = entry(512, "max tokens per sample (and per packed sequence)", ge=2)
    truncation: SFTTruncation = entry(
        "error",
        "sample longer than max_length: error (list the rows), truncate (keep its first "
        "max_length tokens; older spelling: right) or drop it",
    )
    packing: bool = entry(False, "pack samples into sequences of up to max_length tokens")
    train_batch_size: int = entry(8, "sequences per optimizer step (packed when packing)", ge=1)
    micro_batch_size_per_device: int = entry(4, "sequences per forward/backward", ge=1)
    shuffle: bool = entry(True, "shuffle training sequences each epoch")
    seed: int = entry(1, "seed of the shuffling sampler and the built-in data")
    builtin: OfflineBuiltin | None = entry(
        "arithmetic",
        "built-in data written under the checkpoint dir when train_files is empty: "
        "arithmetic (question -> answer chats), or null",
    )
    arithmetic: ArithmeticConfig = entry(
        ArithmeticConfig(ops=["+", "-", "*"], train_size=192, val_size=32),
        "built-in arithmetic task",
    )


@dataclass
class PreferenceDataConfig:
    """Preference rows (prompt/chosen/rejected, or prompt/completion/label for KTO)."""

    train_files: list[str] = entry([], "training files (parquet/jsonl); a single string is ok")
    val_files: list[str] = entry([], "validation files (loss and reward metrics); empty = none")
    apply_chat_template: bool = entry(
        True, "render with the tokenizer's chat template; false = plain text + eos"
    )
    max_prompt_length: int = entry(256, "max prompt tokens (see truncation)", ge=1)
    max_length: int = entry(512, "max prompt + completion tokens (see truncation)", ge=2)
    truncation: PreferenceTruncation = entry(
        "error",
        "row over a limit: error (list the rows), truncate (keep the prompt's end and the "
        "completion's start) or drop it",
    )
    train_batch_size: int = entry(
        8, "rows per optimizer step: pairs (dpo, ipo) or labelled completions (kto)", ge=1
    )
    micro_batch_size_per_device: int = entry(
        4, "rows per forward/backward (a pair is two sequences)", ge=1
    )
    shuffle: bool = entry(True, "shuffle training rows each epoch")
    seed: int = entry(1, "seed of the shuffling sampler and the built-in data")
    builtin: OfflineBuiltin | None = entry(
        "arithmetic",
        "built-in data written under the checkpoint dir when train_files is empty: "
        "arithmetic (correct answer chosen, wrong answer rejected), or null",
    )
    arithmetic: ArithmeticConfig = entry(
        ArithmeticConfig(ops=["+", "-", "*"], train_size=192, val_size=32),
        "built-in arithmetic task",
    )


@dataclass
class OfflineEngineConfig:
    """The train engine of an offline trainer."""

    strategy: Strategy = entry(
        "single",
        "train engine: single (one process), fsdp2 (sharded; needed on more than one "
        "device: trainer.nnodes x trainer.n_gpus_per_node) or auto (fsdp2 on several devices, "
        "else single)",
    )
    grad_clip: float = entry(1.0, "max global gradient norm", gt=0)
    logprob_chunk_size: int = entry(
        512, "tokens whose float32 logits exist at once when computing log-probs", ge=1
    )


@dataclass
class RMEngineConfig(OfflineEngineConfig):
    """The train engine of a reward-model run, with its compute precision."""

    precision: RMPrecision = entry(
        "none",
        "compute precision: none (the model's dtype, no autocast), bf16 or fp16 (autocast "
        "over the fp32 weights; fp16 with loss scaling), auto (bf16 where the device runs it "
        "natively, else none: verl.config.precision.auto_select_precision)",
    )


@dataclass
class PreferenceLossConfig:
    """Which preference loss, and its coefficients."""

    loss_type: str = entry(
        "dpo", "loss name in the verl.algorithms registry: dpo, ipo, kto", nonempty=True
    )
    beta: float = entry(0.1, "reward scale beta (> 0); for ipo the regularisation strength", gt=0)
    label_smoothing: float = entry(
        0.0,
        "dpo only: assumed probability that a pair's labels are flipped, in [0, 0.5)",
        ge=0,
        lt=0.5,
    )
    desirable_weight: float = entry(1.0, "kto: weight of desirable rows' losses", gt=0)
    undesirable_weight: float = entry(1.0, "kto: weight of undesirable rows' losses", gt=0)


@dataclass
class OfflineRunConfig(ClusterRunConfig):
    """The ``trainer:`` section of an offline run: the shared keys and the devices (more
    than one in all: engine.strategy=fsdp2 ranks on Ray workers, one per device)."""

    experiment_name: str = entry("offline", "run name (trackers, default dirs)", nonempty=True)
    test_freq: int = entry(-1, "validation loss every N steps; -1 = only at the end", ge=1, off=-1)


@dataclass
class RMDataConfig(PreferenceDataConfig):
    """Preference pairs for reward-model training (the DPO pair format), with an optional
    per-pair margin column."""

    train_batch_size: int = entry(8, "pairs per optimizer step", ge=1)
    micro_batch_size_per_device: int = entry(
        4, "pairs per forward/backward (a pair is two sequences)", ge=1
    )
    margin_key: str | None = entry(
        "margin",
        "column of a per-pair margin m (loss -logsigmoid(r_chosen - r_rejected - m)); files "
        "without it use m = 0; null = ignore the column",
        nonempty=True,
    )


@dataclass
class SFTConfig(Validated):
    """Everything an SFT run needs. Build with ``load_sft_config`` or in Python."""

    data: SFTDataConfig = entry(SFTDataConfig, "training data")
    model: ModelConfig = entry(ModelConfig, "the model to fine-tune")
    optim: OptimConfig = entry(
        OptimConfig(lr=1e-5, lr_warmup_steps_ratio=0.1, warmup_style="cosine"), "optimizer"
    )
    engine: OfflineEngineConfig = entry(OfflineEngineConfig, "train engine")
    trainer: OfflineRunConfig = entry(OfflineRunConfig(experiment_name="sft"), "run settings")


@dataclass
class DPOConfig(Validated):
    """Everything a DPO / IPO / KTO run needs. Build with ``load_dpo_config`` or in Python."""

    data: PreferenceDataConfig = entry(PreferenceDataConfig, "preference data")
    model: ModelConfig = entry(ModelConfig, "the policy (its initial weights are the reference)")
    optim: OptimConfig = entry(OptimConfig(lr=1e-6), "optimizer")
    engine: OfflineEngineConfig = entry(OfflineEngineConfig, "train engine")
    algorithm: PreferenceLossConfig = entry(PreferenceLossConfig, "preference loss")
    trainer: OfflineRunConfig = entry(OfflineRunConfig(experiment_name="dpo"), "run settings")


@dataclass
class RMConfig(Validated):
    """Everything a reward-model run needs. Build with ``load_rm_config`` or in Python."""

    data: RMDataConfig = entry(RMDataConfig, "preference pairs")
    model: ModelConfig = entry(
        ModelConfig,
        "the backbone, loaded as a sequence classifier with one label (a causal LM gets a "
        "new score head; a reward-model directory keeps its own)",
    )
    optim: OptimConfig = entry(OptimConfig(lr=1e-5), "optimizer")
    engine: RMEngineConfig = entry(RMEngineConfig, "train engine")
    trainer: OfflineRunConfig = entry(OfflineRunConfig(experiment_name="rm"), "run settings")


# --------------------------------------------------------------------------- loading


def load_sft_config(
    path: str | os.PathLike[str] | None = None, overrides: Iterable[str] = ()
) -> SFTConfig:
    """Load and validate an :class:`SFTConfig` ."""
    return load_checked(SFTConfig, path, overrides)


def load_dpo_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Iterable[str] = (),
    *,
    registries: Mapping[str, Iterable[str]] | None = None,
) -> DPOConfig:
    """Load and validate a :class:`DPOConfig` ."""
    return load_checked(DPOConfig, path, overrides, registries)


def load_rm_config(
    path: str | os.PathLike[str] | None = None, overrides: Iterable[str] = ()
) -> RMConfig:
    """Load and validate an :class:`RMConfig` ."""
    return load_checked(RMConfig, path, overrides)
