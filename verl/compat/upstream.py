"""Upstream verl's run-script keys, read onto this schema.

Upstream verl's example scripts (``examples/*/run_*.sh``) set keys that this schema spells
differently, or that configure machinery this build does not have (GPU engine knobs,
Ascend features, sequence parallelism). So that such a script runs as pasted, each key of
:data:`UPSTREAM_KEYS` is, by its value:

- **renamed** to the native key with the same meaning (``*_per_gpu`` becomes
  ``*_per_device`` everywhere; ``model.use_remove_padding`` is ``pack_sequences``);
- **dropped with a note** when the value asks for what happens here anyway, or for a
  setting that changes speed or memory and never results (an engine's eager mode, batch
  balancing across ranks, the log-prob passes' token budgets);
- **refused** (:class:`~verl.compat.aliases.AliasError`) when the value would change results
  and has no native meaning; the message says what to use instead.

Every rename and drop logs one WARNING on the ``verl.compat`` logger naming the native
key or the reason. :func:`translate_upstream` runs inside
:func:`verl.compat.aliases.translate_tree`, so YAML files and command-line overrides read
the same table. ``docs/config.md`` lists it (a test keeps the two in step).

Two spellings of one native key (an upstream key and the native key, or two upstream keys)
must agree, in a YAML file and on the command line alike; :func:`reconcile` holds the one
pair whose upstream meaning combines two different values: ``data.filter_overlong_prompts=
True`` with ``data.truncation=error`` (or ``left``) drops long prompts, because upstream
filters them out before its truncation applies to what remains.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("verl.compat")

__all__ = [
    "OFFLINE_UPSTREAM_KEYS",
    "UPSTREAM_KEYS",
    "UpstreamKey",
    "reconcile",
    "short_repr",
    "translate_upstream",
]

DROP = object()  # UpstreamKey.value's answer for "drop this value with the reason"


@dataclass(frozen=True)
class UpstreamKey:
    """How one upstream key is read.

    ``native``: the key it becomes (``None``: dropped). ``keeps``: the values that are
    dropped or renamed (``None``: any value); another value is refused with ``refusal``.
    ``reason``: why a dropped key changes nothing here. ``value``: maps the upstream value
    to the native one (default: unchanged), or to :data:`DROP` to drop it after all.
    ``reads``: the docs table's account of a key whose reading is more than a rename or a
    drop. ``choice``: the key is a Hydra config-group choice (``engine=fsdp``): only a
    string value is read by this entry, a mapping there is the native section.
    """

    native: str | None = None
    reason: str = ""
    keeps: tuple[Any, ...] | None = None
    refusal: str = ""
    value: Callable[[Any], Any] | None = None
    reads: str = ""
    choice: bool = False


def _drop(reason: str, keeps: tuple[Any, ...] | None = None, refusal: str = "") -> UpstreamKey:
    return UpstreamKey(reason=reason, keeps=keeps, refusal=refusal)


_NO_SP = (
    "sequence parallelism (Ulysses) is not implemented here; set it to 1 (long sequences: "
    "activation checkpointing, actor.logprob_chunk_size, a smaller token budget)"
)
_LOG_PROB_BUDGET = (
    "the log-prob passes micro-batch by the actor's own settings (actor.use_dynamic_bsz, "
    "actor.ppo_max_token_len_per_device, rollout/ref.log_prob_micro_batch_size_per_device); "
    "micro-batching changes memory and speed, never the log-probs"
)
_NOT_HERE = "is not implemented here; leave it null"


_SPEED = "speed and memory only, never results"
_MEGATRON = (
    "Megatron-LM is not available here (it needs CUDA GPUs and Megatron-Core; there is no "
    "Megatron engine in this build): the roles train with FSDP2 (actor.strategy=fsdp2, "
    "critic.strategy=fsdp2; remove the megatron.* keys), or strategy=auto; Megatron's "
    "sequence parallelism has an FSDP2 counterpart: actor_rollout_ref.actor."
    "ulysses_sequence_parallel_size=N (critic.ulysses_sequence_parallel_size)"
)
_PROFILER = (
    "upstream's profilers (nsys, npu, torch memory) record a run and change nothing of its "
    "results; the torch profiler here is trainer.profile_steps (Chrome traces in log_dir)"
)
_VISION = "no image or video inputs: this build trains text-only models"
_MICRO = (
    "upstream's global micro-batch size (replaced there by *_per_gpu); micro-batching changes "
    "memory and speed, never the loss: the native key is {native}"
)
_ROLLOUT_PARALLEL = (
    "it splits the rollout engine over {what} (memory and speed: the same samples); the "
    "native rollout generates from the actor's own weights in its worker, a vLLM rollout's "
    "own tensor parallelism is rollout.vllm.tensor_parallel_size"
)


class Refused(Exception):
    """Raised by an :attr:`UpstreamKey.value` function for a value it refuses (the message
    says why and what to use); read as the key's refusal."""


def _strategy(key: str, fsdp: str, why: str) -> UpstreamKey:
    """A native strategy key that also takes upstream's value ``fsdp`` (FSDP1), read as
    ``fsdp``: FSDP1 and FSDP2 shard the same data-parallel training (the same results).
    Upstream's ``megatron`` is refused: there is no Megatron engine here."""

    def read(value: Any) -> Any:
        if value == "megatron":
            raise Refused(_MEGATRON)
        return fsdp if value == "fsdp" else value

    return UpstreamKey(
        native=key,
        value=read,
        reads=f"fsdp: `{fsdp}` ({why}); megatron refused (no Megatron engine: it needs CUDA "
        "GPUs and Megatron-Core); the native values as they are",
    )


_RL_FSDP = "upstream's FSDP1; FSDP2 shards the same training, with the same results"
# The offline engine runs fsdp2 in a process group (torchrun, or Ray ranks) and one process
# unwrapped: auto is fsdp2 on several ranks, single on one, as upstream's FSDP on one rank
# is one process's training.
_OFFLINE_FSDP = (
    "FSDP2 on several ranks (torchrun or trainer.n_gpus_per_node), one unwrapped process on "
    "one: upstream's FSDP1 on one rank trains the same"
)


# The RL trainer's keys (TrainerConfig), upstream spelling -> how it is read.
UPSTREAM_KEYS: dict[str, UpstreamKey] = {
    # data
    "data.filter_overlong_prompts": UpstreamKey(
        native="data.truncation",
        keeps=(True, False),
        value=lambda on: "drop" if on else DROP,
        reason="prompts over data.max_prompt_length then follow data.truncation (default error)",
        reads="true: `data.truncation=drop`, also beside data.truncation=error or left "
        "(upstream filters long prompts out before it truncates what remains), refused beside "
        "data.truncation=truncate; false: dropped (prompts over data.max_prompt_length then "
        "follow data.truncation, default error)",
    ),
    "data.return_raw_chat": _drop("every batch keeps each row's raw prompt (raw_prompt)"),
    "data.return_raw_input_ids": _drop("every batch keeps each row's raw prompt (raw_prompt)"),
    "data.return_full_prompt": _drop("every batch keeps each row's raw prompt (raw_prompt)"),
    "data.reward_fn_key": _drop(
        "the reward function is chosen by each row's data_source column",
        keeps=("data_source",),
        refusal="rewards are chosen by the data_source column; rename your column to it",
    ),
    "data.custom_cls.path": _drop(
        "no custom dataset class",
        keeps=(None,),
        refusal="custom dataset classes are not supported; give parquet/jsonl files with a "
        "prompt column (docs/data.md)",
    ),
    "data.custom_cls.name": _drop(
        "no custom dataset class", keeps=(None,), refusal="see data.custom_cls.path"
    ),
    # model, actor, rollout, reference
    "actor_rollout_ref.hybrid_engine": _drop(
        "the actor, the rollout and the reference always share one worker (hybrid engine)",
        keeps=(True,),
        refusal="the rollout always shares the actor's worker here; a separate rollout pool "
        "is resource_pool.* with rollout.name=vllm",
    ),
    "actor_rollout_ref.actor.strategy": _strategy(
        "actor_rollout_ref.actor.strategy", "fsdp2", _RL_FSDP
    ),
    "critic.strategy": _strategy("critic.strategy", "fsdp2", _RL_FSDP),
    "actor_rollout_ref.model.use_remove_padding": UpstreamKey(
        native="actor_rollout_ref.actor.pack_sequences"
    ),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": _drop(
        _ROLLOUT_PARALLEL.format(what="devices by tensor slices")
    ),
    "actor_rollout_ref.rollout.gpu_memory_utilization": UpstreamKey(
        native="actor_rollout_ref.rollout.vllm.gpu_memory_utilization"
    ),
    "actor_rollout_ref.rollout.enforce_eager": UpstreamKey(
        native="actor_rollout_ref.rollout.vllm.enforce_eager"
    ),
    "actor_rollout_ref.rollout.free_cache_engine": _drop(
        "a rollout engine sleeps after generating and wakes before, always"
    ),
    "actor_rollout_ref.rollout.calculate_log_probs": _drop(
        "every rollout returns its sampling log-probs (rollout_log_probs), and the rollout/* "
        "mismatch metrics are logged every step"
    ),
    "actor_rollout_ref.rollout.mode": _drop(
        "rollouts are generated in the worker before each update from the current weights: "
        "on-policy, as upstream's server mode (async, its default since v0.7) and sync "
        "modes are; one-step-off training is trainer.async_rollout=true",
        keeps=("sync", "async"),
        refusal="the rollout modes are sync and async (both read as the native on-policy "
        "rollout); one-step-off training is trainer.async_rollout=true",
    ),
    "actor_rollout_ref.rollout.max_num_batched_tokens": _drop(
        "a vLLM scheduling limit (speed and memory); not passed on"
    ),
    "actor_rollout_ref.rollout.max_num_seqs": _drop(
        "a vLLM scheduling limit (speed and memory); not passed on"
    ),
    "actor_rollout_ref.rollout.enable_chunked_prefill": _drop(
        "a vLLM scheduling choice (speed and memory); not passed on"
    ),
    "actor_rollout_ref.rollout.disable_log_stats": _drop("vLLM's own statistics are not logged"),
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": _drop(_LOG_PROB_BUDGET),
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": _drop(_LOG_PROB_BUDGET),
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": _drop(_LOG_PROB_BUDGET),
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": _drop(_LOG_PROB_BUDGET),
    # critic
    "critic.model.use_remove_padding": UpstreamKey(native="critic.pack_sequences"),
    "critic.forward_max_token_len_per_gpu": _drop(
        "the critic's value pass micro-batches by critic.ppo_max_token_len_per_device "
        "(or critic.forward_micro_batch_size_per_device); memory and speed only"
    ),
    "critic.model.fsdp_config.param_offload": UpstreamKey(
        native="critic.fsdp_config.param_offload"
    ),
    "critic.model.fsdp_config.optimizer_offload": UpstreamKey(
        native="critic.fsdp_config.optimizer_offload"
    ),
    "critic.model.fsdp_config.reshard_after_forward": UpstreamKey(
        native="critic.fsdp_config.reshard_after_forward"
    ),
    # trainer
    "trainer.balance_batch": _drop(
        "it reorders rows across data-parallel ranks for speed; losses are aggregated over "
        "the whole batch, and micro-batches here are token-budgeted per rank"
    ),
    "trainer.max_actor_ckpt_to_keep": UpstreamKey(native="trainer.max_ckpt_to_keep"),
    "trainer.max_critic_ckpt_to_keep": UpstreamKey(native="trainer.max_ckpt_to_keep"),
    "trainer.del_local_ckpt_after_load": _drop(
        "checkpoints are kept after a resume",
        keeps=(False,),
        refusal="checkpoints are never deleted on load here (retention: trainer.max_ckpt_to_keep)",
    ),
    "trainer.esi_redundant_time": _drop(
        "an Ascend elastic-training setting; nothing here reads it"
    ),
    "trainer.ray_wait_register_center_timeout": _drop(
        "upstream's worker registration; Ray worker groups here report a start-up failure "
        "by rank (trainer.worker_heartbeat_timeout for stalls)"
    ),
    "trainer.default_hdfs_dir": _drop(
        "no HDFS copy", keeps=(None,), refusal="copying checkpoints to HDFS " + _NOT_HERE
    ),
    "ray_init.num_cpus": _drop(
        "a local Ray cluster gets max(the machine's CPUs, the run's processes) logical CPUs"
    ),
    "ray_init.timeline_json_file": _drop(
        "no Ray timeline", keeps=(None,), refusal="Ray timelines " + _NOT_HERE
    ),
}

# FSDP wrapping knobs, wherever upstream puts a role's fsdp_config
for _fsdp in (
    "actor_rollout_ref.actor.fsdp_config",
    "actor_rollout_ref.ref.fsdp_config",
    "critic.model.fsdp_config",
):
    UPSTREAM_KEYS[f"{_fsdp}.fsdp_size"] = _drop(
        "FSDP2 shards over all of the role's ranks",
        keeps=(-1,),
        refusal="hybrid sharding (FSDP within groups of ranks) is not implemented; set -1",
    )
    UPSTREAM_KEYS[f"{_fsdp}.wrap_policy.min_num_params"] = _drop(
        "FSDP2 wraps each decoder layer (and the whole model) here; the wrapping changes "
        "memory and speed, not results"
    )
    UPSTREAM_KEYS[f"{_fsdp}.wrap_policy.transformer_layer_cls_to_wrap"] = _drop(
        "FSDP2 wraps each decoder layer (the model's own layer class) here"
    )


def _choice_value(allowed: dict[Any, Any], refusal: str) -> Callable[[Any], Any]:
    def read(value: Any) -> Any:
        if value in allowed:
            return allowed[value]
        raise Refused(refusal)

    return read


def _logger_value(value: Any) -> Any:
    """``trainer.logger=console``: one sink written as a string is a list of one."""
    return [value] if isinstance(value, str) else value


def _tool_config(value: Any) -> Any:
    """Upstream's tool YAML: one ``multi_turn.tools`` entry ``{path: the YAML, name: its
    tool_schema's function name}`` per tool. Only the names are read here; what each
    ``class_name`` runs as (or why it is refused) is decided when the tools load, at
    start-up before any model (``verl.tools.upstream_adapter``)."""
    if value is None:
        return DROP
    import yaml

    path = os.path.abspath(os.fspath(value))
    if not os.path.isfile(path):
        raise Refused(f"tool config {path}: no such file")
    try:
        with open(path, encoding="utf-8") as fh:
            tools = (yaml.safe_load(fh) or {}).get("tools")
        names = [entry["tool_schema"]["function"]["name"] for entry in tools]
    except (yaml.YAMLError, AttributeError, KeyError, TypeError) as exc:
        raise Refused(
            f"tool config {path}: not upstream's format, a 'tools:' list of {{class_name, "
            f"config, tool_schema: {{type: function, function: {{name, ...}}}}}} "
            f"({type(exc).__name__}: {exc})"
        ) from None
    if not names or not all(isinstance(n, str) and n for n in names):
        raise Refused(f"tool config {path}: no tools, or a tool_schema without a name")
    return [{"path": path, "name": name} for name in names]


def _reward_manager(value: Any) -> Any:
    """Upstream's reward-manager names: ``dapo`` and ``prime`` score each response with the
    data source's scorer, as ``naive`` does (dapo's overlong penalty is
    reward_model.overlong_buffer.*, prime's parallel workers are a speed-up)."""
    if value in ("dapo", "prime"):
        return "naive"
    if value == "batch":
        raise Refused(
            "the batch reward manager calls compute_score(data_sources, solution_strs, "
            "ground_truths, extra_infos) once per batch; here a custom reward function scores "
            "one response (compute_score(data_source, solution_str, ground_truth, extra_info)): "
            "write it per response and use reward_model.reward_manager=naive"
        )
    return value


def _policy_kwarg(name: str, default: float) -> UpstreamKey:
    """``actor.policy_loss.<name>`` (upstream's loss hyperparameter): its default, which is
    the loss's own default here, is dropped; another value goes to policy_loss_kwargs."""
    native = f"actor_rollout_ref.actor.policy_loss_kwargs.{name}"
    return UpstreamKey(
        native=native,
        reason=f"{default} is the loss's own default here",
        value=lambda value: DROP if value == default else value,
        reads=f"{default} (the loss's own default here): dropped; another value: renamed "
        f"`{native}` (checked against the chosen loss's hyperparameters)",
    )


def _device(value: Any) -> Any:
    if value == "npu":
        raise Refused("Ascend NPUs are not supported; the devices here are cpu and cuda (auto)")
    return value


def _defaults_list(value: Any) -> Any:
    """A Hydra ``defaults:`` list of an upstream config file: the config it builds on is this
    build's defaults; a Megatron group is refused."""
    text = repr(value)
    if "megatron" in text:
        raise Refused(_MEGATRON)
    return DROP


_RL_MORE: dict[str, UpstreamKey] = {
    # Hydra's own keys in a --config-name file
    "defaults": UpstreamKey(
        value=_defaults_list,
        reason="the file builds on this build's defaults (Hydra's defaults list is not read)",
        reads="dropped: the file builds on this build's defaults (Hydra's defaults list is not "
        "read); a list naming a Megatron group is refused",
    ),
    "hydra": _drop("Hydra's own settings (search path, run directory) are not read"),
    # data
    "data.filter_overlong_prompts_workers": _drop(
        "prompts are filtered in the loader's process; workers change speed only"
    ),
    "data.trust_remote_code": _drop(
        "the tokenizer is loaded with actor_rollout_ref.model.trust_remote_code"
    ),
    "data.tokenizer": _drop(
        "the tokenizer is the model's",
        keeps=(None,),
        refusal="the prompts are tokenized by the policy's tokenizer: "
        "actor_rollout_ref.model.tokenizer_path",
    ),
    "data.use_shm": _drop("copying the data to shared memory is a loading speed-up"),
    "data.image_key": _drop(_VISION),
    "data.video_key": _drop(_VISION),
    "data.image_patch_size": _drop(_VISION),
    "data.return_multi_modal_inputs": _drop(_VISION),
    "data.validation_shuffle": _drop(
        "validation metrics are means over every validation row, whatever their order"
    ),
    "data.train_max_samples": _drop(
        "every row of the files is used",
        keeps=(-1, None),
        refusal="no row cap here; write the rows to use into the training file",
    ),
    "data.val_max_samples": _drop(
        "every row of the files is used",
        keeps=(-1, None),
        refusal="no row cap here; write the rows to use into the validation file",
    ),
    "data.sampler.class_path": _drop(
        "prompts are drawn by a seeded shuffle (data.shuffle, data.seed)",
        keeps=(None,),
        refusal="custom samplers (curricula) are not supported; order the rows in the file "
        "and set data.shuffle=false",
    ),
    "data.sampler.class_name": _drop(
        "prompts are drawn by a seeded shuffle",
        keeps=(None,),
        refusal="see data.sampler.class_path",
    ),
    "data.datagen.path": _drop(
        "no generated data", keeps=(None,), refusal="dynamic data generation is not supported"
    ),
    "data.datagen.name": _drop(
        "no generated data", keeps=(None,), refusal="dynamic data generation is not supported"
    ),
    "data.apply_chat_template_kwargs": _drop(
        "no extra chat-template arguments",
        keeps=({}, None),
        refusal="chat-template arguments are not passed here; write the prompt text the "
        "template should produce and set data.apply_chat_template=false",
    ),
    "data.tool_config_path": _drop(
        "upstream copies rollout.multi_turn.tool_config_path here, which lists the tools "
        "in the prompts here too"
    ),
    "data.gen_batch_size": _drop(
        "dynamic sampling here generates data.train_batch_size prompts per round until a "
        "step's informative groups are collected (algorithm.filter_groups.max_num_gen_batches "
        "bounds the rounds); a larger generation batch changes speed"
    ),
    # model
    "actor_rollout_ref.model.lora.rank": UpstreamKey(native="actor_rollout_ref.model.lora_rank"),
    "actor_rollout_ref.model.lora.alpha": UpstreamKey(native="actor_rollout_ref.model.lora_alpha"),
    "actor_rollout_ref.model.lora.dropout": UpstreamKey(
        native="actor_rollout_ref.model.lora_dropout"
    ),
    "actor_rollout_ref.model.torch_dtype": UpstreamKey(native="actor_rollout_ref.model.dtype"),
    "actor_rollout_ref.nccl_timeout": _drop(
        "collectives here time out by trainer.worker_heartbeat_timeout (a stalled rank)"
    ),
    # actor
    "actor_rollout_ref.actor.ppo_micro_batch_size": _drop(
        _MICRO.format(native="actor.ppo_micro_batch_size_per_device")
    ),
    "actor_rollout_ref.actor.use_remove_padding": UpstreamKey(
        native="actor_rollout_ref.actor.pack_sequences"
    ),
    "actor_rollout_ref.actor.use_fused_kernels": _drop(f"fused log-prob kernels: {_SPEED}"),
    "actor_rollout_ref.actor.use_prefix_grouper": UpstreamKey(
        native="actor_rollout_ref.actor.share_prompt_prefix"
    ),
    "actor_rollout_ref.actor.use_torch_compile": _drop(f"compiled log-prob kernels: {_SPEED}"),
    "actor_rollout_ref.ref.use_torch_compile": _drop(f"compiled log-prob kernels: {_SPEED}"),
    "actor_rollout_ref.actor.entropy_checkpointing": _drop(_SPEED),
    "actor_rollout_ref.ref.entropy_checkpointing": _drop(_SPEED),
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking": _drop(
        f"{_SPEED} (log-probs are computed in chunks here: actor.logprob_chunk_size)"
    ),
    "actor_rollout_ref.ref.entropy_from_logits_with_chunking": _drop(
        f"{_SPEED} (log-probs are computed in chunks here: actor.logprob_chunk_size)"
    ),
    "actor_rollout_ref.actor.calculate_entropy": _drop(
        "the policy's entropy is computed and logged every step (actor/entropy)"
    ),
    "actor_rollout_ref.actor.calculate_sum_pi_squared": _drop(
        "the estimators here compute the statistics they need"
    ),
    "actor_rollout_ref.actor.sum_pi_squared_checkpointing": _drop(_SPEED),
    "actor_rollout_ref.actor.freeze_vision_tower": _drop(_VISION),
    "actor_rollout_ref.actor.data_loader_seed": _drop(
        "mini-batches are shuffled with a generator seeded by trainer.seed"
    ),
    "actor_rollout_ref.actor.rollout_n": _drop("it copies rollout.n upstream"),
    "actor_rollout_ref.actor.checkpoint.async_save": _drop(
        "checkpoints are written synchronously (atomically)",
        keeps=(False,),
        refusal="asynchronous checkpoint saving is not implemented; set false",
    ),
    "actor_rollout_ref.actor.policy_loss.loss_mode": UpstreamKey(
        native="actor_rollout_ref.actor.policy_loss"
    ),
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": _policy_kwarg("clip_cov_ratio", 0.0002),
    "actor_rollout_ref.actor.policy_loss.clip_cov_lb": _policy_kwarg("clip_cov_lb", 1.0),
    "actor_rollout_ref.actor.policy_loss.clip_cov_ub": _policy_kwarg("clip_cov_ub", 5.0),
    "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": _policy_kwarg("kl_cov_ratio", 0.0002),
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": _policy_kwarg("ppo_kl_coef", 1.0),
    "actor_rollout_ref.actor.tau_pos": _policy_kwarg("tau_pos", 1.0),
    "actor_rollout_ref.actor.tau_neg": _policy_kwarg("tau_neg", 1.05),
    "actor_rollout_ref.actor.optim.clip_grad": UpstreamKey(
        native="actor_rollout_ref.actor.grad_clip"
    ),
    "actor_rollout_ref.actor.optim.lr_scheduler_type": UpstreamKey(
        native="actor_rollout_ref.actor.optim.warmup_style"
    ),
    "actor_rollout_ref.actor.optim.lr_decay_style": UpstreamKey(
        native="actor_rollout_ref.actor.optim.warmup_style"
    ),
    # reference
    "actor_rollout_ref.ref.log_prob_micro_batch_size": _drop(
        _MICRO.format(native="ref.log_prob_micro_batch_size_per_device")
    ),
    "actor_rollout_ref.ref.strategy": _drop(
        "the reference runs in the actor's worker, sharded as the actor is (actor.strategy)",
        keeps=("fsdp", "fsdp2", "${actor_rollout_ref.actor.strategy}"),
        refusal=_MEGATRON,
    ),
    "actor_rollout_ref.ref.rollout_n": _drop("it copies rollout.n upstream"),
    "actor_rollout_ref.ref.model": _drop(
        "the reference is the policy's initial weights (actor_rollout_ref.model.path)",
        keeps=(None,),
        refusal="the reference model here is the policy's initial weights; a different "
        "reference model is not supported",
    ),
    # rollout
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": _drop(
        _MICRO.format(native="rollout.log_prob_micro_batch_size_per_device")
    ),
    "actor_rollout_ref.rollout.data_parallel_size": _drop(
        _ROLLOUT_PARALLEL.format(what="data-parallel engine replicas")
    ),
    "actor_rollout_ref.rollout.expert_parallel_size": _drop(
        _ROLLOUT_PARALLEL.format(what="devices by experts")
    ),
    "actor_rollout_ref.rollout.pipeline_model_parallel_size": _drop(
        _ROLLOUT_PARALLEL.format(what="devices by layers")
    ),
    "actor_rollout_ref.rollout.max_model_len": UpstreamKey(
        native="actor_rollout_ref.rollout.vllm.max_model_len"
    ),
    "actor_rollout_ref.rollout.prompt_length": UpstreamKey(native="data.max_prompt_length"),
    "actor_rollout_ref.rollout.response_length": UpstreamKey(native="data.max_response_length"),
    "actor_rollout_ref.rollout.dtype": _drop(
        "the rollout computes in the actor's precision (actor.precision)"
    ),
    "actor_rollout_ref.rollout.load_format": _drop(
        "the rollout engine is started from the actor's weights, whatever the load format"
    ),
    "actor_rollout_ref.rollout.layered_summon": _drop(
        f"gathering the weights layer by layer for the weight push: {_SPEED}"
    ),
    "actor_rollout_ref.rollout.multi_stage_wake_up": _drop(
        f"waking the engine's weights and KV cache in stages: {_SPEED}"
    ),
    "actor_rollout_ref.rollout.update_weights_bucket_megabytes": UpstreamKey(
        native="actor_rollout_ref.rollout.vllm.weight_sync_bucket_mb"
    ),
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": UpstreamKey(
        native="actor_rollout_ref.rollout.vllm.weight_sync_bucket_mb"
    ),
    "actor_rollout_ref.rollout.checkpoint_engine.backend": _drop(
        "weights are pushed to the engine in buckets in-process",
        keeps=("naive", None),
        refusal="the weight push here is in-process (buckets of "
        "rollout.vllm.weight_sync_bucket_mb); other transfer backends are not available",
    ),
    "actor_rollout_ref.rollout.enable_prefix_caching": _drop(f"vLLM prefix caching: {_SPEED}"),
    "actor_rollout_ref.rollout.cudagraph_capture_sizes": _drop(f"CUDA graphs: {_SPEED}"),
    "actor_rollout_ref.rollout.scheduling_policy": _drop(
        f"the engine's request order: {_SPEED} (every request completes)"
    ),
    "actor_rollout_ref.rollout.skip_tokenizer_init": _drop(
        "the engine is given token ids either way"
    ),
    "actor_rollout_ref.rollout.ignore_eos": _drop(
        "generation stops at EOS",
        keeps=(False,),
        refusal="generation always stops at the end-of-sequence token here",
    ),
    "actor_rollout_ref.rollout.logprobs_mode": _drop(
        "the rollout returns the sampled tokens' log-probs",
        keeps=("processed_logprobs", None),
        refusal="other rollout log-prob modes (raw logits) are not implemented",
    ),
    "actor_rollout_ref.rollout.over_sample_rate": _drop(
        "every response is generated to its end here (upstream stops the slowest fraction "
        "of requests early and pads them: a speed-up)"
    ),
    "actor_rollout_ref.rollout.skip_rollout": _drop(
        "rollouts are generated",
        keeps=(False,),
        refusal="reusing dumped rollouts is data.rollout_files (pre-generated rollouts)",
    ),
    "actor_rollout_ref.rollout.skip_dump_dir": _drop("rollouts are generated (skip_rollout)"),
    "actor_rollout_ref.rollout.quantization": _drop(
        "the rollout generates in the actor's precision",
        keeps=(None,),
        refusal="quantized rollout engines are not implemented; the inference roles' "
        "precision is trainer.model_precision_map",
    ),
    "actor_rollout_ref.rollout.quantization_config_file": _drop(
        "no quantization", keeps=(None,), refusal="see actor_rollout_ref.rollout.quantization"
    ),
    "actor_rollout_ref.rollout.mtp": _drop(
        "no speculative decoding", keeps=(None,), refusal="see actor_rollout_ref.model.mtp.enable"
    ),
    "actor_rollout_ref.rollout.enable_rollout_routing_replay": _drop(
        "no MoE routing replay",
        keeps=(False,),
        refusal="MoE routing replay is not implemented",
    ),
    "actor_rollout_ref.rollout.agent.num_workers": _drop(
        "the agent loop runs in the rollout worker"
    ),
    "actor_rollout_ref.rollout.agent.default_agent_loop": _drop(
        "single-turn generation, and the agent loop with rollout.multi_turn.enable=true",
        keeps=("single_turn_agent", "tool_agent", None),
        refusal="custom agent loops here are programs run against an OpenAI-compatible "
        "server: actor_rollout_ref.rollout.agent.program",
    ),
    "actor_rollout_ref.rollout.agent.agent_loop_config_path": _drop(
        "no custom agent loop",
        keeps=(None,),
        refusal="custom agent loops here are programs run against an OpenAI-compatible "
        "server: actor_rollout_ref.rollout.agent.program",
    ),
    "actor_rollout_ref.rollout.agent.custom_async_server.path": _drop(
        "no custom server",
        keeps=(None,),
        refusal="custom rollout servers are not supported",
    ),
    "actor_rollout_ref.rollout.agent.custom_async_server.name": _drop(
        "no custom server", keeps=(None,), refusal="custom rollout servers are not supported"
    ),
    # multi-turn
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": UpstreamKey(
        native="actor_rollout_ref.rollout.multi_turn.max_turns",
        value=lambda value: DROP if value is None else value,
        reason="null: the native default (multi_turn.max_turns)",
    ),
    "actor_rollout_ref.rollout.multi_turn.max_user_turns": _drop(
        "the turns between model turns (tool results, interaction replies) are bounded by "
        "multi_turn.max_turns here"
    ),
    "actor_rollout_ref.rollout.multi_turn.max_parallel_calls": UpstreamKey(
        native="actor_rollout_ref.rollout.multi_turn.max_parallel_tool_calls"
    ),
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": UpstreamKey(
        native="actor_rollout_ref.rollout.multi_turn.max_tool_response_tokens"
    ),
    "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": _drop(
        "a tool result longer than multi_turn.max_tool_response_tokens keeps its first "
        "tokens here, whichever side upstream cut (results differ only for longer tool "
        "results)"
    ),
    "actor_rollout_ref.rollout.multi_turn.format": _drop(
        "tool calls are read in the Hermes format (<tool_call>{json}</tool_call>)",
        keeps=("hermes",),
        refusal="tool calls here are parsed in the Hermes format only "
        "(<tool_call>{json}</tool_call>)",
    ),
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": _drop(
        "turns are appended as the chat template renders them, never re-tokenized"
    ),
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": _drop(
        "appended turns are checked to be the template's own suffix (always)"
    ),
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": _drop(
        "no repeated rollouts",
        keeps=(None,),
        refusal="repeated rollouts of one conversation are not implemented; sample more "
        "responses with rollout.n",
    ),
    "actor_rollout_ref.rollout.multi_turn.tool_config_path": UpstreamKey(
        native="actor_rollout_ref.rollout.multi_turn.tools",
        value=_tool_config,
        reason="null: no tools",
        reads="each tool of the YAML becomes a multi_turn.tools entry {path: the YAML, name}: "
        "upstream's Gsm8kTool runs this project's GSM8K scorer, SandboxFusionTool the "
        "python tool's local sandbox, a user class (upstream's BaseTool interface) runs "
        "through an adapter with its row's extra_info.tools_kwargs[name].create_kwargs; "
        "search, MCP, geo3k and image tools refused with the reason; tool rewards are not "
        "added to the score (docs/multiturn.md)",
    ),
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path": _drop(
        "no interaction",
        keeps=(None,),
        refusal="upstream's interaction YAML (interaction classes, per-row "
        "interaction_kwargs) is not read here; an interaction is a function in a Python "
        "file: actor_rollout_ref.rollout.multi_turn.interaction.path and .name "
        "(docs/multiturn.md)",
    ),
    # critic
    "critic.ppo_micro_batch_size": _drop(
        _MICRO.format(native="critic.ppo_micro_batch_size_per_device")
    ),
    "critic.forward_micro_batch_size": _drop(
        _MICRO.format(native="critic.forward_micro_batch_size_per_device")
    ),
    "critic.rollout_n": _drop("it copies rollout.n upstream"),
    "critic.data_loader_seed": _drop(
        "mini-batches are shuffled with a generator seeded by trainer.seed"
    ),
    "critic.checkpoint.async_save": _drop(
        "checkpoints are written synchronously (atomically)",
        keeps=(False,),
        refusal="asynchronous checkpoint saving is not implemented; set false",
    ),
    "critic.model.trust_remote_code": _drop(
        "the critic is loaded with actor_rollout_ref.model.trust_remote_code"
    ),
    "critic.optim.clip_grad": UpstreamKey(native="critic.grad_clip"),
    "critic.optim.lr_scheduler_type": UpstreamKey(native="critic.optim.warmup_style"),
    "critic.optim.lr_decay_style": UpstreamKey(native="critic.optim.warmup_style"),
    # reward
    "reward_model.reward_manager": UpstreamKey(
        native="reward_model.reward_manager",
        value=_reward_manager,
        reads="dapo, prime: `naive` (each response scored by its data source's scorer; "
        "dapo's overlong penalty is `reward_model.overlong_buffer.*`, prime's worker pool a "
        "speed-up); batch refused (a custom reward function here scores one response); "
        "other names as they are",
    ),
    "reward_model.reward_kwargs.overlong_buffer_cfg.enable": UpstreamKey(
        native="reward_model.overlong_buffer.enable"
    ),
    "reward_model.reward_kwargs.overlong_buffer_cfg.len": UpstreamKey(
        native="reward_model.overlong_buffer.len"
    ),
    "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor": UpstreamKey(
        native="reward_model.overlong_buffer.penalty_factor"
    ),
    "reward_model.reward_kwargs.overlong_buffer_cfg.log": _drop(
        "the overlong penalty is logged every step (reward/overlong_*)"
    ),
    "reward_model.reward_kwargs.max_resp_len": _drop(
        "the overlong buffer ends at data.max_response_length here (upstream's scripts set "
        "the two alike)"
    ),
    "reward_model.micro_batch_size": _drop(
        _MICRO.format(native="reward_model.micro_batch_size_per_device")
    ),
    "reward_model.forward_max_token_len_per_gpu": _drop(
        "the reward model micro-batches by reward_model.micro_batch_size_per_device; "
        "memory and speed only"
    ),
    "reward_model.use_dynamic_bsz": _drop(
        "the reward model micro-batches by reward_model.micro_batch_size_per_device; "
        "memory and speed only"
    ),
    "reward_model.strategy": _drop(
        "the reward model runs in its worker, sharded as the actor is",
        keeps=("fsdp", "fsdp2"),
        refusal=_MEGATRON,
    ),
    "reward_model.ulysses_sequence_parallel_size": _drop(
        "the reward model scores whole sequences in one rank",
        keeps=(1,),
        refusal="sequence parallelism of the reward model is not implemented; set 1",
    ),
    "reward_model.model.use_remove_padding": _drop(
        "the reward model's forward ignores padding either way; memory and speed only"
    ),
    "reward_model.model.trust_remote_code": _drop(
        "the reward model is loaded with actor_rollout_ref.model.trust_remote_code"
    ),
    "reward_model.model.input_tokenizer": _drop(
        "responses are decoded with the policy's tokenizer and re-encoded with the reward "
        "model's own (reward_model.model.tokenizer_path), always"
    ),
    "reward_model.model.fsdp_config.param_offload": _drop(
        f"the reward model's parameters between uses: {_SPEED}"
    ),
    "reward_model.model.fsdp_config.reshard_after_forward": _drop(_SPEED),
    "reward_model.model.fsdp_config.forward_prefetch": _drop(_SPEED),
    "reward_model.model.fsdp_config.fsdp_size": _drop(
        "FSDP2 shards over all of the role's ranks",
        keeps=(-1,),
        refusal="hybrid sharding (FSDP within groups of ranks) is not implemented; set -1",
    ),
    "reward_model.param_offload": _drop(f"the reward model's parameters between uses: {_SPEED}"),
    "reward_model.max_length": _drop(
        "the reward model scores prompt + response whole",
        keeps=(None,),
        refusal="truncating the reward model's input is not implemented",
    ),
    "reward_model.launch_reward_fn_async": _drop(
        "rule rewards are scored in worker processes (reward_model.timeout_s); timing only"
    ),
    "reward_model.num_workers": _drop("rule rewards are scored in a pool of worker processes"),
    "reward_model.use_reward_loop": _drop(
        "rewards are computed after generation by the reward manager (the same scores)"
    ),
    "reward_model.reward_loop_source": _drop("the reward manager is reward_model.reward_manager"),
    "reward_model.reward_loop_module_path": _drop(
        "no custom reward loop",
        keeps=(None,),
        refusal="register a reward manager (verl.rewards.register_reward_manager) and name "
        "it in reward_model.reward_manager",
    ),
    "reward_model.reward_loop_class_name": _drop(
        "no custom reward loop", keeps=(None,), refusal="see reward_model.reward_loop_module_path"
    ),
    "reward_model.enable_resource_pool": _drop(
        "the reward model's devices are resource_pool.reward_model_devices"
    ),
    "reward_model.n_gpus_per_node": _drop(
        "the reward model's devices are resource_pool.reward_model_devices"
    ),
    "reward_model.nnodes": _drop(
        "the reward model's devices are resource_pool.reward_model_devices"
    ),
    "reward_model.sandbox_fusion.url": _drop(
        "code is run in the local sandbox (verl.rewards.sandbox)",
        keeps=(None,),
        refusal="a remote SandboxFusion service is not used here; the code scorer runs tests "
        "in a local sandboxed subprocess (data_source=code)",
    ),
    "reward_model.sandbox_fusion.max_concurrent": _drop("the local sandbox's concurrency"),
    "reward_model.sandbox_fusion.memory_limit_mb": _drop("the local sandbox's own limits apply"),
    "reward_manager.source": _drop("the reward manager is reward_model.reward_manager"),
    "reward_manager.module.path": _drop(
        "no custom reward manager",
        keeps=(None,),
        refusal="see reward_model.reward_loop_module_path",
    ),
    "reward_manager.module.name": _drop("no custom reward manager module"),
    "custom_reward_function.reward_kwargs": _drop(
        "no extra arguments", keeps=({}, None), refusal="bind the arguments in your function"
    ),
    # algorithm
    "algorithm.rollout_correction.rollout_is_threshold": UpstreamKey(
        native="actor_rollout_ref.actor.rollout_is_threshold"
    ),
    "algorithm.rollout_correction.rollout_rs_threshold": UpstreamKey(
        native="actor_rollout_ref.actor.rollout_rs_threshold"
    ),
    "algorithm.rollout_correction.rollout_is": UpstreamKey(
        native="actor_rollout_ref.actor.rollout_is_level",
        value=lambda value: DROP if value is None else value,
        reason="null: no truncated importance sampling (rollout_is_threshold null)",
    ),
    "algorithm.rollout_correction.rollout_rs": _drop(
        "masked importance sampling here drops sequences by their geometric-mean ratio "
        "(actor.rollout_rs_threshold)",
        keeps=(None, "geometric"),
        refusal="only the geometric-mean rejection is implemented (actor.rollout_rs_threshold)",
    ),
    "algorithm.rollout_correction.rollout_rs_threshold_lower": _drop(
        "the rejection band is [1/threshold, threshold]",
        keeps=(None,),
        refusal="the rejection band here is [1/actor.rollout_rs_threshold, "
        "actor.rollout_rs_threshold]",
    ),
    "algorithm.rollout_correction.rollout_token_veto_threshold": _drop(
        "no token veto", keeps=(None,), refusal="the token veto is not implemented"
    ),
    "algorithm.rollout_correction.rollout_is_batch_normalize": _drop(
        "importance weights are not renormalized",
        keeps=(False,),
        refusal="batch-normalized importance weights are not implemented",
    ),
    "algorithm.rollout_correction.bypass_mode": _drop(
        "the old log-probs are recomputed by the actor (actor.recompute_old_log_prob)",
        keeps=(False,),
        refusal="bypass mode (the rollout's log-probs as the old policy) is not implemented",
    ),
    "algorithm.rollout_correction.loss_type": _drop(
        "the corrected loss is the actor's policy loss",
        keeps=("ppo_clip",),
        refusal="set the loss with actor_rollout_ref.actor.policy_loss",
    ),
    "algorithm.rollout_correction.use_policy_gradient": _drop(
        "the corrected loss is the actor's policy loss",
        keeps=(False,),
        refusal="set the loss with actor_rollout_ref.actor.policy_loss",
    ),
    # trainer
    "trainer.logger": UpstreamKey(
        native="trainer.logger",
        value=_logger_value,
        reads="a list as it is; one sink written as a string (`console`) is a list of it",
    ),
    "trainer.use_legacy_worker_impl": _drop("one worker implementation here"),
    "trainer.device": UpstreamKey(
        native="trainer.device",
        value=_device,
        reads="as it is (auto, cpu, cuda); npu refused: Ascend NPUs are not supported",
    ),
    "trainer.tensorboard_dir": UpstreamKey(native="trainer.log_dir"),
    "trainer.rl_logging_board_dir": _drop("no RL Logging Board output (metrics.jsonl in log_dir)"),
    "trainer.profile_steps": UpstreamKey(
        native="trainer.profile_steps",
        value=lambda value: [] if value is None else [value] if isinstance(value, int) else value,
        reads="a list of steps as it is; one step: a list of it; null: `[]`",
    ),
    "trainer.profile_continuous_steps": _drop(_PROFILER),
    "trainer.ray_wait_register_center_timeout": UPSTREAM_KEYS[
        "trainer.ray_wait_register_center_timeout"
    ],
    "transfer_queue.enable": _drop(
        "batches move between roles in-process or through Ray's object store",
        keeps=(False,),
        refusal="upstream's TransferQueue is not available",
    ),
    "ray_kwargs.timeline_json_file": UPSTREAM_KEYS["ray_init.timeline_json_file"],
}


# Per-role knobs upstream repeats for every model and FSDP engine config.
_MODEL_KNOBS: dict[str, UpstreamKey] = {
    "use_shm": _drop("copying the model to shared memory speeds loading"),
    "use_fused_kernels": _drop(f"fused log-prob kernels: {_SPEED}"),
    "use_liger": _drop(f"Liger kernels: {_SPEED}"),
    "enable_activation_offload": _drop(f"offloading activations to CPU: {_SPEED}"),
    "enable_activation_offloading": _drop(f"offloading activations to CPU: {_SPEED}"),
    "fused_kernel_options.*": _drop(f"fused log-prob kernels: {_SPEED}"),
    "tiled_mlp.*": _drop(f"tiling the MLP's activations: {_SPEED}"),
    "external_lib": _drop(
        "no extra model library",
        keeps=(None,),
        refusal="model code is loaded with the checkpoint: trust_remote_code=true",
    ),
    "custom_chat_template": _drop(
        "the tokenizer's own chat template",
        keeps=(None,),
        refusal="put the template into the tokenizer directory's tokenizer_config.json "
        "(tokenizer_path)",
    ),
    "hf_config_path": _drop(
        "the model's own config.json",
        keeps=(None,),
        refusal="override config entries with the model's override_config",
    ),
    "lora_adapter_path": _drop(
        "no adapter to load",
        keeps=(None,),
        refusal="starting from a saved LoRA adapter is not implemented; merge it into the "
        "model (verl merge) and train from the merged directory",
    ),
    "mtp.enable": _drop(
        "no multi-token prediction",
        keeps=(False,),
        refusal="multi-token prediction (MTP) training and speculative decoding are not "
        "implemented",
    ),
    "mtp.enable_train": _drop(
        "no multi-token prediction", keeps=(False,), refusal="MTP training is not implemented"
    ),
    "mtp.enable_rollout": _drop(
        "no multi-token prediction",
        keeps=(False,),
        refusal="speculative decoding with MTP is not implemented",
    ),
    "mtp.*": _drop("no multi-token prediction (mtp.enable=false)"),
}


def _engine_knobs(dtype_key: str, sp_key: str | None) -> dict[str, UpstreamKey]:
    """Upstream's FSDP engine keys (engine/fsdp.yaml), for a role whose model dtype is
    ``dtype_key`` and whose sequence-parallel size is ``sp_key`` (None: refused above 1)."""
    knobs = {
        "model_dtype": UpstreamKey(native=dtype_key),
        "dtype": _drop(
            "the compute precision is the role's precision key (trainer.mixed_precision)"
        ),
        "offload_policy": _drop(f"FSDP2's CPU offload policy: {_SPEED}"),
        "forward_prefetch": _drop(_SPEED),
        "use_orig_params": _drop("FSDP1's flat parameters; FSDP2 shards each parameter"),
        "use_torch_compile": _drop(f"compiled kernels: {_SPEED}"),
        "entropy_checkpointing": _drop(_SPEED),
        "entropy_from_logits_with_chunking": _drop(
            f"{_SPEED} (log-probs are computed in chunks here: logprob_chunk_size)"
        ),
        "forward_only": _drop("whether a role trains follows from the role"),
        "full_determinism": _drop(
            "the same seed gives the same run on one machine here (trainer.seed)"
        ),
        "seed": _drop("the seed is trainer.seed"),
        "strategy": _drop(
            "the engine is the role's strategy key", keeps=("fsdp", "fsdp2"), refusal=_MEGATRON
        ),
        "optimizer_offload": _drop(f"{_SPEED} (an inference role has no optimizer)"),
        "wrap_policy.*": _drop(
            "FSDP2 wraps each decoder layer (and the whole model) here; the wrapping changes "
            "memory and speed, not results"
        ),
        "fsdp_size": _drop(
            "FSDP2 shards over all of the role's ranks",
            keeps=(-1,),
            refusal="hybrid sharding (FSDP within groups of ranks) is not implemented; set -1",
        ),
    }
    if sp_key is not None:
        knobs["ulysses_sequence_parallel_size"] = UpstreamKey(native=sp_key)
    else:
        knobs["ulysses_sequence_parallel_size"] = _drop(
            "no sequence parallelism", keeps=(1,), refusal=_NO_SP
        )
    return knobs


def _under(prefix: str, knobs: dict[str, UpstreamKey]) -> dict[str, UpstreamKey]:
    """``knobs`` under ``prefix`` (a key already in the table keeps its entry)."""
    return {f"{prefix}.{name}": entry for name, entry in knobs.items()}


_ARR = "actor_rollout_ref"
for _role, _sp in (("actor", f"{_ARR}.actor"), ("ref", f"{_ARR}.ref")):
    _knobs = _engine_knobs(f"{_ARR}.model.dtype", f"{_sp}.ulysses_sequence_parallel_size")
    if _role == "actor":  # the actor has an optimizer: its optimizer_offload is native
        del _knobs["optimizer_offload"]
    for _path, _entry in _under(f"{_ARR}.{_role}.fsdp_config", _knobs).items():
        UPSTREAM_KEYS.setdefault(_path, _entry)
for _path, _entry in _under(
    "critic.model.fsdp_config",
    _engine_knobs("critic.model.dtype", "critic.ulysses_sequence_parallel_size"),
).items():
    UPSTREAM_KEYS.setdefault(_path, _entry)
for _path, _entry in _under(
    "reward_model.model.fsdp_config", _engine_knobs("reward_model.model.dtype", None)
).items():
    UPSTREAM_KEYS.setdefault(_path, _entry)
for _model in (f"{_ARR}.model", "critic.model", "reward_model.model"):
    for _path, _entry in _under(_model, _MODEL_KNOBS).items():
        UPSTREAM_KEYS.setdefault(_path, _entry)
for _optim in (f"{_ARR}.actor.optim", "critic.optim"):
    UPSTREAM_KEYS.update(
        {
            f"{_optim}.num_cycles": _drop(
                "the cosine schedule decays over half a cycle",
                keeps=(0.5,),
                refusal="the cosine schedule here decays once (num_cycles 0.5); use min_lr_ratio "
                "for its floor",
            ),
            f"{_optim}.optimizer": _drop(
                "the optimizer is AdamW",
                keeps=("AdamW", "adamw"),
                refusal="the optimizer here is AdamW (optim.betas, optim.eps, optim.weight_decay)",
            ),
            f"{_optim}.optimizer_impl": _drop(
                "torch's AdamW", keeps=("torch.optim",), refusal="the optimizer is torch's AdamW"
            ),
            f"{_optim}.override_optimizer_config.*": _drop(
                "no optimizer overrides",
                keeps=(None, {}),
                refusal="Megatron-LM's optimizer options are not available (AdamW: optim.*)",
            ),
            f"{_optim}.warmup_style": UpstreamKey(
                native=f"{_optim}.warmup_style",
                value=lambda value: DROP if value is None else value,
                reason="null: upstream reads lr_scheduler_type (the native default constant)",
                reads="null: dropped (upstream then reads lr_scheduler_type); other values "
                "as they are",
            ),
        }
    )

# Whole subtrees: any key under the prefix (a leaf under a refused subtree is refused).
_SUBTREES: dict[str, UpstreamKey] = {
    **{
        f"{section}.megatron.*": UpstreamKey(keeps=(), refusal=_MEGATRON)
        for section in (
            f"{_ARR}.actor",
            f"{_ARR}.ref",
            f"{_ARR}.rollout",
            "critic",
            "reward_model",
        )
    },
    **{
        f"{section}.profiler.*": _drop(_PROFILER)
        for section in (
            _ARR,
            f"{_ARR}.actor",
            f"{_ARR}.ref",
            f"{_ARR}.rollout",
            "critic",
            "reward_model",
        )
    },
    "global_profiler.*": _drop(_PROFILER),
    "trainer.npu_profile.*": _drop(_PROFILER),
    "trainer.controller_nsight_options.*": _drop(_PROFILER),
    "trainer.worker_nsight_options.*": _drop(_PROFILER),
    f"{_ARR}.rollout.trace.*": _drop(
        "tracing rollouts to MLflow/Weave records them and changes nothing of the run "
        "(trainer.rollout_data_dir writes each step's rollouts)"
    ),
    f"{_ARR}.rollout.prometheus.*": _drop("the engine's Prometheus metrics are not served"),
    f"{_ARR}.rollout.engine_kwargs.*": _drop(f"the rollout engine's own arguments: {_SPEED}"),
    f"{_ARR}.rollout.checkpoint_engine.*": _drop(f"the weight push's transport: {_SPEED}"),
    f"{_ARR}.actor.router_replay.*": _drop(
        "no MoE routing replay",
        keeps=("disabled", None),
        refusal="MoE routing replay is not implemented",
    ),
    f"{_ARR}.model.lora.*": _drop(
        "Megatron's LoRA options; the LoRA adapters here are peft's "
        "(actor_rollout_ref.model.lora_rank, lora_alpha, target_modules)"
    ),
    f"{_ARR}.ref.router_replay.*": _drop(
        "no MoE routing replay",
        keeps=("disabled", None),
        refusal="MoE routing replay is not implemented",
    ),
    "reward_model.rollout.*": _drop(
        "upstream's generative reward model (an LLM judge served by vLLM/SGLang) is "
        "configured here only by reward_model.rollout.name"
    ),
    "reward_model.reward_kwargs.*": _drop(
        "no reward-manager arguments",
        keeps=(None, {}),
        refusal="reward-manager arguments are not passed here; bind them in a custom reward "
        "function (custom_reward_function.path)",
    ),
    "ray_init.*": _drop(
        "Ray's start-up options of upstream's driver; a local Ray cluster here is started "
        "for the run's processes (trainer.ray_address joins another)"
    ),
}
_RL_MORE["reward_model.rollout.name"] = _drop(
    "no generative reward model",
    keeps=(None,),
    refusal="a generative reward model (an LLM judge served by vLLM/SGLang) is not available; "
    "a reward model here is a sequence classifier (reward_model.model.path), or score with a "
    "custom reward function (custom_reward_function.path)",
)

# Upstream subtrees that moved between its releases: read as the older spelling, which the
# table then reads (the head's ray_kwargs.ray_init is v0.5's ray_init, ...).
UPSTREAM_MOVES: dict[str, str] = {
    "ray_kwargs.ray_init": "ray_init",
    "critic.fsdp": "critic.model.fsdp_config",
    "reward.reward_manager.name": "reward_model.reward_manager",
    "reward.reward_kwargs": "reward_model.reward_kwargs",
    "reward_manager.name": "reward_model.reward_manager",
}

for _path, _entry in _RL_MORE.items():
    UPSTREAM_KEYS.setdefault(_path, _entry)
UPSTREAM_KEYS.update(_SUBTREES)

_SFT_NO_SP = (
    "sequence parallelism (Ulysses) is not implemented yet; set it to 1 (long samples: "
    "model.enable_gradient_checkpointing, engine.logprob_chunk_size, a smaller "
    "data.micro_batch_size_per_device)"
)
_OFFLINE_OFFLOAD = (
    "the offline engine keeps parameters and optimizer state where it trains them (on a "
    "CPU that is host memory already); offloading changes memory and speed, never results"
)
_SAME_LOSS = (
    "a step's loss does not depend on how the step is split into micro-batches "
    "(data.micro_batch_size_per_device); memory and speed only"
)


# The offline trainers' keys (SFTConfig, DPOConfig), read the same way: the old trainer
# (fsdp_sft_trainer's top-level keys) and the engine-based one (sft_trainer, upstream's
# sft_trainer_engine.yaml with its engine/optim/model config-group choices).
OFFLINE_UPSTREAM_KEYS: dict[str, UpstreamKey] = {
    "model.partial_pretrain": UpstreamKey(native="model.path"),
    "trainer.default_hdfs_dir": UPSTREAM_KEYS["trainer.default_hdfs_dir"],
    "model.fsdp_config.param_offload": _drop(_OFFLINE_OFFLOAD),
    "model.fsdp_config.cpu_offload": _drop(_OFFLINE_OFFLOAD),
    "ulysses_sequence_parallel_size": _drop("no sequence parallelism", keeps=(1,), refusal=_NO_SP),
    "use_remove_padding": _drop("SFT pads or packs by data.packing"),
    "engine": UpstreamKey(
        native="engine.strategy",
        keeps=("fsdp", "fsdp2"),
        value=lambda _: "auto",
        refusal="the offline engines here are FSDP2 (engine=fsdp) and one process "
        "(engine.strategy=single); Megatron-LM is not available",
        reads=f"fsdp, fsdp2 (a config-group choice): `engine.strategy=auto` ({_OFFLINE_FSDP}); "
        "other values refused: Megatron-LM is not available",
        choice=True,
    ),
    "engine.strategy": _strategy("engine.strategy", "auto", _OFFLINE_FSDP),
    "engine.ulysses_sequence_parallel_size": _drop(
        "no sequence parallelism", keeps=(1,), refusal=_SFT_NO_SP
    ),
    "optim": UpstreamKey(
        keeps=("fsdp",),
        reason="the optimizer is AdamW set by the optim.* keys (upstream's fsdp optimizer group)",
        refusal="Megatron-LM's optimizer is not available; optim=fsdp is AdamW (optim.*)",
        choice=True,
    ),
    "model": UpstreamKey(
        keeps=("hf_model",),
        reason="the model is a HuggingFace directory or hub id (model.path)",
        refusal="the model here is a HuggingFace directory or hub id: model=hf_model, model.path",
        choice=True,
    ),
    "model.use_remove_padding": _drop(
        "padding never enters the loss, so removing it changes memory and speed only; "
        "packing here is data.packing, which also changes how many samples a step holds, so "
        "it is a separate choice"
    ),
    "optim.clip_grad": UpstreamKey(native="engine.grad_clip"),
    "data.use_dynamic_bsz": _drop(_SAME_LOSS),
    "data.max_token_len_per_gpu": _drop(_SAME_LOSS),
    "data.pad_mode": _drop(
        "samples are right-padded (packed with data.packing); padding never enters the loss"
    ),
}


# the offline trainers' other keys (upstream's sft_trainer.yaml and sft_trainer_engine.yaml
# with its engine/optim/model groups, at v0.5, v0.6, v0.7 and its head)
OFFLINE_UPSTREAM_KEYS.update(
    {
        "defaults": _RL_MORE["defaults"],
        "hydra": _RL_MORE["hydra"],
        "trainer.logger": _RL_MORE["trainer.logger"],
        "trainer.device": _RL_MORE["trainer.device"],
        "data.micro_batch_size": _drop(
            "upstream's SFT trainer does not read it (it reads micro_batch_size_per_gpu, here "
            "data.micro_batch_size_per_device); micro-batching never changes the loss"
        ),
        "data.balance_dp_token": _drop(_SAME_LOSS),
        "data.use_shm": _drop("copying the data to shared memory is a loading speed-up"),
        "data.chat_template": _drop(
            "the tokenizer's own chat template",
            keeps=(None,),
            refusal="put the template into the tokenizer directory's tokenizer_config.json "
            "(model.tokenizer_path)",
        ),
        "data.custom_cls.path": UPSTREAM_KEYS["data.custom_cls.path"],
        "data.custom_cls.name": UPSTREAM_KEYS["data.custom_cls.name"],
        "data.train_max_samples": _RL_MORE["data.train_max_samples"],
        "data.val_max_samples": _RL_MORE["data.val_max_samples"],
        "data.apply_chat_template_kwargs": _RL_MORE["data.apply_chat_template_kwargs"],
        "data.multiturn.enable": _drop(
            "a row with a data.messages_key column is read as a conversation"
        ),
        "data.multiturn.messages_key": UpstreamKey(native="data.messages_key"),
        "data.multiturn.tools_key": _drop(
            "a conversation's tool schemas are not rendered into the prompt here (rows "
            "without a tools column train the same)"
        ),
        "data.tools_key": _drop(
            "a conversation's tool schemas are not rendered into the prompt here (rows "
            "without a tools column train the same)"
        ),
        "data.multiturn.enable_thinking_key": _drop(
            "the chat template renders each conversation as it is"
        ),
        "data.enable_thinking_key": _drop("the chat template renders each conversation as it is"),
        "data.ignore_input_ids_mismatch": _drop(
            "each conversation is tokenized once, as the template renders it"
        ),
        "model.strategy": _drop(
            "the engine is engine.strategy", keeps=("fsdp", "fsdp2"), refusal=_MEGATRON
        ),
        "model.fsdp_config.offload_params": _drop(_OFFLINE_OFFLOAD),
        "optim.lr_scheduler": UpstreamKey(native="optim.warmup_style"),
        "optim.lr_scheduler_type": UpstreamKey(native="optim.warmup_style"),
        "optim.lr_decay_style": UpstreamKey(native="optim.warmup_style"),
        "optim.warmup_steps_ratio": UpstreamKey(native="optim.lr_warmup_steps_ratio"),
        "optim.warmup_style": UpstreamKey(
            native="optim.warmup_style",
            value=lambda value: DROP if value is None else value,
            reason="null: upstream reads lr_scheduler_type (the native default constant)",
            reads="null: dropped (upstream then reads lr_scheduler_type); other values as they are",
        ),
        "optim.lr_warmup_init": _drop(
            "warmup starts at 0", keeps=(0, 0.0), refusal="the warmup here starts at 0"
        ),
        "optim.min_lr": _drop(
            "no floor",
            keeps=(0, 0.0, None),
            refusal="the schedule's floor here is optim.min_lr_ratio (a fraction of optim.lr)",
        ),
        "optim.num_cycles": UPSTREAM_KEYS[f"{_ARR}.actor.optim.num_cycles"],
        "optim.optimizer": UPSTREAM_KEYS[f"{_ARR}.actor.optim.optimizer"],
        "optim.optimizer_impl": UPSTREAM_KEYS[f"{_ARR}.actor.optim.optimizer_impl"],
        "optim.override_optimizer_config.*": UPSTREAM_KEYS[
            f"{_ARR}.actor.optim.override_optimizer_config.*"
        ],
        "engine.param_offload": OFFLINE_UPSTREAM_KEYS["model.fsdp_config.param_offload"],
        "engine.optimizer_offload": _drop(_OFFLINE_OFFLOAD),
        "engine.reshard_after_forward": _drop(_SPEED),
        **{
            f"engine.{name}": _drop(
                "no Megatron parallelism", keeps=(1, None, False), refusal=_MEGATRON
            )
            for name in (
                "tensor_model_parallel_size",
                "pipeline_model_parallel_size",
                "virtual_pipeline_model_parallel_size",
                "context_parallel_size",
                "expert_model_parallel_size",
                "expert_tensor_parallel_size",
                "use_mbridge",
            )
        },
        "engine.vanilla_mbridge": _drop("no Megatron bridge (Megatron-LM is not available)"),
        "checkpoint.save_contents": _drop(
            "a checkpoint holds the model, the optimizer and the rest needed to resume"
        ),
        "checkpoint.load_contents": _drop("a resume reads the whole checkpoint"),
        "trainer.checkpoint.save_contents": _drop(
            "a checkpoint holds the model, the optimizer and the rest needed to resume"
        ),
        "trainer.checkpoint.load_contents": _drop("a resume reads the whole checkpoint"),
        "trainer.profile_interval": _drop(_PROFILER),
        "megatron.*": UpstreamKey(keeps=(), refusal=_MEGATRON),
    }
)
for _path, _entry in {
    **_under("model.fsdp_config", _engine_knobs("model.dtype", None)),
    **_under("engine", _engine_knobs("model.dtype", None)),
    **_under("model", _MODEL_KNOBS),
}.items():
    if _path not in ("engine.strategy", "engine.ulysses_sequence_parallel_size"):
        OFFLINE_UPSTREAM_KEYS.setdefault(_path, _entry)
OFFLINE_UPSTREAM_MOVES: dict[str, str] = {}


def translate_upstream(
    tree: dict[str, Any],
    root: str,
    error: type[Exception],
    put: Callable[..., None],
    errors: list[str] | None = None,
    known: Callable[[str], bool] | None = None,
) -> None:
    """Read ``tree``'s upstream keys in place (see the module docstring); ``error`` is the
    exception raised for a refused value, ``put(tree, native key, value, upstream key,
    upstream value)`` sets a renamed key (the alias module's own setter: its conflict check
    and note).

    The subtrees that moved between upstream's releases (:data:`UPSTREAM_MOVES`) are read
    first as their older spelling; then every exact key of the table, then its subtrees
    (``prefix.*``: each leaf under the prefix). A value that is an OmegaConf interpolation
    (``${...}``) or Hydra's missing value ``???`` is dropped with a note: upstream copies
    another key there, and the native default follows that key here.

    With an ``errors`` list, each refused key's message is appended there and the key is
    removed, and the other keys are still read (one message per problem); without one the
    first refusal is raised. ``known(dotted key)`` says whether the schema has a key: a
    ``*_per_gpu`` key is renamed only onto a ``*_per_device`` key that exists (another is
    left for the unknown-key check, under the name it was written with).
    """
    rl = root == "TrainerConfig"
    table = UPSTREAM_KEYS if rl else OFFLINE_UPSTREAM_KEYS
    moves = UPSTREAM_MOVES if rl else OFFLINE_UPSTREAM_MOVES

    def refuse(message: str) -> None:
        if errors is None:
            raise error(message)
        errors.append(message)

    for old, new in moves.items():
        found, value = _pop(tree, old)
        if found:
            logger.warning("%s is read as upstream's %s (its older spelling)", old, new)
            conflict = _merge(tree, new, value)
            if conflict:
                refuse(f"{old} and {new} both set {conflict}; give one of them")
    exact = [(path, key) for path, key in table.items() if not path.endswith(".*")]
    subtrees = [(path[:-2], key) for path, key in table.items() if path.endswith(".*")]
    for path, key in exact:
        if key.choice and not isinstance(_get_path(tree, path), str):
            continue  # a config-group choice is a string; a mapping is the native section
        found, value = _pop(tree, path)
        if found:
            _read_one(tree, path, value, key, error, put, refuse)
    for prefix, key in subtrees:
        found, value = _pop(tree, prefix)
        if found:
            for leaf, leaf_value in _leaves(value, prefix):
                _read_one(tree, leaf, leaf_value, key, error, put, refuse)
    _rename_per_gpu(tree, tree, "", error, put, errors, known)


def _read_one(
    tree: dict[str, Any],
    path: str,
    value: Any,
    key: UpstreamKey,
    error: type[Exception],
    put: Callable[..., None],
    refuse: Callable[[str], None],
) -> None:
    """Read one upstream ``path=value`` by its entry ``key`` (rename, drop or refusal)."""
    if _copies_another_key(value):
        logger.warning(
            "%s=%s is dropped: upstream copies another key there; the native default "
            "follows it here",
            path,
            short_repr(value),
        )
        return
    try:
        if key.keeps is not None and value not in key.keeps:
            raise Refused(key.refusal or key.reason)
        native_value = key.value(value) if key.value is not None else value
    except Refused as exc:
        refuse(f"{path}={short_repr(value)}: {exc}")
        return
    if key.native == path and native_value == value:  # a native value, as it is
        _restore(tree, path, value)
        return
    if key.native is None or native_value is DROP:
        logger.warning("%s=%s is dropped: %s", path, short_repr(value), key.reason)
        return
    try:
        put(tree, key.native, native_value, path, value)
    except error as exc:
        refuse(str(exc))


def _copies_another_key(value: Any) -> bool:
    """An OmegaConf interpolation (``${...}``) or Hydra's missing value (``???``)."""
    return isinstance(value, str) and (value.startswith("${") or value == "???")


def _leaves(value: Any, prefix: str) -> list[tuple[str, Any]]:
    """``(dotted key, value)`` of every leaf of ``value`` under ``prefix``; an empty mapping
    or a non-mapping is one leaf."""
    if not isinstance(value, dict) or not value:
        return [(prefix, value)]
    out: list[tuple[str, Any]] = []
    for name, child in value.items():
        out += _leaves(child, f"{prefix}.{name}")
    return out


def _get_path(tree: dict[str, Any], path: str) -> Any:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _merge(tree: dict[str, Any], path: str, value: Any) -> str | None:
    """Put ``value`` at ``path`` of ``tree``, merging mappings; the dotted key of the first
    leaf already there with another value, else ``None``."""
    *parents, last = path.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return path
    if last not in node:
        node[last] = value
        return None
    current = node[last]
    if isinstance(current, dict) and isinstance(value, dict):
        for name, child in value.items():
            conflict = _merge(current, name, child)
            if conflict:
                return f"{path}.{conflict}"
        return None
    return None if current == value else path


def reconcile(path: str, spellings: dict[str, Any]) -> tuple[bool, Any]:
    """``(True, value)`` when the native key ``path``, given by the two keys of
    ``spellings`` (key as written -> the native value it sets) with different values,
    has one upstream meaning; else ``(False, None)`` (the two are a conflict).

    - ``data.filter_overlong_prompts=True`` with ``data.truncation=error`` or ``left``:
      drop (upstream filters long prompts out before it truncates what remains);
    - the config-group choice ``engine=fsdp`` with ``engine.strategy``: the strategy
      (the choice selects the engine's group, the key sets the strategy within it).
    """
    if path == "engine.strategy" and set(spellings) == {"engine", "engine.strategy"}:
        return True, spellings["engine.strategy"]
    filtered, truncation = spellings.get(_FILTER), spellings.get("data.truncation")
    if path != "data.truncation" or filtered != "drop" or truncation not in ("error", "left"):
        return False, None
    logger.info(
        "%s=True with data.truncation=%s: prompts over data.max_prompt_length are dropped "
        "(data.truncation=drop), as upstream filters them out before its truncation "
        "applies to the prompts that remain",
        _FILTER,
        truncation,
    )
    return True, "drop"


_FILTER = "data.filter_overlong_prompts"
_SHORT = 200  # characters of a value quoted in a message


def short_repr(value: Any) -> str:
    """``repr(value)``, cut to :data:`_SHORT` characters (a message quotes the value, never
    a whole file's worth of it)."""
    text = repr(value)
    return text if len(text) <= _SHORT else f"{text[:_SHORT]}... ({len(text)} characters)"


def _restore(tree: dict[str, Any], path: str, value: Any) -> None:
    """Put back what :func:`_pop` took (its emptied parents included)."""
    *parents, last = path.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _pop(tree: dict[str, Any], path: str) -> tuple[bool, Any]:
    """Remove ``path`` from ``tree``; ``(found, value)``. Emptied parents are removed."""
    *parents, last = path.split(".")
    chain = [tree]
    for part in parents:
        node = chain[-1].get(part)
        if not isinstance(node, dict):
            return False, None
        chain.append(node)
    if last not in chain[-1]:
        return False, None
    value = chain[-1].pop(last)
    for parent, part in zip(reversed(chain[:-1]), reversed(parents), strict=True):
        if parent[part]:
            break
        del parent[part]
    return True, value


# *_per_device keys that take no null (upstream's null there means "derived from another key")
_NOT_NULL = frozenset({"micro_batch_size_per_device"})


def _rename_per_gpu(
    tree: dict[str, Any],
    node: dict[str, Any],
    prefix: str,
    error: type[Exception],
    put: Callable[..., None],
    errors: list[str] | None,
    known: Callable[[str], bool] | None = None,
) -> None:
    """``*_per_gpu`` keys become ``*_per_device`` (upstream says GPU where this says device),
    each set through ``put`` on the whole ``tree`` (its conflict check and note); with
    ``known``, only onto a key the schema has."""
    for name in list(node):
        value = node[name]
        if isinstance(value, dict):
            _rename_per_gpu(tree, value, f"{prefix}{name}.", error, put, errors, known)
        if name.endswith("_per_gpu"):
            native = name[: -len("_per_gpu")] + "_per_device"
            if known is not None and not known(f"{prefix}{native}"):
                continue  # no such key here: reported as unknown, as written
            del node[name]
            if _copies_another_key(value) or (value is None and native in _NOT_NULL):
                logger.warning(
                    "%s%s=%s is dropped: upstream derives it from another key; the native "
                    "default applies here",
                    prefix,
                    name,
                    short_repr(value),
                )
                continue
            try:
                put(tree, f"{prefix}{native}", value, f"{prefix}{name}")
            except error as exc:
                if errors is None:
                    raise
                errors.append(str(exc))
