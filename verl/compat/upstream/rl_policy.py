"""Upstream keys of the RL trainer's data, model, actor, reference, rollout and multi-turn
sections, and Hydra's own keys (a section of :data:`UPSTREAM_KEYS`)."""

from __future__ import annotations

from verl.compat.upstream.entries import (
    _MEGATRON,
    _MICRO,
    _ROLLOUT_PARALLEL,
    _SPEED,
    _VIDEO,
    DROP,
    UpstreamKey,
    _defaults_list,
    _drop,
    _policy_kwarg,
    _tool_config,
)

POLICY_KEYS: dict[str, UpstreamKey] = {
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
    "data.image_key": _drop(
        "a row's images are read from its `images` column (docs/vision.md)",
        keeps=("images",),
        refusal="the image column is always `images` here: rename the column in the data",
    ),
    "data.video_key": _drop(_VIDEO),
    "data.image_patch_size": _drop("the model's processor sets the patch size"),
    "data.return_multi_modal_inputs": _drop(
        "a row's image inputs go to the model whenever the row has images"
    ),
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
    "actor_rollout_ref.actor.freeze_vision_tower": _drop(
        "the vision tower trains with the language model",
        keeps=(False,),
        refusal="freezing the vision tower is not implemented: the whole model trains; "
        "remove the key or set it to False",
    ),
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
}
