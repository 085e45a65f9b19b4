"""Local backend: every worker of a group lives in the driver process.

``LocalWorkerGroup(worker_cls, resource_pool, *args, **kwargs)`` creates
``resource_pool.world_size`` instances of ``worker_cls(*args, **kwargs)``, rank ``r`` knowing
``rank=r``, and runs each group call on rank 0, 1, ... one after another.

Use it for single-device runs (``world_size=1``) and to test dispatch logic. With
``world_size > 1`` there are no real collectives: the workers share one process and no
rendezvous (``master_addr``/``master_port`` are ``None``), so a worker that initialises
``torch.distributed`` must run under a multi-process backend (Ray) instead.

Arguments are passed by reference, as the dispatch modes produce them: ``DP_COMPUTE``
chunks are views into the driver's tensors, so a worker must not modify its input tensors
in place (under Ray the driver would not see that; here it would).
"""

from __future__ import annotations

import logging
from typing import Any

from verl.controller.resource_pool import ResourcePool
from verl.controller.worker import DistInfo, Worker, instantiate_worker
from verl.controller.worker_group import WorkerGroup

logger = logging.getLogger(__name__)

__all__ = ["LocalWorkerGroup"]

_CLOSED_ATTR = "_verl_closed"


class LocalWorkerGroup(WorkerGroup):
    """``resource_pool.world_size`` in-process workers of ``worker_cls``, called rank by rank."""

    def __init__(
        self, worker_cls: type[Worker], resource_pool: ResourcePool, *args: Any, **kwargs: Any
    ) -> None:
        if not isinstance(resource_pool, ResourcePool):
            raise TypeError(
                f"resource_pool must be a ResourcePool, got {type(resource_pool).__name__} "
                "(e.g. ResourcePool(process_on_nodes=[2]))"
            )
        super().__init__(worker_cls, resource_pool.world_size)
        self._resource_pool = resource_pool
        self._workers: list[Worker] = []
        for rank in range(resource_pool.world_size):
            _, local_rank = resource_pool.placement(rank)
            info = DistInfo(rank=rank, world_size=resource_pool.world_size, local_rank=local_rank)
            self._workers.append(instantiate_worker(worker_cls, info, args, kwargs))
        logger.debug(
            "created %d local %s workers in pool %r",
            len(self._workers),
            worker_cls.__name__,
            resource_pool.name,
        )

    @property
    def resource_pool(self) -> ResourcePool:
        return self._resource_pool

    @property
    def workers(self) -> list[Worker]:
        """The worker objects in rank order (the role's workers for a ``spawn()`` view)."""
        if self._role is None:
            return list(self._workers)
        return [w.role_workers[self._role] for w in self._workers]  # type: ignore[attr-defined]

    def _execute(self, method_name: str, calls: list[tuple[tuple, dict[str, Any]]]) -> list[Any]:
        outputs = []
        for rank, (worker, (args, kwargs)) in enumerate(zip(self.workers, calls, strict=True)):
            try:
                outputs.append(getattr(worker, method_name)(*args, **kwargs))
            except Exception as e:
                if hasattr(e, "add_note"):  # Python >= 3.11
                    e.add_note(f"(in {type(worker).__name__}.{method_name} on rank {rank})")
                raise
        return outputs

    def shutdown(self) -> None:
        """``Worker.close`` on every worker (of every role, for a colocated group), once; the
        worker objects stay readable (a test may inspect them after a run)."""
        for worker in self._workers:
            if not worker.__dict__.get(_CLOSED_ATTR):
                worker.__dict__[_CLOSED_ATTR] = True
                worker.close()

    def request_stop(self, signum: int) -> None:
        for worker in self._workers:
            worker.request_stop(signum)

    def _role_view(self, role: str) -> LocalWorkerGroup:
        view = LocalWorkerGroup.__new__(LocalWorkerGroup)
        WorkerGroup.__init__(view, self._worker_cls, self._world_size, role=role)
        view._resource_pool = self._resource_pool
        view._workers = self._workers
        return view
