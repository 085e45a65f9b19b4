"""Flat keyword arguments of ``TrainerConfig(...)``, mapped onto the nested schema.

``TrainerConfig(mixed_precision="bf16", max_grad_norm=0.5, activation_checkpointing=True)``
is the same config as setting the nested keys ("twins") of those flat keys. A flat
key whose twin was also given a different (non-default) value is an error, never a silent
override. The table in ``docs/precision.md`` ("Flat keys") is the user-facing version.
These keys exist only in the Python API: YAML and overrides use the nested keys.

:func:`adapt_keywords` is the ``keywords`` input adapter of ``verl.registry.CONFIG_ADAPTERS``,
which ``TrainerConfig.__init__`` asks: it names torch dtypes and the tutorials' spellings
(:func:`verl.compat.aliases.translate_flat_kwargs`), takes the flat keys out, refuses an
unknown keyword with the nearest key, and gives back what to do on the built config: set
the flat keys' twins (:func:`apply_flat_keys`), then name the precisions written as text and
fill the role precision keys (:mod:`verl.compat.precision_keys`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from verl.compat.aliases import note_ignore_modules, translate_flat_kwargs
from verl.compat.precision_keys import fill_role_precisions, name_precision_strings
from verl.config.load import ConfigError, ConfigProblem, field_types, get_path, suggest
from verl.config.schema_roles import MixedPrecisionConfig

_ARR = "actor_rollout_ref"
_ACTOR, _CRITIC = f"{_ARR}.actor", "critic"
_MODEL = {"actor": f"{_ARR}.model", "critic": "critic.model"}
_SHARDING = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}
Assignments = list[tuple[str, Any]]


def _only(value: Any, allowed: tuple[str, ...], what: str = "keys") -> dict[str, Any]:
    """``value`` as a dict, or ValueError naming its keys outside ``allowed``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a mapping, got {type(value).__name__}")
    unknown = set(value) - set(allowed)
    if unknown:
        raise ValueError(f"unknown {what} {sorted(unknown)}; use {', '.join(allowed)}")
    return dict(value)


def _precision_map(cfg: Any, value: Any) -> Assignments:
    if not isinstance(value, Mapping):
        raise ValueError("must be a mapping {role: precision}")
    return [("trainer.model_precision_map", dict(value))]


def _checkpointing(cfg: Any, value: Any) -> Assignments:
    if isinstance(value, Mapping):
        per_role = _only(value, ("actor", "critic"), "roles")
    else:
        per_role = dict.fromkeys(_MODEL, value)
    return [(f"{_MODEL[r]}.enable_gradient_checkpointing", bool(v)) for r, v in per_role.items()]


def _hybrid_engine(cfg: Any, value: Any) -> Assignments:
    if not value:
        raise ValueError(
            "a rollout with its own copy of the weights is not supported; the actor and "
            "the rollout always share one worker and one set of weights (drop the key)"
        )
    return []


def _hybrid_engine_config(cfg: Any, value: Any) -> Assignments:
    value = _only(value, ("enable_activation_recomputation", "actor_shard_dim", "critic_shard_dim"))
    on = value.get("enable_activation_recomputation")
    out = [] if on is None else [(f"{_MODEL['actor']}.enable_gradient_checkpointing", bool(on))]
    for role, section in (("actor", _ACTOR), ("critic", _CRITIC)):
        if f"{role}_shard_dim" in value:  # checked by translate_flat_kwargs
            out.append((f"{section}.fsdp_config.shard_dim", value[f"{role}_shard_dim"]))
    return out


def _fsdp(cfg: Any, value: Any) -> Assignments:
    keys = ("sharding_strategy", "cpu_offload", "offload_params", "mixed_precision")
    value = _only(value, (*keys, "ignore_modules"))
    out: Assignments = []
    if "ignore_modules" in value:
        note_ignore_modules("fsdp_config", value.pop("ignore_modules"))
    if "sharding_strategy" in value:
        name = str(value["sharding_strategy"]).upper()
        if name not in _SHARDING:
            raise ValueError(
                f"sharding_strategy {value['sharding_strategy']!r} is not supported; use "
                "FULL_SHARD or SHARD_GRAD_OP (one process: strategy=single)"
            )
        out.append(("reshard_after_forward", _SHARDING[name]))
    if "cpu_offload" in value:
        out += [(key, bool(value["cpu_offload"])) for key in ("param_offload", "optimizer_offload")]
    if "offload_params" in value:  # as parallel_config.offload_params in YAML: parameters only
        on = bool(value["offload_params"])
        if "cpu_offload" in value and bool(value["cpu_offload"]) != on:
            raise ValueError(
                f"cpu_offload={value['cpu_offload']!r} and offload_params={value['offload_params']!r} "
                "both set param_offload; give one of them"
            )
        out.append(("param_offload", on))
    if "mixed_precision" in value:
        mp = value["mixed_precision"]
        keys = ("param_dtype", "reduce_dtype", "buffer_dtype")
        mp = None if mp is None else MixedPrecisionConfig(**_only(mp, keys, "mixed_precision keys"))
        out.append(("mixed_precision", mp))
    return [(f"{p}.fsdp_config.{key}", v) for p in (_ACTOR, _CRITIC) for key, v in out]


def _accumulation(cfg: Any, value: Any) -> Assignments:
    steps, n, out = int(value), cfg.actor_rollout_ref.rollout.n, []
    if steps < 1:
        raise ValueError("must be >= 1")
    roles = [(_ACTOR, cfg.actor_rollout_ref.actor, _ARR)]
    roles += [(_CRITIC, cfg.critic, "critic")] if cfg.critic_enabled else []
    for prefix, section, group in roles:
        if section.use_dynamic_bsz:
            raise ValueError(
                f"{prefix}.use_dynamic_bsz=true packs micro-batches by tokens, so the number "
                "of accumulation steps is not fixed; drop one of them"
            )
        samples, ranks = section.ppo_mini_batch_size * n, cfg.dp_size(group)
        micro = samples // ranks // steps
        if samples % ranks or (samples // ranks) % steps or micro == 0:
            raise ValueError(
                f"{prefix}: ppo_mini_batch_size * rollout.n = {samples} samples over "
                f"{ranks} rank(s) do not split into {steps} equal micro-batches"
            )
        out.append((f"{prefix}.ppo_micro_batch_size_per_device", micro))
    return out


# flat key -> its assignments ``[(nested key path, value)]``; the user-facing version is the
# table "Flat keys" of docs/precision.md.
FLAT: dict[str, Callable[[Any, Any], Assignments]] = {
    "mixed_precision": lambda cfg, v: [("trainer.mixed_precision", v)],
    "model_precision_map": _precision_map,
    "gradient_precision": lambda cfg, v: [("trainer.gradient_precision", v)],
    "use_gradient_scaling": lambda cfg, v: [("trainer.use_gradient_scaling", v)],
    "use_flash_attention": lambda cfg, v: [("trainer.use_flash_attention", bool(v))],
    "dynamic_precision": lambda cfg, v: [("trainer.dynamic_precision", bool(v))],
    "max_grad_norm": lambda cfg, v: [(f"{p}.grad_clip", float(v)) for p in (_ACTOR, _CRITIC)],
    "activation_checkpointing": _checkpointing,
    "gradient_accumulation_steps": _accumulation,
    "fsdp_config": _fsdp,
    "enable_3d_hybrid_engine": _hybrid_engine,
    "hybrid_engine_config": _hybrid_engine_config,
}
FLAT_KEYS: tuple[str, ...] = tuple(FLAT)


def apply_flat_keys(cfg: Any, flat: Mapping[str, Any]) -> None:
    """Set the nested twins of the ``flat`` keyword arguments on ``cfg`` in place.

    Raises ``ConfigError`` listing every flat key that is unknown, has a value it cannot
    map, or contradicts a nested value (or another flat key) given alongside it.
    """
    problems: list[ConfigProblem] = []
    assigned: dict[str, tuple[Any, str]] = {}
    for key, value in flat.items():
        try:
            if key not in FLAT:
                raise ValueError(f"unknown flat key; the flat keys are {', '.join(FLAT_KEYS)}")
            pairs = FLAT[key](cfg, value)
        except ValueError as err:
            problems.append(ConfigProblem(key, f"{key}={value!r}: {err}", (key,)))
            continue
        for path, new in pairs:
            old, other = assigned.setdefault(path, (new, key))
            if old != new:
                message = (
                    f"flat keys {other} and {key} both set {path}, to {old!r} and {new!r}; give one"
                )
                problems.append(ConfigProblem(key, message, (key, other)))
    default = type(cfg)()
    for path, (new, key) in assigned.items():
        current = get_path(cfg, path)
        if current != get_path(default, path) and current != new:
            message = (
                f"flat key {key}={flat[key]!r} sets {path}={new!r}, but {path} was also given "
                f"as {current!r}; set one of them"
            )
            problems.append(ConfigProblem(path, message, (path, key)))
    if problems:
        raise ConfigError(problems)
    for path, (new, _) in assigned.items():
        parent, _, last = path.rpartition(".")
        setattr(get_path(cfg, parent), last, new)


def adapt_keywords(
    cls: type, kwargs: dict[str, Any]
) -> tuple[dict[str, Any], Callable[[Any], None]]:
    """``cls(**kwargs)``'s section keywords, and what to do on the built config (see the
    module docstring). Raises ``TypeError`` for a keyword that is neither a section of
    ``cls`` nor a flat key, ``AliasError`` for a spelling with no native meaning."""
    kwargs = translate_flat_kwargs(kwargs)  # torch dtypes, tutorial spellings
    flat = {key: kwargs.pop(key) for key in list(kwargs) if key in FLAT}
    unknown = [key for key in kwargs if key not in field_types(cls)]
    if unknown:
        raise TypeError(_unknown_keywords(cls, unknown, kwargs))

    def finish(cfg: Any) -> None:
        if flat:
            apply_flat_keys(cfg, flat)
        name_precision_strings(cfg)  # "bfloat16", "torch.float16" ... -> bf16, fp16
        fill_role_precisions(cfg)  # trainer.mixed_precision / model_precision_map -> role keys

    return kwargs, finish


def _unknown_keywords(cls: type, unknown: list[str], kwargs: Mapping[str, Any]) -> str:
    """The message for ``cls(**kwargs)``'s keywords that are neither a section nor a flat
    key: each with the nearest key (``*_per_gpu`` as ``*_per_device``)."""
    name, lines = cls.__name__, []
    for key in unknown:
        native = key[: -len("_per_gpu")] + "_per_device" if key.endswith("_per_gpu") else key
        lines.append(f"{key}={kwargs[key]!r}{suggest(native, cls, cls)}")
    return (
        f"{name}(): unknown keyword{'s' if len(unknown) > 1 else ''} "
        + "; ".join(lines)
        + f"; {name} takes its sections ({', '.join(field_types(cls))}) and "
        "the flat "
        f"keys ({', '.join(FLAT_KEYS)}), and a nested key is set on its section "
        f"({name}(data=DataConfig(...))) or as an override "
        "(load_config(overrides=['data.train_batch_size=8']))"
    )
