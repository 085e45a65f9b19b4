"""Upstream keys of the RL trainer's critic, reward, algorithm and trainer sections (a
section of :data:`UPSTREAM_KEYS`)."""

from __future__ import annotations

from verl.compat.upstream.core import UPSTREAM_KEYS
from verl.compat.upstream.entries import (
    _MEGATRON,
    _MICRO,
    _PROFILER,
    _SPEED,
    DROP,
    UpstreamKey,
    _device,
    _drop,
    _logger_value,
    _reward_manager,
)

RUN_KEYS: dict[str, UpstreamKey] = {
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
