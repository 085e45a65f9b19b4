"""Single-controller plumbing: workers, dispatch modes, resource pools and worker groups.

The driver holds no model; it calls ``WorkerGroup`` proxies whose registered methods split
a ``DataProto`` by data-parallel rank, run every worker, and gather the results
(``wg.method(batch)``), or start the call without waiting (``wg.submit("method", batch)``
-> ``GroupFuture``; ``.result()`` gathers).

Backends, picked by name with ``make_worker_group("local" | "ray", worker_cls, pool, ...)``:

- ``LocalWorkerGroup``: every rank in the driver process, run one after another; for
  tests and single-device runs.
- ``RayWorkerGroup``: one Ray actor per rank, placed by placement groups built from the
  ``ResourcePool`` (groups over the same pool object share its devices), with a real
  ``torch.distributed`` group when ``world_size > 1``. ``ensure_ray`` starts or joins Ray (``shutdown_ray`` stops it);
  a dead worker process surfaces as ``WorkerDiedError``, one that stops answering its
  heartbeat as ``WorkerStalledError``.

Nothing in this package imports Ray at import time: ``RayWorkerGroup``, ``RayOptions``,
``ensure_ray`` and ``shutdown_ray`` are loaded on first access.
"""

from __future__ import annotations

from verl.controller.colocate import ClassWithInitArgs, ColocatedWorker, create_colocated_worker_cls
from verl.controller.dispatch import Dispatch, MethodDispatch, register
from verl.controller.factory import BACKENDS, make_worker_group
from verl.controller.local import LocalWorkerGroup
from verl.controller.resource_pool import ResourcePool
from verl.controller.worker import DistInfo, Worker, instantiate_worker
from verl.controller.worker_group import (
    GroupFuture,
    WorkerDiedError,
    WorkerGroup,
    WorkerStalledError,
    registered_methods,
)
from verl.utils.lazy import lazy_exports

# names whose module imports Ray, loaded on first access
_LAZY = {
    "RayOptions": "verl.controller.ray_backend",
    "RayWorkerGroup": "verl.controller.ray_backend",
    "ensure_ray": "verl.controller.ray_backend",
    "shutdown_ray": "verl.controller.ray_cluster",
}

__all__ = [
    "BACKENDS",
    "ClassWithInitArgs",
    "ColocatedWorker",
    "Dispatch",
    "DistInfo",
    "GroupFuture",
    "LocalWorkerGroup",
    "MethodDispatch",
    "RayOptions",
    "RayWorkerGroup",
    "ResourcePool",
    "Worker",
    "WorkerDiedError",
    "WorkerGroup",
    "WorkerStalledError",
    "create_colocated_worker_cls",
    "ensure_ray",
    "instantiate_worker",
    "make_worker_group",
    "register",
    "registered_methods",
    "shutdown_ray",
]


__getattr__ = lazy_exports(__name__, _LAZY)
