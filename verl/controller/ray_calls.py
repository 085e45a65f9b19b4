"""The driver's side of a ``RayWorkerGroup`` (``verl.controller.ray_backend``): its actors
and the calls running on them.

Contract: :class:`RayActors` holds one group's actor handles (shared by its ``spawn()``
role views), their pids and nodes, the first death or stall seen (after which the group
runs nothing more), and the results nobody waits for any more; ``shutdown()`` closes the
workers when none is busy or dead (at most ``_CLOSE_GRACE_S``), kills the actors and
releases the pool's placement. :class:`RayPending` is one call's per-rank results:
``wait()`` returns them in rank order or raises on the first failing rank, as
``WorkerDiedError`` (naming role, rank, pid, node and Ray's cause) when the rank's process
died, also when another rank failed first in a collective with it (looked for during
``_DEATH_GRACE_S``), or ``WorkerStalledError`` when the heartbeat finds a rank that does
not run. Other errors are raised as they are, noted with the call and rank.

This module imports Ray.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import OutOfMemoryError, RayActorError, RayError, WorkerCrashedError

from verl.controller.ray_failures import death_cause, node_death
from verl.controller.ray_heartbeat import Heartbeat
from verl.controller.ray_placement import PoolPlacement, release_placement
from verl.controller.resource_pool import ResourcePool
from verl.controller.worker_group import PendingOutputs, WorkerDiedError, WorkerStalledError

logger = logging.getLogger(__name__)

__all__ = ["RayActors", "RayPending"]

# After an ordinary error from one rank, how long to look for a dead rank among the others:
# a rank blocked in a collective with a rank that died fails with a connection error at
# about the moment the death is reported, and the death is the cause worth naming.
_DEATH_GRACE_S = 2.0

_DEATH_ERRORS = (RayActorError, WorkerCrashedError, OutOfMemoryError)

# How long shutdown waits for idle workers' ``Worker.close`` (an inference engine's own
# shutdown) before killing the actors anyway.
_CLOSE_GRACE_S = 15.0


@dataclass
class RayActors:
    """The actors of one group, shared by its ``spawn()`` role views."""

    label: str
    pool: ResourcePool
    placement: PoolPlacement | None
    handles: list[Any] = field(default_factory=list)
    pids: list[int | None] = field(default_factory=list)
    nodes: list[str | None] = field(default_factory=list)  # "<ip> id <node id>" per rank
    dead: WorkerDiedError | None = None
    closed: bool = False
    heartbeat: Heartbeat | None = None
    # results of ranks a failed call stopped waiting for; kept (not dropped) so that Ray does
    # not report their errors as unhandled, and collected quietly at shutdown
    abandoned: list[Any] = field(default_factory=list)
    # the calls started on the workers (``execute``), to tell at shutdown whether any runs
    running: list[Any] = field(default_factory=list)

    def started(self, refs: list[Any]) -> None:
        """Note the refs of a call just started (and forget the finished ones)."""
        if self.running:
            _, self.running = ray.wait(self.running, num_returns=len(self.running), timeout=0)
        self.running.extend(refs)

    def _close_workers(self) -> None:
        """``Worker.close`` on every rank, when none is running a call or has died (a busy or
        broken group is killed at once: a stop that must be quick is not held up)."""
        if self.dead is not None or not self.handles:
            return
        if self.running:
            _, busy = ray.wait(self.running, num_returns=len(self.running), timeout=0)
            if busy:
                return
        refs = [handle.close_worker.remote() for handle in self.handles]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_CLOSE_GRACE_S)
        for ref in ready:
            try:
                ray.get(ref)
            except Exception as e:  # closing is best effort; the kill below follows anyway
                logger.warning("%s: closing a worker failed: %s", self.label, e)
        self.abandoned.extend(ref for ref in refs if ref not in ready)

    def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        if ray.is_initialized():
            self._close_workers()
            for handle in self.handles:
                try:
                    ray.kill(handle, no_restart=True)
                except Exception as e:  # already dead, or the cluster is gone
                    logger.debug("could not kill %s actor: %s", self.label, e)
            if self.abandoned:
                ready, _ = ray.wait(
                    self.abandoned, num_returns=len(self.abandoned), timeout=_DEATH_GRACE_S
                )
                for ref in ready:
                    try:
                        ray.get(ref)
                    except Exception as e:
                        logger.debug("abandoned %s result: %s", self.label, type(e).__name__)
            self.abandoned = []
        if self.placement is not None:
            release_placement(self.pool, self.placement)
            self.placement = None
        logger.debug("shut down %d %s actor(s)", len(self.handles), self.label)


class RayPending(PendingOutputs):
    """The per-rank ObjectRefs of one call; ``wait`` raises on the first failing rank."""

    def __init__(self, actors: RayActors, role: str, method: str, refs: list[Any]) -> None:
        self._actors = actors
        self._role = role
        self._method = method
        self._rank_of = {ref: rank for rank, ref in enumerate(refs)}
        self._outputs: list[Any] = [None] * len(refs)
        self._pending = list(refs)

    def done(self) -> bool:
        if not self._pending:
            return True
        ready, _ = ray.wait(self._pending, num_returns=len(self._pending), timeout=0)
        return len(ready) == len(self._pending)

    def wait(self, timeout: float | None = None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        heartbeat = self._actors.heartbeat
        while self._pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if heartbeat is not None:
                self._check_heartbeat(heartbeat)
                left = heartbeat.interval_s if left is None else min(left, heartbeat.interval_s)
            ready, self._pending = ray.wait(self._pending, num_returns=1, timeout=left)
            if (
                not ready
                and heartbeat is not None
                and (deadline is None or time.monotonic() < deadline)
            ):
                continue
            if not ready:
                ranks = sorted(self._rank_of[r] for r in self._pending)
                raise TimeoutError(
                    f"{self._role}.{self._method}: ranks {ranks} still running after {timeout}s"
                )
            for ref in ready:
                try:
                    self._outputs[self._rank_of[ref]] = self._get(ref)
                except BaseException:
                    self._actors.abandoned.extend(self._pending)
                    self._pending = []
                    raise
        return self._outputs

    def _check_heartbeat(self, heartbeat: Heartbeat) -> None:
        stall = heartbeat.check()
        if stall is None:
            return
        rank = stall.rank
        pid = self._actors.pids[rank] if rank < len(self._actors.pids) else None
        node = self._actors.nodes[rank] if rank < len(self._actors.nodes) else None
        where = ", ".join(x for x in (pid and f"pid {pid}", node and f"node {node}") if x)
        error = WorkerStalledError(
            self._role,
            rank,
            f"({where or 'process not started yet'}) no answer to its heartbeat for "
            f"{stall.silent_s:.1f}s (timeout {heartbeat.timeout_s:g}s, "
            "trainer.worker_heartbeat_timeout): the process is alive but does not run "
            "(stopped with SIGSTOP, frozen, or stuck in native code holding the interpreter "
            "lock); the group is unusable, restart the run (it resumes from the last "
            "checkpoint)",
            method=self._method,
        )
        if self._actors.dead is None:
            self._actors.dead = error
        self._actors.abandoned.extend(self._pending)
        self._actors.abandoned.extend(heartbeat.abandon())
        self._actors.heartbeat = None
        self._pending = []
        raise error

    def _get(self, ref: Any) -> Any:
        rank = self._rank_of[ref]
        try:
            return ray.get(ref)
        except _DEATH_ERRORS as e:
            if self._actors.closed:
                raise RuntimeError(
                    f"the {self._role} worker group was shut down while {self._method!r} ran"
                ) from e
            raise self._died(rank, e) from e
        except Exception as e:
            # a rank in a collective with a dead rank fails too: report the dead one
            death = self._find_death()
            if death is not None:
                logger.debug("rank %d failed after rank %d died: %s", rank, death.rank, e)
                raise death from e
            _note(e, f"(in {self._role}.{self._method} on rank {rank})")
            raise

    def _find_death(self) -> WorkerDiedError | None:
        deadline = time.monotonic() + _DEATH_GRACE_S
        rest = list(self._pending)
        while rest and (left := deadline - time.monotonic()) > 0:
            ready, rest = ray.wait(rest, num_returns=1, timeout=left)
            for ref in ready:
                try:
                    ray.get(ref)
                except _DEATH_ERRORS as e:
                    return self._died(self._rank_of[ref], e)
                except Exception:
                    continue
        return None

    def _died(self, rank: int, error: RayError) -> WorkerDiedError:
        pid = self._actors.pids[rank] if rank < len(self._actors.pids) else None
        node = self._actors.nodes[rank] if rank < len(self._actors.nodes) else None
        where = ", ".join(x for x in (pid and f"pid {pid}", node and f"node {node}") if x)
        cause = f"({where}) {death_cause(error)}" if where else death_cause(error)
        cause += node_death(node)
        died = WorkerDiedError(self._role, rank, cause, method=self._method)
        if self._actors.dead is None:
            self._actors.dead = died
        return died


def _note(error: BaseException, note: str) -> None:
    if hasattr(error, "add_note"):  # Python >= 3.11
        error.add_note(note)
