"""Other spellings of config keys and values, mapped onto the one schema.

Readers arrive with configs written for other verl versions and tutorials: a torch dtype
where the schema names a precision (``"param_dtype": torch.bfloat16``), a per-role
``parallel_config`` block, ``trainer.fsdp_init``, ``data.train_dataloader`` ... This module
turns those spellings into the native keys before the config is built, and logs one note
per alias naming the native key (``verl.compat`` logger, WARNING). A spelling with no
native meaning that could change results is refused with :class:`AliasError`, whose message
gives the native spelling; one whose effect the native code already has, or that cannot
change results here, is dropped with a note saying why.

Upstream verl's run-script keys (``*_per_gpu``, ``trainer.critic_warmup``, ...) have a table
of their own, :mod:`verl.compat.upstream`, which :func:`translate_tree` applies first.

Two entry points, each called once by the config package (its only dependency on this
module, which imports nothing of verl but that table, and never torch):

* :func:`translate_flat_kwargs` — keyword arguments of ``TrainerConfig(...)``
  (called from ``verl/config/schema.py``, ``_init_with_flat_keys``);
* :func:`translate_tree` — the user YAML tree of ``load_config(path)`` (called from
  ``verl/config/load.py``, ``load_validated``);
* :func:`translate_override` — one dotted ``key=value`` command-line override, through the
  same tree translation (called from ``verl/config/load.py``, ``apply_override``), so that
  ``trainer.fsdp_init=true`` means on the command line what it means in a YAML file.

The user-facing tables are ``docs/tutorials/000_mixed_precision.md`` and
``docs/tutorials/001_fsdp.md``.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from verl.compat.upstream import translate_upstream

logger = logging.getLogger("verl.compat")

__all__ = [
    "DTYPE_NAMES",
    "AliasError",
    "precision_name",
    "replace_dtypes",
    "translate_flat_kwargs",
    "translate_override",
    "translate_tree",
]

# str(torch dtype) -> the schema's precision name
DTYPE_NAMES = {
    "torch.float32": "fp32",
    "torch.float": "fp32",
    "torch.bfloat16": "bf16",
    "torch.float16": "fp16",
    "torch.half": "fp16",
    "torch.float8_e4m3fn": "fp8",
}

_SHARDING = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}
_PARALLEL_KEYS = ("type", "sharding_strategy", "cpu_offload", "offload_params", "mixed_precision")
_TRAINABLE = {  # parallel_config location -> (section path, model path)
    ("actor_rollout_ref", "actor"): ("actor_rollout_ref.actor", "actor_rollout_ref.model"),
    ("critic",): ("critic", "critic.model"),
}
_DATALOADER_KEYS = {  # data.train_dataloader.<key> -> the native key
    "num_workers": "data.dataloader_num_workers",
    "persistent_workers": "data.persistent_workers",
    "prefetch_factor": "data.prefetch_factor",
}


class AliasError(ValueError):
    """A key or value spelled for another verl that has no native counterpart here; the
    message names the key and the native spelling to use instead."""


def note(alias: str, native: str) -> None:
    """Log that ``alias`` was read as ``native``."""
    logger.warning("config alias %s -> %s (the native spelling)", alias, native)


def _is_torch_dtype(value: Any) -> bool:
    kind = type(value)
    return kind.__name__ == "dtype" and kind.__module__ == "torch"


def precision_name(value: Any, key: str = "precision") -> Any:
    """``value`` as a schema precision name when it is a torch dtype, else ``value``.

    Raises :class:`AliasError` for a torch dtype with no precision name (``torch.int8``).
    """
    if not _is_torch_dtype(value):
        return value
    name = DTYPE_NAMES.get(str(value))
    if name is None:
        raise AliasError(
            f"{key}={value}: no precision of that dtype; use one of "
            f"{', '.join(sorted(set(DTYPE_NAMES.values())))} (or the torch dtypes "
            f"{', '.join(DTYPE_NAMES)})"
        )
    return name


def replace_dtypes(value: Any, key: str = "") -> Any:
    """A copy of ``value`` with every torch dtype (in mappings, lists, dataclasses) replaced
    by its precision name; dataclass instances are replaced in place of their fields."""
    if _is_torch_dtype(value):
        return precision_name(value, key)
    if isinstance(value, Mapping):
        return {k: replace_dtypes(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(replace_dtypes(v, f"{key}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            old = getattr(value, field.name)
            new = replace_dtypes(old, f"{key}.{field.name}" if key else field.name)
            if new is not old:
                setattr(value, field.name, new)
        return value
    return value


# --- TrainerConfig(...) keyword arguments -------------------------------------------------


def translate_flat_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``TrainerConfig(**kwargs)``'s arguments with torch dtypes named and the tutorial
    spellings of the flat keys mapped (see the module docstring)."""
    out = {key: replace_dtypes(value, key) for key, value in kwargs.items()}
    hybrid = out.get("hybrid_engine_config")
    if isinstance(hybrid, Mapping):
        out["hybrid_engine_config"] = _drop_shard_dims(dict(hybrid))
    return out


def _drop_shard_dims(hybrid: dict[str, Any]) -> dict[str, Any]:
    for key in ("actor_shard_dim", "critic_shard_dim"):
        if key not in hybrid:
            continue
        dim = hybrid.pop(key)
        if not isinstance(dim, int) or isinstance(dim, bool) or dim not in (0, 1):
            raise AliasError(
                f"hybrid_engine_config.{key}={dim!r}: a shard dim is 0 or 1; FSDP2 here "
                "shards every parameter along dim 0 (there is no native key), drop it"
            )
        logger.warning(
            "hybrid_engine_config.%s=%s is dropped: FSDP2 here shards every parameter "
            "along dim 0 (no native key); the shard dim does not change results, and the "
            "bytes all-gathered per parameter are the same for either dim",
            key,
            dim,
        )
    return hybrid


# --- the YAML tree of load_config(path) ---------------------------------------------------


def translate_tree(tree: Mapping[str, Any], root: str = "TrainerConfig") -> dict[str, Any]:
    """The user YAML ``tree`` with the tutorial keys mapped onto ``root``'s schema.

    Only the RL config (``root="TrainerConfig"``) has aliases; other trees are returned
    with their torch dtypes named. Raises :class:`AliasError`.
    """
    out = replace_dtypes(copy.deepcopy(dict(tree)))
    translate_upstream(out, root, AliasError, _put)  # upstream verl's run-script keys
    if root != "TrainerConfig":
        return out
    for where, (section, model) in _TRAINABLE.items():
        parent = _get(out, where)
        if isinstance(parent, dict) and "parallel_config" in parent:
            block = parent.pop("parallel_config")
            _parallel_config(out, ".".join(where), block, section, model)
    rollout = _get(out, ("actor_rollout_ref", "rollout"))
    if isinstance(rollout, dict) and "parallel_config" in rollout:
        _rollout_parallel_config(out, rollout.pop("parallel_config"))
    trainer = out.get("trainer")
    if isinstance(trainer, dict) and "fsdp_init" in trainer:
        _fsdp_init(out, trainer.pop("fsdp_init"))
    if isinstance(trainer, dict) and "rollout_batch_size" in trainer:
        # tutorial 001 section 7.3 puts it beside trainer.async_rollout
        size = trainer.pop("rollout_batch_size")
        _put(out, "data.rollout_batch_size", size, "trainer.rollout_batch_size")
    data = out.get("data")
    if isinstance(data, dict) and "train_dataloader" in data:
        _train_dataloader(out, data.pop("train_dataloader"))
    return out


def translate_override(key: str, value: Any, root: str = "TrainerConfig") -> list[tuple[str, Any]]:
    """The native ``(dotted key, value)`` assignments of the override ``key=value``.

    The override is nested into a one-leaf tree and run through :func:`translate_tree`, so
    the command line and a YAML file share one alias table. A key that no alias touches
    comes back unchanged as ``[(key, value)]`` (a mapping value still replaces the whole
    mapping); an alias becomes the leaves it maps onto (none when it is dropped with a
    note). Raises :class:`AliasError` as :func:`translate_tree` does.
    """
    tree: Any = value
    for part in reversed(key.split(".")):
        tree = {part: tree}
    out = translate_tree(tree, root)
    if out == tree:
        return [(key, value)]
    return list(_leaves(out, ""))


def _leaves(node: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for name, value in node.items():
        path = f"{prefix}{name}"
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, f"{path}.")
        elif not isinstance(value, Mapping):
            yield path, value


def _parallel_config(
    tree: dict[str, Any], where: str, block: Any, section: str, model: str
) -> None:
    block = _mapping(block, f"{where}.parallel_config")
    unknown = set(block) - {*_PARALLEL_KEYS, "activation_checkpointing"}
    if unknown:
        raise AliasError(
            f"{where}.parallel_config has unknown keys {sorted(unknown)}; it takes "
            f"{', '.join((*_PARALLEL_KEYS, 'activation_checkpointing'))}, or use the native "
            f"keys {section}.strategy and {section}.fsdp_config.*"
        )
    for key, value in block.items():
        alias = f"{where}.parallel_config.{key}"
        for path, native in _parallel_assignments(alias, key, value, section, model):
            _put(tree, path, native, alias)


def _parallel_assignments(
    alias: str, key: str, value: Any, section: str, model: str
) -> list[tuple[str, Any]]:
    fsdp = f"{section}.fsdp_config"
    if key == "type":
        kind = str(value).lower()
        if kind in ("fsdp", "fsdp2"):
            return [(f"{section}.strategy", "fsdp2")]
        raise AliasError(
            f"{alias}={value!r}: the engines here are {section}.strategy=fsdp2 (FSDP2), "
            "single (one process, no wrapping) or auto; Megatron-LM and DDP are not available"
        )
    if key == "sharding_strategy":
        name = str(value).upper()
        if name not in _SHARDING:
            raise AliasError(
                f"{alias}={value!r}: use FULL_SHARD ({fsdp}.reshard_after_forward=true) or "
                f"SHARD_GRAD_OP ({fsdp}.reshard_after_forward=false)"
            )
        return [(f"{fsdp}.reshard_after_forward", _SHARDING[name])]
    if key == "cpu_offload":
        on = _bool(value, alias)
        return [(f"{fsdp}.param_offload", on), (f"{fsdp}.optimizer_offload", on)]
    if key == "offload_params":
        return [(f"{fsdp}.param_offload", _bool(value, alias))]
    if key == "mixed_precision":
        return [(f"{fsdp}.mixed_precision", _mixed_precision(value, alias))]
    # activation_checkpointing
    return [(f"{model}.enable_gradient_checkpointing", _bool(value, alias))]


def _mixed_precision(value: Any, alias: str) -> Any:
    if value is True:  # bf16 compute, fp32 reduction and buffers (MixedPrecisionConfig)
        return {"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    if value is False or value is None:
        return None
    if isinstance(value, Mapping):
        return dict(value)
    if value in ("bf16", "fp16"):
        return {"param_dtype": value, "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    if value == "fp8":
        raise AliasError(
            f"{alias}=fp8: fp8 training compute needs an H100-class GPU (capability 8.9+) "
            "with transformer-engine, which this build does not use; fp8 here is weight-only "
            "for the inference roles: trainer.model_precision_map={reference: fp8, reward: "
            "fp8}, with bf16 for the trained roles (trainer.mixed_precision=bf16)"
        )
    raise AliasError(
        f"{alias}={value!r}: use true (bf16 compute), false, bf16, fp16, or a mapping "
        "{param_dtype, reduce_dtype, buffer_dtype}"
    )


def _rollout_parallel_config(tree: dict[str, Any], block: Any) -> None:
    """The rollout shares the actor's module (hybrid engine): its block may only agree."""
    where = "actor_rollout_ref.rollout.parallel_config"
    block = _mapping(block, where)
    for key, value in block.items():
        alias = f"{where}.{key}"
        if key == "activation_checkpointing":
            logger.warning(
                "%s=%s is dropped: generation runs no backward pass, so there are no "
                "activations to recompute (native: actor_rollout_ref.model."
                "enable_gradient_checkpointing, for the actor's update)",
                alias,
                value,
            )
            continue
        if key not in _PARALLEL_KEYS:
            raise AliasError(f"{alias}: unknown key; the rollout takes {', '.join(_PARALLEL_KEYS)}")
        section, model = _TRAINABLE[("actor_rollout_ref", "actor")]
        for path, native in _parallel_assignments(alias, key, value, section, model):
            current = _get(tree, tuple(path.split(".")))
            if current is not None and current != native:
                raise AliasError(
                    f"{alias}={value!r} differs from {path}={current!r}: the rollout generates "
                    "with the actor's own FSDP module and weights (hybrid engine), so it has "
                    f"no setting of its own; set {path} once"
                )
            _put(tree, path, native, alias)


def _fsdp_init(tree: dict[str, Any], value: Any) -> None:
    on = _bool(value, "trainer.fsdp_init")
    strategy = "fsdp2" if on else "single"
    _put(tree, "actor_rollout_ref.actor.strategy", strategy, "trainer.fsdp_init")


def _train_dataloader(tree: dict[str, Any], block: Any) -> None:
    block = _mapping(block, "data.train_dataloader")
    unknown = set(block) - set(_DATALOADER_KEYS)
    if unknown:
        raise AliasError(
            f"data.train_dataloader has unknown keys {sorted(unknown)}; it takes "
            f"{', '.join(_DATALOADER_KEYS)} (the native data keys are data.train_batch_size, "
            "data.shuffle, data.seed)"
        )
    for key, value in block.items():
        _put(tree, _DATALOADER_KEYS[key], value, f"data.train_dataloader.{key}")


# --- small helpers ------------------------------------------------------------------------


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise AliasError(f"{where} must be a mapping, got {value!r}")
    return dict(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise AliasError(f"{where}={value!r}: must be true or false")
    return value


def _get(tree: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = tree
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _put(tree: dict[str, Any], path: str, value: Any, alias: str) -> None:
    """Set ``path`` to ``value``; a different value already given there is an error."""
    parts = path.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise AliasError(f"{alias} sets {path}, but {'.'.join(parts[:-1])} is not a mapping")
        node = child
    last = parts[-1]
    if last in node and node[last] != value:
        raise AliasError(
            f"{alias} sets {path}={value!r}, but {path} is also given as {node[last]!r}; "
            "give one of them"
        )
    node[last] = value
    note(alias, f"{path}={value!r}")
