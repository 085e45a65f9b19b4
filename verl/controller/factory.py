"""``make_worker_group``: the one place where a worker-group backend is picked by name.

The trainer says ``make_worker_group(cfg.backend, CriticWorker, pool, config=cfg)`` and gets
a ``LocalWorkerGroup`` (``"local"``: every rank in the driver process) or a
``RayWorkerGroup`` (``"ray"``: one Ray actor per rank); both have the same call surface
(group methods, ``submit``, ``spawn``, ``shutdown``). Ray is imported only for ``"ray"``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from verl.controller.local import LocalWorkerGroup
from verl.controller.resource_pool import ResourcePool
from verl.controller.worker import Worker
from verl.controller.worker_group import WorkerGroup

if TYPE_CHECKING:
    from verl.controller.ray_backend import RayOptions

logger = logging.getLogger(__name__)

__all__ = ["BACKENDS", "make_worker_group"]

BACKENDS = ("local", "ray")


def make_worker_group(
    backend: str,
    worker_cls: type[Worker],
    resource_pool: ResourcePool,
    *args: Any,
    ray_options: RayOptions | None = None,
    **kwargs: Any,
) -> WorkerGroup:
    """A worker group of ``worker_cls(*args, **kwargs)`` on ``resource_pool`` with ``backend``.

    ``ray_options`` (a ``RayOptions``) configures the Ray backend and is ignored by the
    local one; every other argument goes to the worker's constructor.
    """
    if backend == "local":
        if ray_options is not None:
            logger.debug("make_worker_group: ray_options ignored by the local backend")
        return LocalWorkerGroup(worker_cls, resource_pool, *args, **kwargs)
    if backend == "ray":
        from verl.controller.ray_backend import RayWorkerGroup

        return RayWorkerGroup(worker_cls, resource_pool, *args, ray_options=ray_options, **kwargs)
    raise ValueError(f"unknown worker-group backend {backend!r}; expected one of {BACKENDS}")
