"""Single-controller plumbing: workers, dispatch modes, resource pools and worker groups.

The driver holds no model; it calls ``WorkerGroup`` proxies whose registered methods split
a ``DataProto`` by data-parallel rank, run every worker, and gather the results. Backends:
``LocalWorkerGroup`` (in-process, here). Nothing in this package imports Ray at import time.
"""

from verl.controller.colocate import ClassWithInitArgs, ColocatedWorker, create_colocated_worker_cls
from verl.controller.dispatch import Dispatch, MethodDispatch, register
from verl.controller.local import LocalWorkerGroup
from verl.controller.resource_pool import ResourcePool, ResourcePoolManager, Role
from verl.controller.worker import DistInfo, Worker, instantiate_worker
from verl.controller.worker_group import WorkerGroup, registered_methods

__all__ = [
    "ClassWithInitArgs",
    "ColocatedWorker",
    "Dispatch",
    "DistInfo",
    "LocalWorkerGroup",
    "MethodDispatch",
    "ResourcePool",
    "ResourcePoolManager",
    "Role",
    "Worker",
    "WorkerGroup",
    "create_colocated_worker_cls",
    "instantiate_worker",
    "register",
    "registered_methods",
]
