"""Building blocks of the schema: :func:`entry` (a field with its help text and bounds) and
the enumerations. Registry-backed keys (estimators, losses, rollout backends ...) are plain
``str`` fields, checked against the live ``verl.registry`` by the RL run's checks
(``verl.trainer.rl.registry_checks``). The help text is the comment of the generated YAML and the meaning column of the docs.
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
CheckpointContent = Literal["model", "optimizer", "extra", "hf_model"]
Logger = Literal["console", "jsonl", "tensorboard", "wandb", "mlflow"]
Device = Literal["auto", "cpu", "cuda"]
Backend = Literal["auto", "local", "ray"]
ResumeMode = Literal["auto", "disable", "resume_path"]
ArithmeticOp = Literal["+", "-", "*"]
ArithmeticPhrasing = Literal["question", "words", "compute", "calculate"]
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
    """A dataclass field with ``default``, a one-line ``help`` and its allowed values: bounds
    ``ge``/``gt``/``le``/``lt``, a sentinel ``off`` allowed besides them (``-1`` = off), and
    ``nonempty`` for strings; ``Checks.fields`` checks them all (null passes)."""
    bounds = {"ge": ge, "gt": gt, "le": le, "lt": lt, "off": off}
    metadata = {"help": help, **{k: v for k, v in bounds.items() if v is not None}}
    if nonempty:
        metadata["nonempty"] = True
    if isinstance(default, type) and dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=default, metadata=metadata)
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)
