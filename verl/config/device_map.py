"""The device map: which devices each role runs on, resolved into resource pools.

The cluster's ``trainer.nnodes x trainer.n_gpus_per_node`` devices (GPUs, or processes on a
CPU machine) are numbered node by node. The ``resource_pool`` section gives each
model-holding worker group a list of device ids (null: every device for the actor, the
actor's for the others). Groups with the same list share one pool (colocated, one process
per device); disjoint lists get pools of their own; lists that partly overlap are refused.
A group's data-parallel size is the length of its list. See ``docs/distributed.md``.
"""

# `entry(...)` returns a dataclasses.Field (default_factory for mutables), which RUF009 cannot see.
# ruff: noqa: RUF009

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl.config._fields import entry
from verl.config.roles import GROUPS, group_devices_key

if TYPE_CHECKING:
    from verl.config.schema import TrainerConfig

# worker group -> the resource_pool key holding its devices, in placement order
ROLE_DEVICE_KEYS = {group: group_devices_key(group) for group in GROUPS}


@dataclass
class DataParallelConfig:
    """The ``resource_pool:`` section: device ids per role (see ``verl.config.device_map``)."""

    actor_devices: list[int] | None = entry(
        None, "device ids of the actor/rollout/reference worker; null = every device"
    )
    critic_devices: list[int] | None = entry(
        None, "device ids of the critic; null = the actor's (colocated)"
    )
    reward_model_devices: list[int] | None = entry(
        None, "device ids of the reward model; null = the actor's (colocated)"
    )


class DeviceMapError(ValueError):
    """A device map that cannot be placed; the message names the keys and the fix."""


@dataclass(frozen=True)
class DeviceMap:
    """Resolved placement: ``pools`` (``{pool name: device ids}``, in the order roles first
    name them) and ``roles`` (``{role: pool name}``)."""

    num_devices: int  # nnodes * devices_per_node
    devices_per_node: int  # trainer.n_gpus_per_node
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


def _role_lists(
    dp: DataParallelConfig, roles: list[str], num_devices: int
) -> dict[str, tuple[str, list[int]]]:
    actor = list(range(num_devices)) if dp.actor_devices is None else list(dp.actor_devices)
    lists = {role: (key := ROLE_DEVICE_KEYS[role], getattr(dp, key)) for role in roles}
    return {role: (key, actor if ids is None else list(ids)) for role, (key, ids) in lists.items()}


def device_map_problems(
    dp: DataParallelConfig, nnodes: int, devices_per_node: int, roles: list[str] | None = None
) -> list[tuple[tuple[str, ...], str]]:
    """Every problem of ``dp`` as ``(keys, message)``; empty when it can be placed."""
    roles = list(ROLE_DEVICE_KEYS) if roles is None else roles
    num = nnodes * devices_per_node
    cluster = (
        f"the cluster has {num} device(s) (trainer.nnodes={nnodes} x "
        f"trainer.n_gpus_per_node={devices_per_node}), ids 0..{num - 1}"
    )
    problems: list[tuple[tuple[str, ...], str]] = []
    lists = _role_lists(dp, roles, num)
    valid: dict[str, tuple[str, set[int]]] = {}
    for role, (key, ids) in lists.items():
        full = f"resource_pool.{key}"
        if not ids:
            problems.append(((full,), f"{full}=[]: a role needs at least one device"))
            continue
        bad_type = [d for d in ids if not isinstance(d, int) or isinstance(d, bool)]
        if bad_type:
            problems.append(((full,), f"{full}={ids}: device ids must be ints, got {bad_type}"))
            continue
        outside = sorted({d for d in ids if not 0 <= d < num})
        if outside:
            problems.append(
                (
                    (full, "trainer.nnodes", "trainer.n_gpus_per_node"),
                    f"{full}={ids}: device(s) {outside} do not exist; {cluster}",
                )
            )
            continue
        repeated = sorted({d for d in ids if ids.count(d) > 1})
        if repeated:
            problems.append(((full,), f"{full}={ids}: device(s) {repeated} listed twice"))
            continue
        valid[role] = (full, set(ids))
    items = list(valid.items())
    for i, (_, (key_a, a)) in enumerate(items):
        for _, (key_b, b) in items[i + 1 :]:
            shared = a & b
            if shared and a != b:
                problems.append(
                    (
                        (key_a, key_b),
                        f"{key_b}={sorted(b)} partly overlaps {key_a}={sorted(a)} (shared: "
                        f"{sorted(shared)}); give both the same list to colocate the roles, "
                        "or disjoint lists to place them apart",
                    )
                )
    return problems


def resolve_device_map(
    dp: DataParallelConfig, nnodes: int, devices_per_node: int, roles: list[str] | None = None
) -> DeviceMap:
    """Place ``roles`` (default: all three) on pools; raises :class:`DeviceMapError`."""
    roles = list(ROLE_DEVICE_KEYS) if roles is None else roles
    problems = device_map_problems(dp, nnodes, devices_per_node, roles)
    if problems:
        raise DeviceMapError("; ".join(message for _, message in problems))
    num = nnodes * devices_per_node
    pools: dict[str, tuple[int, ...]] = {}
    role_pool: dict[str, str] = {}
    for role, (_, ids) in _role_lists(dp, roles, num).items():
        key = tuple(sorted(ids))
        name = next((n for n, members in pools.items() if members == key), None)
        if name is None:
            name = "global_pool" if key == tuple(range(num)) else f"{role}_pool"
            pools[name] = key
        role_pool[role] = name
    return DeviceMap(num, devices_per_node, pools, role_pool)


def set_device_map(
    cfg: TrainerConfig | DataParallelConfig, dp: DataParallelConfig | None = None
) -> DeviceMap:
    """The short Python form of the ``resource_pool`` section: ``set_device_map(cfg, dp)``
    writes ``dp`` into ``cfg`` (growing a single node's ``n_gpus_per_node`` to the highest id
    named), ``set_device_map(cfg)`` resolves the config's own section, ``set_device_map(dp)``
    the lists alone on one node. Returns the :class:`DeviceMap`; raises
    :class:`DeviceMapError`."""
    if isinstance(cfg, DataParallelConfig):
        if dp is not None:
            raise TypeError("set_device_map(DataParallelConfig) takes no second argument")
        return resolve_device_map(cfg, 1, _devices_named(cfg) or 1)
    if dp is not None:
        cfg.resource_pool = dataclasses.replace(dp)
        t = cfg.trainer
        needed = _devices_named(dp)
        if t.nnodes == 1 and needed > t.n_gpus_per_node:
            t.n_gpus_per_node = needed
    t = cfg.trainer
    return resolve_device_map(cfg.resource_pool, t.nnodes, t.n_gpus_per_node)


def _devices_named(dp: DataParallelConfig) -> int:
    """1 + the highest device id any list names (0 when no list is given)."""
    lists = (getattr(dp, key) or [] for key in ROLE_DEVICE_KEYS.values())
    return max((d + 1 for ids in lists for d in ids if isinstance(d, int)), default=0)
