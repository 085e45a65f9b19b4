"""Bucketed, time-limited weight push into a rollout engine that holds its own copy.

The ``native`` and ``hf`` backends sample from the training module itself; a serving engine
(vLLM) keeps its own weights and must be sent the new ones after every actor update. The
push here is engine-agnostic: ``receive(weights_iterator)`` is the engine's loader (for vLLM,
``collective_rpc("reload_weights", ...)``), run on a helper thread and fed the tensors one
bucket at a time. Each bucket must be consumed within ``timeout_s`` seconds, and the
loader must return within ``timeout_s`` after the last one; otherwise
:class:`WeightSyncTimeout` names the role, the bucket and the seconds instead of hanging.
After a timeout the engine is mid-load and its weights are undefined: the caller must not
sample from it again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = ["WeightSyncError", "WeightSyncTimeout", "iter_buckets", "push_weights"]

_POLL_S = 0.05
_END = object()


class WeightSyncError(RuntimeError):
    """The engine's loader failed while taking new weights."""


class WeightSyncTimeout(WeightSyncError, TimeoutError):
    """The engine did not take a bucket (or finish loading) within the timeout."""


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def iter_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group ``(name, tensor)`` pairs, in order, into lists of at most ``bucket_bytes`` bytes.

    A tensor larger than ``bucket_bytes`` gets a bucket of its own. Tensors are not copied.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be >= 1")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        n = _nbytes(tensor)
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += n
    if bucket:
        yield bucket


def _materialize(tensor: torch.Tensor) -> torch.Tensor:
    """A plain CPU tensor of the full value (a sharded DTensor is gathered)."""
    tensor = tensor.detach()
    if hasattr(tensor, "full_tensor"):
        tensor = tensor.full_tensor()
    return tensor.cpu()


def push_weights(
    receive: Callable[[Iterator[tuple[str, torch.Tensor]]], Any],
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    bucket_bytes: int,
    timeout_s: float,
    role: str,
    engine: str,
    timeout_key: str = "timeout",
    before_bucket: Callable[[int], None] | None = None,
) -> dict[str, float]:
    """Feed ``named_tensors`` to ``receive`` bucket by bucket, each within ``timeout_s``.

    ``receive`` gets one iterator over all ``(name, tensor)`` pairs (plain CPU tensors) and
    must consume it; it runs on a daemon thread under ``torch.no_grad``. ``role`` / ``engine``
    / ``timeout_key`` only word the errors. ``before_bucket(i)`` runs on the calling thread
    before bucket ``i`` is gathered (``verl.rollout.rank_zero`` tells the other ranks to
    join the gather). Returns ``{"seconds", "buckets", "megabytes"}``.

    Raises :class:`WeightSyncTimeout` when a bucket is not consumed, or the loader does not
    return, within ``timeout_s``; :class:`WeightSyncError` when the loader raises.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r} must be > 0")
    buckets = list(iter_buckets(named_tensors, bucket_bytes))
    start = time.perf_counter()
    handoff: queue.Queue = queue.Queue()  # one bucket at a time: each waits for the last
    consumed = threading.Semaphore(0)
    failure: list[BaseException] = []

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        while True:
            bucket = handoff.get()
            if bucket is _END:
                return
            yield from bucket
            consumed.release()  # the loader asked for the tensor after this bucket

    def run() -> None:
        try:
            with torch.no_grad():
                receive(stream())
        except BaseException as exc:  # reported on the pushing thread
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"verl-weight-sync-{engine}", daemon=True)
    thread.start()

    def fail_if_loader_failed(what: str) -> None:
        if failure:
            raise WeightSyncError(
                f"{role}: the {engine} rollout engine failed while loading {what}: "
                f"{type(failure[0]).__name__}: {failure[0]}"
            ) from failure[0]

    def fail_if_loader_died(what: str) -> None:
        fail_if_loader_failed(what)
        if not thread.is_alive():
            raise WeightSyncError(
                f"{role}: the {engine} rollout engine's loader returned before {what}; "
                "it must consume every tensor"
            )

    def wait(done: Callable[[float], bool], what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not done(_POLL_S):
            fail_if_loader_died(what)
            if time.monotonic() >= deadline:
                handoff.put(_END)  # a loader that wakes up later ends instead of blocking
                raise WeightSyncTimeout(
                    f"{role}: weight sync to the {engine} rollout engine timed out after "
                    f"{timeout_s:g} s waiting for {what} ({timeout_key}={timeout_s:g}); the "
                    "engine holds partly loaded weights and cannot be used any more"
                )

    total = 0
    for i, bucket in enumerate(buckets):
        if before_bucket is not None:
            before_bucket(i)
        tensors = [(name, _materialize(t)) for name, t in bucket]
        nbytes = sum(_nbytes(t) for _, t in tensors)
        total += nbytes
        what = (
            f"bucket {i + 1}/{len(buckets)} ({len(tensors)} tensors from {tensors[0][0]!r}, "
            f"{nbytes / 2**20:.1f} MiB) to be taken"
        )
        handoff.put(tensors)
        wait(lambda s: consumed.acquire(timeout=s), what)
    handoff.put(_END)
    wait(lambda s: (thread.join(timeout=s), not thread.is_alive())[1], "the load to finish")
    fail_if_loader_failed("the weights")
    seconds = time.perf_counter() - start
    logger.debug(
        "%s: pushed %d buckets (%.1f MiB) to %s in %.2f s",
        role,
        len(buckets),
        total / 2**20,
        engine,
        seconds,
    )
    return {"seconds": seconds, "buckets": float(len(buckets)), "megabytes": total / 2**20}
