"""The RL trainer's upstream keys that its run scripts set most: batch sizes, strategies,
the FSDP blocks, Ray's start-up options (the first section of :data:`UPSTREAM_KEYS`)."""

from __future__ import annotations

from verl.compat.upstream.entries import (
    _LOG_PROB_BUDGET,
    _NOT_HERE,
    _RL_FSDP,
    DROP,
    UpstreamKey,
    _drop,
    _strategy,
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
    "actor_rollout_ref.rollout.tensor_model_parallel_size": UpstreamKey(
        native="actor_rollout_ref.rollout.vllm.tensor_parallel_size",
        reads="renamed `actor_rollout_ref.rollout.vllm.tensor_parallel_size` (vLLM's own "
        "worker processes, each with a slice of every layer), which is read with "
        "rollout.name=vllm; with another rollout.name a size above 1 is not used, with a "
        "warning at validation: the native and hf rollouts generate from the actor's own "
        "weights (to split the actor's layers over devices set "
        "actor_rollout_ref.actor.tensor_parallel_size), an SGLang rollout's size is "
        "rollout.sglang.tensor_parallel_size",
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
