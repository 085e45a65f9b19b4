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

Its entry points, applied around the native loader by the input adapters of
:mod:`verl.compat.loading` and :mod:`verl.compat.flat_keys` (registered in
``verl.registry.CONFIG_ADAPTERS``; this module imports nothing of verl but the upstream
table, and never torch):

* :func:`translate_flat_kwargs` -- keyword arguments of ``TrainerConfig(...)``
  (``verl.compat.flat_keys.adapt_keywords``);
* :func:`translate_tree` -- the user YAML tree of ``load_config(path)``
  (``verl.compat.loading.LoadAdapter.tree``);
* :func:`translate_override` -- one dotted ``key=value`` command-line override, through the
  same tree translation (``LoadAdapter.override``), so that ``trainer.fsdp_init=true``
  means on the command line what it means in a YAML file.

Two spellings of one native key (an alias and the native key, or two aliases) must give
the same value, in a YAML file and on the command line alike: :class:`KeySources` records
which spelling set each native key, and a second spelling with another value is refused
with one message naming both keys and values (:func:`conflict_message`), unless the
upstream table reconciles the pair (:func:`verl.compat.upstream.reconcile`). The same key
given twice on the command line is an ordinary override (the last wins), and so is a
command-line key over a YAML file's. Values quoted in messages are cut to 200 characters.

The user-facing tables are ``docs/tutorials/000_mixed_precision.md`` and
``docs/tutorials/001_fsdp.md``.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from verl.compat.upstream import reconcile, short_repr, translate_upstream

logger = logging.getLogger("verl.compat")

__all__ = [
    "DTYPE_NAMES",
    "DTYPE_STRINGS",
    "AliasError",
    "KeySources",
    "Spelling",
    "conflict_message",
    "precision_name",
    "precision_string",
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

# a dtype written as text where the schema names a precision: "torch.bfloat16", "bfloat16"
DTYPE_STRINGS = {
    **DTYPE_NAMES,
    **{name.removeprefix("torch."): precision for name, precision in DTYPE_NAMES.items()},
}

_SHARDING = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}
_ROLLOUT_PARALLEL = "actor_rollout_ref.rollout.parallel_config."
_PARALLEL_KEYS = ("type", "sharding_strategy", "cpu_offload", "offload_params", "mixed_precision")
# what tutorial 001 says of Megatron-LM's place, for a refused engine name
NO_MEGATRON = (
    "there is no Megatron-LM engine here (Megatron-Core needs CUDA GPUs): train with FSDP2 "
    "(strategy=fsdp2); Megatron's sequence parallelism has an FSDP2 counterpart, "
    "ulysses_sequence_parallel_size=N (docs/distributed.md)"
)
_TRAINABLE = {  # parallel_config location -> (section path, model path)
    ("actor_rollout_ref", "actor"): ("actor_rollout_ref.actor", "actor_rollout_ref.model"),
    ("critic",): ("critic", "critic.model"),
}
_DATALOADER_KEYS = {  # data.train_dataloader.<key> -> the native key
    "num_workers": "data.dataloader_num_workers",
    "persistent_workers": "data.persistent_workers",
    "prefetch_factor": "data.prefetch_factor",
}


_MISSING = object()


class AliasError(ValueError):
    """A key or value spelled for another verl that has no native counterpart here; the
    message names the key and the native spelling to use instead."""


@dataclasses.dataclass(frozen=True)
class Spelling:
    """One assignment of a native key: ``key`` and ``value`` as the user wrote them (an
    alias or the native key itself), ``native`` the value it sets, ``source`` where it
    was written (``"file"`` or ``"command line"``)."""

    key: str
    value: Any
    native: Any
    source: str


def conflict_message(path: str, first: Spelling, second: Spelling) -> str:
    """The one message for two spellings that set the native key ``path`` differently: the
    same whichever came first (the native key, then the aliases by name)."""
    first, second = sorted((first, second), key=lambda s: (s.key != path, s.key))

    def given(s: Spelling) -> str:
        text = f"{s.key}={short_repr(s.value)}"
        if s.key != path:
            text += f" (sets {path}={short_repr(s.native)})"
        return text

    return f"{given(first)} and {given(second)} set the same key; give one of them"


class KeySources:
    """Which spelling set each native key of one config being loaded.

    :meth:`claim` gives the value a native key takes when one more spelling sets it: the
    same key again replaces it (an override), a command-line key replaces a YAML file's,
    and two different spellings from one source must agree, unless
    :func:`~verl.compat.upstream.reconcile` says what the pair means.
    """

    def __init__(self) -> None:
        self._by_path: dict[str, Spelling] = {}
        # per native key: the last rollout parallel_config spelling, the last other one
        self._rollout: dict[str, Spelling] = {}
        self._own: dict[str, Spelling] = {}

    def _check_rollout(self, path: str, new: Spelling, current: Any) -> None:
        """A ``rollout.parallel_config`` spelling and any other spelling of the same actor
        key must agree, whichever source each came from: the rollout has no FSDP setting
        of its own, so a command-line override cannot make them differ either."""
        rollout = new.key.startswith(_ROLLOUT_PARALLEL)
        other = (self._own if rollout else self._rollout).get(path)
        if other is None and rollout and current is not _MISSING:
            other = Spelling(path, current, current, new.source)
        (self._rollout if rollout else self._own)[path] = new
        if other is None or other.native == new.native:
            return
        first, second = (new, other) if rollout else (other, new)
        raise AliasError(
            f"{first.key}={short_repr(first.value)} ({first.source}) differs from "
            f"{second.key}={short_repr(second.value)} ({second.source}) on {path}: the "
            "rollout generates with the actor's own FSDP module and weights (hybrid engine), "
            f"so it has no setting of its own; set {path} once"
        )

    def claim(self, path: str, new: Spelling, current: Any = _MISSING) -> Any:
        """The value ``path`` takes when ``new`` sets it; ``current`` is the value the tree
        already holds there when no spelling of this object set it (a native key written in
        the same source). Raises :class:`AliasError` for two spellings that disagree."""
        self._check_rollout(path, new, current)
        old = self._by_path.get(path)
        if old is None and current is not _MISSING:
            old = Spelling(path, current, current, new.source)
        value = new.native
        if old is not None and old.key != new.key and old.native != new.native:
            merged, value = reconcile(path, {old.key: old.native, new.key: new.native})
            if not merged:
                if old.source == new.source:
                    raise AliasError(conflict_message(path, old, new))
                value = new.native
        self._by_path[path] = dataclasses.replace(new, native=value)
        return value


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


def precision_string(value: Any) -> str | None:
    """The precision name a dtype written as text spells (``"bfloat16"``,
    ``"torch.bfloat16"`` -> ``"bf16"``), else ``None``. Only for a key whose schema type is a
    precision: elsewhere (``model.override_config.torch_dtype``) the text is what it says."""
    return DTYPE_STRINGS.get(value) if isinstance(value, str) else None


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
        _check_shard_dims(hybrid)
    return out


_SHARD_DIMS = {  # hybrid_engine_config.<key> -> the native key
    "actor_shard_dim": "actor_rollout_ref.actor.fsdp_config.shard_dim",
    "critic_shard_dim": "critic.fsdp_config.shard_dim",
}


def _check_shard_dims(hybrid: Mapping[str, Any]) -> None:
    """Tutorial 000 section 6.4's per-role shard dims: FSDP2's ``shard_placement_fn`` shards
    each parameter of that role along the dim (``<role>.fsdp_config.shard_dim``)."""
    for key, native in _SHARD_DIMS.items():
        if key not in hybrid:
            continue
        dim = hybrid[key]
        if not isinstance(dim, int) or isinstance(dim, bool) or dim not in (0, 1):
            raise AliasError(
                f"hybrid_engine_config.{key}={short_repr(dim)}: a shard dim is 0 or 1 (rows or "
                f"columns of a [out, in] weight); native: {native}"
            )
        note(f"hybrid_engine_config.{key}", f"{native}={dim}")


# --- the YAML tree of load_config(path) ---------------------------------------------------


def translate_tree(
    tree: Mapping[str, Any],
    root: str = "TrainerConfig",
    *,
    errors: list[str] | None = None,
    sources: KeySources | None = None,
    source: str = "file",
    known: Callable[[str], bool] | None = None,
) -> dict[str, Any]:
    """The user YAML ``tree`` with the tutorial keys mapped onto ``root``'s schema.

    Only the RL config (``root="TrainerConfig"``) has the tutorials' aliases; every root
    reads upstream verl's keys (:mod:`verl.compat.upstream`) and has its torch dtypes
    named. ``sources`` records which spelling set each native key (``source``: where the
    tree was written); ``known(dotted key)``, when given, says which keys the schema has
    (``*_per_gpu`` is renamed only onto an existing ``*_per_device``). Raises
    :class:`AliasError` for the first refused key; with an ``errors`` list, every refused
    key's message is appended there instead, the key is left out, and every other key is
    still translated.
    """
    collected: list[str] = [] if errors is None else errors
    start = len(collected)
    sources = KeySources() if sources is None else sources

    def put(
        node: dict[str, Any], path: str, value: Any, alias: str, written: Any = _MISSING
    ) -> None:
        _put(node, path, value, alias, written, sources, source)

    out = replace_dtypes(copy.deepcopy(dict(tree)))
    translate_upstream(out, root, AliasError, put, collected, known)  # upstream's keys
    if root == "TrainerConfig":
        for step in _TUTORIAL_STEPS:
            try:
                step(out, put)
            except AliasError as exc:
                collected.append(str(exc))
    if errors is None and len(collected) > start:
        raise AliasError("\n".join(collected[start:]))
    return out


def _tutorial_parallel(out: dict[str, Any], put: _Put) -> None:
    for where, (section, model) in _TRAINABLE.items():
        parent = _get(out, where)
        if isinstance(parent, dict) and "parallel_config" in parent:
            block = parent.pop("parallel_config")
            _parallel_config(out, ".".join(where), block, section, model, put)


def _tutorial_rollout(out: dict[str, Any], put: _Put) -> None:
    rollout = _get(out, ("actor_rollout_ref", "rollout"))
    if isinstance(rollout, dict) and "parallel_config" in rollout:
        _rollout_parallel_config(out, rollout.pop("parallel_config"), put)


def _tutorial_trainer(out: dict[str, Any], put: _Put) -> None:
    trainer = out.get("trainer")
    if isinstance(trainer, dict) and "fsdp_init" in trainer:
        on = _bool(trainer.pop("fsdp_init"), "trainer.fsdp_init")
        strategy = "fsdp2" if on else "single"
        put(out, "actor_rollout_ref.actor.strategy", strategy, "trainer.fsdp_init")
    if isinstance(trainer, dict) and "rollout_batch_size" in trainer:
        # tutorial 001 section 7.3 puts it beside trainer.async_rollout
        size = trainer.pop("rollout_batch_size")
        put(out, "data.rollout_batch_size", size, "trainer.rollout_batch_size")


def _tutorial_data(out: dict[str, Any], put: _Put) -> None:
    data = out.get("data")
    if isinstance(data, dict) and "train_dataloader" in data:
        block = _mapping(data.pop("train_dataloader"), "data.train_dataloader")
        unknown = set(block) - set(_DATALOADER_KEYS)
        if unknown:
            raise AliasError(
                f"data.train_dataloader has unknown keys {sorted(unknown)}; it takes "
                f"{', '.join(_DATALOADER_KEYS)} (the native data keys are "
                "data.train_batch_size, data.shuffle, data.seed)"
            )
        for key, value in block.items():
            put(out, _DATALOADER_KEYS[key], value, f"data.train_dataloader.{key}")


_Put = Callable[..., None]  # put(tree, native key, value, alias[, value as written])
_TUTORIAL_STEPS = (_tutorial_parallel, _tutorial_rollout, _tutorial_trainer, _tutorial_data)


def translate_override(
    key: str,
    value: Any,
    root: str = "TrainerConfig",
    known: Callable[[str], bool] | None = None,
) -> list[tuple[str, Any]]:
    """The native ``(dotted key, value)`` assignments of the override ``key=value``.

    The override is nested into a one-leaf tree and run through :func:`translate_tree`, so
    the command line and a YAML file share one alias table. A key that no alias touches
    comes back unchanged as ``[(key, value)]`` (a mapping value still replaces the whole
    mapping); an alias becomes the leaves it maps onto (none when it is dropped with a
    note). Raises :class:`AliasError` as :func:`translate_tree` does (``known``: as there).
    """
    tree: Any = value
    for part in reversed(key.split(".")):
        tree = {part: tree}
    out = translate_tree(tree, root, known=known)
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
    tree: dict[str, Any], where: str, block: Any, section: str, model: str, put: _Put
) -> None:
    block = _mapping(block, f"{where}.parallel_config")
    if "ignore_modules" in block:
        note_ignore_modules(f"{where}.parallel_config", block.pop("ignore_modules"))
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
            put(tree, path, native, alias, value)


def note_ignore_modules(where: str, value: Any) -> None:
    """Accept tutorial 001's ``ignore_modules`` (LoRA adapter classes kept out of FSDP's
    sharding) with a note: FSDP2 here shards each adapter inside the layer it belongs to
    (frozen and trainable parameters in one unit), which is what keeping the adapters out
    of FSDP1's flat parameters achieved; ignoring them in FSDP2 would leave their
    gradients unreduced across ranks. Raises :class:`AliasError` for a value that is not a
    list of names."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise AliasError(
            f"{where}.ignore_modules={short_repr(value)}: a list of module class names"
        )
    logger.warning(
        "%s.ignore_modules=%s is accepted and needs no effect: FSDP2 shards each LoRA "
        "adapter with the layer it belongs to (one unit, frozen and trainable parameters "
        "together), and every trainable parameter's gradient is reduced across ranks; LoRA "
        "is actor_rollout_ref.model.lora_rank",
        where,
        list(names),
    )


def _parallel_assignments(
    alias: str, key: str, value: Any, section: str, model: str
) -> list[tuple[str, Any]]:
    fsdp = f"{section}.fsdp_config"
    if key == "type":
        kind = str(value).lower()
        if kind in ("fsdp", "fsdp2"):
            return [(f"{section}.strategy", "fsdp2")]
        raise AliasError(
            f"{alias}={short_repr(value)}: the engines here are {section}.strategy=fsdp2 (FSDP2), "
            f"single (one process, no wrapping) or auto; DDP is not available, and {NO_MEGATRON}"
        )
    if key == "sharding_strategy":
        name = str(value).upper()
        if name not in _SHARDING:
            raise AliasError(
                f"{alias}={short_repr(value)}: use FULL_SHARD ({fsdp}.reshard_after_forward=true) or "
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
        f"{alias}={short_repr(value)}: use true (bf16 compute), false, bf16, fp16, or a mapping "
        "{param_dtype, reduce_dtype, buffer_dtype}"
    )


def _rollout_parallel_config(tree: dict[str, Any], block: Any, put: _Put) -> None:
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
                    f"{alias}={short_repr(value)} differs from {path}={short_repr(current)}: the "
                    "rollout generates with the actor's own FSDP module and weights (hybrid "
                    f"engine), so it has no setting of its own; set {path} once"
                )
            put(tree, path, native, alias, value)


# --- small helpers ------------------------------------------------------------------------


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise AliasError(f"{where} must be a mapping, got {short_repr(value)}")
    return dict(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise AliasError(f"{where}={short_repr(value)}: must be true or false")
    return value


def _get(tree: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = tree
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _put(
    tree: dict[str, Any],
    path: str,
    value: Any,
    alias: str,
    written: Any = _MISSING,
    sources: KeySources | None = None,
    source: str = "file",
) -> None:
    """Set ``path`` to ``value`` for the spelling ``alias`` (which the user wrote with the
    value ``written``, default ``value``); another spelling of ``path`` with a different
    value is an error (:meth:`KeySources.claim`)."""
    parts = path.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise AliasError(f"{alias} sets {path}, but {'.'.join(parts[:-1])} is not a mapping")
        node = child
    last = parts[-1]
    sources = KeySources() if sources is None else sources
    current = node.get(last, _MISSING)
    spelled = value if written is _MISSING else written
    node[last] = sources.claim(path, Spelling(alias, spelled, value, source), current)
    note(alias, f"{path}={short_repr(node[last])}")
