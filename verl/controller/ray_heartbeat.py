"""Heartbeat of a Ray worker group: notice a rank that stops answering, by name, in bounded time.

A rank whose process dies is reported by Ray within seconds (``WorkerDiedError``). A rank
whose process is alive but no longer runs (stopped with SIGSTOP, frozen by swapping, a
debugger, a cgroup freezer) is not: the driver would wait for its result, and the other
ranks in a collective with it, until the collective timeout (1800 s by default).

While the driver waits on a group's call, ``Heartbeat.check()`` (called by the wait loop
at least every ``interval_s``) sends each rank's actor a ``heartbeat`` call, which runs in
a concurrency group of its own (a second thread of the actor), so it is answered even
while the rank's worker method runs for minutes. A ping unanswered for ``timeout_s``
means the process stopped running; ``check`` returns that rank, and the group reports
``WorkerStalledError`` naming the role, rank, pid and node. A rank is watched from its
first answer on: until then its process may still be starting.

A Python thread needs the interpreter lock to answer: native code that holds it for
longer than ``timeout_s`` (not torch operators, which release it) also counts as stalled.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import ray

logger = logging.getLogger(__name__)

__all__ = ["HEARTBEAT_GROUP", "Heartbeat", "Stall"]

# the actor's concurrency group that answers pings, beside the default group's worker calls
HEARTBEAT_GROUP = "heartbeat"


@dataclass(frozen=True)
class Stall:
    """A rank whose ping has gone unanswered for ``silent_s`` seconds."""

    rank: int
    silent_s: float


class Heartbeat:
    """Pings for the actors of one group; ``check()`` finds a rank that stopped answering.

    Args:
        handles: the actor handles in rank order; each has a ``heartbeat`` method in the
            ``HEARTBEAT_GROUP`` concurrency group.
        timeout_s: how long a ping may go unanswered.
    """

    def __init__(self, handles: list[Any], timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"heartbeat timeout_s={timeout_s} must be > 0")
        self._handles = handles
        self.timeout_s = float(timeout_s)
        # a ping every fifth of the timeout, at most every 5 s: answers come back in ~1 ms,
        # so a stall is seen between timeout_s and timeout_s + interval_s after it began
        self.interval_s = min(self.timeout_s / 5, 5.0)
        self._in_flight: dict[int, tuple[Any, float]] = {}  # rank -> (ref, sent at)
        self._last_sent = [float("-inf")] * len(handles)
        # ranks that answered once: before that the actor may still be starting (a new
        # worker process takes seconds), which is not a stall
        self._up: set[int] = set()

    def check(self) -> Stall | None:
        """Collect answers, send due pings; the first rank silent for ``timeout_s``, if any."""
        now = time.monotonic()
        if self._in_flight:
            refs = [ref for ref, _ in self._in_flight.values()]
            answered, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            done = set(answered)
            for rank in [r for r, (ref, _) in self._in_flight.items() if ref in done]:
                ref, _ = self._in_flight.pop(rank)
                try:
                    ray.get(ref)
                    self._up.add(rank)
                except Exception as e:  # the actor died: the call's own result says so
                    logger.debug("heartbeat of rank %d failed: %s", rank, type(e).__name__)
        for rank, handle in enumerate(self._handles):
            if rank not in self._in_flight and now - self._last_sent[rank] >= self.interval_s:
                ref = handle.heartbeat.remote()
                self._in_flight[rank] = (ref, now)
                self._last_sent[rank] = now
        stalled = [
            Stall(rank, now - sent)
            for rank, (_, sent) in self._in_flight.items()
            if rank in self._up and now - sent > self.timeout_s
        ]
        return min(stalled, key=lambda s: s.rank) if stalled else None

    def abandon(self) -> list[Any]:
        """Stop pinging; the refs of unanswered pings (to be collected at shutdown)."""
        refs = [ref for ref, _ in self._in_flight.values()]
        self._in_flight.clear()
        return refs
