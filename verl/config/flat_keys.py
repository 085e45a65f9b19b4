"""Flat keyword arguments of ``TrainerConfig(...)``, mapped onto the nested schema.

``TrainerConfig(mixed_precision="bf16", max_grad_norm=0.5, activation_checkpointing=True)``
is the same config as setting the nested keys ("twins") of those flat keys. A flat
key whose twin was also given a different (non-default) value is an error, never a silent
override. The table in ``docs/precision.md`` ("Flat keys") is the user-facing version.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from verl.config.load import ConfigError, ConfigProblem, get_path
from verl.config.schema_roles import MixedPrecisionConfig

_ARR = "actor_rollout_ref"
_ACTOR, _CRITIC = f"{_ARR}.actor", "critic"

# The flat keys; what each one sets is the table "Flat keys" of docs/precision.md (and
# _assignments below).
FLAT_KEYS: tuple[str, ...] = (
    "mixed_precision",
    "model_precision_map",
    "gradient_precision",
    "use_gradient_scaling",
    "use_flash_attention",
    "dynamic_precision",
    "max_grad_norm",
    "activation_checkpointing",
    "gradient_accumulation_steps",
    "fsdp_config",
    "enable_3d_hybrid_engine",
    "hybrid_engine_config",
)

_SHARDING = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}
_FSDP_KEYS = ("sharding_strategy", "cpu_offload", "mixed_precision")
_MP_KEYS = ("param_dtype", "reduce_dtype", "buffer_dtype")


def apply_flat_keys(cfg: Any, flat: Mapping[str, Any]) -> None:
    """Set the nested twins of the ``flat`` keyword arguments on ``cfg`` in place.

    Raises ``ConfigError`` listing every flat key that is unknown, has a value it cannot
    map, or contradicts a nested value given alongside it.
    """
    problems: list[ConfigProblem] = []
    assigned: dict[str, tuple[Any, str]] = {}
    for key, value in flat.items():
        try:
            pairs = _assignments(cfg, key, value)
        except ValueError as err:
            problems.append(ConfigProblem(key, f"{key}={value!r}: {err}", (key,)))
            continue
        for path, new in pairs:
            if path in assigned and assigned[path][0] != new:
                other = assigned[path][1]
                problems.append(
                    ConfigProblem(
                        key,
                        f"flat keys {other} and {key} both set {path}, to "
                        f"{assigned[path][0]!r} and {new!r}; give one",
                        (key, other),
                    )
                )
                continue
            assigned[path] = (new, key)

    default = type(cfg)()
    for path, (new, key) in assigned.items():
        current, was = get_path(cfg, path), get_path(default, path)
        if current != was and current != new:
            problems.append(
                ConfigProblem(
                    path,
                    f"flat key {key}={flat[key]!r} sets {path}={new!r}, but {path} was also "
                    f"given as {current!r}; set one of them",
                    (path, key),
                )
            )
    if problems:
        raise ConfigError(problems)
    for path, (new, _) in assigned.items():
        _set(cfg, path, new)


def _assignments(cfg: Any, key: str, value: Any) -> list[tuple[str, Any]]:
    if key in ("mixed_precision", "gradient_precision", "use_gradient_scaling"):
        return [(f"trainer.{key}", value)]
    if key in ("use_flash_attention", "dynamic_precision"):
        return [(f"trainer.{key}", bool(value))]
    if key == "model_precision_map":
        if not isinstance(value, Mapping):
            raise ValueError("must be a mapping {role: precision}")
        return [(f"trainer.{key}", dict(value))]
    if key == "max_grad_norm":
        return [(f"{_ACTOR}.grad_clip", float(value)), (f"{_CRITIC}.grad_clip", float(value))]
    if key == "activation_checkpointing":
        if isinstance(value, Mapping):
            _only(value, ("actor", "critic"), "roles")
            per_role = {r: bool(v) for r, v in value.items()}
        else:
            per_role = {"actor": bool(value), "critic": bool(value)}
        paths = {"actor": f"{_ARR}.model", "critic": "critic.model"}
        return [(f"{paths[r]}.enable_gradient_checkpointing", v) for r, v in per_role.items()]
    if key == "hybrid_engine_config":
        value = _only(_as_dict(value), ("enable_activation_recomputation",))
        if "enable_activation_recomputation" not in value:
            return []
        on = bool(value["enable_activation_recomputation"])
        return [(f"{_ARR}.model.enable_gradient_checkpointing", on)]
    if key == "enable_3d_hybrid_engine":
        if not value:
            raise ValueError(
                "a rollout with its own copy of the weights is not supported; the actor and "
                "the rollout always share one worker and one set of weights (drop the key)"
            )
        return []
    if key == "fsdp_config":
        return _fsdp_assignments(_as_dict(value))
    if key == "gradient_accumulation_steps":
        return _accumulation_assignments(cfg, int(value))
    raise ValueError(f"unknown flat key; the flat keys are {', '.join(FLAT_KEYS)}")


def _fsdp_assignments(value: dict[str, Any]) -> list[tuple[str, Any]]:
    _only(value, _FSDP_KEYS)
    out: list[tuple[str, Any]] = []
    for prefix in (_ACTOR, _CRITIC):
        fc = f"{prefix}.fsdp_config"
        if "sharding_strategy" in value:
            name = str(value["sharding_strategy"]).upper()
            if name not in _SHARDING:
                raise ValueError(
                    f"sharding_strategy {value['sharding_strategy']!r} is not supported; use "
                    "FULL_SHARD or SHARD_GRAD_OP (one process: strategy=single)"
                )
            out.append((f"{fc}.reshard_after_forward", _SHARDING[name]))
        if "cpu_offload" in value:
            on = bool(value["cpu_offload"])
            out += [(f"{fc}.param_offload", on), (f"{fc}.optimizer_offload", on)]
        if "mixed_precision" in value:
            mp = value["mixed_precision"]
            out.append((f"{fc}.mixed_precision", None if mp is None else _mixed_precision(mp)))
    return out


def _mixed_precision(mp: Any) -> Any:
    return MixedPrecisionConfig(**_only(_as_dict(mp), _MP_KEYS, "mixed_precision keys"))


def _accumulation_assignments(cfg: Any, steps: int) -> list[tuple[str, Any]]:
    if steps < 1:
        raise ValueError("must be >= 1")
    n = cfg.actor_rollout_ref.rollout.n
    out = []
    roles = [(_ACTOR, cfg.actor_rollout_ref.actor, _ARR)]
    if cfg.critic_enabled:
        roles.append((_CRITIC, cfg.critic, "critic"))
    for prefix, section, role in roles:
        if section.use_dynamic_bsz:
            raise ValueError(
                f"{prefix}.use_dynamic_bsz=true packs micro-batches by tokens, so the number "
                "of accumulation steps is not fixed; drop one of them"
            )
        samples = section.ppo_mini_batch_size * n
        per_rank, rest = divmod(samples, cfg.dp_size(role))
        micro, rest2 = divmod(per_rank, steps)
        if rest or rest2 or micro == 0:
            raise ValueError(
                f"{prefix}: ppo_mini_batch_size * rollout.n = {samples} samples over "
                f"{cfg.dp_size(role)} rank(s) do not split into {steps} equal micro-batches"
            )
        out.append((f"{prefix}.ppo_micro_batch_size_per_device", micro))
    return out


def _only(value: Mapping[str, Any], allowed: tuple[str, ...], what: str = "keys") -> Any:
    """``value``, or ValueError naming its keys outside ``allowed``."""
    unknown = set(value) - set(allowed)
    if unknown:
        raise ValueError(f"unknown {what} {sorted(unknown)}; use {', '.join(allowed)}")
    return value


def _as_dict(value: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return dict(value)
    raise ValueError(f"must be a mapping, got {type(value).__name__}")


def _set(cfg: Any, path: str, value: Any) -> None:
    parent, _, last = path.rpartition(".")
    setattr(get_path(cfg, parent), last, value)
