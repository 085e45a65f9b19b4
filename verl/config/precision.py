"""Which precision each role computes in, and whether this device can run it.

One key per role (``<role section>.precision``): ``none`` (the model's dtype, no autocast),
``fp32`` / ``bf16`` / ``fp16`` (trainable roles keep fp32 master weights and compute in it;
inference roles store their weights in it), weight-only ``fp8`` / ``int4`` (inference roles
only), or ``auto`` (:func:`auto_select_precision`). The adapters ``trainer.mixed_precision``,
``trainer.model_precision_map`` and the FSDP2 block's ``param_dtype`` say what a role key left
null means (:func:`trainer_precision`: read here whenever the key is null, and written into
it when a config is built, by ``verl.compat.precision_keys``, the API edge that also names
dtypes written as text); a role nothing states a precision for is ``auto``. Every
consumer asks :func:`role_precision`. Checks run in :func:`precision_problems` before any
model loads, without importing torch unless an explicit choice needs a look at the device.
See ``docs/precision.md``.
"""

from __future__ import annotations

import logging
import typing
from typing import Any

from verl.config._fields import Precision
from verl.config.load import get_path
from verl.config.roles import ROLES as _ROLES
from verl.config.roles import TRAINABLE_ROLES
from verl.utils.device_probe import (
    cpu_bf16_is_fast_and_correct,
    cuda_available,
    cuda_capability,
    cuda_name,
)

logger = logging.getLogger(__name__)

ROLES = tuple(_ROLES)  # actor, critic, reference, reward (verl.config.roles)
PRECISIONS: tuple[str, ...] = typing.get_args(Precision)
# weight-only formats: inference roles only (int4 needs no special hardware)
WEIGHT_ONLY = ("fp8", "int4")
# Minimum CUDA compute capability of each reduced *compute* precision. fp8 is listed for
# ``auto`` (fp8 where the GPU has fp8 matmuls); validation asks it only of compute
# precisions: weight-only fp8/int4 dequantize into the activations' dtype and run anywhere.
MIN_CAPABILITY = {"bf16": (8, 0), "fp8": (8, 9)}


def active_roles(cfg: Any) -> list[str]:
    """Roles this run builds a model for."""
    built = (True, cfg.critic_enabled, cfg.ref_enabled, cfg.reward_model.enable)
    return [role for role, on in zip(ROLES, built) if on]


def run_device(cfg: Any) -> str:
    """``trainer.device`` with ``auto`` resolved: ``cuda`` when available, else ``cpu``."""
    if cfg.trainer.device != "auto":
        return cfg.trainer.device
    return "cuda" if cuda_available() else "cpu"


def role_key(role: str) -> str:
    """The config key stating ``role``'s precision (``critic`` -> ``critic.precision``)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; use one of {ROLES}")
    return f"{_ROLES[role].section}.precision"


def _section(cfg: Any, role: str) -> Any:
    role_key(role)  # the error for an unknown role
    return get_path(cfg, _ROLES[role].section)


def trainer_precision(cfg: Any, role: str) -> str | None:
    """What the trainer-wide keys say of ``role`` (read whenever its role key is null, and
    written into that key when a config is built, ``verl.compat.precision_keys``): ``trainer.model_precision_map``, else
    ``trainer.mixed_precision``, else (trainable roles) the FSDP2 block's ``param_dtype``."""
    t = cfg.trainer
    if role in t.model_precision_map:
        return t.model_precision_map[role]
    if t.mixed_precision in WEIGHT_ONLY and role in TRAINABLE_ROLES:
        return "bf16"  # a global weight-only format is for the inference roles
    if t.mixed_precision is not None or role not in TRAINABLE_ROLES:
        return t.mixed_precision
    block = _section(cfg, role).fsdp_config.mixed_precision
    return None if block is None else block.param_dtype


def _written_precision(cfg: Any, role: str) -> str:
    """``role``'s role key, else what the trainer keys say, else ``auto``."""
    return _section(cfg, role).precision or trainer_precision(cfg, role) or "auto"


# Tutorial 000, section 4.1's tip, quoted where its advice resolves a mix of half precisions.
MIX_TIP = (
    "tutorial 000 §4.1: '不要混用bf16和fp16在同一训练流程中 ... 强行混用会导致NaN梯度' "
    "(do not mix bf16 and fp16 in one training run; mixing them gives NaN gradients)"
)


def mix_resolutions(cfg: Any) -> dict[str, str]:
    """``{role: "bf16"}`` for each trainable role built here whose ``fp16`` comes from
    ``trainer.model_precision_map`` while another trainable role computes in ``bf16``.

    Tutorial 000's precision map puts ``critic: fp16`` beside a bf16 actor, and its own tip
    (:data:`MIX_TIP`) says not to mix the two: the tip is applied (such a role computes in
    bf16, which keeps fp32's exponent range, so no value the fp16 role would have produced
    overflows) and :func:`precision_warnings` says so. An fp16 written on the role's own key
    (``critic.precision=fp16``) is not overridden: that mix is refused, citing the tip.
    """
    trained = [r for r in active_roles(cfg) if r in TRAINABLE_ROLES]
    written = {r: _written_precision(cfg, r) for r in trained}
    if "bf16" not in written.values():
        return {}
    mapped = cfg.trainer.model_precision_map
    return {r: "bf16" for r, v in written.items() if v == "fp16" and mapped.get(r) == "fp16"}


def stated_precision(cfg: Any, role: str) -> str:
    """What the config states of ``role``, ``auto`` unresolved: its role key, else what the
    trainer keys say, else ``auto`` (the default); a map's fp16 beside a bf16 trainable role
    is bf16 (:func:`mix_resolutions`)."""
    written = _written_precision(cfg, role)
    if role in TRAINABLE_ROLES and written == "fp16":
        return mix_resolutions(cfg).get(role, written)
    return written


def role_precision(cfg: Any, role: str) -> str:
    """The precision ``role`` computes in: ``none``, ``fp32``, ``bf16``, ``fp16``, ``fp8`` or
    ``int4``: :func:`stated_precision`, with ``auto`` resolved (:func:`_resolve_auto`)."""
    precision = stated_precision(cfg, role)
    return _resolve_auto(cfg, role) if precision == "auto" else precision


def _resolve_auto(cfg: Any, role: str) -> str:
    """``auto`` for ``role`` on the run's device (:func:`auto_select_precision`), kept to what
    the role's setup runs: a model loaded in a reduced dtype computes in it (``none``: there
    are no fp32 master weights to autocast from), fp16 training is left out on ``fsdp2``
    (no sharded loss scaling there) and weight-only formats on an ``fsdp2`` reference."""
    group = _ROLES[role].group
    if get_path(cfg, f"{group}.model").dtype != "fp32":
        return "none"
    choice = auto_select_precision(run_device(cfg))[role]
    # a group with a train engine (a role not built here has no strategy to ask)
    trained_by = role in active_roles(cfg) and any(
        _ROLES[r].group == group for r in TRAINABLE_ROLES
    )
    if trained_by and cfg.engine_strategy(group) == "fsdp2":
        if choice in WEIGHT_ONLY:
            return "bf16"
        if choice == "fp16" and role in TRAINABLE_ROLES:
            return "none"
    return choice


def auto_select_precision(device: str = "cpu") -> dict[str, str]:
    """The precision of each role that ``auto`` picks on ``device`` (``"cpu"``/``"cuda"``).

    - CUDA with compute capability >= 8.9 (fp8-capable): bf16 training, fp8 reference/reward;
    - CUDA >= 8.0: bf16 everywhere;
    - older CUDA: fp16 (with dynamic loss scaling);
    - CPU: bf16 when the CPU has native bf16 instructions (``avx512_bf16`` or AMX) and a
      bf16 matmul is within bf16 rounding of the fp32 one, else ``none`` (fp32). Without
      those instructions bf16 is emulated and slower than fp32 (see docs/precision.md).
    """
    if device.startswith("cuda"):
        major, minor = cuda_capability(device)
        if (major, minor) >= MIN_CAPABILITY["fp8"]:
            return {r: "bf16" if r in TRAINABLE_ROLES else "fp8" for r in ROLES}
        if (major, minor) >= MIN_CAPABILITY["bf16"]:
            return dict.fromkeys(ROLES, "bf16")
        return dict.fromkeys(ROLES, "fp16")
    return dict.fromkeys(ROLES, "bf16" if cpu_bf16_is_fast_and_correct() else "none")


def precision_problems(cfg: Any) -> list[tuple[tuple[str, ...], str]]:
    """Every precision problem of ``cfg`` as ``(key paths, message)``; empty when valid."""
    t, out = cfg.trainer, []
    map_key = "trainer.model_precision_map"
    for role, value in t.model_precision_map.items():
        if role not in ROLES:
            out.append(((map_key,), f"{map_key} has unknown role {role!r}; use {', '.join(ROLES)}"))
        elif value not in PRECISIONS:
            continue  # reported by the schema walk (a Literal value)
        elif role in TRAINABLE_ROLES and value in WEIGHT_ONLY:
            out.append(((map_key,), _weight_only_message(f"{map_key}.{role}", value)))
        elif _section(cfg, role).precision not in (None, value):
            key = role_key(role)
            message = (
                f"{map_key}.{role}={value} contradicts {key}={_section(cfg, role).precision}; "
                f"set one of them ({key} is the role's own key)"
            )
            out.append(((map_key, key), message))
    for role in ROLES:
        value, key = _section(cfg, role).precision, role_key(role)  # values: schema walk
        if t.model_precision_map.get(role) == value:
            continue  # a map entry, checked above
        if role in TRAINABLE_ROLES and value in WEIGHT_ONLY:
            out.append(((key,), _weight_only_message(key, value)))
    if out:
        return out

    # ``auto`` picks what the device and the role's setup run, so a role left at ``auto`` is
    # checked only against explicit choices that it could contradict: a half precision of
    # another trainable role, or loss scaling asked for. Then (and only then) it is resolved,
    # which looks at the device.
    stated = {role: stated_precision(cfg, role) for role in active_roles(cfg)}
    explicit_half = any(v in ("bf16", "fp16") for r, v in stated.items() if r in TRAINABLE_ROLES)
    resolve = explicit_half or bool(t.use_gradient_scaling)
    resolved = {
        r: role_precision(cfg, r) if v == "auto" and resolve else v for r, v in stated.items()
    }
    # Only a reduced precision needs a look at the device (and so an import of torch).
    # Weight-only formats (the only fp8 here) compute in the activations' dtype: no check.
    computed = {r: v for r, v in resolved.items() if v not in WEIGHT_ONLY}
    device = run_device(cfg) if any(v in MIN_CAPABILITY for v in computed.values()) else "cpu"
    cap = cuda_capability(device) if device.startswith("cuda") else None
    for role, prec in computed.items():
        need = MIN_CAPABILITY.get(prec)
        if cap is not None and need is not None and cap < need:
            message = (
                f"{role} precision {prec} needs a GPU of compute capability >= {need[0]}.{need[1]}, "
                f"but {cuda_name(device)} has {cap[0]}.{cap[1]}; use fp16 (or mixed_precision=auto)"
            )
            out.append(((role_key(role),), message))
    ref = resolved.get("reference")
    if ref in WEIGHT_ONLY and cfg.engine_strategy("actor_rollout_ref") == "fsdp2":
        message = (
            f"reference precision {ref} with strategy=fsdp2: {ref} weight-only layers keep "
            "their weights as unsharded buffers, which FSDP2 would copy whole to every rank; "
            "use bf16 for the reference, or strategy=single"
        )
        out.append(((role_key("reference"),), message))

    trained = {r: resolved[r] for r in TRAINABLE_ROLES if r in resolved}
    half = {r: v for r, v in trained.items() if v in ("bf16", "fp16")}
    if len(set(half.values())) > 1:
        message = (
            f"trainable roles mix bf16 and fp16 ({', '.join(f'{r}={v}' for r, v in half.items())}): "
            "they exchange tensors (values, log-probs, advantages) and share one loss-scaling "
            "policy, and fp16 overflows where bf16 does not; use one of them for every "
            f"trainable role ({MIX_TIP})"
        )
        out.append((tuple(role_key(r) for r in half), message))
    for role, prec in trained.items():
        if prec != "auto":
            out += _trained_role_problems(cfg, role, prec, (role_key(role),))

    return out


def gradient_scaling(cfg: Any, role: str) -> bool | None:
    """The loss scaling ``role``'s engine runs with: ``trainer.use_gradient_scaling`` when the
    role computes in fp16, else ``None`` (off: loss scaling protects fp16 gradients from
    underflow; bf16 and fp32 have fp32's exponent range, so scaling is a no-op there, and
    :func:`precision_warnings` says so when it was asked for)."""
    if role_precision(cfg, role) == "fp16":
        return cfg.trainer.use_gradient_scaling
    return None


def _weight_only_message(key: str, value: str) -> str:
    return (
        f"{key}={value}: {value} is weight-only storage for inference roles (reference, "
        "reward); a trainable role cannot train in it. Use bf16"
    )


def _trained_role_problems(
    cfg: Any, role: str, prec: str, keys: tuple[str, ...]
) -> list[tuple[tuple[str, ...], str]]:
    """A trainable role's precision against its engine, model dtype and FSDP2 settings."""
    prefix, section = _ROLES[role].group, _section(cfg, role)
    model = get_path(cfg, f"{prefix}.model")
    fsdp_key = f"{_ROLES[role].section}.fsdp_config.mixed_precision"
    mp, out = section.fsdp_config.mixed_precision, []
    if prec == "fp16" and cfg.engine_strategy(prefix) == "fsdp2":
        message = (
            f"{role} precision fp16 with strategy=fsdp2: fp16 training needs dynamic loss "
            "scaling, which the fsdp2 engine does not have (a sharded inf check); use bf16, "
            "or strategy=single"
        )
        out.append((keys, message))
    if prec in ("fp32", "bf16", "fp16") and model.dtype != "fp32":
        message = (
            f"{role} precision {prec} keeps fp32 master weights (gradient_precision=fp32), but "
            f"{prefix}.model.dtype={model.dtype}; set {prefix}.model.dtype=fp32 (the compute "
            "dtype comes from the precision)"
        )
        out.append(((*keys, f"{prefix}.model.dtype"), message))
    if mp is not None and mp.param_dtype != prec:
        message = (
            f"{fsdp_key}.param_dtype={mp.param_dtype} contradicts {role} precision {prec}; "
            "set one of them (they are the same setting)"
        )
        out.append(((*keys, fsdp_key), message))
    gradient = cfg.trainer.gradient_precision
    compressed = mp is not None and mp.reduce_dtype == "bf16" and gradient == "fp32"
    if mp is not None and mp.reduce_dtype != gradient and not compressed:
        message = (
            f"{fsdp_key}.reduce_dtype={mp.reduce_dtype} contradicts trainer.gradient_precision="
            f"{gradient}; gradients are reduced and kept in fp32"
        )
        out.append((("trainer.gradient_precision", fsdp_key), message))
    return out


def precision_warnings(cfg: Any) -> list[str]:
    """Settings that run but are probably not meant."""
    t = cfg.trainer
    out = []
    roles = active_roles(cfg)
    for role, value in t.model_precision_map.items():
        if role in ROLES and role not in roles:
            out.append(
                f"trainer.model_precision_map.{role}={value} is unused: {_why_not_built(cfg, role)}; "
                f"drop the entry (it would apply if the {role} were built)"
            )
    resolved = mix_resolutions(cfg)
    if resolved:
        bf16 = [r for r in roles if r in TRAINABLE_ROLES and r not in resolved]
        for role in resolved:
            out.append(
                f"trainer.model_precision_map.{role}=fp16 beside {', '.join(bf16)}=bf16: the "
                f"{role} computes in bf16, as {MIX_TIP}; set trainer.model_precision_map."
                f"{role}=bf16 to say so"
            )
    if t.use_gradient_scaling:
        trained_now = {r: role_precision(cfg, r) for r in roles if r in TRAINABLE_ROLES}
        if "fp16" not in trained_now.values():
            out.append(
                "trainer.use_gradient_scaling=true is a no-op: no trainable role computes in "
                f"fp16 ({', '.join(f'{r}={v}' for r, v in trained_now.items())}); loss scaling "
                "protects fp16 gradients from underflow, and bf16/fp32 keep fp32's exponent "
                "range, so no scaler runs (drop the key, or use null)"
            )
    for role in (r for r in roles if r in TRAINABLE_ROLES):
        mp = _section(cfg, role).fsdp_config.mixed_precision
        strategy = cfg.engine_strategy(_ROLES[role].group)
        if mp is not None and mp.reduce_dtype == "bf16" and strategy == "fsdp2":
            out.append(
                f"{_ROLES[role].section}.fsdp_config.mixed_precision.reduce_dtype=bf16: the "
                f"{role}'s gradients are reduce-scattered in bf16 (gradient compression: half "
                "the bytes of fp32), each reduced value rounded to bf16 (relative error up to "
                "2^-8), then kept and accumulated in fp32"
            )
    # auto never picks fp16 on a CPU; on an old GPU it may, which matters only without scaling
    resolve = t.use_gradient_scaling is False
    precision = {r: role_precision(cfg, r) if resolve else stated_precision(cfg, r) for r in roles}
    trained = [precision[r] for r in roles if r in TRAINABLE_ROLES]
    if t.use_gradient_scaling is False and "fp16" in trained:
        out.append(
            "trainer.use_gradient_scaling=false with fp16 training: small gradients underflow "
            "to zero; use null (on for fp16)"
        )
    fp16 = [r for r in roles if precision[r] == "fp16"]
    if fp16 and run_device(cfg) == "cpu":
        out.append(
            f"fp16 on CPU ({', '.join(fp16)}): CPUs have no fp16 matmul units, so it is "
            "emulated (a 1024x1024 matmul measured ~200x slower than fp32); use bf16 or none"
        )
    return out


def _why_not_built(cfg: Any, role: str) -> str:
    """Why ``role`` has no model in this run, naming the key that decides it."""
    if role == "critic":
        if cfg.critic.enable is False:
            return "critic.enable=false: no critic is built"
        return f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} trains no critic"
    if role == "reward":
        return "reward_model.enable=false: no reward model is built"
    return (
        "no reference model is built (no KL term: actor_rollout_ref.actor.use_kl_loss and "
        "algorithm.use_kl_in_reward are off)"
    )
