"""Ray backend: one Ray actor per rank, placed with placement groups built from a ResourcePool.

``RayWorkerGroup(worker_cls, resource_pool, *args, **kwargs)`` has the shape of
``LocalWorkerGroup`` but runs each rank's ``worker_cls(*args, **kwargs)`` in its own Ray
actor process, so ranks compute in parallel, join a real ``torch.distributed`` group and can
live on other machines. Creating a group:

1. Placement: one placement group per node of the pool (``STRICT_PACK``), one bundle per
   process (``{"CPU": num_cpus_per_worker}``, plus ``{"GPU": 1}`` when ``use_gpu``). Rank
   ``r`` goes to bundle ``local_rank`` of its node's group (``ResourcePool.placement``).
   The placement groups are cached on the pool object: groups created over the *same*
   ``ResourcePool`` share them, i.e. they run on the same devices (colocation by pool).
   Each actor claims only a small slice of its bundle, so several groups fit in one bundle;
   the bundle itself is what is reserved. They are removed when the last group using them
   shuts down.
2. Rendezvous: every actor starts at once; rank 0's reports its node IP and a port on it,
   which it holds (a bound, listening socket) for the ``torch.distributed`` store, so the
   store listens on that address only (127.0.0.1 on a local cluster).
3. Set-up, on every rank at once: ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/
   ``MASTER_PORT`` and ``OMP_NUM_THREADS`` in the environment, ``torch.set_num_threads``,
   and, when ``world_size > 1``, ``init_distributed`` (gloo on CPU, nccl on CUDA) *before*
   the worker is constructed, so its ``__init__`` may already use collectives.

Colocating several roles in one process per rank: build one group over
``create_colocated_worker_cls({...})`` and ``spawn()`` it; each role's group calls its
methods through ``ColocatedWorker.call_role`` on the shared actors.

Calls never wait blindly: the driver waits on every rank's result with ``ray.wait`` and
raises on the first failure, so a rank that died (killed, out of memory) surfaces within
seconds as ``WorkerDiedError`` naming the role, rank and cause, even while the other ranks
are stuck in a collective with it. A rank whose process is alive but does not run (SIGSTOP,
frozen) is found by a heartbeat (``verl.controller.ray_heartbeat``, answered by a second
thread of each actor) and surfaces as ``WorkerStalledError`` after
``RayOptions.heartbeat_timeout_s``. ``shutdown()`` kills the actors.

Starting or joining the cluster is ``verl.controller.ray_cluster`` (``ensure_ray``);
placement groups are ``verl.controller.ray_placement``; the actor of one rank is
``verl.controller.ray_actor``; the driver's view of the actors and of the calls running on
them (waits, deaths, stalls, shutdown) is ``verl.controller.ray_calls``.

This module imports Ray; ``verl.controller`` loads it only when a Ray name is first used.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from verl.controller.ray_actor import _WorkerHost
from verl.controller.ray_calls import RayActors, RayPending
from verl.controller.ray_cluster import ensure_ray
from verl.controller.ray_heartbeat import Heartbeat
from verl.controller.ray_placement import acquire_placement
from verl.controller.resource_pool import ResourcePool
from verl.controller.worker import DistInfo, Worker
from verl.controller.worker_group import WorkerGroup
from verl.protocol import DataProto

logger = logging.getLogger(__name__)

__all__ = ["RayOptions", "RayWorkerGroup", "ensure_ray"]

# The share of its bundle each actor claims. The placement group reserves the whole bundle;
# actors only need to be placed in it, and a small claim lets up to 100 groups (roles)
# share one bundle, which is what colocation by pool means.
_ACTOR_SHARE = 0.01


@dataclass(frozen=True)
class RayOptions:
    """How a ``RayWorkerGroup`` places and sets up its actors.

    Passed as ``RayWorkerGroup(..., ray_options=RayOptions(...))`` so that these names never
    collide with the worker's own keyword arguments.

    Attributes:
        device_type: ``"cpu"`` or ``"cuda"``: the ``torch.distributed`` backend (gloo /
            nccl). Default: ``"cuda"`` when the pool has ``use_gpu``, else ``"cpu"``.
        num_cpus_per_worker: CPUs in each process's bundle; also its ``OMP_NUM_THREADS``
            and ``torch.set_num_threads``. Groups sharing a pool must agree on it.
        collective_timeout_s: ``torch.distributed`` collective timeout (default
            ``VERL_COLLECTIVE_TIMEOUT_S`` or 1800 s).
        placement_timeout_s: how long to wait for the cluster to grant the placement
            groups before failing with the resources it lacks.
        runtime_env: per-actor Ray runtime environment (e.g. extra ``env_vars``).
        heartbeat_timeout_s: while the driver waits on a call, a rank whose process does not
            answer a heartbeat for this long (stopped, frozen) fails the call with
            ``WorkerStalledError``; None turns the heartbeat off.
    """

    device_type: str | None = None
    num_cpus_per_worker: int = 1
    collective_timeout_s: float | None = None
    placement_timeout_s: float = 120.0
    runtime_env: dict[str, Any] | None = None
    heartbeat_timeout_s: float | None = 60.0

    def __post_init__(self) -> None:
        if self.device_type not in (None, "cpu", "cuda"):
            raise ValueError(f"device_type={self.device_type!r}; expected 'cpu' or 'cuda'")
        if not isinstance(self.num_cpus_per_worker, int) or self.num_cpus_per_worker < 1:
            raise ValueError(
                f"num_cpus_per_worker={self.num_cpus_per_worker!r} must be an int >= 1"
            )
        if self.placement_timeout_s <= 0:
            raise ValueError(f"placement_timeout_s={self.placement_timeout_s} must be > 0")
        if self.heartbeat_timeout_s is not None and not self.heartbeat_timeout_s > 0:
            raise ValueError(
                f"heartbeat_timeout_s={self.heartbeat_timeout_s!r} must be > 0 seconds, or None "
                "to turn the heartbeat off"
            )


class RayWorkerGroup(WorkerGroup):
    """``resource_pool.world_size`` Ray actors of ``worker_cls``, one per rank.

    ``RayWorkerGroup(worker_cls, resource_pool, *args, ray_options=None, **kwargs)``: every
    rank runs ``worker_cls(*args, **kwargs)`` in its own actor (arguments are pickled, so
    they must be picklable; a module-level worker class is imported by the actor, a class
    defined in ``__main__`` is shipped by value). Starts a local Ray cluster through
    ``ensure_ray`` when Ray is not initialised yet.
    """

    def __init__(
        self,
        worker_cls: type[Worker],
        resource_pool: ResourcePool,
        *args: Any,
        ray_options: RayOptions | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(resource_pool, ResourcePool):
            raise TypeError(
                f"resource_pool must be a ResourcePool, got {type(resource_pool).__name__} "
                "(e.g. ResourcePool(process_on_nodes=[2]))"
            )
        super().__init__(worker_cls, resource_pool.world_size)
        opts = ray_options or RayOptions()
        if not isinstance(opts, RayOptions):
            raise TypeError(f"ray_options must be a RayOptions, got {type(opts).__name__}")
        device_type = opts.device_type or ("cuda" if resource_pool.use_gpu else "cpu")
        if device_type == "cuda" and not resource_pool.use_gpu:
            raise ValueError(
                f"device_type='cuda' needs GPUs, but resource pool {resource_pool.name!r} has "
                "use_gpu=False (set use_gpu=True on the pool, or device_type='cpu')"
            )
        self._options = opts
        self._device_type = device_type
        self._resource_pool = resource_pool

        if not ray.is_initialized():
            ensure_ray(
                num_cpus=max(
                    os.cpu_count() or 1, resource_pool.world_size * opts.num_cpus_per_worker
                )
            )
        bundle: dict[str, float] = {"CPU": float(opts.num_cpus_per_worker)}
        if resource_pool.use_gpu:
            bundle["GPU"] = 1.0
        start = time.monotonic()
        placement = acquire_placement(resource_pool, bundle, opts.placement_timeout_s)
        self._actors = RayActors(worker_cls.__name__, resource_pool, placement)
        try:
            self._create_actors(worker_cls, args, kwargs)
        except BaseException:
            self._actors.shutdown()
            raise
        logger.info(
            "started %d %s actor(s) in pool %r (%s) in %.1fs",
            self.world_size,
            worker_cls.__name__,
            resource_pool.name,
            device_type,
            time.monotonic() - start,
        )

    def _create_actors(self, worker_cls: type[Worker], args: tuple, kwargs: dict) -> None:
        pool, opts, actors = self._resource_pool, self._options, self._actors
        assert actors.placement is not None
        for rank in range(pool.world_size):
            node, local_rank = pool.placement(rank)
            options: dict[str, Any] = {
                "num_cpus": _ACTOR_SHARE * opts.num_cpus_per_worker,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=actors.placement.groups[node],
                    placement_group_bundle_index=local_rank,
                ),
            }
            if pool.use_gpu:
                options["num_gpus"] = _ACTOR_SHARE
            if opts.runtime_env is not None:
                options["runtime_env"] = opts.runtime_env
            label = f"{worker_cls.__name__} rank={rank}"
            actors.handles.append(_WorkerHost.options(**options).remote(label))
        actors.pids = [None] * pool.world_size
        if opts.heartbeat_timeout_s is not None:
            actors.heartbeat = Heartbeat(actors.handles, opts.heartbeat_timeout_s)
        actors.nodes = [None] * pool.world_size

        # rank 0 hosts the rendezvous (also for world_size 1: an engine may still want one)
        rendezvous = [actors.handles[0].rendezvous.remote(pool.world_size)]
        ((master_addr, master_port),) = RayPending(
            actors, worker_cls.__name__, "rendezvous", rendezvous
        ).wait()
        refs = []
        for rank, handle in enumerate(actors.handles):
            _, local_rank = pool.placement(rank)
            info = DistInfo(
                rank=rank,
                world_size=pool.world_size,
                local_rank=local_rank,
                master_addr=master_addr,
                master_port=master_port,
            )
            refs.append(
                handle.init_worker.remote(
                    worker_cls,
                    info,
                    args,
                    kwargs,
                    self._device_type,
                    opts.num_cpus_per_worker,
                    opts.collective_timeout_s,
                )
            )
        started = RayPending(actors, worker_cls.__name__, "__init__", refs).wait()
        actors.pids = [pid for pid, _ in started]
        actors.nodes = [node for _, node in started]

    # ------------------------------------------------------------------ WorkerGroup API

    @property
    def resource_pool(self) -> ResourcePool:
        return self._resource_pool

    @property
    def actor_handles(self) -> list[Any]:
        """The Ray actor handles in rank order (shared with the ``spawn()`` role groups)."""
        return list(self._actors.handles)

    @property
    def pids(self) -> list[int | None]:
        """The process id of each rank's actor."""
        return list(self._actors.pids)

    @property
    def nodes(self) -> list[str | None]:
        """Each rank's node: ``"<ip> id <first 12 hex digits of the Ray node id>"``."""
        return list(self._actors.nodes)

    @property
    def _label(self) -> str:
        if self._role is None:
            return self._actors.label
        return f"{self._role} ({self._target_cls.__name__})"

    def _start(self, method_name: str, calls: list[tuple[tuple, dict[str, Any]]]) -> RayPending:
        if self._actors.closed:
            raise RuntimeError(f"the {self._label} worker group was shut down")
        dead = self._actors.dead
        if dead is not None:
            raise type(dead)(
                dead.role,
                dead.rank,
                f"{dead.cause} [the group cannot run {method_name!r} any more: create a new one]",
                method=dead.method,
            )
        shared = len(calls) > 1 and all(c is calls[0] for c in calls)
        if shared:
            # ONE_TO_ALL: serialize each batch once, not once per rank
            args, kwargs = calls[0]
            args = tuple(ray.put(a) if isinstance(a, DataProto) else a for a in args)
            kwargs = {k: ray.put(v) if isinstance(v, DataProto) else v for k, v in kwargs.items()}
            calls = [(args, kwargs)] * len(calls)
        target = (self._role, method_name)
        spec = self._methods.get(method_name)
        beside = spec is not None and spec.beside  # on the actor's second thread
        refs = [
            (handle.execute_beside if beside else handle.execute).remote(target, *args, **kwargs)
            for handle, (args, kwargs) in zip(self._actors.handles, calls, strict=True)
        ]
        if not beside:  # a quick read beside a call does not make the worker busy
            self._actors.started(refs)
        return RayPending(self._actors, self._label, method_name, refs)

    def _execute(self, method_name: str, calls: list[tuple[tuple, dict[str, Any]]]) -> list[Any]:
        return self._start(method_name, calls).wait()

    def _role_view(self, role: str) -> RayWorkerGroup:
        view = RayWorkerGroup.__new__(RayWorkerGroup)
        WorkerGroup.__init__(view, self._worker_cls, self._world_size, role=role)
        view._options = self._options
        view._device_type = self._device_type
        view._resource_pool = self._resource_pool
        view._actors = self._actors
        return view

    def request_stop(self, signum: int) -> None:
        if self._actors.closed:
            return
        # not waited for: a dead rank's error is collected quietly at shutdown
        self._actors.abandoned.extend(h.request_stop.remote(signum) for h in self._actors.handles)

    def shutdown(self) -> None:
        """Close the workers (``Worker.close``, when no call runs and none died; at most
        ``_CLOSE_GRACE_S`` of ``verl.controller.ray_calls``), kill the actors (of every
        role, for a colocated group) and release the pool.

        The pool's placement groups are removed once no other group uses them. Idempotent.
        """
        self._actors.shutdown()
