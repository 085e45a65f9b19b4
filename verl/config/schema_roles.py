"""Config sections of the model-holding roles: actor / rollout / reference, critic, reward model.

The trained roles (actor, critic) share their keys through :class:`TrainedRoleConfig`; the
rollout's sections (sampling, multi-turn tools, agent programs, serving engines) live in
``verl.config.schema_rollout``.

Key names follow upstream verl where the same setting exists (``ppo_mini_batch_size``,
``clip_ratio``, ``fsdp_config.param_offload`` ...), with ``_per_device`` in place of
``_per_gpu`` since a device may be a CPU process. Batch-size units are stated in
``docs/config.md`` ("Batch sizes") and in each field's help.
"""

# `entry(...)` returns a dataclasses.Field (default_factory for mutables), which RUF009 cannot see.
# ruff: noqa: RUF009

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from verl.config._fields import (
    EMBEDDED_MODEL,
    CheckpointContent,
    Dtype,
    Precision,
    Strategy,
    WarmupStyle,
    entry,
)
from verl.config.schema_reward import JudgeConfig, RemoteRewardConfig, RewardOverlapConfig
from verl.config.schema_rollout import RolloutConfig
from verl.registry import POLICY_LOSSES

# Tokens per micro-batch when ppo_max_token_len_per_device is null: measured on a 2-core
# CPU (README "Against TRL", docs/memory.md) as near the fastest split while holding a
# fraction of the activations of one micro-batch of the whole mini-batch.
DEFAULT_TOKEN_BUDGET = 1024
# Help of the actor's and critic's enable_gradient_checkpointing. The threshold and the
# estimate live in verl.models.precision (AUTO_CHECKPOINTING_MIN_BYTES), which the config
# layer may not import; tests/models/test_precision.py checks that the two agree.
CHECKPOINTING_HELP = (
    "recompute activations in backward; null = on when a micro-batch's activations are "
    "estimated above 512 MiB (docs/memory.md)"
)


class MicroBatchSplit:
    """How a trained role (actor, critic) cuts its passes into micro-batches.

    A pass uses row counts when its row-count key is set (``ppo_micro_batch_size_per_device``
    for the update; the log-prob / value passes' own keys, else the update's) and
    ``use_dynamic_bsz`` is not true; otherwise micro-batches of at most :attr:`token_budget`
    tokens. ``use_dynamic_bsz=true`` forces the token budget, ``false`` forces row counts.
    """

    use_dynamic_bsz: bool | None
    ppo_micro_batch_size_per_device: int | None
    ppo_max_token_len_per_device: int | None

    def rows_per_micro_batch(self, pass_rows: int | None = None) -> int | None:
        """Rows per micro-batch of a pass whose own row count is ``pass_rows`` (null: the
        update's), or ``None`` when the pass is split by :attr:`token_budget`."""
        if self.use_dynamic_bsz:
            return None
        rows = pass_rows if pass_rows is not None else self.ppo_micro_batch_size_per_device
        if rows is None and self.use_dynamic_bsz is False:
            raise ValueError(
                "use_dynamic_bsz=false needs ppo_micro_batch_size_per_device (row-count "
                "micro-batches); set it, or leave use_dynamic_bsz null for the token budget"
            )
        return rows

    @property
    def uses_token_budget(self) -> bool:
        """The update's micro-batches are formed by :attr:`token_budget`."""
        return self.rows_per_micro_batch() is None

    @property
    def token_budget(self) -> int:
        """Tokens per micro-batch per device (``ppo_max_token_len_per_device``, null =
        ``DEFAULT_TOKEN_BUDGET``)."""
        budget = self.ppo_max_token_len_per_device
        return DEFAULT_TOKEN_BUDGET if budget is None else budget

    def max_update_tokens(
        self, max_prompt: int, max_response: int, rows_per_prompt: int = 1
    ) -> int:
        """Most tokens one update micro-batch computes: the token budget, or for row-count
        micro-batches each row's prompt and response. With ``rows_per_prompt`` > 1 (packed
        with shared prompts, ``rollout.n`` rows per prompt) the rows of a micro-batch carry
        at most ``ceil(rows / rows_per_prompt) + 1`` prompts."""
        rows = self.rows_per_micro_batch()
        if rows is None:
            return self.token_budget
        prompts = rows if rows_per_prompt <= 1 else min(rows, -(-rows // rows_per_prompt) + 1)
        return rows * max_response + prompts * max_prompt


@dataclass
class ModelConfig:
    """A causal LM loaded from a local path (or the embedded model)."""

    path: str = entry(
        EMBEDDED_MODEL,
        f"local HF model directory or checkpoint, or '{EMBEDDED_MODEL}' (the embedded model)",
    )
    tokenizer_path: str | None = entry(None, "tokenizer directory; null = model path")
    trust_remote_code: bool = entry(False, "allow model code shipped with the checkpoint")
    enable_gradient_checkpointing: bool | None = entry(None, CHECKPOINTING_HELP)
    dtype: Dtype = entry("fp32", "parameter dtype of the loaded model")
    override_config: dict[str, Any] = entry({}, "entries that override the HF model config")
    lora_rank: int = entry(0, "LoRA adapter rank (peft); 0 = train every weight", ge=0)
    lora_alpha: float = entry(16.0, "LoRA scale: adapters are scaled by alpha / rank", gt=0)
    lora_dropout: float = entry(0.0, "dropout on the LoRA adapters' input", ge=0, lt=1)
    target_modules: list[str] = entry(
        ["all-linear"], "LoRA: module names to adapt (all-linear = every linear but the head)"
    )
    exclude_modules: list[str] = entry([], "LoRA: module names never adapted")


@dataclass
class OptimConfig:
    """AdamW with a warmup then constant/cosine learning-rate schedule."""

    lr: float = entry(1e-6, "peak learning rate", ge=0)
    betas: list[float] = entry([0.9, 0.999], "AdamW betas [beta1, beta2]")
    weight_decay: float = entry(0.01, "AdamW decoupled weight decay", ge=0)
    eps: float = entry(1e-8, "AdamW epsilon", gt=0)
    lr_warmup_steps: int = entry(-1, "linear warmup steps; -1 = use lr_warmup_steps_ratio", ge=-1)
    lr_warmup_steps_ratio: float = entry(0.0, "warmup steps as a fraction of all steps", ge=0, le=1)
    warmup_style: WarmupStyle = entry("constant", "schedule after warmup")
    min_lr_ratio: float = entry(0.0, "cosine schedule floor, as a fraction of lr", ge=0, le=1)
    total_training_steps: int = entry(-1, "schedule length; -1 = set by the trainer", ge=1, off=-1)


@dataclass
class MixedPrecisionConfig:
    """FSDP2 mixed precision: compute dtype of params, gradient reduction and buffers."""

    param_dtype: Dtype = entry("bf16", "dtype parameters are cast to for compute")
    reduce_dtype: Dtype = entry("fp32", "dtype of gradient reduction")
    buffer_dtype: Dtype = entry("fp32", "dtype of module buffers")


@dataclass
class FSDPConfig:
    """FSDP2 wrapping of a trained model (ignored by strategy=single)."""

    param_offload: bool = entry(False, "keep parameters on CPU between uses")
    optimizer_offload: bool = entry(False, "keep optimizer state on CPU between updates")
    reshard_after_forward: bool = entry(True, "free gathered parameters after forward")
    shard_dim: int = entry(
        0,
        "parameter dimension FSDP2 shards along (shard_placement_fn): 0 = rows of a [out, in] "
        "weight, 1 = columns (1-D parameters along 0); same results, different shard shapes",
        ge=0,
        le=1,
    )
    mixed_precision: MixedPrecisionConfig | None = entry(
        None,
        "null = compute in the model dtype; {param_dtype, reduce_dtype, buffer_dtype} "
        "enables FSDP2 mixed precision; reduce_dtype=bf16 reduce-scatters gradients in bf16 "
        "(half the bytes; gradients still kept in fp32)",
    )


@dataclass
class CheckpointConfig:
    """What a checkpoint of this role contains."""

    save_contents: list[CheckpointContent] = entry(
        ["model", "optimizer", "extra"],
        "parts saved: model, optimizer, extra (scheduler, RNG), all needed to resume; "
        "+ hf_model: a loadable HF model in huggingface/ (not for a LoRA critic)",
    )
    load_contents: list[CheckpointContent] | None = entry(
        None,
        "parts restored on resume: null = model, optimizer, extra (hf_model is never read); "
        "only all three are implemented",
    )


@dataclass
class TrainedRoleConfig(MicroBatchSplit):
    """The keys every trained role (``actor_rollout_ref.actor``, ``critic``) has, declared
    once: precision, engine, batching into mini- and micro-batches, packing, sequence
    parallelism, optimizer, FSDP2 wrapping and checkpoint contents."""

    precision: Precision | None = entry(
        None,
        "compute precision of the role (the actor's is also the rollout's): none, fp32, "
        "bf16, fp16, auto; null = trainer.mixed_precision",
    )
    strategy: Strategy = entry(
        "auto", "train engine: single (one process), fsdp2, or auto (fsdp2 for > 1 device)"
    )
    ppo_mini_batch_size: int = entry(
        4, "prompts per optimizer step (multiplied by rollout.n into samples)", ge=1
    )
    ppo_micro_batch_size_per_device: int | None = entry(
        None,
        "samples per forward/backward per device; null = micro-batches of at most "
        "ppo_max_token_len_per_device tokens",
        ge=1,
    )
    use_dynamic_bsz: bool | None = entry(
        None,
        "micro-batches by the token budget (true) or by row counts (false) in the update and "
        "the no-gradient passes (the actor's old/ref log-probs, the critic's values); null = "
        "token budget for a pass without a row count",
    )
    ppo_max_token_len_per_device: int | None = entry(
        None,
        "token budget per micro-batch per device (real tokens with pack_sequences, else rows "
        f"x padded length); a longer sample goes alone; null = {DEFAULT_TOKEN_BUDGET}",
        ge=1,
    )
    ppo_epochs: int = entry(1, "passes over each step's batch", ge=1)
    shuffle: bool = entry(True, "shuffle samples between mini-batches")
    grad_clip: float = entry(1.0, "max global gradient norm", gt=0)
    pack_sequences: bool = entry(
        True,
        "forwards (log-probs or values) and the update run on each micro-batch's real tokens "
        "packed end to end (position ids restart per sequence, attention stays within it): "
        "no padding compute; false = padded rows",
    )
    share_prompt_prefix: bool = entry(
        True,
        "with pack_sequences, rows with identical prompt ids (a GRPO group) are packed as "
        "one prompt + their responses (explicit attention mask; same results): each prompt "
        "computed once in the update and the no-gradient passes; micro-batches keep a group "
        "together. sdpa/eager attention only (others: plain packing)",
    )
    ulysses_sequence_parallel_size: int = entry(
        1,
        "Ulysses sequence parallelism: ranks that split each micro-batch's tokens (and, "
        "around attention, its heads) in the forward and update passes; must divide the "
        "role's ranks and the model's attention heads; fsdp2 only; 1 = off "
        "(docs/distributed.md)",
        ge=1,
    )
    tensor_parallel_size: int = entry(
        1,
        "tensor parallelism: ranks that split each layer's heads and MLP width (and the "
        "vocabulary) and compute the same rows; must divide the role's ranks, the model's "
        "query and key/value heads and intermediate size; fsdp2 only, Llama / Qwen2 "
        "models; the reference follows the actor's; 1 = off (docs/distributed.md)",
        ge=1,
    )
    optim: OptimConfig = entry(OptimConfig, "optimizer of the trained model")
    fsdp_config: FSDPConfig = entry(FSDPConfig, "FSDP2 wrapping of the trained model")
    checkpoint: CheckpointConfig = entry(CheckpointConfig, "checkpoint contents of the role")


@dataclass
class ActorConfig(TrainedRoleConfig):
    """The policy being trained: PPO-style clipped updates (the trained-role keys of
    :class:`TrainedRoleConfig`, then the policy's own)."""

    recompute_old_log_prob: bool | None = entry(
        None,
        "run the separate old-log-prob pass; null = auto: skipped (the update's own detached "
        "log-probs are the old ones) when the update is one optimizer step per batch "
        "(ppo_epochs=1, ppo_mini_batch_size >= data.train_batch_size) and nothing reads "
        "old_log_probs before it (KL in reward, an estimator that takes them)",
    )
    clip_ratio: float = entry(0.2, "PPO clip epsilon", gt=0)
    clip_ratio_low: float | None = entry(None, "lower clip epsilon; null = clip_ratio")
    clip_ratio_high: float | None = entry(None, "upper clip epsilon; null = clip_ratio", gt=0)
    clip_ratio_c: float = entry(3.0, "dual-clip bound for negative advantages (> 1)", gt=1)
    loss_agg_mode: str | None = entry(
        None,
        "how token losses become one scalar: token-mean, seq-mean-token-sum, "
        "seq-mean-token-mean, seq-mean-token-sum-norm; null = the policy loss's own "
        "(gspo: seq-mean-token-mean), else token-mean",
    )
    loss_scale_factor: float | None = entry(
        None, "constant divisor for seq-mean-token-sum-norm; null = max_response_length", gt=0
    )
    policy_loss: str = entry(
        "vanilla", "policy-loss name (verl.algorithms registry)", nonempty=True
    )
    policy_loss_kwargs: dict[str, Any] = entry(
        {},
        "hyperparameters of the policy loss by name, e.g. clip_cov_ratio, kl_cov_ratio, "
        "ppo_kl_coef; checked against the loss's registry entry",
    )
    rollout_is_threshold: float | None = entry(
        None,
        "truncated importance sampling: weight each token's policy loss by "
        "min(exp(old_log_prob - rollout_log_prob), threshold); null = off",
        gt=0,
    )
    rollout_is_level: Literal["token", "sequence"] = entry(
        "token",
        "ratio that rollout_is_threshold truncates: token (per token) or sequence (the "
        "product over the response, one weight per sequence)",
    )
    rollout_rs_threshold: float | None = entry(
        None,
        "masked importance sampling: drop (weight 0) sequences whose geometric-mean "
        "ratio exp(mean(old_log_prob - rollout_log_prob)) leaves [1/threshold, threshold]; "
        "> 1; null = off",
        gt=1,
    )
    entropy_coeff: float = entry(0.0, "entropy bonus coefficient")
    use_kl_loss: bool = entry(False, "add KL(actor || ref) to the loss (GRPO style)")
    kl_loss_coef: float = entry(0.001, "coefficient of the KL loss", ge=0)
    kl_loss_type: str = entry(
        "low_var_kl",
        "KL estimator of the KL loss: k1 (kl), abs, k2 (mse), k3 (low_var_kl); suffix + "
        "for k2's gradient",
    )
    logprob_chunk_size: int = entry(
        512,
        "tokens whose float32 logits exist at once when computing log-probs (bounds memory)",
        ge=1,
    )

    @property
    def clip_ratio_bounds(self) -> tuple[float, float]:
        """``(eps_low, eps_high)``: the ratio is clipped to ``[1 - eps_low, 1 + eps_high]``."""
        low, high = self.clip_ratio_low, self.clip_ratio_high
        return (self.clip_ratio if low is None else low, self.clip_ratio if high is None else high)

    @property
    def resolved_loss_agg_mode(self) -> str:
        """``loss_agg_mode``, or when null the policy loss's registry default
        (``default_loss_agg_mode``: GSPO's is ``seq-mean-token-mean``), else ``token-mean``."""
        if self.loss_agg_mode is not None:
            return self.loss_agg_mode
        return POLICY_LOSSES.needs(self.policy_loss, "default_loss_agg_mode", None) or "token-mean"


@dataclass
class RefFSDPConfig:
    """FSDP2 wrapping of the frozen reference model."""

    param_offload: bool = entry(False, "keep reference parameters on CPU between uses")
    reshard_after_forward: bool = entry(True, "free gathered parameters after forward")


@dataclass
class RefConfig:
    """The frozen reference policy (used when a KL term is on)."""

    precision: Precision | None = entry(
        None,
        "reference compute precision: none, fp32, bf16, fp16, fp8, int4, auto; "
        "null = trainer.mixed_precision",
    )
    log_prob_micro_batch_size_per_device: int | None = entry(
        None,
        "samples per forward when computing reference log-probs; null = as the actor's "
        "update (its token budget by default)",
        ge=1,
    )
    ulysses_sequence_parallel_size: int | None = entry(
        None,
        "sequence-parallel ranks of the reference log-prob pass; null = as the actor's",
        ge=1,
    )
    fsdp_config: RefFSDPConfig = entry(RefFSDPConfig, "reference FSDP2 wrapping")


@dataclass
class ActorRolloutRefConfig:
    """The hybrid worker: actor, rollout and reference share one model path."""

    model: ModelConfig = entry(ModelConfig, "policy model (also the reference)")
    actor: ActorConfig = entry(ActorConfig, "policy training")
    rollout: RolloutConfig = entry(RolloutConfig, "generation")
    ref: RefConfig = entry(RefConfig, "reference policy")


@dataclass
class CriticModelConfig:
    """The value model: a causal LM body with a scalar head."""

    path: str | None = entry(None, "value model path; null = actor_rollout_ref.model.path")
    tokenizer_path: str | None = entry(None, "tokenizer directory; null = the model's")
    dtype: Dtype = entry("fp32", "parameter dtype of the loaded model")
    enable_gradient_checkpointing: bool | None = entry(None, CHECKPOINTING_HELP)
    override_config: dict[str, Any] = entry({}, "entries that override the HF model config")
    lora_rank: int = entry(
        0, "LoRA adapter rank of the body (peft; the value head trains fully); 0 = off", ge=0
    )
    lora_alpha: float = entry(
        16.0, "LoRA scale numerator: adapters are scaled by alpha / rank", gt=0
    )
    lora_dropout: float = entry(0.0, "dropout on the LoRA adapters' input", ge=0, lt=1)
    target_modules: list[str] = entry(
        ["all-linear"], "LoRA: module names of the body to adapt (all-linear = every linear)"
    )
    exclude_modules: list[str] = entry([], "LoRA: module names never adapted")


@dataclass
class CriticConfig(TrainedRoleConfig):
    """The value function, trained by clipped value regression (the trained-role keys of
    :class:`TrainedRoleConfig`, then the critic's own)."""

    enable: bool | None = entry(None, "null = on iff algorithm.adv_estimator needs values (gae)")
    model: CriticModelConfig = entry(CriticModelConfig, "value model")
    optim: OptimConfig = entry(OptimConfig(lr=1e-5), "critic optimizer")
    forward_micro_batch_size_per_device: int | None = entry(
        None,
        "samples per forward when computing values (no gradient); null = as the update",
        ge=1,
    )
    cliprange_value: float = entry(0.5, "value clip range around the old values", gt=0)
    loss_coef: float = entry(1.0, "multiplier of the value loss", gt=0)
    loss_agg_mode: str = entry(
        "token-mean",
        "how token losses become one scalar: token-mean, seq-mean-token-sum, "
        "seq-mean-token-mean, seq-mean-token-sum-norm",
    )


@dataclass
class RewardModelModelConfig:
    """A sequence-classification reward model."""

    path: str | None = entry(None, "reward model path (required when reward_model.enable)")
    tokenizer_path: str | None = entry(None, "tokenizer directory; null = model path")
    dtype: Dtype = entry("fp32", "parameter dtype of the loaded model")
    override_config: dict[str, Any] = entry({}, "entries that override the HF model config")


@dataclass
class OverlongBufferConfig:
    """DAPO soft overlong penalty: linear penalty over the last ``len`` response tokens."""

    enable: bool = entry(False, "penalise responses that enter the buffer")
    len: int = entry(0, "buffer length in tokens at the end of max_response_length")
    penalty_factor: float = entry(1.0, "penalty at the very end of the buffer", ge=0)


@dataclass
class RewardModelConfig:
    """Scoring: rule-based reward manager and optional model-based reward."""

    enable: bool = entry(
        False, "score training responses with a reward model, not the rule scorers"
    )
    model: RewardModelModelConfig = entry(RewardModelModelConfig, "reward model")
    precision: Precision | None = entry(
        None,
        "reward model compute precision: none, fp32, bf16, fp16, fp8, int4, auto; "
        "null = trainer.mixed_precision",
    )
    micro_batch_size_per_device: int = entry(8, "samples per reward-model forward", ge=1)
    reward_manager: str = entry("naive", "name in the verl.rewards registry", nonempty=True)
    normalize: bool = entry(False, "normalise training scores by their running mean/std")
    clip_range: list[float] | None = entry(None, "[lo, hi] clip of scores; null = no clip")
    timeout_s: float | None = entry(
        None,
        "per-sample scoring timeout in seconds; null = none for built-in scorers, 30 s for a custom reward function (always run in a worker process)",
        gt=0,
    )
    overlong_buffer: OverlongBufferConfig = entry(OverlongBufferConfig, "overlong penalty")
    max_abs_reward: float = entry(
        1e6, "a score with |r| above this is a failure (reward/out_of_bound), scored 0", gt=0
    )
    max_failure_rate: float | None = entry(
        0.5,
        "stop the run when more than this fraction of a training step's reward calls fail "
        "(1.0 = only when all fail; null = never)",
        ge=0.0,
        le=1.0,
    )
    val_max_failure_rate: float | None = entry(
        1.0,
        "the same for each validation batch (1.0 = stop only when every call failed)",
        ge=0.0,
        le=1.0,
    )
    judge: JudgeConfig = entry(JudgeConfig, "an LLM judge as a reward source (docs/judge.md)")
    remote: RemoteRewardConfig = entry(RemoteRewardConfig, "a scoring service over HTTP")
    mixture: dict[str, float] = entry(
        {},
        "weights of reward sources by name (rules, model, judge, remote), summed into one "
        "score; {} = one source: the reward model (enable), else the judge, the remote "
        "service, the rules",
    )
    overlap: RewardOverlapConfig = entry(RewardOverlapConfig, "scoring overlapped with generation")
