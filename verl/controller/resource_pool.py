"""Resource pools: the processes per node that one worker group runs on.

A ``ResourcePool`` describes a set of worker processes: ``process_on_nodes[i]`` processes
on node ``i``, one per device when ``use_gpu``. It is a description only; a backend (local,
Ray) turns it into processes.

Which role runs in which pool is not decided here: the one placement model is the device
map (``verl.config.device_map``: device ids per role, roles with the same ids colocated in
one pool), and ``verl.trainer.rl.placement`` builds one ``ResourcePool`` per pool of it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["ResourcePool"]


@dataclass
class ResourcePool:
    """``process_on_nodes[i]`` worker processes on node ``i``; ranks are numbered node by node."""

    process_on_nodes: list[int]
    use_gpu: bool = False
    name: str = "global_pool"
    # Backend-private state: the Ray backend keeps the pool's placement groups here, so every
    # worker group created over this same pool object lands on the same devices.
    backend_state: dict[str, Any] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self.process_on_nodes = list(self.process_on_nodes)
        if not self.process_on_nodes:
            raise ValueError(f"resource pool {self.name!r}: process_on_nodes is empty")
        for n in self.process_on_nodes:
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(
                    f"resource pool {self.name!r}: process_on_nodes={self.process_on_nodes} "
                    "must hold positive ints (processes per node)"
                )

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    @property
    def num_nodes(self) -> int:
        return len(self.process_on_nodes)

    def placement(self, rank: int) -> tuple[int, int]:
        """``(node_index, local_rank)`` of global ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank={rank} is outside [0, world_size={self.world_size})")
        for node, count in enumerate(self.process_on_nodes):
            if rank < count:
                return node, rank
            rank -= count
        raise AssertionError("unreachable")
