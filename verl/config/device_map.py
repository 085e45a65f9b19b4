"""The device map: which devices each role runs on, resolved into resource pools.

A cluster has ``trainer.nnodes x trainer.n_gpus_per_node`` devices (GPUs, or worker
processes on a CPU machine), numbered node by node: node 0 holds ids
``0 .. n_gpus_per_node - 1``, node 1 the next ``n_gpus_per_node``, and so on. The
``resource_pool`` section (:class:`DataParallelConfig`) gives each model-holding role a list
of device ids:

- ``actor_devices``: the hybrid actor / rollout / reference worker (null = every device);
- ``critic_devices``, ``reward_model_devices``: null = the actor's devices.

Roles with the *same* list share one pool: one process per device holds all of them
(colocated, taking turns on the device). Roles with *disjoint* lists get pools of their
own and can run at the same time. Lists that partly overlap are refused, because a device
would hold two processes that each believe they own it. A role's data-parallel size is
the length of its list.

``resolve_device_map(cfg)`` turns a config into a :class:`DeviceMap`; the trainer builds
one resource pool per entry of ``DeviceMap.pools``. ``set_device_map`` (also exported as
``verl.utils.set_device_map``) is the short Python form.
"""

# `entry(...)` returns a dataclasses.Field (default_factory for mutables), which RUF009 cannot see.
# ruff: noqa: RUF009

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl.config._fields import entry
from verl.config.roles import GROUPS, group_devices_key

if TYPE_CHECKING:
    from verl.config.schema import TrainerConfig

__all__ = [
    "ROLE_DEVICE_KEYS",
    "DataParallelConfig",
    "DeviceMap",
    "DeviceMapError",
    "device_map_problems",
    "resolve_device_map",
    "set_device_map",
]

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
    """Resolved placement: pools of device ids and the pool of each role.

    Attributes:
        num_devices: devices in the cluster (``nnodes * devices_per_node``).
        devices_per_node: ``trainer.n_gpus_per_node``.
        pools: ``{pool_name: device ids}``, in the order roles first name them.
        roles: ``{role: pool_name}`` for the roles given to :func:`resolve_device_map`.
    """

    num_devices: int
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
        counts: dict[int, int] = {}
        for device in self.pools[pool]:
            node = device // self.devices_per_node
            counts[node] = counts.get(node, 0) + 1
        return [counts[node] for node in sorted(counts)]

    @property
    def processes(self) -> int:
        """Worker processes over all pools."""
        return sum(len(ids) for ids in self.pools.values())


def _role_lists(
    dp: DataParallelConfig, roles: list[str], num_devices: int
) -> dict[str, tuple[str, list[int]]]:
    actor = dp.actor_devices
    actor_ids = list(range(num_devices)) if actor is None else list(actor)
    out = {}
    for role in roles:
        key = ROLE_DEVICE_KEYS[role]
        ids = getattr(dp, key)
        out[role] = (key, actor_ids if ids is None else list(ids))
    return out


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
    """The short Python form of the ``resource_pool`` section.

    ``set_device_map(trainer_config, DataParallelConfig(actor_devices=[0, 1],
    critic_devices=[2]))`` writes the device lists into ``trainer_config.resource_pool``,
    grows ``trainer.n_gpus_per_node`` (single node) when the lists name more devices than
    the cluster has, and returns the resolved :class:`DeviceMap`.
    ``set_device_map(trainer_config)`` resolves the config's own section, and
    ``set_device_map(DataParallelConfig(...))`` resolves the lists alone on one node with
    as many devices as the highest id needs. Raises :class:`DeviceMapError`.
    """
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
    ids = [
        d
        for key in ROLE_DEVICE_KEYS.values()
        for d in (getattr(dp, key) or [])
        if isinstance(d, int)
    ]
    return max(ids) + 1 if ids else 0
