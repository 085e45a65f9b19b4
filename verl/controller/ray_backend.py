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
placement groups are ``verl.controller.ray_placement``.

This module imports Ray; ``verl.controller`` loads it only when a Ray name is first used.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import OutOfMemoryError, RayActorError, RayError, WorkerCrashedError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from verl.controller.ray_cluster import LOOPBACK, ensure_ray
from verl.controller.ray_failures import death_cause, node_death
from verl.controller.ray_heartbeat import HEARTBEAT_GROUP, Heartbeat
from verl.controller.ray_placement import PoolPlacement, acquire_placement, release_placement
from verl.controller.resource_pool import ResourcePool
from verl.controller.worker import DistInfo, Worker, instantiate_worker
from verl.controller.worker_group import (
    PendingOutputs,
    WorkerDiedError,
    WorkerGroup,
    WorkerStalledError,
)
from verl.protocol import DataProto

logger = logging.getLogger(__name__)

__all__ = ["RayOptions", "RayWorkerGroup", "ensure_ray"]

# The share of its bundle each actor claims. The placement group reserves the whole bundle;
# actors only need to be placed in it, and a small claim lets up to 100 groups (roles)
# share one bundle, which is what colocation by pool means.
_ACTOR_SHARE = 0.01

# After an ordinary error from one rank, how long to look for a dead rank among the others:
# a rank blocked in a collective with a rank that died fails with a connection error at
# about the moment the death is reported, and the death is the cause worth naming.
_DEATH_GRACE_S = 2.0

_DEATH_ERRORS = (RayActorError, WorkerCrashedError, OutOfMemoryError)

# How long shutdown waits for idle workers' ``Worker.close`` (an inference engine's own
# shutdown) before killing the actors anyway.
_CLOSE_GRACE_S = 15.0


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


# --------------------------------------------------------------------------- actor side


@ray.remote(max_restarts=0, max_task_retries=0, concurrency_groups={HEARTBEAT_GROUP: 1})
class _WorkerHost:
    """The Ray actor of one rank: sets up the process, then holds and calls the worker."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._worker: Worker | None = None
        # rank 0's bound rendezvous socket; kept open for the store that listens on it
        self._store_socket: socket.socket | None = None

    def __repr__(self) -> str:
        # Ray prefixes the actor's log lines with this: "(CriticWorker rank=1 pid=...)"
        return self._label

    def rendezvous(self, world_size: int) -> tuple[str, int]:
        """This node's IP and a port on it for rank 0 to host the rendezvous store.

        For a process group, the port is held: a socket bound to the node's IP (127.0.0.1
        on a local cluster) and listening, handed to the store in ``init_worker``, so the
        store listens on that address only (torch's own store listens on every interface).
        """
        from verl.utils.distributed import find_free_port

        node_ip = ray.util.get_node_ip_address()
        if world_size == 1:
            # nothing listens unless an engine builds its own group later: keep the port free
            return node_ip, find_free_port(node_ip)
        family = socket.AF_INET6 if ":" in node_ip else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.bind((node_ip, 0))
        listener.listen(socket.SOMAXCONN)
        self._store_socket = listener
        return node_ip, int(listener.getsockname()[1])

    def init_worker(
        self,
        worker_cls: type[Worker],
        info: DistInfo,
        args: tuple,
        kwargs: dict[str, Any],
        device_type: str,
        num_threads: int,
        collective_timeout_s: float | None,
    ) -> tuple[int, str]:
        """Set up the process (env, threads, logging, process group), then build the worker."""
        # Ray forwards the actor's stderr to the driver, prefixed with this actor's label;
        # without a handler the workers' log records would be dropped.
        logging.basicConfig(
            level=os.environ.get("VERL_WORKER_LOG_LEVEL", "INFO").upper(),
            format="%(levelname)s %(name)s: %(message)s",
        )
        os.environ.update(info.to_env())
        os.environ["OMP_NUM_THREADS"] = str(num_threads)
        os.environ["MKL_NUM_THREADS"] = str(num_threads)
        import torch

        torch.set_num_threads(num_threads)
        if info.world_size > 1:
            from verl.utils.distributed import init_distributed

            if info.master_addr == LOOPBACK and "GLOO_SOCKET_IFNAME" not in os.environ:
                # a local cluster: gloo's peer sockets on loopback too, not on the address
                # the host name resolves to
                loopback = [n for _, n in socket.if_nameindex() if n in ("lo", "lo0")]
                if loopback:
                    os.environ["GLOO_SOCKET_IFNAME"] = loopback[0]

            assert info.master_addr is not None and info.master_port is not None
            init_distributed(
                info.rank,
                info.world_size,
                info.master_addr,
                info.master_port,
                device_type=device_type,
                timeout_s=collective_timeout_s,
                listen_fd=self._store_socket.fileno() if self._store_socket else None,
            )
        self._worker = instantiate_worker(worker_cls, info, args, kwargs)
        # the IP alone does not tell apart nodes sharing a machine (or an address)
        node_id = ray.get_runtime_context().get_node_id()
        return os.getpid(), f"{ray.util.get_node_ip_address()} id {node_id[:12]}"

    @ray.method(concurrency_group=HEARTBEAT_GROUP)
    def heartbeat(self) -> int:
        """Answered from a thread of its own, also while ``execute`` runs: the process runs."""
        return os.getpid()

    @ray.method(concurrency_group=HEARTBEAT_GROUP)
    def request_stop(self, signum: int) -> None:
        """``Worker.request_stop`` from the heartbeat's thread, so it lands while ``execute``
        runs (a flag the running call polls; nothing else is touched)."""
        if self._worker is not None:
            self._worker.request_stop(signum)

    def close_worker(self) -> None:
        """``Worker.close`` before the actor is killed (releases engines, temporary files)."""
        if self._worker is not None:
            self._worker.close()

    def execute(self, target: tuple[str | None, str], /, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` (of colocated ``role``, when given) with the resolved arguments."""
        role, method = target
        if self._worker is None:
            raise RuntimeError(f"{self._label}: the worker was not constructed")
        if role is None:
            return getattr(self._worker, method)(*args, **kwargs)
        return self._worker.call_role(role, method, *args, **kwargs)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- driver side


@dataclass
class _Actors:
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


class _RayPending(PendingOutputs):
    """The per-rank ObjectRefs of one call; ``wait`` raises on the first failing rank."""

    def __init__(self, actors: _Actors, role: str, method: str, refs: list[Any]) -> None:
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
        self._actors = _Actors(worker_cls.__name__, resource_pool, placement)
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
        ((master_addr, master_port),) = _RayPending(
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
        started = _RayPending(actors, worker_cls.__name__, "__init__", refs).wait()
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

    def _start(self, method_name: str, calls: list[tuple[tuple, dict[str, Any]]]) -> _RayPending:
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
        refs = [
            handle.execute.remote(target, *args, **kwargs)
            for handle, (args, kwargs) in zip(self._actors.handles, calls, strict=True)
        ]
        self._actors.started(refs)
        return _RayPending(self._actors, self._label, method_name, refs)

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
        ``_CLOSE_GRACE_S``), kill the actors (of every role, for a colocated group) and
        release the pool.

        The pool's placement groups are removed once no other group uses them. Idempotent.
        """
        self._actors.shutdown()
