"""Dispatch modes: how a worker-group call splits its inputs across ranks and gathers outputs.

A worker method marked ``@register(dispatch_mode=...)`` becomes a method of every worker
group built over that worker class. The mode decides what each rank receives and what the
driver gets back:

- ``ONE_TO_ALL``: every rank receives the same arguments (the same objects: nothing is
  copied by the dispatch); the driver gets the list of per-rank results, or only rank 0's
  with ``register(..., rank_zero_result=True)`` (every rank is still called, so collectives
  inside the method still work).
- ``DP_COMPUTE``: every ``DataProto`` argument is split into ``world_size`` chunks by
  data-parallel rank (padded with ``pad_to_divisor`` first when its length does not divide,
  never mutating the caller's batch); other arguments go unchanged to every rank. The
  per-rank ``DataProto`` outputs are concatenated in rank order and the padding removed.

This module is backend-neutral: ``split_inputs`` and ``collect_outputs`` are the whole
contract a backend (local, Ray) needs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from verl.protocol import DataProto

logger = logging.getLogger(__name__)

__all__ = [
    "Dispatch",
    "DispatchPlan",
    "MethodDispatch",
    "collect_outputs",
    "get_method_dispatch",
    "register",
    "split_inputs",
]

_DISPATCH_ATTR = "_verl_dispatch"

F = TypeVar("F", bound=Callable[..., Any])


class Dispatch(Enum):
    """How a registered worker method is called across the ranks of a group."""

    ONE_TO_ALL = "one_to_all"
    DP_COMPUTE = "dp_compute"


@dataclass(frozen=True)
class MethodDispatch:
    """What ``@register`` stores on a worker method."""

    mode: Dispatch
    rank_zero_result: bool = False


def register(
    dispatch_mode: Dispatch = Dispatch.ONE_TO_ALL, *, rank_zero_result: bool = False
) -> Callable[[F], F]:
    """Mark a worker method as callable through a worker group with ``dispatch_mode``.

    ``rank_zero_result`` (``ONE_TO_ALL`` only) makes the group return rank 0's result
    instead of the list of all ranks' results.
    """
    if not isinstance(dispatch_mode, Dispatch):
        raise TypeError(
            f"register: dispatch_mode must be a Dispatch member, got {dispatch_mode!r} "
            "(use @register(dispatch_mode=Dispatch.DP_COMPUTE), with parentheses)"
        )
    if rank_zero_result and dispatch_mode is not Dispatch.ONE_TO_ALL:
        raise ValueError(f"register: rank_zero_result applies to ONE_TO_ALL, not {dispatch_mode}")
    spec = MethodDispatch(dispatch_mode, rank_zero_result)

    def decorate(fn: F) -> F:
        setattr(fn, _DISPATCH_ATTR, spec)
        return fn

    return decorate


def get_method_dispatch(fn: Any) -> MethodDispatch | None:
    """The dispatch spec ``@register`` put on ``fn``, or ``None`` if it is not registered."""
    return getattr(fn, _DISPATCH_ATTR, None)


@dataclass
class DispatchPlan:
    """Per-rank ``(args, kwargs)`` of one group call, plus what collecting needs to know."""

    calls: list[tuple[tuple, dict[str, Any]]]
    pad_count: int = 0
    padded_len: int | None = None


def _split_dp_compute(world_size: int, args: tuple, kwargs: dict[str, Any]) -> DispatchPlan:
    named = {f"arg {i}": a for i, a in enumerate(args) if isinstance(a, DataProto)}
    named |= {f"argument {k!r}": v for k, v in kwargs.items() if isinstance(v, DataProto)}
    if not named:
        raise TypeError("DP_COMPUTE needs at least one DataProto argument to split by rank")
    lengths = {name: len(dp) for name, dp in named.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"DP_COMPUTE: DataProto arguments differ in length: {lengths}")
    n = next(iter(lengths.values()))
    pad = (-n) % world_size

    def chunks_of(dp: DataProto) -> list[DataProto]:
        if pad:
            # select() shares tensors but not dicts, so padding never touches the caller's batch
            dp = dp.select()
            dp.pad_to_divisor(world_size)
        return dp.chunk(world_size)

    split_args = [chunks_of(a) if isinstance(a, DataProto) else None for a in args]
    split_kwargs = {k: chunks_of(v) for k, v in kwargs.items() if isinstance(v, DataProto)}
    calls = []
    for rank in range(world_size):
        rank_args = tuple(
            s[rank] if s is not None else a for a, s in zip(args, split_args, strict=True)
        )
        rank_kwargs = {
            k: split_kwargs[k][rank] if k in split_kwargs else v for k, v in kwargs.items()
        }
        calls.append((rank_args, rank_kwargs))
    if pad:
        logger.debug("DP_COMPUTE padded %d rows to %d for world_size=%d", n, n + pad, world_size)
    return DispatchPlan(calls, pad_count=pad, padded_len=n + pad)


def split_inputs(
    mode: Dispatch, world_size: int, args: tuple, kwargs: dict[str, Any]
) -> DispatchPlan:
    """Decide what each of ``world_size`` ranks receives for one group call."""
    if mode is Dispatch.ONE_TO_ALL:
        return DispatchPlan([(args, kwargs)] * world_size)
    if mode is Dispatch.DP_COMPUTE:
        return _split_dp_compute(world_size, args, kwargs)
    raise NotImplementedError(f"dispatch mode {mode} is not implemented")


def collect_outputs(
    spec: MethodDispatch, plan: DispatchPlan, outputs: list[Any], method: str = "method"
) -> Any:
    """Turn the per-rank outputs of one group call into what the driver receives."""
    if spec.mode is Dispatch.ONE_TO_ALL:
        return outputs[0] if spec.rank_zero_result else outputs
    if spec.mode is Dispatch.DP_COMPUTE:
        if all(o is None for o in outputs):
            return None
        bad = {r: type(o).__name__ for r, o in enumerate(outputs) if not isinstance(o, DataProto)}
        if bad:
            raise TypeError(
                f"DP_COMPUTE method {method!r} must return a DataProto (or None) on every rank; "
                f"got {bad} by rank"
            )
        merged = DataProto.concat(outputs)
        if plan.pad_count:
            if len(merged) != plan.padded_len:
                raise ValueError(
                    f"DP_COMPUTE method {method!r} returned {len(merged)} rows for "
                    f"{plan.padded_len} padded input rows, so the {plan.pad_count} padding "
                    "rows cannot be removed; make the input length divisible by world_size"
                )
            merged.unpad(plan.pad_count)
        return merged
    raise NotImplementedError(f"dispatch mode {spec.mode} is not implemented")
