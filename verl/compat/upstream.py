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


def _strategy(key: str, fsdp: str, why: str) -> UpstreamKey:
    """A native strategy key that also takes upstream's value ``fsdp`` (FSDP1), read as
    ``fsdp``: FSDP1 and FSDP2 shard the same data-parallel training (the same results)."""
    return UpstreamKey(
        native=key,
        value=lambda value: fsdp if value == "fsdp" else value,
        reads=f"fsdp: `{fsdp}` ({why}); the native values as they are",
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
        "one engine rank generates",
        keeps=(1,),
        refusal="tensor-parallel rollout engines are not available here (the weight push is "
        "in-process); set 1 (native: rollout.vllm.tensor_parallel_size)",
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
        "generation runs in the worker (sync)",
        keeps=("sync",),
        refusal="upstream's server-mode rollout is not here: one-step-off asynchronous "
        "training is trainer.async_rollout=true, tools and turns rollout.multi_turn",
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

_SFT_NO_SP = (
    "sequence parallelism (Ulysses) is not implemented yet; set it to 1 (long samples: "
    "model.enable_gradient_checkpointing, engine.logprob_chunk_size, a smaller "
    "data.micro_batch_size_per_device)"
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
    "model.fsdp_config.param_offload": _drop(
        "the offline engine keeps parameters where it trains them",
        keeps=(False,),
        refusal="CPU offload of the offline trainers is not implemented; set false",
    ),
    "model.fsdp_config.cpu_offload": _drop(
        "the offline engine keeps parameters where it trains them",
        keeps=(False,),
        refusal="CPU offload of the offline trainers is not implemented; set false",
    ),
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

    With an ``errors`` list, each refused key's message is appended there and the key is
    removed, and the other keys are still read (one message per problem); without one the
    first refusal is raised. ``known(dotted key)`` says whether the schema has a key: a
    ``*_per_gpu`` key is renamed only onto a ``*_per_device`` key that exists (another is
    left for the unknown-key check, under the name it was written with).
    """
    table = UPSTREAM_KEYS if root == "TrainerConfig" else OFFLINE_UPSTREAM_KEYS
    for path, key in table.items():
        if key.choice and not isinstance(tree.get(path), str):
            continue  # a config-group choice is a string; a mapping is the native section
        found, value = _pop(tree, path)
        if not found:
            continue
        try:
            if key.keeps is not None and value not in key.keeps:
                raise error(f"{path}={short_repr(value)}: {key.refusal or key.reason}")
            native_value = key.value(value) if key.value is not None else value
            if key.native == path and native_value == value:  # a native value, as it is
                _restore(tree, path, value)
                continue
            if key.native is None or native_value is DROP:
                logger.warning("%s=%s is dropped: %s", path, short_repr(value), key.reason)
                continue
            put(tree, key.native, native_value, path, value)
        except error as exc:
            if errors is None:
                raise
            errors.append(str(exc))
    _rename_per_gpu(tree, tree, "", error, put, errors, known)


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
            try:
                put(tree, f"{prefix}{native}", value, f"{prefix}{name}")
            except error as exc:
                if errors is None:
                    raise
                errors.append(str(exc))
