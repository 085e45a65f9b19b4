"""The typed config schema: one dataclass per section, ``TrainerConfig`` at the top.

The tree mirrors upstream verl's ``ppo_trainer.yaml`` (``data``, ``actor_rollout_ref``,
``critic``, ``reward_model``, ``custom_reward_function``, ``algorithm``, ``trainer``).
These dataclasses hold every default; ``verl/trainer/config/ppo_trainer.yaml`` is
generated from them (``python -m verl.cli.config_gen yaml``). Constructing a config does not
validate it: call ``cfg.validate()`` (``load_config`` does).
"""

# `entry(...)` returns a dataclasses.Field (default_factory for mutables), which RUF009 cannot see.
# ruff: noqa: RUF009

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from verl.config._fields import (
    PATH_FIELDS,
    ArithmeticOp,
    ArithmeticPhrasing,
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
from verl.config.device_map import DataParallelConfig, DeviceMap, resolve_device_map
from verl.config.load import ConfigError, build, init_fields, input_adapter
from verl.config.schema_roles import (
    ActorRolloutRefConfig,
    CriticConfig,
    RewardModelConfig,
)
from verl.config.validate import Validated, load_checked
from verl.registry import ADVANTAGE_ESTIMATORS


@dataclass
class ArithmeticConfig:
    """The built-in arithmetic task: "a op b" questions with integer answers."""

    digits: int = entry(1, "digits per operand", ge=1)
    max_digits: int | None = entry(None, "operands up to this many digits; null = digits", ge=1)
    balance_digits: bool = entry(
        False,
        "draw each operand's digit count uniformly (else operands uniform over the range); "
        "RL built-in data only",
    )
    ops: list[ArithmeticOp] = entry(["+"], "operators drawn from: +, -, *")
    negative: bool = entry(
        False, "subtraction in either order, so answers may be negative; RL built-in data only"
    )
    phrasings: list[ArithmeticPhrasing] = entry(
        ["question"],
        "question forms drawn per prompt: question (What is 3 + 4?), words (3 plus 4), "
        "compute, calculate; extra_info.phrasing names each (trainer.val_group_by)",
    )
    train_size: int = entry(1024, "generated training prompts", ge=1)
    val_size: int = entry(64, "generated validation prompts", ge=0)

    @property
    def digit_range(self) -> tuple[int, int]:
        """``(digits, max_digits)``: the digit counts operands are drawn from."""
        return self.digits, self.max_digits or self.digits


@dataclass
class DataConfig:
    """Prompt datasets and their batching."""

    train_files: list[str] = entry([], "training files (parquet/jsonl); a single string is ok")
    val_files: list[str] = entry([], "validation files; empty = no file-based validation")
    rollout_files: list[str] = entry(
        [],
        "pre-generated rollouts (verl generate files) to train from instead of generating: "
        "their log-probs are the behaviour policy (needs actor.rollout_is_threshold)",
    )
    prompt_key: str = entry("prompt", "prompt column (text or chat messages)", nonempty=True)
    max_prompt_length: int = entry(128, "max prompt tokens (see truncation)", ge=1)
    max_response_length: int = entry(64, "max generated tokens per response", ge=1)
    train_batch_size: int = entry(8, "prompts per training step", ge=1)
    rollout_batch_size: int | None = entry(
        None, "prompts per generation batch in flight (async); null = train_batch_size", ge=1
    )
    val_batch_size: int | None = entry(None, "prompts per validation batch; null = all", ge=1)
    truncation: Truncation = entry(
        "error",
        "prompt longer than max_prompt_length: error, drop it, or keep its end (truncate; "
        "older spelling: left)",
    )
    shuffle: bool = entry(True, "shuffle training prompts each epoch")
    seed: int = entry(1, "seed of the shuffling sampler")
    dataloader_num_workers: int = entry(
        0,
        "prompt-loader worker processes; > 0 reads train_files lazily (each row read and "
        "tokenized in a worker when its batch is due; same batches as 0)",
        ge=0,
    )
    persistent_workers: bool = entry(
        False, "keep the loader's workers between epochs (needs dataloader_num_workers >= 1)"
    )
    prefetch_factor: int | None = entry(
        None, "batches each worker reads ahead; null = torch's 2 (needs workers >= 1)", ge=1
    )
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

    type: str = entry(
        "fixed",
        "fixed, adaptive (moves the coefficient toward target_kl), or linear / cosine "
        "(ramps kl_coef to final_kl_coef over schedule_steps)",
    )
    kl_coef: float = entry(0.001, "(initial) KL coefficient", ge=0)
    horizon: int = entry(10000, "adaptive controller horizon in samples", ge=1)
    target_kl: float = entry(0.1, "adaptive controller target KL", gt=0)
    final_kl_coef: float | None = entry(None, "linear/cosine: the coefficient ramped to", ge=0)
    schedule_steps: int = entry(1, "linear/cosine: trainer steps of the ramp, then held", ge=1)


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
        10, "generation batches one step may draw before failing; 0 = unbounded", ge=0
    )


@dataclass
class PFPPOConfig:
    """PF-PPO: redraw the step's responses by reward (``algorithm.use_pf_ppo``)."""

    reweight_method: str = entry(
        "pow", "weights from scores: pow (|score|^weight_pow), max_min, max_random"
    )
    weight_pow: float = entry(2.0, "exponent of the pow method", ge=0)


@dataclass
class DistillConfig:
    """On-policy distillation (``algorithm.distill``, docs/distillation.md): a frozen teacher
    scores the student's samples; the per-token reverse KL to it is a loss term."""

    enable: bool = entry(False, "add the reverse KL to a teacher to the actor's loss")
    teacher_path: str | None = entry(
        None,
        "the teacher: a HF causal LM directory or hub id with the student's tokenizer "
        "(required with enable=true)",
    )
    teacher_precision: Precision = entry(
        "none",
        "the teacher's weights and compute: none (the student's model.dtype), fp32, bf16, "
        "fp16, or weight-only fp8 / int4",
    )
    coef: float = entry(1.0, "weight of the distillation loss", ge=0)
    estimator: str = entry(
        "k1",
        "per-token reverse KL: k1 / k3 (sampled token) or topk (full distribution over the "
        "student's top-k tokens)",
        nonempty=True,
    )
    topk: int = entry(16, "tokens per position of the topk estimator", ge=1)
    topk_tail: bool = entry(
        True, "topk: a bucket for the mass outside the top-k (false: renormalise over it)"
    )
    mix_task_reward: bool = entry(
        False,
        "true: the task's policy loss plus coef x KL; false: coef x KL alone (rewards only logged)",
    )
    log_prob_micro_batch_size_per_device: int | None = entry(
        None, "rows per teacher forward; null = as the reference's", ge=1
    )
    teacher_pool: Literal["colocated", "separate"] = entry(
        "colocated", "colocated (in the actor's workers) or separate (teacher_devices)"
    )
    fixed_fraction: float = entry(
        0.0,
        "GKD mixing: probability that a step trains on the data's fixed responses instead of "
        "the student's samples (drawn per step from trainer.seed and the step); 0 = on-policy "
        "only, 1 = supervised KD (needs estimator=topk, mix_task_reward=false)",
        ge=0,
        le=1,
    )
    response_key: str = entry(
        "reward_model",
        "fixed_fraction > 0: the prompt rows' column holding the fixed response, reward_model "
        "or extra_info (the columns that reach the trainer)",
        nonempty=True,
    )
    response_dict_keys: list[str] = entry(
        ["ground_truth"],
        "keys leading into response_key's mapping (as data.response_dict_keys of SFT); the "
        "default reads reward_model.ground_truth, e.g. the arithmetic answer",
    )


@dataclass
class AlgorithmConfig:
    """Advantage estimation, the in-reward KL penalty and dynamic sampling."""

    gamma: float = entry(1.0, "discount factor", ge=0, le=1)
    lam: float = entry(1.0, "GAE lambda", ge=0, le=1)
    adv_estimator: str = entry(
        "grpo",
        "advantage-estimator name in the verl.algorithms registry (gae, grpo, ...)",
        nonempty=True,
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
    use_pf_ppo: bool = entry(
        False, "PF-PPO: train on the step's responses redrawn with replacement by reward"
    )
    pf_ppo: PFPPOConfig = entry(PFPPOConfig, "PF-PPO reweighting")
    distill: DistillConfig = entry(DistillConfig, "on-policy distillation from a teacher")


@dataclass
class RunSectionConfig:
    """The keys every trainer's ``trainer:`` section shares (RL, SFT, DPO): run identity,
    logging, schedule, checkpoints and resuming."""

    project_name: str = entry("verl", "project name (trackers, default directories)", nonempty=True)
    experiment_name: str = entry("default", "run name (trackers, default dirs)", nonempty=True)
    logger: list[Logger] = entry(
        ["console"], "metric sinks: console, jsonl, tensorboard, wandb, mlflow"
    )
    log_dir: str = entry("runs/{project_name}/{experiment_name}", "jsonl/tensorboard log directory")
    device: Device = entry("auto", "auto = cuda when available, else cpu")
    total_epochs: int = entry(1, "passes over the training data", ge=1)
    total_training_steps: int | None = entry(None, "null = total_epochs x steps per epoch", ge=1)
    save_freq: int = entry(
        -1, "checkpoint every N steps and after the last step; -1 = never", ge=1, off=-1
    )
    test_freq: int = entry(-1, "validate every N steps; -1 = never", ge=1, off=-1)
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
        "resume even though the checkpoint's model, tokenizer, data or loss settings differ "
        "from this config (docs/checkpoints.md lists the keys)",
    )
    max_ckpt_to_keep: int | None = entry(
        None, "keep only the newest N complete checkpoints; null = keep all", ge=1
    )
    seed: int = entry(42, "global seed (model init, dropout, sampling)")
    num_threads: int | None = entry(None, "torch intra-op threads; null = torch default", ge=1)


@dataclass
class ClusterRunConfig(RunSectionConfig):
    """The shared keys, and the machines and devices the run spans (RL, SFT, DPO)."""

    nnodes: int = entry(1, "machines", ge=1)
    n_gpus_per_node: int = entry(1, "devices (GPUs, or CPU processes) per machine", ge=1)
    ray_address: str | None = entry(
        None, "Ray cluster to join (e.g. auto); null = RAY_ADDRESS or a new local cluster"
    )

    @property
    def world_size(self) -> int:
        """Devices in the cluster: ``nnodes * n_gpus_per_node``."""
        return self.nnodes * self.n_gpus_per_node


@dataclass
class RunConfig(ClusterRunConfig):
    """The ``trainer:`` section of an RL run: the shared keys, resources and precision."""

    backend: Backend = entry(
        "auto", "worker groups: local (in-process), ray, or auto (local for one process)"
    )
    ray_dashboard: bool = entry(False, "start the Ray dashboard (bound to 127.0.0.1)")
    worker_heartbeat_timeout: float | None = entry(
        60.0,
        "seconds a Ray worker may leave its heartbeat unanswered (stopped, frozen) before "
        "the run fails naming its role and rank; null = no heartbeat",
    )
    val_group_by: list[str] = entry(
        [], "extra_info fields to also report validation by: val/acc/<source>/<field>=<value>"
    )
    log_val_generations: int = entry(
        0, "validation samples (prompt, response, score) logged as a table per validation", ge=0
    )
    rollout_data_dir: str | None = entry(
        None,
        "write each training step's rollouts to <dir>/<step>.jsonl (prompt, response, "
        "ground_truth, score, data_source, step); may contain {project_name}, {experiment_name}",
    )
    validation_data_dir: str | None = entry(
        None, "write each validation's generations to <dir>/<step>.jsonl (as rollout_data_dir)"
    )
    critic_warmup: int = entry(
        0,
        "first steps that update only the critic, so the actor's first update has a trained "
        "value function (needs a critic)",
        ge=0,
    )
    val_only: bool = entry(
        False,
        "validate once (the resumed checkpoint, else the initial model) and stop: no "
        "training, no export",
    )
    async_rollout: bool = entry(
        False,
        "one-step-off training: generate the next batches on a copy of the policy while the "
        "current one trains (docs/rollout.md#asynchronous-rollout)",
    )
    max_staleness: int = entry(
        1,
        "async_rollout: actor updates a sample may lag (one_step_off: the batches generated "
        "ahead, >= 1; streaming: >= 0, staler samples are dropped)",
        ge=0,
    )
    rollout_mode: Literal["one_step_off", "streaming"] = entry(
        "one_step_off",
        "async_rollout: one_step_off (whole batches queued max_staleness ahead) or streaming "
        "(groups buffered as generated, the staler ones dropped; docs/rollout.md#streaming)",
    )
    stream_buffer_groups: int | None = entry(
        None,
        "rollout_mode=streaming: prompt groups generated or buffered ahead of training; null "
        "= (max_staleness + 1) * data.train_batch_size",
        ge=1,
    )
    partial_rollout: Literal["off", "continue", "resume"] = entry(
        "off",
        "rollout_mode=streaming: new weights reach the rollout copy in the middle of a "
        "generation call; continue (sequences in flight decode on under them) or resume "
        "(prompt + prefix prefilled again under them), each token recording its policy "
        "version (docs/rollout.md#partial-rollouts); off = between calls only",
    )
    rollout_num_threads: int | None = entry(
        None,
        "async_rollout on the local backend: torch intra-op threads of the rollout copy's "
        "thread (with trainer.num_threads for the training side, so the two sides need not "
        "oversubscribe the same cores); null = the count torch gives a new thread",
        ge=1,
    )
    rollout_copies: int = entry(
        1, "async_rollout, Ray backend: rollout copy processes splitting each batch", ge=1
    )
    profile_steps: list[int] = entry(
        [],
        "training steps (1-based) to record with the torch profiler; each writes a "
        "Chrome trace profile_step_N.json into log_dir",
    )
    mixed_precision: Precision | None = entry(
        None,
        "precision of every role whose own precision key is null: none (the model dtype, no "
        "autocast), fp32, bf16, fp16, fp8 or int4 (inference roles only; trainable roles then "
        "use bf16) or auto (per device, see docs/precision.md); null = auto",
    )
    model_precision_map: dict[str, Precision] = entry(
        {},
        "per-role precision, keys actor, critic, reference, reward (e.g. {actor: bf16, "
        "reference: fp8}); written into the role keys left null, before mixed_precision",
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
        ge=0,
    )
    divergence_max_grad_norm: float = entry(
        1e5,
        "a step whose actor or critic pre-clip grad norm is above this looks diverged: not "
        "checkpointed, and max_consecutive_divergent_steps in a row (or the final step) stop "
        "the run with an error; 0 = not checked (docs/reliability.md)",
        ge=0,
    )
    divergence_max_policy_kl: float = entry(
        10.0,
        "the same for |actor/approx_kl|, the per-token KL in nats the update moved the policy "
        "within one step (0 when it is one optimizer step); 0 = not checked",
        ge=0,
    )
    max_consecutive_divergent_steps: int = entry(
        1, "steps in a row past a divergence bound that stop the run", ge=1
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
class TrainerConfig(Validated):
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """The sections by keyword (or position, in field order); a section not given takes
        its defaults. Other keywords (the flat keys, ``TrainerConfig(mixed_precision="bf16")``,
        and torch dtypes) are read by the ``keywords`` input adapter of
        ``verl.registry.CONFIG_ADAPTERS`` (built-in: ``verl.compat.flat_keys``), which also
        fills what they and the trainer-wide precision keys set on the built config."""
        adapt, finish = input_adapter("keywords"), None
        if adapt is not None:
            kwargs, finish = adapt(type(self), kwargs)
        init_fields(self, args, kwargs)
        if finish is not None:
            finish(self)

    # Derived values: the one place each "null means ..." default is resolved (what an
    # algorithm needs is asked of its registry entry, never of a list of names).

    def estimator_needs(self, what: str) -> bool:
        """Whether the estimator's registry entry declares ``what`` (``needs_critic``, ...);
        False for an unregistered name, which ``validate`` reports."""
        return bool(ADVANTAGE_ESTIMATORS.needs(self.algorithm.adv_estimator, what))

    @property
    def critic_enabled(self) -> bool:
        """``critic.enable``, or when null, whether the estimator needs values."""
        enable = self.critic.enable
        return self.estimator_needs("needs_critic") if enable is None else enable

    @property
    def ref_enabled(self) -> bool:
        """A KL term is on (loss or reward) or the estimator needs reference log-probs."""
        kl = self.actor_rollout_ref.actor.use_kl_loss or self.algorithm.use_kl_in_reward
        return kl or self.estimator_needs("needs_reference")

    @property
    def placed_roles(self) -> list[str]:
        """The worker groups this run places on devices, in placement order."""
        optional = {"critic": self.critic_enabled, "reward_model": self.reward_model.enable}
        d = self.algorithm.distill  # a teacher on a pool of its own (docs/distillation.md)
        optional["teacher"] = d.enable and d.teacher_pool == "separate"
        return ["actor_rollout_ref"] + [g for g, on in optional.items() if on]

    @property
    def world_size(self) -> int:
        """Devices in the cluster: ``nnodes * n_gpus_per_node``."""
        return self.trainer.world_size

    @property
    def device_map(self) -> DeviceMap:
        """The placement of the placed roles; raises ``DeviceMapError`` if it cannot be."""
        t = self.trainer
        return resolve_device_map(
            self.resource_pool, t.nnodes, t.n_gpus_per_node, self.placed_roles
        )

    def dp_size(self, group: str) -> int:
        """Data-parallel ranks of a worker group (``actor_rollout_ref``, ``critic``, ...)."""
        return self.device_map.dp_size(group)

    def trained_section(self, group: str) -> Any:
        """The section of the role a worker group trains: ``actor_rollout_ref`` -> its
        ``actor``, ``critic`` -> ``critic``."""
        return self.actor_rollout_ref.actor if group == "actor_rollout_ref" else self.critic

    def engine_strategy(self, group: str) -> str:
        """The train engine of ``actor_rollout_ref`` or ``critic``: auto = fsdp2 iff > 1 rank."""
        section = self.trained_section(group)
        if section.strategy != "auto":
            return section.strategy
        return "fsdp2" if self.dp_size(group) > 1 else "single"

    @property
    def worker_backend(self) -> str:
        """``trainer.backend``, with auto = ray iff the roles need more than one process."""
        if self.trainer.backend != "auto":
            return self.trainer.backend
        return "ray" if self.device_map.processes > 1 else "local"

    @property
    def critic_model_path(self) -> str:
        """``critic.model.path``, or the actor's model path when null."""
        return self.critic.model.path or self.actor_rollout_ref.model.path

    @property
    def tokenizer_path(self) -> str:
        """The policy tokenizer: ``model.tokenizer_path`` or ``model.path``."""
        return self.actor_rollout_ref.model.tokenizer_path or self.actor_rollout_ref.model.path

    @property
    def rollout_seed(self) -> int:
        """``rollout.seed``, or ``trainer.seed`` when null."""
        seed = self.actor_rollout_ref.rollout.seed
        return self.trainer.seed if seed is None else seed

    @property
    def checkpoint_dir(self) -> str:
        """``trainer.default_local_dir`` with its ``{...}`` fields filled in."""
        return self.trainer.default_local_dir.format(**self._path_fields())

    @property
    def log_dir(self) -> str:
        """``trainer.log_dir`` with its ``{...}`` fields filled in."""
        return self.trainer.log_dir.format(**self._path_fields())

    def _path_fields(self) -> dict[str, str]:
        return {name: getattr(self.trainer, name) for name in PATH_FIELDS}


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Iterable[str] = (),
    *,
    registries: Mapping[str, Iterable[str]] | None = None,
) -> TrainerConfig:
    """The defaults, a YAML file ``path`` (a partial tree) and dotted ``overrides``, validated
    (``registries``: extra ``{key path: allowed names}`` checks); raises ``ConfigError``."""
    return load_checked(TrainerConfig, path, overrides, registries)


def from_dict(data: Mapping[str, Any], cls: type = TrainerConfig) -> Any:
    """A config (``TrainerConfig`` by default) from nested dicts (a partial tree), type-checked
    only (``ConfigError``); ``load_config`` / ``cfg.validate()`` run the full validation."""
    obj, problems, _ = build(cls, data)
    if problems:
        raise ConfigError(problems)
    return obj
