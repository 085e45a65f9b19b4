"""The offline trainers' upstream keys (``SFTConfig``, ``DPOConfig``): :data:`OFFLINE_UPSTREAM_KEYS`."""

from __future__ import annotations

from verl.compat.upstream.entries import (
    _MEGATRON,
    _OFFLINE_FSDP,
    _PROFILER,
    _SPEED,
    DROP,
    Refused,
    UpstreamKey,
    _drop,
    _strategy,
)
from verl.compat.upstream.rl import (
    _ARR,
    _MODEL_KNOBS,
    _RL_MORE,
    UPSTREAM_KEYS,
    _engine_knobs,
    _under,
)

_SFT_SP = (
    "Ulysses splits each sample's tokens over that many ranks to save memory; the offline "
    "engine here keeps whole samples on each rank, and its ranks are data-parallel over the "
    "same global batch (data.train_batch_size) with the loss summed over every rank: the "
    "same loss and gradients, memory and speed only (long samples: "
    "model.enable_gradient_checkpointing, a smaller data.micro_batch_size_per_device)"
)


def _sp_size(value: object) -> object:
    """A sequence-parallel size (a positive integer) is dropped with :data:`_SFT_SP`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Refused(f"a sequence-parallel size is a positive integer, not {value!r}")
    return DROP


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
    "ulysses_sequence_parallel_size": UpstreamKey(
        reason=_SFT_SP,
        value=_sp_size,
        reads=f"any size: dropped ({_SFT_SP})",
    ),
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
    "engine.ulysses_sequence_parallel_size": UpstreamKey(
        reason=_SFT_SP,
        value=_sp_size,
        reads=f"any size: dropped ({_SFT_SP})",
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
