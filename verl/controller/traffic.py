"""Count what crosses the driver/worker boundary, per worker-group method call.

``TrafficMeter`` wraps the calls of worker groups and records, for every rank of every
call, the pickled size of the arguments the rank receives and of the result it sends back,
and which ``DataProto`` keys were in them. Pickle is what a remote backend (Ray) sends, so
the sizes are what a call costs on the wire; on the local backend nothing is copied, but
the meter measures the same bytes, which makes it usable in fast tests::

    meter = TrafficMeter()
    with meter.watch(trainer.actor_rollout_wg, trainer.critic_wg):
        trainer.train_step(batch)
    print(meter.table())

Only calls made while watching are counted; ``watch`` restores the groups afterwards.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from verl.controller.worker_group import PendingOutputs, WorkerGroup
from verl.protocol import DataProto

__all__ = ["CallRecord", "TrafficMeter", "pickled_size"]


def pickled_size(obj: Any) -> int:
    """Bytes of ``obj`` pickled with protocol 5 (what a remote call sends for it)."""
    return len(pickle.dumps(obj, protocol=5))


def _keys(objs: Any) -> tuple[set[str], set[str], set[str]]:
    """Tensor, non-tensor and meta_info keys of every ``DataProto`` in ``objs``."""
    tensors: set[str] = set()
    non_tensors: set[str] = set()
    meta: set[str] = set()
    for obj in objs:
        if isinstance(obj, DataProto):
            tensors |= set(obj.batch)
            non_tensors |= set(obj.non_tensor_batch)
            meta |= set(obj.meta_info)
    return tensors, non_tensors, meta


@dataclass
class CallRecord:
    """One rank's share of one group call."""

    method: str
    rank: int
    sent_bytes: int  # arguments, driver -> worker
    tensor_keys: set[str] = field(default_factory=set)
    non_tensor_keys: set[str] = field(default_factory=set)
    meta_keys: set[str] = field(default_factory=set)
    returned_bytes: int | None = None  # result, worker -> driver (None until gathered)


class _MeteredOutputs(PendingOutputs):
    """Forwards to the backend's pending outputs; sizes the results when they arrive."""

    def __init__(self, inner: PendingOutputs, records: list[CallRecord]) -> None:
        self._inner = inner
        self._records = records

    def wait(self, timeout: float | None = None) -> list[Any]:
        outputs = self._inner.wait(timeout)
        for record, out in zip(self._records, outputs, strict=True):
            if record.returned_bytes is None:
                record.returned_bytes = pickled_size(out)
        return outputs

    def done(self) -> bool:
        return self._inner.done()


class TrafficMeter:
    """Records the bytes and ``DataProto`` keys of every watched worker-group call."""

    def __init__(self) -> None:
        self.records: list[CallRecord] = []

    @contextlib.contextmanager
    def watch(self, *groups: WorkerGroup | None) -> Iterator[TrafficMeter]:
        """Count the calls of ``groups`` (``None`` entries are skipped) inside the block."""
        watched = [g for g in groups if g is not None]
        for group in watched:
            if not isinstance(group, WorkerGroup):
                raise TypeError(f"TrafficMeter.watch: {group!r} is not a WorkerGroup")
            if "_start" in vars(group):
                raise RuntimeError(f"TrafficMeter.watch: {group!r} is already being watched")
            group._start = self._wrap(group._start)  # type: ignore[method-assign]
        try:
            yield self
        finally:
            for group in watched:
                del group._start

    def _wrap(self, start: Any) -> Any:
        def metered_start(method_name: str, calls: list[tuple[tuple, dict[str, Any]]]) -> Any:
            records = []
            for rank, (args, kwargs) in enumerate(calls):
                tensors, non_tensors, meta = _keys([*args, *kwargs.values()])
                records.append(
                    CallRecord(
                        method=method_name,
                        rank=rank,
                        sent_bytes=pickled_size((args, kwargs)),
                        tensor_keys=tensors,
                        non_tensor_keys=non_tensors,
                        meta_keys=meta,
                    )
                )
            self.records.extend(records)
            return _MeteredOutputs(start(method_name, calls), records)

        return metered_start

    # ------------------------------------------------------------------ summaries
    def sent_bytes(self, method: str | None = None) -> int:
        """Argument bytes of every counted call (of ``method`` only, if given)."""
        return sum(r.sent_bytes for r in self.records if method in (None, r.method))

    def returned_bytes(self, method: str | None = None) -> int:
        """Result bytes of every gathered call (of ``method`` only, if given)."""
        return sum(r.returned_bytes or 0 for r in self.records if method in (None, r.method))

    def by_method(self) -> dict[str, dict[str, Any]]:
        """``{method: {"calls", "sent_bytes", "returned_bytes", "keys", "meta_keys"}}``.

        ``calls`` counts group calls (not ranks); ``keys`` are the tensor and non-tensor
        keys any rank received, ``meta_keys`` the ``meta_info`` keys.
        """
        out: dict[str, dict[str, Any]] = {}
        for r in self.records:
            row = out.setdefault(
                r.method,
                {
                    "calls": 0,
                    "sent_bytes": 0,
                    "returned_bytes": 0,
                    "keys": set(),
                    "meta_keys": set(),
                },
            )
            row["calls"] += r.rank == 0
            row["sent_bytes"] += r.sent_bytes
            row["returned_bytes"] += r.returned_bytes or 0
            row["keys"] |= r.tensor_keys | r.non_tensor_keys
            row["meta_keys"] |= r.meta_keys
        return out

    def table(self) -> str:
        """A human-readable table of :meth:`by_method`, with a total line."""
        rows = self.by_method()
        lines = [f"{'method':<22} {'calls':>5} {'sent':>12} {'returned':>12}  keys received"]
        for name, row in rows.items():
            keys = ", ".join(sorted(row["keys"]))
            meta = ", ".join(sorted(row["meta_keys"]))
            lines.append(
                f"{name:<22} {row['calls']:>5} {row['sent_bytes']:>12,} "
                f"{row['returned_bytes']:>12,}  {keys}" + (f" | meta: {meta}" if meta else "")
            )
        lines.append(f"{'total':<22} {'':>5} {self.sent_bytes():>12,} {self.returned_bytes():>12,}")
        return "\n".join(lines)
