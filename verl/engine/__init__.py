"""Training engines: a model + optimizer + LR schedule, stepped in micro-batches.

``build_engine("single", module, optim_spec, ...)`` returns the one-process engine;
``"fsdp2"`` (torch.distributed FSDP2, one process per device) arrives with the Ray/FSDP2
worker issue. This package is the only place in verl that knows about FSDP.
"""

from __future__ import annotations

import torch
from torch import nn

from verl.engine.base import OptimSpec, TrainEngine, resolve_dtype
from verl.engine.single import SingleProcessEngine

__all__ = ["OptimSpec", "SingleProcessEngine", "TrainEngine", "build_engine", "resolve_dtype"]

STRATEGIES = ("single", "fsdp2")


def build_engine(
    strategy: str,
    module: nn.Module,
    optim: OptimSpec | None = None,
    *,
    grad_clip: float | None = None,
    device: str | torch.device = "cpu",
    param_dtype: str | torch.dtype | None = None,
    autocast_dtype: str | torch.dtype | None = None,
) -> TrainEngine:
    """Build the train engine for ``strategy`` (``"single"`` or ``"fsdp2"``).

    ``optim`` is the engine's ``optimizer_cfg`` (``None``: inference only, e.g. the
    reference policy); see :class:`verl.engine.base.TrainEngine` for the other arguments.
    """
    kwargs = dict(
        grad_clip=grad_clip, device=device, param_dtype=param_dtype, autocast_dtype=autocast_dtype
    )
    if strategy == "single":
        return SingleProcessEngine(module, optim, **kwargs)
    if strategy == "fsdp2":
        raise NotImplementedError(
            "strategy='fsdp2' is not implemented yet: the FSDP2 engine lands with the "
            "Ray/FSDP2 worker issue. Use strategy='single' (one process) until then."
        )
    raise ValueError(f"unknown engine strategy={strategy!r}; use one of {STRATEGIES}")
