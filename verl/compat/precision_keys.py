"""Precision spellings: dtypes written as text, and the trainer-wide keys, onto the role keys.

Each role's precision is stated by its own key (``<role section>.precision``, see
``verl.config.precision``), which is all that its consumers read. The other spellings are
adapters applied here, at the API edge:

* :func:`name_precision_strings`: a dtype written as text where a precision is named
  (``"bfloat16"`` -> ``bf16``, with a note); torch dtypes themselves are named earlier, by
  :func:`verl.compat.aliases.replace_dtypes`;
* :func:`fill_role_precisions`: every role key left null gets what the trainer-wide keys say
  of it (:func:`trainer_precision`: ``trainer.model_precision_map``, else
  ``trainer.mixed_precision``, else the FSDP2 block's ``param_dtype``), and a map's fp16
  beside a bf16 trainable role becomes bf16 (:func:`tip_roles`, tutorial 000's tip).

Both run when a ``TrainerConfig`` is built (its keyword adapter,
``verl.compat.flat_keys.adapt_keywords``, which loading goes through too); the fill runs
again when the config is validated (``verl.trainer.rl.config_checks``: the RL trainer
validates its config when it is built), so a trainer-wide key set on a built config reaches
the role keys it leaves null before anything runs. Filling is idempotent and never
overwrites a role key that holds a value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import typing
from typing import Any

from verl.compat.aliases import note, precision_string
from verl.config.load import field_types, unwrap_optional
from verl.config.precision import ROLES, TRAINABLE_ROLES, WEIGHT_ONLY, active_roles, role_section

__all__ = ["fill_role_precisions", "name_precision_strings", "tip_roles", "trainer_precision"]


def _is_precision(tp: Any) -> bool:
    """Whether a schema type is a precision enumeration (``Precision``, ``Dtype``)."""
    tp = unwrap_optional(tp)[0]
    return typing.get_origin(tp) is typing.Literal and "bf16" in typing.get_args(tp)


def _is_precision_map(tp: Any) -> bool:
    """Whether a schema type is ``dict[str, <precision>]`` (``trainer.model_precision_map``)."""
    tp = unwrap_optional(tp)[0]
    return typing.get_origin(tp) is dict and _is_precision(typing.get_args(tp)[1])


def name_precision_strings(obj: Any, prefix: str = "") -> None:
    """In place: every precision key of the config ``obj`` (sections followed) holding a
    dtype written as text (``"bfloat16"``, ``"torch.float16"``) gets the precision name
    (``bf16``, ``fp16``), with the alias note; torch dtypes themselves are named by
    ``verl.compat.aliases.replace_dtypes``."""
    hints = field_types(type(obj))
    for f in dataclasses.fields(obj):
        value, path, tp = getattr(obj, f.name), f"{prefix}{f.name}", hints[f.name]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            name_precision_strings(value, f"{path}.")
        elif _is_precision(tp) and precision_string(value) is not None:
            setattr(obj, f.name, precision_string(value))
            note(f"{path}={value!r}", f"{path}={precision_string(value)}")
        elif isinstance(value, dict) and _is_precision_map(tp):
            for key, item in value.items():
                if precision_string(item) is not None:
                    value[key] = precision_string(item)
                    note(f"{path}.{key}={item!r}", f"{path}.{key}={value[key]}")


def trainer_precision(cfg: Any, role: str) -> str | None:
    """What the trainer-wide keys say of ``role``: ``trainer.model_precision_map``, else
    ``trainer.mixed_precision`` (a weight-only format there is for the inference roles: the
    trainable ones get bf16), else (trainable roles) the FSDP2 block's ``param_dtype``."""
    t = cfg.trainer
    if role in t.model_precision_map:
        return t.model_precision_map[role]
    if t.mixed_precision in WEIGHT_ONLY and role in TRAINABLE_ROLES:
        return "bf16"
    if t.mixed_precision is not None or role not in TRAINABLE_ROLES:
        return t.mixed_precision
    block = role_section(cfg, role).fsdp_config.mixed_precision
    return None if block is None else block.param_dtype


def tip_roles(cfg: Any) -> list[str]:
    """The trainable roles built here whose ``trainer.model_precision_map`` entry is fp16
    while another trainable role built here computes in bf16 (role keys, filled): they
    compute in bf16.

    Tutorial 000's precision map puts ``critic: fp16`` beside a bf16 actor, and its own tip
    says not to mix the two (bf16 keeps fp32's exponent range, so no value the fp16 role
    would have produced overflows): the tip is applied, and the run's precision checks say
    so. An fp16 written on the role's own key beside a bf16 role is refused instead.
    """
    mapped = cfg.trainer.model_precision_map
    trained = [r for r in active_roles(cfg) if r in TRAINABLE_ROLES]
    keys = {r: role_section(cfg, r).precision for r in trained}
    return [
        r
        for r in trained
        if mapped.get(r) == "fp16"
        and keys[r] in ("fp16", "bf16")
        and any(keys[other] == "bf16" for other in trained if other != r)
    ]


def fill_role_precisions(cfg: Any) -> None:
    """In place: every role precision key that is null gets :func:`trainer_precision`, then
    the roles of :func:`tip_roles` get bf16. Idempotent; a role key holding a value is kept
    (the checks report one that contradicts ``trainer.model_precision_map``)."""
    for role in ROLES:
        section = role_section(cfg, role)
        if section.precision is None:
            section.precision = trainer_precision(cfg, role)
    with contextlib.suppress(TypeError, ValueError):  # an ill-typed key: the checks name it
        for role in tip_roles(cfg):
            role_section(cfg, role).precision = "bf16"
