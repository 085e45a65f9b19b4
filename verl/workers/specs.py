"""Role specs: what each worker reads of the run's config, built once at the edge.

A worker does not receive the ``TrainerConfig`` tree. Where the workers are built (the RL
trainer's ``build_roles``, the asynchronous rollout's copy) one function per role turns the
config into a small frozen, picklable spec holding the values that role reads, with every
derived value resolved here, once: the engine strategy, the role's precision as
:class:`~verl.engine.options.EngineOptions`, the micro-batch split, the loss settings, the
rollout backend's constructor options.

=======================  ====================================  ==============================
function                 spec                                  worker
=======================  ====================================  ==============================
:func:`actor_rollout_ref_spec`  :class:`ActorRolloutRefSpec`   ``ActorRolloutRefWorker``
  (:func:`actor_spec`,    (:class:`ActorSpec`, :class:`RefSpec`,
  :func:`ref_spec`,       :class:`RolloutSpec`,
  :func:`rollout_spec`,   :class:`TeacherSpec`)
  :func:`teacher_spec`)
:func:`rollout_copy_spec`  :class:`ActorRolloutRefSpec`        ``RolloutCopyWorker``
:func:`teacher_pool_spec`  :class:`TeacherPoolSpec`            ``TeacherWorker``
:func:`critic_spec`      :class:`CriticSpec`                   ``CriticWorker``
:func:`reward_model_spec`  :class:`RewardModelSpec`            ``RewardModelWorker``
=======================  ====================================  ==============================

The values read from the config's precision and rollout keys come from
:mod:`verl.workers.role_options`. What stays with the worker: its device (from its rank), its process group, the run's total
optimizer steps (``init_model(total_steps)``) and the loss functions, bound from the spec at
set-up (:mod:`verl.workers.losses`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from verl.config import TrainerConfig
from verl.config.schema_roles import MicroBatchSplit
from verl.engine.options import EngineOptions
from verl.models.lora import LoraSpec, lora_spec_from_config
from verl.registry import ADVANTAGE_ESTIMATORS, DISTILL_ESTIMATORS
from verl.workers.role_options import (
    dynamic_precision_threshold,
    engine_options,
    precision_options,
    rollout_options,
)

__all__ = [
    "ActorLossSpec",
    "ActorRolloutRefSpec",
    "ActorSpec",
    "BatchingSpec",
    "CriticSpec",
    "DistillLossSpec",
    "ModelSpec",
    "RefSpec",
    "RewardModelSpec",
    "RolloutSpec",
    "TeacherPoolSpec",
    "TeacherSpec",
    "ValueLossSpec",
    "actor_rollout_ref_spec",
    "actor_spec",
    "check_spec",
    "critic_spec",
    "ref_spec",
    "reward_model_spec",
    "rollout_copy_spec",
    "rollout_spec",
    "teacher_pool_spec",
    "teacher_spec",
]

ROLES = ("actor_rollout", "actor_rollout_ref")


# ---------------------------------------------------------------------------- the types
@dataclass(frozen=True)
class ModelSpec:
    """A causal LM (or value model body) to load: ``path`` with these settings."""

    path: str
    tokenizer_path: str
    trust_remote_code: bool
    dtype: str
    override_config: dict[str, Any] = field(default_factory=dict)
    lora: LoraSpec | None = None
    gradient_checkpointing: bool | None = None  # null = decided by the micro-batch tokens


@dataclass(frozen=True)
class BatchingSpec(MicroBatchSplit):
    """How a trained role cuts a step's batch: mini-batches of ``ppo_mini_batch_size``
    prompts (x ``rollout_n`` samples, over all data-parallel ranks), ``ppo_epochs`` passes,
    shuffled; micro-batches by rows or by the token budget (the methods of
    :class:`~verl.config.schema_roles.MicroBatchSplit`), packed or padded."""

    use_dynamic_bsz: bool | None
    ppo_micro_batch_size_per_device: int | None
    ppo_max_token_len_per_device: int | None
    ppo_mini_batch_size: int
    rollout_n: int
    ppo_epochs: int
    shuffle: bool
    loss_agg_mode: str
    pack_sequences: bool = False
    share_prompt_prefix: bool = False

    def mini_batch_size(self, data_parallel_size: int) -> int:
        """Samples per mini-batch on one data-parallel rank (sequence group)."""
        return self.ppo_mini_batch_size * self.rollout_n // data_parallel_size


@dataclass(frozen=True)
class DistillLossSpec:
    """The on-policy distillation term of the actor's loss (``algorithm.distill``)."""

    estimator: str
    coef: float
    mix_task_reward: bool
    topk_tail: Any
    needs_topk: bool


@dataclass(frozen=True)
class ActorLossSpec:
    """Every setting of the actor's loss (:func:`verl.workers.losses.bind_actor_loss`)."""

    policy_loss: str
    policy_loss_kwargs: dict[str, Any]
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    loss_agg_mode: str
    loss_scale_factor: float
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    rollout_is_threshold: float | None
    rollout_is_level: str
    rollout_rs_threshold: float | None
    distill: DistillLossSpec | None = None


@dataclass(frozen=True)
class ValueLossSpec:
    """Every setting of the critic's loss (:func:`verl.workers.losses.bind_value_loss`)."""

    cliprange_value: float
    loss_agg_mode: str
    loss_coef: float
    loss_scale_factor: float


@dataclass(frozen=True)
class ActorSpec:
    """The trained policy: its engine, optimizer section, batching and loss."""

    strategy: str
    engine: EngineOptions
    optim: Any  # the role's OptimConfig (numbers), an OptimSpec once total_steps is known
    batching: BatchingSpec
    loss: ActorLossSpec
    logprob_chunk_size: int
    checkpoint_tokens: int  # most tokens of an update micro-batch (activation checkpointing)


@dataclass(frozen=True)
class RefSpec:
    """The frozen reference policy (a copy of the initial actor, or the LoRA base)."""

    engine: EngineOptions
    precision: str
    dynamic_min_free_gb: float | None  # trainer.dynamic_precision; None = off
    log_prob_micro_batch_size: int | None


@dataclass(frozen=True)
class TeacherSpec:
    """The distillation teacher (``algorithm.distill``), frozen beside the reference.

    ``separate``: the teacher is a worker group of its own (``teacher_pool=separate``); the
    actor worker does not load it and, for ``topk``, computes only the student's top-k ids.
    """

    path: str
    precision: str
    engine: EngineOptions
    log_prob_micro_batch_size: int | None
    needs_topk: bool
    topk: int
    separate: bool = False


@dataclass(frozen=True)
class TeacherPoolSpec:
    """Everything the teacher's own worker group reads (``TeacherWorker``): the teacher, the
    student's model (its tokenizer and dtype), the engine strategy of the teacher's pool and
    the actor's micro-batch split and scoring settings, so that it scores as the colocated
    teacher does (``autocast_dtype``: the actor engine's)."""

    seed: int
    device: str
    use_flash_attention: bool
    model: ModelSpec
    teacher: TeacherSpec
    strategy: str
    batching: BatchingSpec
    logprob_chunk_size: int
    autocast_dtype: Any


@dataclass(frozen=True)
class RolloutSpec:
    """The rollout: backend, its constructor options, default sampling and agent loops."""

    name: str
    options: dict[str, Any]
    n: int
    temperature: float
    top_p: float
    top_k: int
    do_sample: bool
    seed: int | None
    stop: tuple[str, ...]
    log_prob_micro_batch_size: int | None
    with_sum_pi_squared: bool
    multi_turn: Any  # the rollout.multi_turn section (tools, interaction, limits)
    agent: Any  # the rollout.agent section (an agent program)
    reward_manager: str | None
    weight_sync_bucket_mb: float
    weight_sync_timeout_s: float


@dataclass(frozen=True)
class ActorRolloutRefSpec:
    """Everything the hybrid actor / rollout / reference worker reads."""

    role: str
    seed: int
    device: str
    use_flash_attention: bool
    max_prompt_length: int
    max_response_length: int
    model: ModelSpec
    actor: ActorSpec
    rollout: RolloutSpec
    ref: RefSpec | None = None
    teacher: TeacherSpec | None = None


@dataclass(frozen=True)
class CriticSpec:
    """Everything the critic worker reads."""

    seed: int
    device: str
    use_flash_attention: bool
    model: ModelSpec
    strategy: str
    engine: EngineOptions
    optim: Any
    batching: BatchingSpec
    loss: ValueLossSpec
    forward_micro_batch_size: int | None
    checkpoint_tokens: int


@dataclass(frozen=True)
class RewardModelSpec:
    """Everything the reward-model worker reads."""

    device: str
    path: str | None
    tokenizer_path: str | None
    dtype: str
    override_config: dict[str, Any]
    precision: str
    dynamic_min_free_gb: float | None
    micro_batch_size: int
    actor_tokenizer_path: str
    actor_trust_remote_code: bool


def check_spec(spec: Any, cls: type, builder: str) -> None:
    """Raise ``TypeError`` unless ``spec`` is a ``cls`` (a worker given the config tree
    instead names the function that builds its spec)."""
    if not isinstance(spec, cls):
        raise TypeError(
            f"the worker takes a {cls.__name__}, got {type(spec).__name__}; build it from the "
            f"config with verl.workers.specs.{builder}(config)"
        )


def _role_precision(config: Any, role: str) -> str:
    from verl.config.precision import role_precision

    return role_precision(config, role)


# ---------------------------------------------------------------------------- the builders
def _model_spec(model_cfg: Any, path: str, tokenizer_path: str, trust_remote_code: bool) -> Any:
    return ModelSpec(
        path=path,
        tokenizer_path=tokenizer_path,
        trust_remote_code=trust_remote_code,
        dtype=model_cfg.dtype,
        override_config=dict(model_cfg.override_config),
        lora=lora_spec_from_config(model_cfg),
        gradient_checkpointing=model_cfg.enable_gradient_checkpointing,
    )


def _batching(role_cfg: Any, config: TrainerConfig, loss_agg_mode: str) -> BatchingSpec:
    return BatchingSpec(
        use_dynamic_bsz=role_cfg.use_dynamic_bsz,
        ppo_micro_batch_size_per_device=role_cfg.ppo_micro_batch_size_per_device,
        ppo_max_token_len_per_device=role_cfg.ppo_max_token_len_per_device,
        ppo_mini_batch_size=role_cfg.ppo_mini_batch_size,
        rollout_n=config.actor_rollout_ref.rollout.n,
        ppo_epochs=role_cfg.ppo_epochs,
        shuffle=role_cfg.shuffle,
        loss_agg_mode=loss_agg_mode,
        pack_sequences=bool(getattr(role_cfg, "pack_sequences", False)),
        share_prompt_prefix=bool(getattr(role_cfg, "share_prompt_prefix", False)),
    )


def actor_spec(config: TrainerConfig) -> ActorSpec:
    """The trained policy of ``actor_rollout_ref.actor`` (with ``algorithm.distill``'s term)."""
    arr, acfg, data = config.actor_rollout_ref, config.actor_rollout_ref.actor, config.data
    strategy = config.engine_strategy("actor_rollout_ref")
    clip_low, clip_high = acfg.clip_ratio_bounds
    dcfg = config.algorithm.distill
    distill = None
    if dcfg.enable:
        distill = DistillLossSpec(
            estimator=dcfg.estimator,
            coef=dcfg.coef,
            mix_task_reward=dcfg.mix_task_reward,
            topk_tail=dcfg.topk_tail,
            needs_topk=bool(DISTILL_ESTIMATORS.needs(dcfg.estimator, "needs_topk")),
        )
    # seq-mean-token-sum-norm divides by a constant; left to agg_loss's default it would be
    # each micro-batch's trimmed response width, and the gradient would depend on the split.
    scale_factor = acfg.loss_scale_factor
    if scale_factor is None:
        scale_factor = data.max_response_length
    loss = ActorLossSpec(
        policy_loss=acfg.policy_loss,
        policy_loss_kwargs=dict(acfg.policy_loss_kwargs),
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        clip_ratio_c=acfg.clip_ratio_c,
        loss_agg_mode=acfg.resolved_loss_agg_mode,
        loss_scale_factor=scale_factor,
        entropy_coeff=acfg.entropy_coeff,
        use_kl_loss=acfg.use_kl_loss,
        kl_loss_coef=acfg.kl_loss_coef,
        kl_loss_type=acfg.kl_loss_type,
        rollout_is_threshold=acfg.rollout_is_threshold,
        rollout_is_level=acfg.rollout_is_level,
        rollout_rs_threshold=acfg.rollout_rs_threshold,
        distill=distill,
    )
    shared = acfg.pack_sequences and acfg.share_prompt_prefix
    fsdp = engine_options(
        strategy,
        acfg.fsdp_config,
        acfg.ulysses_sequence_parallel_size,
        acfg.tensor_parallel_size,
    )
    engine = EngineOptions(
        grad_clip=acfg.grad_clip, **precision_options(config, "actor", strategy, fsdp)
    )
    return ActorSpec(
        strategy=strategy,
        engine=engine,
        optim=acfg.optim,
        batching=_batching(acfg, config, acfg.resolved_loss_agg_mode),
        loss=loss,
        logprob_chunk_size=acfg.logprob_chunk_size,
        checkpoint_tokens=acfg.max_update_tokens(
            data.max_prompt_length, data.max_response_length, arr.rollout.n if shared else 1
        ),
    )


def ref_spec(config: TrainerConfig) -> RefSpec:
    """The reference policy of ``actor_rollout_ref.ref`` (its engine built unless LoRA)."""
    arr = config.actor_rollout_ref
    strategy = config.engine_strategy("actor_rollout_ref")
    sp = arr.ref.ulysses_sequence_parallel_size
    if sp is None:
        sp = arr.actor.ulysses_sequence_parallel_size
    # the reference's forwards split like the actor's (its tensor ranks hold the same rows)
    fsdp = engine_options(strategy, arr.ref.fsdp_config, sp, arr.actor.tensor_parallel_size)
    return RefSpec(
        engine=EngineOptions(**precision_options(config, "reference", strategy, fsdp)),
        precision=_role_precision(config, "reference"),
        dynamic_min_free_gb=dynamic_precision_threshold(config, "reference"),
        log_prob_micro_batch_size=arr.ref.log_prob_micro_batch_size_per_device,
    )


def teacher_spec(config: TrainerConfig, strategy: str | None = None) -> TeacherSpec | None:
    """The distillation teacher of ``algorithm.distill`` (None when it is off): an
    inference engine of ``strategy`` (default: the actor's) with the reference's FSDP2
    settings, no sequence parallelism."""
    dcfg, arr = config.algorithm.distill, config.actor_rollout_ref
    if not dcfg.enable:
        return None
    strategy = strategy or config.engine_strategy("actor_rollout_ref")
    precision = dcfg.teacher_precision
    options = engine_options(strategy, arr.ref.fsdp_config, 1)
    if precision in ("fp32", "bf16", "fp16"):
        options["param_dtype"] = precision
    return TeacherSpec(
        path=dcfg.teacher_path,
        precision=precision,
        engine=EngineOptions(**options),
        log_prob_micro_batch_size=(
            dcfg.log_prob_micro_batch_size_per_device
            or arr.ref.log_prob_micro_batch_size_per_device
        ),
        needs_topk=bool(DISTILL_ESTIMATORS.needs(dcfg.estimator, "needs_topk")),
        topk=dcfg.topk,
        separate=dcfg.teacher_pool == "separate",
    )


def teacher_pool_spec(config: TrainerConfig) -> TeacherPoolSpec:
    """The teacher's own worker group (``algorithm.distill.teacher_pool=separate``): fsdp2
    over its pool's devices when it has several, else the single engine."""
    mcfg, actor = config.actor_rollout_ref.model, actor_spec(config)
    strategy = "fsdp2" if config.dp_size("teacher") > 1 else "single"
    return TeacherPoolSpec(
        seed=config.trainer.seed,
        device=config.trainer.device,
        use_flash_attention=config.trainer.use_flash_attention,
        model=_model_spec(
            mcfg, mcfg.path, mcfg.tokenizer_path or mcfg.path, mcfg.trust_remote_code
        ),
        teacher=teacher_spec(config, strategy),
        strategy=strategy,
        batching=actor.batching,
        logprob_chunk_size=actor.logprob_chunk_size,
        autocast_dtype=actor.engine.autocast_dtype,
    )


def rollout_spec(config: TrainerConfig) -> RolloutSpec:
    """The rollout of ``actor_rollout_ref.rollout``: the backend's options resolved here."""
    from verl.rollout import get_rollout_engine

    rcfg = config.actor_rollout_ref.rollout
    reward_model = getattr(config, "reward_model", None)
    return RolloutSpec(
        name=rcfg.name,
        options=rollout_options(config, get_rollout_engine(rcfg.name)),
        n=rcfg.n,
        temperature=rcfg.temperature,
        top_p=rcfg.top_p,
        top_k=rcfg.top_k,
        do_sample=rcfg.do_sample,
        seed=rcfg.seed,
        stop=tuple(rcfg.stop),
        log_prob_micro_batch_size=rcfg.log_prob_micro_batch_size_per_device,
        with_sum_pi_squared=bool(
            ADVANTAGE_ESTIMATORS.needs(config.algorithm.adv_estimator, "needs_sum_pi_squared")
        ),
        multi_turn=rcfg.multi_turn,
        agent=rcfg.agent,
        reward_manager=getattr(reward_model, "reward_manager", None),
        weight_sync_bucket_mb=rcfg.vllm.weight_sync_bucket_mb,
        weight_sync_timeout_s=rcfg.vllm.weight_sync_timeout_s,
    )


def actor_rollout_ref_spec(
    config: TrainerConfig, role: str = "actor_rollout_ref"
) -> ActorRolloutRefSpec:
    """The spec of the hybrid worker: ``role="actor_rollout_ref"`` keeps a reference
    policy, ``"actor_rollout"`` does not; the teacher when ``algorithm.distill.enable``."""
    if role not in ROLES:
        raise ValueError(f"role={role!r}; expected 'actor_rollout' or 'actor_rollout_ref'")
    arr = config.actor_rollout_ref
    mcfg = arr.model
    return ActorRolloutRefSpec(
        role=role,
        seed=config.trainer.seed,
        device=config.trainer.device,
        use_flash_attention=config.trainer.use_flash_attention,
        max_prompt_length=config.data.max_prompt_length,
        max_response_length=config.data.max_response_length,
        model=_model_spec(
            mcfg, mcfg.path, mcfg.tokenizer_path or mcfg.path, mcfg.trust_remote_code
        ),
        actor=actor_spec(config),
        rollout=rollout_spec(config),
        ref=ref_spec(config) if role == "actor_rollout_ref" else None,
        teacher=teacher_spec(config),
    )


def rollout_copy_spec(config: TrainerConfig) -> ActorRolloutRefSpec:
    """The asynchronous rollout's copy of the policy: built like the actor, without a
    reference, on the single engine (one process holds the whole copy: a plain module,
    never sharded; the actor may be FSDP2 over several ranks, its full state dict is what
    the copy loads)."""
    config = copy.deepcopy(config)
    config.actor_rollout_ref.actor.strategy = "single"
    return actor_rollout_ref_spec(config, role="actor_rollout")


def critic_spec(config: TrainerConfig) -> CriticSpec:
    """The value model of ``critic`` (``critic.model.path`` null: the actor's model)."""
    ccfg, data = config.critic, config.data
    strategy = config.engine_strategy("critic")
    fsdp = engine_options(
        strategy,
        ccfg.fsdp_config,
        ccfg.ulysses_sequence_parallel_size,
        ccfg.tensor_parallel_size,
    )
    path = ccfg.model.path or config.actor_rollout_ref.model.path
    return CriticSpec(
        seed=config.trainer.seed,
        device=config.trainer.device,
        use_flash_attention=config.trainer.use_flash_attention,
        model=_model_spec(ccfg.model, path, path, config.actor_rollout_ref.model.trust_remote_code),
        strategy=strategy,
        engine=EngineOptions(
            grad_clip=ccfg.grad_clip, **precision_options(config, "critic", strategy, fsdp)
        ),
        optim=ccfg.optim,
        batching=_batching(ccfg, config, ccfg.loss_agg_mode),
        loss=ValueLossSpec(
            cliprange_value=ccfg.cliprange_value,
            loss_agg_mode=ccfg.loss_agg_mode,
            loss_coef=ccfg.loss_coef,
            # a constant, as the actor's: not each micro-batch's trimmed width
            loss_scale_factor=data.max_response_length,
        ),
        forward_micro_batch_size=ccfg.forward_micro_batch_size_per_device,
        checkpoint_tokens=ccfg.max_update_tokens(data.max_prompt_length, data.max_response_length),
    )


def reward_model_spec(config: TrainerConfig) -> RewardModelSpec:
    """The sequence-classification reward model of ``reward_model``."""
    rcfg, mcfg = config.reward_model, config.reward_model.model
    return RewardModelSpec(
        device=config.trainer.device,
        path=mcfg.path,
        tokenizer_path=mcfg.tokenizer_path or mcfg.path,
        dtype=mcfg.dtype,
        override_config=dict(mcfg.override_config),
        precision=_role_precision(config, "reward"),
        dynamic_min_free_gb=dynamic_precision_threshold(config, "reward"),
        micro_batch_size=rcfg.micro_batch_size_per_device,
        actor_tokenizer_path=config.tokenizer_path,
        actor_trust_remote_code=config.actor_rollout_ref.model.trust_remote_code,
    )
