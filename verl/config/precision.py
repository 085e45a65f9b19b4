"""Which precision each role computes in, and whether this device can run it.

One key per role (``<role section>.precision``): ``none`` (the model's dtype, no autocast),
``fp32`` / ``bf16`` / ``fp16`` (trainable roles keep fp32 master weights and compute in it;
inference roles store their weights in it), weight-only ``fp8`` / ``int4`` (inference roles
only), or ``auto`` (:func:`auto_select_precision`); null is ``auto``. Every consumer asks
:func:`role_precision`, which reads the role key alone. The other spellings
(``trainer.mixed_precision``, ``trainer.model_precision_map``, the FSDP2 block's
``param_dtype``, dtypes written as text) are input adapters, ``verl.compat.precision_keys``:
they fill the role keys when a config is built and again when it is validated (the
trainer validates it when it is built), and nothing reads them afterwards. The checks of a
run's precisions (``verl.trainer.rl.precision_checks``) look at the device only when an
explicit choice needs it, so a default config is checked without importing torch. See
``docs/precision.md``.
"""

from __future__ import annotations

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

# the device probes are asked through this module (one place to stub them in tests)
__all__ = [
    "MIN_CAPABILITY",
    "PRECISIONS",
    "ROLES",
    "TRAINABLE_ROLES",
    "WEIGHT_ONLY",
    "active_roles",
    "auto_select_precision",
    "cuda_capability",
    "cuda_name",
    "gradient_scaling",
    "role_key",
    "role_precision",
    "role_section",
    "run_device",
    "stated_precision",
]

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


def role_section(cfg: Any, role: str) -> Any:
    """The config section holding ``role``'s own keys (``critic`` -> ``cfg.critic``)."""
    role_key(role)  # the error for an unknown role
    return get_path(cfg, _ROLES[role].section)


def stated_precision(cfg: Any, role: str) -> str:
    """What the config states of ``role``: its role key, ``auto`` (unresolved) when null."""
    return role_section(cfg, role).precision or "auto"


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


def gradient_scaling(cfg: Any, role: str) -> bool | None:
    """The loss scaling ``role``'s engine runs with: ``trainer.use_gradient_scaling`` when the
    role computes in fp16, else ``None`` (off: loss scaling protects fp16 gradients from
    underflow; bf16 and fp32 have fp32's exponent range, so scaling is a no-op there, and
    the precision checks say so when it was asked for)."""
    if role_precision(cfg, role) == "fp16":
        return cfg.trainer.use_gradient_scaling
    return None
