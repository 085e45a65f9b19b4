"""Training engines: a model + optimizer + LR schedule, stepped in micro-batches.

``build_engine("single", module, optim_spec, options)`` returns the one-process engine;
``build_engine("fsdp2", ...)`` the FSDP2 engine (torch.distributed, one process per device,
the process group initialised first by ``verl.utils.distributed.init_distributed``). The
engine arguments are one :class:`~verl.engine.options.EngineOptions`. This package is the
only place in verl that knows about FSDP.
"""

from __future__ import annotations

from torch import nn

from verl.engine.base import NonFiniteLossError, OptimSpec, TrainEngine, resolve_dtype
from verl.engine.fsdp import FSDP2Engine
from verl.engine.options import EngineOptions
from verl.engine.single import SingleProcessEngine

__all__ = [
    "EngineOptions",
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
    options: EngineOptions | None = None,
    **overrides: object,
) -> TrainEngine:
    """Build the train engine for ``strategy`` (``"single"`` or ``"fsdp2"``).

    ``optim`` is the engine's ``optimizer_cfg`` (``None``: inference only, e.g. the
    reference policy); ``options`` its :class:`~verl.engine.options.EngineOptions`, with
    ``overrides`` (fields of it) applied on top. The fsdp2-only options are documented on
    :class:`verl.engine.fsdp.FSDP2Engine`; the single engine refuses the ones it cannot
    honour (:meth:`EngineOptions.check_single_process`).
    """
    if strategy == "single":
        return SingleProcessEngine(module, optim, EngineOptions.of(options, **overrides))
    if strategy == "fsdp2":
        return FSDP2Engine(module, optim, EngineOptions.of(options, **overrides))
    raise ValueError(f"unknown engine strategy={strategy!r}; use one of {STRATEGIES}")
