"""The arguments of a train engine, listed once: :class:`EngineOptions`.

Everything an engine takes besides its module and its optimizer (``OptimSpec``): where the
module lives, its precision, the non-finite guard, offloading, and the FSDP2 layout.
``build_engine(strategy, module, optim, options)``, :class:`~verl.engine.single.SingleProcessEngine`
and :class:`~verl.engine.fsdp.FSDP2Engine` all take one ``EngineOptions``; each also takes
the fields as keyword overrides (``build_engine("single", m, optim, grad_clip=1.0)``),
applied over ``options`` by :meth:`EngineOptions.of`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["FSDP2_ONLY", "EngineOptions"]

# The fields only the fsdp2 engine reads; the single engine refuses other values for them.
FSDP2_ONLY = (
    "reshard_after_forward",
    "mixed_precision",
    "cpu_offload",
    "full_state_dict_from_rank0",
    "sequence_parallel_size",
    "shard_dim",
    "tensor_parallel_size",
)


@dataclass(frozen=True)
class EngineOptions:
    """How a train engine places, casts, guards and offloads its module.

    Every backend:
        grad_clip: max global L2 grad norm, or ``None`` to only measure it.
        device: where parameters live (``"cpu"``, ``"cuda:0"``...).
        param_dtype: cast parameters to this dtype (``None`` keeps them). Keep float32
            master weights when training with autocast.
        autocast_dtype: run forwards under ``torch.autocast`` in this dtype (``None`` or
            float32: no autocast).
        grad_scaling: dynamic loss scaling (``torch.amp.GradScaler``); ``None`` = on iff
            ``autocast_dtype`` is float16. A scaled step whose gradients overflow is skipped
            and counted like any other non-finite step.
        max_consecutive_nonfinite: raise ``NonFiniteLossError`` when this many optimizer
            steps in a row were skipped for a non-finite loss or gradient norm (0 = never).
        offload_params / offload_optimizer: keep parameters (and gradients) / optimizer state
            in host memory between uses: moved to ``device`` when a ``train_mode``,
            ``eval_mode`` or ``gathered_params`` block starts (optimizer state only for
            ``train_mode``) and back when the outermost block ends. Nothing moves when
            ``device`` is the CPU.

    fsdp2 only (:data:`FSDP2_ONLY`; documented on :class:`verl.engine.fsdp.FSDP2Engine`):
        reshard_after_forward, mixed_precision, cpu_offload, full_state_dict_from_rank0,
        sequence_parallel_size, shard_dim, tensor_parallel_size.
    """

    grad_clip: float | None = None
    device: Any = "cpu"  # str | torch.device
    param_dtype: Any = None  # str | torch.dtype | None
    autocast_dtype: Any = None  # str | torch.dtype | None
    grad_scaling: bool | None = None
    max_consecutive_nonfinite: int = 0
    offload_params: bool = False
    offload_optimizer: bool = False
    reshard_after_forward: bool = True
    mixed_precision: dict[str, Any] | None = None
    cpu_offload: bool = False
    full_state_dict_from_rank0: bool = False
    sequence_parallel_size: int = 1
    shard_dim: int = 0
    tensor_parallel_size: int = 1

    @classmethod
    def of(cls, options: EngineOptions | None = None, **overrides: Any) -> EngineOptions:
        """``options`` (``None``: every default) with the fields in ``overrides`` replaced.

        Raises:
            TypeError: an override that is no field of :class:`EngineOptions`.
        """
        base = cls() if options is None else options
        if not isinstance(base, cls):
            raise TypeError(
                f"engine options must be an EngineOptions, got {type(base).__name__}; "
                "pass EngineOptions(...) or its fields as keywords"
            )
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(
                f"unknown engine option(s) {unknown}; the options are the fields of "
                f"EngineOptions: {[f.name for f in dataclasses.fields(cls)]}"
            )
        return dataclasses.replace(base, **overrides) if overrides else base

    def replace(self, **changes: Any) -> EngineOptions:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def check_single_process(self) -> None:
        """Refuse the fsdp2-only options the single-process engine cannot honour.

        Raises:
            ValueError: ``sequence_parallel_size != 1``, ``tensor_parallel_size != 1``, or
                ``mixed_precision`` / ``cpu_offload`` / ``full_state_dict_from_rank0`` set.
        """
        if self.sequence_parallel_size != 1:
            raise ValueError(
                f"ulysses_sequence_parallel_size={self.sequence_parallel_size} needs the fsdp2 "
                "engine (strategy=fsdp2 or auto over several devices); the single engine runs "
                "one process"
            )
        if self.tensor_parallel_size != 1:
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size} needs the fsdp2 engine "
                "(strategy=fsdp2 over several devices); the single engine runs one process"
            )
        if self.mixed_precision or self.cpu_offload or self.full_state_dict_from_rank0:
            raise ValueError(
                "mixed_precision / cpu_offload / full_state_dict_from_rank0 are fsdp2 options; "
                "the single engine takes param_dtype / autocast_dtype instead"
            )
