"""``torch.distributed`` set-up shared by every multi-process path (Ray workers, tests).

``init_distributed(rank, world_size, master_addr, master_port)`` joins the default process
group with the backend that fits the device (``gloo`` on CPU, ``nccl`` when CUDA is used)
and a collective timeout, so a dead peer turns into an error instead of a hang. It is
idempotent for the same layout and refuses a different one.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_COLLECTIVE_TIMEOUT_S",
    "backend_for_device",
    "destroy_distributed",
    "find_free_port",
    "init_distributed",
    "is_distributed",
]

# Long enough for a slow rank to finish a generation phase on a CPU, short enough that a
# dead peer fails the run within minutes rather than never. Overridable per call and by
# VERL_COLLECTIVE_TIMEOUT_S.
DEFAULT_COLLECTIVE_TIMEOUT_S = 1800.0


def backend_for_device(device_type: str) -> str:
    """``"gloo"`` for CPU, ``"cpu:gloo,cuda:nccl"`` for CUDA (CPU collectives still work)."""
    if device_type == "cpu":
        return "gloo"
    if device_type == "cuda":
        return "cpu:gloo,cuda:nccl"
    raise ValueError(f"no torch.distributed backend known for device type {device_type!r}")


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (for a rendezvous address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def is_distributed() -> bool:
    """Whether the default process group exists (and so collectives are possible)."""
    return dist.is_available() and dist.is_initialized()


def init_distributed(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    device_type: str = "cpu",
    timeout_s: float | None = None,
    listen_fd: int | None = None,
) -> None:
    """Join the default process group (no-op if already joined with the same layout).

    Args:
        rank / world_size: this process's place.
        master_addr / master_port: rank 0's rendezvous address.
        device_type: ``"cpu"`` or ``"cuda"``; picks the backend.
        timeout_s: collective timeout (default ``VERL_COLLECTIVE_TIMEOUT_S`` or 1800 s).
        listen_fd: rank 0 only: a socket already bound to ``master_addr:master_port`` and
            listening. The rendezvous store then accepts connections there alone; without
            it torch's store listens on every interface of the machine.
    """
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this torch build")
    if dist.is_initialized():
        if dist.get_rank() != rank or dist.get_world_size() != world_size:
            raise RuntimeError(
                f"torch.distributed is already initialised as rank {dist.get_rank()} of "
                f"{dist.get_world_size()}; cannot join again as rank {rank} of {world_size}"
            )
        return
    if timeout_s is None:
        timeout_s = float(os.environ.get("VERL_COLLECTIVE_TIMEOUT_S", DEFAULT_COLLECTIVE_TIMEOUT_S))
    backend = backend_for_device(device_type)
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    timeout = datetime.timedelta(seconds=timeout_s)
    if world_size == 1:
        # nobody to meet: an in-memory store, so nothing listens on the network
        store: dist.Store = dist.HashStore()
    else:
        # the rendezvous store, hosted by rank 0 (what init_method="tcp://..." would build)
        store = dist.TCPStore(
            master_addr,
            master_port,
            world_size,
            is_master=rank == 0,
            timeout=timeout,
            master_listen_fd=listen_fd if rank == 0 else None,
        )
    dist.init_process_group(
        backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout
    )
    logger.info(
        "joined process group: rank %d of %d via %s:%d (%s, timeout %.0fs)",
        rank,
        world_size,
        master_addr,
        master_port,
        backend,
        timeout_s,
    )


def destroy_distributed() -> None:
    """Leave the default process group if this process joined one."""
    if is_distributed():
        dist.destroy_process_group()
