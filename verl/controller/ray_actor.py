"""The Ray actor of one rank of a ``RayWorkerGroup`` (``verl.controller.ray_backend``).

Contract: ``_WorkerHost.options(...).remote(label)`` starts an empty actor (its ``repr``,
``label``, prefixes its log lines). ``rendezvous(world_size)`` (rank 0 only) returns this
node's IP and a port held open for the ``torch.distributed`` store; ``init_worker(...)``
sets up the process (environment, threads, logging, the process group when
``world_size > 1``) and then builds the worker, returning ``(pid, node)``; ``execute``
calls a worker method (of a colocated role when given). ``heartbeat`` and ``request_stop``
run on a thread of their own (``HEARTBEAT_GROUP``), so they are answered while ``execute``
runs; ``execute_beside`` calls a worker method on a thread of its own too
(``BESIDE_GROUP``: ``register(..., beside=True)`` methods, answered while ``execute`` runs);
``close_worker`` calls ``Worker.close``. The actor never restarts and never retries
a task: a dead rank is reported, not replaced.

This module imports Ray.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import ray

from verl.controller.ray_cluster import LOOPBACK
from verl.controller.ray_heartbeat import HEARTBEAT_GROUP
from verl.controller.worker import DistInfo, Worker, instantiate_worker

__all__ = ["BESIDE_GROUP", "_WorkerHost"]

# the actor's concurrency group of ``register(..., beside=True)`` methods: one thread beside
# the default group's worker calls (which stay one after another)
BESIDE_GROUP = "beside"


# The class keeps its underscore name: Ray shows it in actor listings and death messages.
@ray.remote(
    max_restarts=0,
    max_task_retries=0,
    concurrency_groups={HEARTBEAT_GROUP: 1, BESIDE_GROUP: 1},
)
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

    @ray.method(concurrency_group=BESIDE_GROUP)
    def execute_beside(self, target: tuple[str | None, str], /, *args: Any, **kwargs: Any) -> Any:
        """``execute`` on the ``BESIDE_GROUP`` thread, while a call of the default group runs."""
        return self.execute(target, *args, **kwargs)

    def execute(self, target: tuple[str | None, str], /, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` (of colocated ``role``, when given) with the resolved arguments."""
        role, method = target
        if self._worker is None:
            raise RuntimeError(f"{self._label}: the worker was not constructed")
        if role is None:
            return getattr(self._worker, method)(*args, **kwargs)
        return self._worker.call_role(role, method, *args, **kwargs)  # type: ignore[attr-defined]
