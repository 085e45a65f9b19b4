"""The whole RL table: its sections, the per-role model and engine knobs upstream repeats
for every model, whole subtrees, and the subtrees that moved between upstream's releases."""

from __future__ import annotations

from verl.compat.upstream.core import UPSTREAM_KEYS
from verl.compat.upstream.entries import (
    _MEGATRON,
    _NO_SP,
    _PROFILER,
    _SPEED,
    DROP,
    UpstreamKey,
    _drop,
)
from verl.compat.upstream.rl_policy import POLICY_KEYS
from verl.compat.upstream.rl_run import RUN_KEYS

_RL_MORE = {**POLICY_KEYS, **RUN_KEYS}


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
        "the serving engine of upstream's reward loop (speed and memory); the reward model "
        "here scores in its worker (reward_model.rollout.name: see its row)"
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
    "upstream's reward loop serves the reward model (reward_model.model.path) with this "
    "engine and reads its score head; here the sequence classifier scores in its worker: the "
    "same scores, the engine is speed only (a custom reward function that calls a served "
    "generative judge through reward_router_address has no server to call here)"
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
