"""Training engines: a model + optimizer + LR schedule, stepped in micro-batches.

``build_engine("single", module, optim_spec, ...)`` returns the one-process engine;
``build_engine("fsdp2", ...)`` the FSDP2 engine (torch.distributed, one process per device,
the process group initialised first by ``verl.utils.distributed.init_distributed``). This
package is the only place in verl that knows about FSDP.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from verl.engine.base import NonFiniteLossError, OptimSpec, TrainEngine, resolve_dtype
from verl.engine.fsdp import FSDP2Engine
from verl.engine.single import SingleProcessEngine

__all__ = [
    "FSDP2Engine",
    "NonFiniteLossError",
    "OptimSpec",
    "SingleProcessEngine",
    "TrainEngine",
    "build_engine",
    "resolve_dtype",
]

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
    reshard_after_forward: bool = True,
    mixed_precision: dict[str, Any] | None = None,
    cpu_offload: bool = False,
    full_state_dict_from_rank0: bool = False,
    grad_scaling: bool | None = None,
    max_consecutive_nonfinite: int = 0,
    offload_params: bool = False,
    offload_optimizer: bool = False,
    sequence_parallel_size: int = 1,
    shard_dim: int = 0,
) -> TrainEngine:
    """Build the train engine for ``strategy`` (``"single"`` or ``"fsdp2"``).

    ``optim`` is the engine's ``optimizer_cfg`` (``None``: inference only, e.g. the
    reference policy); see :class:`verl.engine.base.TrainEngine` for the other arguments.
    The fsdp2-only options (``reshard_after_forward``, ``mixed_precision``, ``cpu_offload``,
    ``full_state_dict_from_rank0``, ``sequence_parallel_size``, ``shard_dim``) are documented on
    :class:`verl.engine.fsdp.FSDP2Engine`; the single engine refuses non-default values for
    them.
    """
    kwargs = dict(
        grad_clip=grad_clip,
        device=device,
        param_dtype=param_dtype,
        autocast_dtype=autocast_dtype,
        grad_scaling=grad_scaling,
        max_consecutive_nonfinite=max_consecutive_nonfinite,
        offload_params=offload_params,
        offload_optimizer=offload_optimizer,
    )
    fsdp_kwargs = dict(
        reshard_after_forward=reshard_after_forward,
        mixed_precision=mixed_precision,
        cpu_offload=cpu_offload,
        full_state_dict_from_rank0=full_state_dict_from_rank0,
        sequence_parallel_size=sequence_parallel_size,
        shard_dim=shard_dim,
    )
    if strategy == "single":
        if sequence_parallel_size != 1:
            raise ValueError(
                f"ulysses_sequence_parallel_size={sequence_parallel_size} needs the fsdp2 "
                "engine (strategy=fsdp2 or auto over several devices); the single engine runs "
                "one process"
            )
        if mixed_precision or cpu_offload or full_state_dict_from_rank0:
            raise ValueError(
                "mixed_precision / cpu_offload / full_state_dict_from_rank0 are fsdp2 options; "
                "the single engine takes param_dtype / autocast_dtype instead"
            )
        return SingleProcessEngine(module, optim, **kwargs)
    if strategy == "fsdp2":
        return FSDP2Engine(module, optim, **kwargs, **fsdp_kwargs)
    raise ValueError(f"unknown engine strategy={strategy!r}; use one of {STRATEGIES}")
