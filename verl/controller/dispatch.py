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
  A method that returns a ``dict`` on every rank (metrics, which the method has already
  reduced over the data-parallel ranks) gives the driver rank 0's dict.

The data contract: ``register(..., reads=(...), optional=(...), meta=(...))`` declares the
batch keys (tensor or non-tensor) a method reads, the ones it reads when present, and the
``meta_info`` keys it reads when present. Every ``DataProto`` argument is then cut to those
keys before it is split and sent (``select_inputs``), so a worker receives five tensors
when it reads five, never the step's whole batch or its metrics; a declared key the batch
lacks is a ``KeyError`` naming the method and the key. Without ``reads`` the whole batch
is sent.

This module is backend-neutral: ``select_inputs``, ``split_inputs`` and ``collect_outputs``
are the whole contract a backend (local, Ray) needs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
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
    "select_inputs",
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
    """What ``@register`` stores on a worker method.

    ``reads`` is ``None`` for a method that receives whole batches; otherwise the batch keys
    it needs, ``optional`` those it reads when present and ``meta`` the ``meta_info`` keys
    it reads when present (see :func:`register`).
    """

    mode: Dispatch
    rank_zero_result: bool = False
    reads: tuple[str, ...] | None = None
    optional: tuple[str, ...] = ()
    meta: tuple[str, ...] = ()
    beside: bool = False


def _key_tuple(name: str, keys: Iterable[str]) -> tuple[str, ...]:
    if isinstance(keys, str):
        raise TypeError(f"register: {name} must be a tuple of key names, got the string {keys!r}")
    out = tuple(keys)
    bad = [k for k in out if not isinstance(k, str) or not k]
    if bad:
        raise TypeError(f"register: {name} holds non-string or empty key names {bad!r}")
    return out


def register(
    dispatch_mode: Dispatch = Dispatch.ONE_TO_ALL,
    *,
    rank_zero_result: bool = False,
    reads: Iterable[str] | None = None,
    optional: Iterable[str] = (),
    meta: Iterable[str] = (),
    beside: bool = False,
) -> Callable[[F], F]:
    """Mark a worker method as callable through a worker group with ``dispatch_mode``.

    ``rank_zero_result`` (``ONE_TO_ALL`` only) makes the group return rank 0's result
    instead of the list of all ranks' results.

    ``reads``: the ``DataProto`` keys (in ``batch`` or ``non_tensor_batch``) the method
    reads; only those are sent, and a missing one is an error at the call. ``optional``:
    keys sent when the batch has them (the method checks). ``meta``: ``meta_info`` keys sent
    when present; other ``meta_info`` stays on the driver. ``optional`` and ``meta`` need
    ``reads``.

    ``beside``: on a remote backend the call runs on a second thread of each worker's
    process, beside a call in progress (for a quick method that only reads state the
    running call hands over under a lock); other calls on one group run one after another.
    In-process backends run it on the calling thread, as any call.
    """
    if not isinstance(dispatch_mode, Dispatch):
        raise TypeError(
            f"register: dispatch_mode must be a Dispatch member, got {dispatch_mode!r} "
            "(use @register(dispatch_mode=Dispatch.DP_COMPUTE), with parentheses)"
        )
    if rank_zero_result and dispatch_mode is not Dispatch.ONE_TO_ALL:
        raise ValueError(f"register: rank_zero_result applies to ONE_TO_ALL, not {dispatch_mode}")
    read_keys = None if reads is None else _key_tuple("reads", reads)
    optional_keys, meta_keys = _key_tuple("optional", optional), _key_tuple("meta", meta)
    if read_keys is None and (optional_keys or meta_keys):
        raise ValueError("register: optional= and meta= refine reads=; declare reads too")
    if read_keys is not None and not read_keys and dispatch_mode is Dispatch.DP_COMPUTE:
        raise ValueError("register: a DP_COMPUTE method must read at least one batch key")
    both = set(optional_keys) & set(read_keys or ())
    if both:
        raise ValueError(f"register: key(s) {sorted(both)} are in both reads and optional")
    spec = MethodDispatch(
        dispatch_mode, rank_zero_result, read_keys, optional_keys, meta_keys, bool(beside)
    )

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


def _declared_part(spec: MethodDispatch, data: DataProto, method: str, where: str) -> DataProto:
    assert spec.reads is not None
    present = data.batch.keys() | data.non_tensor_batch.keys()
    missing = [k for k in spec.reads if k not in present]
    if missing:
        raise KeyError(
            f"{method} reads batch key(s) {missing} that {where} lacks (it has "
            f"{sorted(present)}); add them to the batch before the call"
        )
    wanted = set(spec.reads) | (set(spec.optional) & present)
    return DataProto(
        batch={k: v for k, v in data.batch.items() if k in wanted},
        non_tensor_batch={k: v for k, v in data.non_tensor_batch.items() if k in wanted},
        meta_info={k: v for k, v in data.meta_info.items() if k in spec.meta},
    )


def select_inputs(
    spec: MethodDispatch, args: tuple, kwargs: dict[str, Any], method: str = "method"
) -> tuple[tuple, dict[str, Any]]:
    """Cut every ``DataProto`` argument to the keys ``spec`` declares (no copy of tensors).

    Unchanged when the method declares no ``reads``. Raises ``KeyError`` naming ``method``
    and the key when a declared key is missing.
    """
    if spec.reads is None:
        return args, kwargs
    new_args = tuple(
        _declared_part(spec, a, method, f"arg {i}") if isinstance(a, DataProto) else a
        for i, a in enumerate(args)
    )
    new_kwargs = {
        k: _declared_part(spec, v, method, f"argument {k!r}") if isinstance(v, DataProto) else v
        for k, v in kwargs.items()
    }
    return new_args, new_kwargs


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
        if all(isinstance(o, dict) for o in outputs):
            return outputs[0]  # metrics: the method reduced them over the ranks already
        bad = {r: type(o).__name__ for r, o in enumerate(outputs) if not isinstance(o, DataProto)}
        if bad:
            raise TypeError(
                f"DP_COMPUTE method {method!r} must return a DataProto (or a dict, or None) on "
                "every rank; "
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
