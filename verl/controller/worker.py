"""Worker base class: one rank of a worker group, holding its place in the process layout.

A worker learns its rank either from the environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, as set by torchrun or by a Ray backend
for its actor process) or from the worker-group backend that creates it (``instantiate_worker``
injects a ``DistInfo`` before ``__init__`` runs, so several workers can live in one process).
It never initialises ``torch.distributed`` itself. The Ray backend joins the default process
group in the actor before constructing a worker of a group with ``world_size > 1``;
otherwise the engines do it, using these values (``init_distributed`` is idempotent).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

__all__ = ["DistInfo", "Worker", "instantiate_worker"]

_INFO_ATTR = "_verl_dist_info"
_STOP_ATTR = "_verl_stop_signum"


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


@dataclass(frozen=True)
class DistInfo:
    """Where one worker sits: global ``rank`` of ``world_size``, ``local_rank`` on its node.

    ``master_addr``/``master_port`` are the rendezvous point for ``torch.distributed``;
    ``None`` when there is none (single process, or the local backend).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size={self.world_size} must be >= 1")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank={self.rank} is outside [0, world_size={self.world_size})")
        if self.local_rank < 0 or self.local_rank > self.rank:
            raise ValueError(f"local_rank={self.local_rank} must be in [0, rank={self.rank}]")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DistInfo:
        """Read ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT``.

        Missing variables mean a single process: rank 0 of 1.
        """
        env = os.environ if env is None else env
        port = env.get("MASTER_PORT")
        return cls(
            rank=_env_int(env, "RANK", 0),
            world_size=_env_int(env, "WORLD_SIZE", 1),
            local_rank=_env_int(env, "LOCAL_RANK", 0),
            master_addr=env.get("MASTER_ADDR") or None,
            master_port=_env_int(env, "MASTER_PORT", 0) if port else None,
        )

    def to_env(self) -> dict[str, str]:
        """The environment variables that make ``from_env`` return this info (for spawning)."""
        env = {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
        }
        if self.master_addr is not None:
            env["MASTER_ADDR"] = self.master_addr
        if self.master_port is not None:
            env["MASTER_PORT"] = str(self.master_port)
        return env


class Worker:
    """Base class of every role worker (actor/rollout/ref, critic, reward model).

    Subclasses call ``super().__init__()`` and mark the methods the driver may call with
    ``@register(dispatch_mode=...)``. Explicit keyword arguments win over an info injected
    by the worker-group backend, which wins over the environment.
    """

    def __init__(
        self,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        master_addr: str | None = None,
        master_port: int | None = None,
    ) -> None:
        base = self.__dict__.get(_INFO_ATTR) or DistInfo.from_env()
        overrides = {
            "rank": rank,
            "world_size": world_size,
            "local_rank": local_rank,
            "master_addr": master_addr,
            "master_port": master_port,
        }
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if overrides:
            if "rank" in overrides and "local_rank" not in overrides:
                # a single-node default that stays valid for the explicit rank
                overrides["local_rank"] = overrides["rank"]
            base = replace(base, **overrides)
        setattr(self, _INFO_ATTR, base)

    @property
    def dist_info(self) -> DistInfo:
        info = self.__dict__.get(_INFO_ATTR)
        if info is None:
            raise RuntimeError(
                f"{type(self).__name__}.__init__ did not call super().__init__() and the worker "
                "was not created by a worker group"
            )
        return info

    @property
    def rank(self) -> int:
        return self.dist_info.rank

    @property
    def world_size(self) -> int:
        return self.dist_info.world_size

    @property
    def local_rank(self) -> int:
        return self.dist_info.local_rank

    @property
    def master_addr(self) -> str | None:
        return self.dist_info.master_addr

    @property
    def master_port(self) -> int | None:
        return self.dist_info.master_port

    def request_stop(self, signum: int) -> None:
        """Ask this worker's long-running call (a training loop) to stop at its next stopping
        point. ``WorkerGroup.request_stop`` delivers it, also while a call runs."""
        self.__dict__.setdefault(_STOP_ATTR, signum)

    def close(self) -> None:
        """Release what the worker holds outside its process's memory (an inference engine,
        temporary files). Its group's ``shutdown`` calls it once, before a remote backend
        kills the process; no-op by default."""
        return None

    @property
    def stop_signum(self) -> int | None:
        """The signal number of the first stop request, or None: a loop polls this."""
        return self.__dict__.get(_STOP_ATTR)


W = TypeVar("W", bound=Worker)


def instantiate_worker(
    worker_cls: type[W], info: DistInfo, args: tuple = (), kwargs: Mapping[str, Any] | None = None
) -> W:
    """Create ``worker_cls(*args, **kwargs)`` that reports ``info`` as its rank layout.

    The info is set before ``__init__`` runs, so the subclass can use ``self.rank`` in its
    constructor and ``super().__init__()`` picks it up instead of the environment.
    """
    if not (isinstance(worker_cls, type) and issubclass(worker_cls, Worker)):
        raise TypeError(f"{worker_cls!r} is not a subclass of verl.controller.Worker")
    worker = worker_cls.__new__(worker_cls)
    setattr(worker, _INFO_ATTR, info)
    worker.__init__(*args, **dict(kwargs or {}))
    return worker
