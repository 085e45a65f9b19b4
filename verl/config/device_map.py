"""The ``resource_pool`` section: which devices each worker group runs on.

Each model-holding worker group gets a list of device ids (null: every device for the actor,
the actor's for the others; ``teacher_devices`` only with ``algorithm.distill.teacher_pool=
separate``); ``verl.utils.device_pools`` checks the lists and groups them
into resource pools (same list: colocated; disjoint: apart; partly overlapping: refused).
See ``docs/distributed.md``.
"""

# `entry(...)` returns a dataclasses.Field (default_factory for mutables), which RUF009 cannot see.
# ruff: noqa: RUF009

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl.config._fields import entry
from verl.config.roles import GROUPS, group_devices_key
from verl.utils.device_pools import (
    DeviceLists,
    DeviceMap,
    DeviceMapError,  # noqa: F401 (re-exported)
    device_list_problems,
    place_device_lists,
)

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
    teacher_devices: list[int] | None = entry(
        None,
        "device ids of the distillation teacher with algorithm.distill.teacher_pool=separate; "
        "null = the actor's (a worker group of its own in the actor's processes)",
    )


def _role_lists(dp: DataParallelConfig, roles: list[str] | None, num: int) -> DeviceLists:
    actor = list(range(num)) if dp.actor_devices is None else list(dp.actor_devices)
    if roles is None:  # the teacher is a group only with teacher_pool=separate
        roles = [g for g in GROUPS if g != "teacher" or dp.teacher_devices is not None]
    lists = {role: (key := ROLE_DEVICE_KEYS[role], getattr(dp, key)) for role in roles}
    return {
        r: (f"resource_pool.{k}", actor if ids is None else list(ids))
        for r, (k, ids) in lists.items()
    }


def device_map_problems(
    dp: DataParallelConfig, nnodes: int, devices_per_node: int, roles: list[str] | None = None
) -> list[tuple[tuple[str, ...], str]]:
    """Every problem of ``dp`` as ``(keys, message)``; empty when it can be placed."""
    lists = _role_lists(dp, roles, nnodes * devices_per_node)
    return device_list_problems(lists, nnodes, devices_per_node)


def resolve_device_map(
    dp: DataParallelConfig, nnodes: int, devices_per_node: int, roles: list[str] | None = None
) -> DeviceMap:
    """Place ``roles`` (default: every group, the teacher when its list is given) on pools;
    raises :class:`DeviceMapError`."""
    lists = _role_lists(dp, roles, nnodes * devices_per_node)
    return place_device_lists(lists, nnodes, devices_per_node)


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
