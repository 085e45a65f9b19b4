"""Device pools: each worker group's list of device ids, checked and grouped into pools.

The cluster's ``nnodes x devices_per_node`` devices (GPUs, or processes on a CPU machine)
are numbered node by node. Groups with the same list share one pool (colocated, one process
per device); disjoint lists get pools of their own; lists that partly overlap are refused,
because a device would hold two processes that each believe they own it. The lists come as
``{group: (config key, device ids)}`` (``verl.config.device_map`` builds them from the
``resource_pool`` section) and every message names the key, the value and the fix.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass

DeviceLists = Mapping[str, tuple[str, list[int]]]


class DeviceMapError(ValueError):
    """A device map that cannot be placed; the message names the keys and the fix."""


@dataclass(frozen=True)
class DeviceMap:
    """Resolved placement: ``pools`` (``{pool name: device ids}``, in the order groups first
    name them) and ``roles`` (``{group: pool name}``)."""

    num_devices: int  # nnodes * devices_per_node
    devices_per_node: int
    pools: dict[str, tuple[int, ...]]
    roles: dict[str, str]

    def devices(self, role: str) -> tuple[int, ...]:
        """Device ids ``role`` runs on."""
        return self.pools[self.roles[role]]

    def dp_size(self, role: str) -> int:
        """Data-parallel ranks of ``role`` (one per device)."""
        return len(self.devices(role))

    def roles_in_pool(self, pool: str) -> list[str]:
        """Roles colocated in ``pool``, in placement order."""
        return [role for role, name in self.roles.items() if name == pool]

    def processes_per_node(self, pool: str) -> list[int]:
        """Processes of ``pool`` on each node it uses (nodes without any are left out)."""
        counts = collections.Counter(d // self.devices_per_node for d in self.pools[pool])
        return [counts[node] for node in sorted(counts)]

    @property
    def processes(self) -> int:
        """Worker processes over all pools."""
        return sum(len(ids) for ids in self.pools.values())


def device_list_problems(
    lists: DeviceLists, nnodes: int, devices_per_node: int
) -> list[tuple[tuple[str, ...], str]]:
    """Every problem of ``lists`` as ``(keys, message)``; empty when they can be placed."""
    num = nnodes * devices_per_node
    cluster = (
        f"the cluster has {num} device(s) (trainer.nnodes={nnodes} x "
        f"trainer.n_gpus_per_node={devices_per_node}), ids 0..{num - 1}"
    )
    problems: list[tuple[tuple[str, ...], str]] = []
    valid: list[tuple[str, set[int]]] = []
    for key, ids in lists.values():
        bad_type = [d for d in ids if not isinstance(d, int) or isinstance(d, bool)]
        outside = [] if bad_type else sorted({d for d in ids if not 0 <= d < num})
        repeated = sorted({d for d in ids if ids.count(d) > 1})
        if not ids:
            problems.append(((key,), f"{key}=[]: a role needs at least one device"))
        elif bad_type:
            problems.append(((key,), f"{key}={ids}: device ids must be ints, got {bad_type}"))
        elif outside:
            message = f"{key}={ids}: device(s) {outside} do not exist; {cluster}"
            problems.append(((key, "trainer.nnodes", "trainer.n_gpus_per_node"), message))
        elif repeated:
            problems.append(((key,), f"{key}={ids}: device(s) {repeated} listed twice"))
        else:
            valid.append((key, set(ids)))
    for i, (key_a, a) in enumerate(valid):
        for key_b, b in valid[i + 1 :]:
            if a & b and a != b:
                message = (
                    f"{key_b}={sorted(b)} partly overlaps {key_a}={sorted(a)} (shared: "
                    f"{sorted(a & b)}); give both the same list to colocate the roles, "
                    "or disjoint lists to place them apart"
                )
                problems.append(((key_a, key_b), message))
    return problems


def place_device_lists(lists: DeviceLists, nnodes: int, devices_per_node: int) -> DeviceMap:
    """Group ``lists`` into pools; raises :class:`DeviceMapError` naming every problem."""
    problems = device_list_problems(lists, nnodes, devices_per_node)
    if problems:
        raise DeviceMapError("; ".join(message for _, message in problems))
    num = nnodes * devices_per_node
    pools: dict[str, tuple[int, ...]] = {}
    role_pool: dict[str, str] = {}
    for role, (_, ids) in lists.items():
        members = tuple(sorted(ids))
        name = next((n for n, pool in pools.items() if pool == members), None)
        if name is None:
            name = "global_pool" if members == tuple(range(num)) else f"{role}_pool"
            pools[name] = members
        role_pool[role] = name
    return DeviceMap(num, devices_per_node, pools, role_pool)
