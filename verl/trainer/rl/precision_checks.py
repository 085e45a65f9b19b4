"""The config checks of an RL run's precisions: each role's key against the other roles,
its engine and model dtype, and the device.

:func:`precision_problems` and :func:`precision_warnings` run in the RL config checks
(``verl.trainer.rl.config_checks``), after the role keys are filled from the trainer-wide
keys (``verl.compat.precision_keys``). They read the role keys; the trainer-wide keys are
read only to check those keys themselves (an unknown role in ``trainer.model_precision_map``,
an entry that contradicts a role key or is unused). The device is asked through
``verl.config.precision`` and only when an explicit reduced precision needs it, so a default
config is checked without importing torch. See ``docs/precision.md``.
"""

from __future__ import annotations

from typing import Any

from verl.compat.precision_keys import tip_roles
from verl.config import precision as P
from verl.config.load import get_path
from verl.config.roles import ROLES as ROLE_SPECS
from verl.utils.device_probe import cpu_bf16_is_fast_and_correct

__all__ = ["MIX_TIP", "precision_problems", "precision_warnings"]

# Tutorial 000, section 4.1's tip, quoted where its advice resolves a mix of half precisions.
MIX_TIP = (
    "tutorial 000 §4.1: '不要混用bf16和fp16在同一训练流程中 ... 强行混用会导致NaN梯度' "
    "(do not mix bf16 and fp16 in one training run; mixing them gives NaN gradients)"
)
_MAP = "trainer.model_precision_map"


def _map_problems(cfg: Any) -> list[tuple[tuple[str, ...], str]]:
    """``trainer.model_precision_map`` itself: its roles, and its entries against the role
    keys (which it fills when they are null; a tip-resolved fp16 is not a contradiction)."""
    out, tipped = [], _tip_states(cfg)
    for role, value in cfg.trainer.model_precision_map.items():
        if role not in P.ROLES:
            out.append(((_MAP,), f"{_MAP} has unknown role {role!r}; use {', '.join(P.ROLES)}"))
        elif value not in P.PRECISIONS:
            continue  # reported by the schema walk (a Literal value)
        elif role in P.TRAINABLE_ROLES and value in P.WEIGHT_ONLY:
            out.append(((_MAP,), _weight_only_message(f"{_MAP}.{role}", value)))
        elif P.role_section(cfg, role).precision not in (None, value) and role not in tipped:
            key, written = P.role_key(role), P.role_section(cfg, role).precision
            message = (
                f"{_MAP}.{role}={value} contradicts {key}={written}; "
                f"set one of them ({key} is the role's own key)"
            )
            out.append(((_MAP, key), message))
    return out


def _tip_states(cfg: Any) -> set[str]:
    """Trainable roles whose map fp16 the tip made bf16, built here or not (their role key
    bf16 beside another trainable role's bf16)."""
    keys = {r: P.role_section(cfg, r).precision for r in P.TRAINABLE_ROLES}
    mapped = cfg.trainer.model_precision_map
    return {
        r
        for r, v in keys.items()
        if mapped.get(r) == "fp16" and v == "bf16" and any(keys[o] == v for o in keys if o != r)
    }


def precision_problems(cfg: Any) -> list[tuple[tuple[str, ...], str]]:
    """Every precision problem of ``cfg`` as ``(key paths, message)``; empty when valid."""
    t, out = cfg.trainer, _map_problems(cfg)
    for role in P.ROLES:
        value, key = P.role_section(cfg, role).precision, P.role_key(role)  # values: schema walk
        if t.model_precision_map.get(role) == value:
            continue  # a map entry, checked above
        if role in P.TRAINABLE_ROLES and value in P.WEIGHT_ONLY:
            out.append(((key,), _weight_only_message(key, value)))
    if out:
        return out

    # ``auto`` picks what the device and the role's setup run, so a role left at ``auto`` is
    # checked only against explicit choices that it could contradict: a half precision of
    # another trainable role, or loss scaling asked for. Then (and only then) it is resolved,
    # which looks at the device.
    stated = {role: P.stated_precision(cfg, role) for role in P.active_roles(cfg)}
    explicit_half = any(v in ("bf16", "fp16") for r, v in stated.items() if r in P.TRAINABLE_ROLES)
    resolve = explicit_half or bool(t.use_gradient_scaling)
    resolved = {
        r: P.role_precision(cfg, r) if v == "auto" and resolve else v for r, v in stated.items()
    }
    # Only a reduced precision needs a look at the device (and so an import of torch).
    # Weight-only formats (the only fp8 here) compute in the activations' dtype: no check.
    computed = {r: v for r, v in resolved.items() if v not in P.WEIGHT_ONLY}
    needs_device = any(v in P.MIN_CAPABILITY for v in computed.values())
    device = P.run_device(cfg) if needs_device else "cpu"
    cap = P.cuda_capability(device) if device.startswith("cuda") else None
    for role, prec in computed.items():
        need = P.MIN_CAPABILITY.get(prec)
        if cap is not None and need is not None and cap < need:
            message = (
                f"{role} precision {prec} needs a GPU of compute capability >= {need[0]}.{need[1]}, "
                f"but {P.cuda_name(device)} has {cap[0]}.{cap[1]}; use fp16 (or mixed_precision=auto)"
            )
            out.append(((P.role_key(role),), message))
    ref = resolved.get("reference")
    if ref in P.WEIGHT_ONLY and cfg.engine_strategy("actor_rollout_ref") == "fsdp2":
        message = (
            f"reference precision {ref} with strategy=fsdp2: {ref} weight-only layers keep "
            "their weights as unsharded buffers, which FSDP2 would copy whole to every rank; "
            "use bf16 for the reference, or strategy=single"
        )
        out.append(((P.role_key("reference"),), message))

    trained = {r: resolved[r] for r in P.TRAINABLE_ROLES if r in resolved}
    half = {r: v for r, v in trained.items() if v in ("bf16", "fp16")}
    if len(set(half.values())) > 1:
        message = (
            f"trainable roles mix bf16 and fp16 ({', '.join(f'{r}={v}' for r, v in half.items())}): "
            "they exchange tensors (values, log-probs, advantages) and share one loss-scaling "
            "policy, and fp16 overflows where bf16 does not; use one of them for every "
            f"trainable role ({MIX_TIP})"
        )
        out.append((tuple(P.role_key(r) for r in half), message))
    for role, prec in trained.items():
        if prec != "auto":
            out += _trained_role_problems(cfg, role, prec, (P.role_key(role),))

    return out


def _weight_only_message(key: str, value: str) -> str:
    return (
        f"{key}={value}: {value} is weight-only storage for inference roles (reference, "
        "reward); a trainable role cannot train in it. Use bf16"
    )


def _trained_role_problems(
    cfg: Any, role: str, prec: str, keys: tuple[str, ...]
) -> list[tuple[tuple[str, ...], str]]:
    """A trainable role's precision against its engine, model dtype and FSDP2 settings."""
    prefix, section = ROLE_SPECS[role].group, P.role_section(cfg, role)
    model = get_path(cfg, f"{prefix}.model")
    fsdp_key = f"{ROLE_SPECS[role].section}.fsdp_config.mixed_precision"
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
    roles = P.active_roles(cfg)
    for role, value in t.model_precision_map.items():
        if role in P.ROLES and role not in roles:
            out.append(
                f"{_MAP}.{role}={value} is unused: {_why_not_built(cfg, role)}; "
                f"drop the entry (it would apply if the {role} were built)"
            )
    tipped = tip_roles(cfg)
    bf16 = [r for r in roles if r in P.TRAINABLE_ROLES and r not in tipped]
    for role in tipped:
        out.append(
            f"{_MAP}.{role}=fp16 beside {', '.join(bf16)}=bf16: the {role} computes in bf16, "
            f"as {MIX_TIP}; set {_MAP}.{role}=bf16 to say so"
        )
    if t.use_gradient_scaling:
        trained_now = {r: P.role_precision(cfg, r) for r in roles if r in P.TRAINABLE_ROLES}
        if "fp16" not in trained_now.values():
            out.append(
                "trainer.use_gradient_scaling=true is a no-op: no trainable role computes in "
                f"fp16 ({', '.join(f'{r}={v}' for r, v in trained_now.items())}); loss scaling "
                "protects fp16 gradients from underflow, and bf16/fp32 keep fp32's exponent "
                "range, so no scaler runs (drop the key, or use null)"
            )
    for role in (r for r in roles if r in P.TRAINABLE_ROLES):
        mp = P.role_section(cfg, role).fsdp_config.mixed_precision
        strategy = cfg.engine_strategy(ROLE_SPECS[role].group)
        if mp is not None and mp.reduce_dtype == "bf16" and strategy == "fsdp2":
            out.append(
                f"{ROLE_SPECS[role].section}.fsdp_config.mixed_precision.reduce_dtype=bf16: the "
                f"{role}'s gradients are reduce-scattered in bf16 (gradient compression: half "
                "the bytes of fp32), each reduced value rounded to bf16 (relative error up to "
                "2^-8), then kept and accumulated in fp32"
            )
    # auto never picks fp16 on a CPU; on an old GPU it may, which matters only without scaling
    resolve = t.use_gradient_scaling is False
    precision = {
        r: P.role_precision(cfg, r) if resolve else P.stated_precision(cfg, r) for r in roles
    }
    trained = [precision[r] for r in roles if r in P.TRAINABLE_ROLES]
    if t.use_gradient_scaling is False and "fp16" in trained:
        out.append(
            "trainer.use_gradient_scaling=false with fp16 training: small gradients underflow "
            "to zero; use null (on for fp16)"
        )
    fp16 = [r for r in roles if precision[r] == "fp16"]
    bf16 = [r for r in roles if precision[r] == "bf16"]
    if (fp16 or bf16) and P.run_device(cfg) == "cpu":
        out.extend(_emulated_half_warnings(fp16, bf16))
    return out


def _emulated_half_warnings(fp16: list[str], bf16: list[str]) -> list[str]:
    """CPU roles computing in a half precision the CPU has no matmul instructions for: fp16
    always, bf16 without ``avx512_bf16``/AMX. Both are emulated there, about 100x slower
    than fp32 (a 1024x1024 matmul: 0.8 vs 78 GFLOP/s on an AVX2-only EPYC)."""
    native_bf16 = cpu_bf16_is_fast_and_correct()
    fallback = "bf16 or none" if native_bf16 else "none (fp32) or auto"
    out = []
    if fp16:
        out.append(
            f"fp16 on CPU ({', '.join(fp16)}): CPUs have no fp16 matmul units, so it is "
            f"emulated (a matmul runs ~100x slower than fp32); use {fallback}"
        )
    if bf16 and not native_bf16:
        out.append(
            f"bf16 on a CPU without native bf16 instructions (avx512_bf16 or AMX) "
            f"({', '.join(bf16)}): it is emulated (a matmul runs ~100x slower than fp32); "
            "use none (fp32) or auto, which picks bf16 only where the CPU has it"
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
