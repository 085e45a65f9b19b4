"""Precision spellings on a built config: dtypes written as text, and the trainer-wide keys.

Each role's precision is stated by its own key (``<role section>.precision``, see
``verl.config.precision``). When a ``TrainerConfig`` is built, its keyword adapter
(``verl.compat.flat_keys.adapt_keywords``) runs :func:`name_precision_strings` (a dtype
written as text where a precision is named, ``"bfloat16"`` -> ``bf16``, with a note) and
then :func:`fill_role_precisions`: every role key left null gets what the trainer-wide keys
say of it (``trainer.model_precision_map``, ``trainer.mixed_precision``, the FSDP2 block's
``param_dtype``; :func:`verl.config.precision.trainer_precision`), so that the role key
holds the one answer. Torch dtypes themselves are named earlier, by
:func:`verl.compat.aliases.replace_dtypes`.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from verl.compat.aliases import note, precision_string
from verl.config.load import field_types, get_path, unwrap_optional
from verl.config.precision import ROLES, trainer_precision
from verl.config.roles import ROLES as ROLE_SPECS

__all__ = ["fill_role_precisions", "name_precision_strings"]


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


def fill_role_precisions(cfg: Any) -> None:
    """Write what the trainer-wide keys say (:func:`verl.config.precision.trainer_precision`)
    into every role precision key that is null, in place."""
    for role in ROLES:
        section = get_path(cfg, ROLE_SPECS[role].section)
        if section.precision is None:
            section.precision = trainer_precision(cfg, role)
