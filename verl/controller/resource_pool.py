"""Resource pools (processes per node) and the mapping from roles to pools (device map).

A ``ResourcePool`` describes a set of worker processes: ``process_on_nodes[i]`` processes
on node ``i``, one per device when ``use_gpu``. Roles that map to the same pool share its
processes (colocated workers, e.g. actor and critic taking turns on the same devices).
These are descriptions only; a backend (local, Ray) turns them into processes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["ResourcePool", "ResourcePoolManager", "Role"]


class Role(Enum):
    """The worker roles the trainer knows how to place."""

    ActorRollout = "actor_rollout"
    ActorRolloutRef = "actor_rollout_ref"
    Critic = "critic"
    RefPolicy = "ref"
    RewardModel = "reward_model"

    @classmethod
    def parse(cls, value: Role | str) -> Role:
        """Accept a ``Role``, its value (``"critic"``) or its name (``"Critic"``)."""
        if isinstance(value, Role):
            return value
        for role in cls:
            if value in (role.value, role.name):
                return role
        raise ValueError(
            f"unknown role {value!r}; known roles: {[r.value for r in cls]} "
            f"(or their names {[r.name for r in cls]})"
        )


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


@dataclass
class ResourcePoolManager:
    """Pools by name and the pool each role runs in.

    ``resource_pool_spec``: ``{pool_name: [procs_per_node, ...]}``.
    ``mapping``: ``{role: pool_name}``; roles may be ``Role`` members or their string names.
    """

    resource_pool_spec: Mapping[str, Sequence[int]]
    mapping: Mapping[Role | str, str]
    use_gpu: bool = False
    _pools: dict[str, ResourcePool] = field(init=False, repr=False)
    _roles: dict[Role, str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.resource_pool_spec:
            raise ValueError("resource_pool_spec is empty; define at least one pool")
        self._pools = {}
        for name, procs in self.resource_pool_spec.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"resource pool names must be non-empty str, got {name!r}")
            if isinstance(procs, int):
                raise ValueError(
                    f"resource pool {name!r}: give a list of processes per node, e.g. [{procs}]"
                )
            self._pools[name] = ResourcePool(list(procs), use_gpu=self.use_gpu, name=name)
        self._roles = {}
        for key, pool in self.mapping.items():
            role = Role.parse(key)
            if role in self._roles:
                raise ValueError(
                    f"role {role.value!r} is mapped twice (to {self._roles[role]!r} and {pool!r})"
                )
            if pool not in self._pools:
                raise ValueError(
                    f"role {role.value!r} maps to unknown resource pool {pool!r}; "
                    f"defined pools: {sorted(self._pools)}"
                )
            self._roles[role] = pool
        if Role.ActorRollout in self._roles and Role.ActorRolloutRef in self._roles:
            raise ValueError(
                "map either actor_rollout or actor_rollout_ref, not both: both hold the actor"
            )
        unused = sorted(set(self._pools) - set(self._roles.values()))
        if unused:
            logger.warning("resource pool(s) %s have no role mapped to them", unused)

    @property
    def pools(self) -> dict[str, ResourcePool]:
        return dict(self._pools)

    @property
    def roles(self) -> dict[Role, str]:
        return dict(self._roles)

    def get_resource_pool(self, role: Role | str) -> ResourcePool:
        """The pool ``role`` runs in."""
        role = Role.parse(role)
        if role not in self._roles:
            raise KeyError(
                f"role {role.value!r} is not mapped to a resource pool; mapped roles: "
                f"{[r.value for r in self._roles]}"
            )
        return self._pools[self._roles[role]]

    def roles_in_pool(self, pool_name: str) -> list[Role]:
        """Roles colocated in pool ``pool_name``, in mapping order."""
        if pool_name not in self._pools:
            raise KeyError(f"no resource pool {pool_name!r}; defined pools: {sorted(self._pools)}")
        return [r for r, p in self._roles.items() if p == pool_name]

    @property
    def total_processes(self) -> int:
        return sum(p.world_size for p in self._pools.values())
