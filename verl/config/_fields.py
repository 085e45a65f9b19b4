"""Shared building blocks of the config schema: the field helper and the enumerations.

Registry-backed keys (estimators, losses, KL kinds, aggregation modes, rollout backends,
reward managers) are plain ``str`` fields: their names live in ``verl.registry`` only, and
``verl.config.validate`` checks them against the live registries.

Every schema field is declared with :func:`entry`, which stores its help text in the
dataclass field metadata. The same text becomes the comment in the generated YAML
defaults and the "meaning" column of the table in ``docs/config.md``.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Literal

# The model shipped with the package (SmolLM2-135M-Instruct, see verl/models). A model path
# equal to this name is not looked up on disk.
EMBEDDED_MODEL = "smollm2-135m-instruct"
# Fields a directory template may name, e.g. "checkpoints/{project_name}/{experiment_name}".
PATH_FIELDS = ("project_name", "experiment_name")

Dtype = Literal["fp32", "bf16", "fp16"]
# Compute precision of a role (trainer.mixed_precision / trainer.model_precision_map):
# "none" = the model dtype, no autocast; "auto" = auto_select_precision() per device.
Precision = Literal["none", "fp32", "bf16", "fp16", "fp8", "int4", "auto"]
GradientPrecision = Literal["fp32"]
Strategy = Literal["auto", "single", "fsdp2"]
WarmupStyle = Literal["constant", "cosine"]
Truncation = Literal["error", "drop", "truncate", "left"]  # left: older name of truncate
CheckpointContent = Literal["model", "optimizer", "extra"]
Logger = Literal["console", "jsonl", "tensorboard", "wandb", "mlflow"]
Device = Literal["auto", "cpu", "cuda"]
Backend = Literal["auto", "local", "ray"]
ResumeMode = Literal["auto", "disable", "resume_path"]
ArithmeticOp = Literal["+", "-", "*"]
BuiltinDataset = Literal["arithmetic"]
# DAPO dynamic sampling: the per-response value compared within a prompt group.
FilterGroupsMetric = Literal["acc", "score", "seq_reward"]


def entry(
    default: Any,
    help: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    off: int | None = None,
    nonempty: bool = False,
) -> Any:
    """A dataclass field with ``default``, a one-line ``help`` text and its allowed values.

    ``ge``/``gt``/``le``/``lt`` bound a number, ``off`` is a sentinel allowed besides the
    bounds (``-1`` = off), ``nonempty`` refuses a blank string; ``verl.config.validate``
    checks them all in one walk (null values pass). Mutable defaults (lists, dicts,
    dataclass instances) and nested section classes get a ``default_factory``.
    """
    bounds = {"ge": ge, "gt": gt, "le": le, "lt": lt, "off": off}
    metadata = {"help": help, **{k: v for k, v in bounds.items() if v is not None}}
    if nonempty:
        metadata["nonempty"] = True
    if isinstance(default, type) and dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=default, metadata=metadata)
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)
