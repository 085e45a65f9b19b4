"""The roles of an RL run, named once: ``actor``, ``critic``, ``reference``, ``reward`` (as
users and logs name them), the worker group holding each (``actor_rollout_ref``, ``critic``,
``reward_model``: also its config section and ``resource_pool`` key prefix), and whether it
is trained. Other modules derive their tables from this one instead of spelling it again.

The distillation teacher on a pool of its own (``algorithm.distill.teacher_pool=separate``)
is a worker group (``teacher``, devices ``resource_pool.teacher_devices``) but no role of the
precision and checkpoint tables: its precision is ``algorithm.distill.teacher_precision`` and
it is never trained or saved.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GROUPS", "ROLES", "TRAINABLE_ROLES", "RoleSpec", "group_devices_key", "role_of_group"]


@dataclass(frozen=True)
class RoleSpec:
    """One role; ``section`` holds its own keys (``<section>.precision``)."""

    name: str
    group: str
    devices_key: str
    trainable: bool
    section: str


_SPECS = (
    RoleSpec("actor", "actor_rollout_ref", "actor_devices", True, "actor_rollout_ref.actor"),
    RoleSpec("critic", "critic", "critic_devices", True, "critic"),
    RoleSpec("reference", "actor_rollout_ref", "actor_devices", False, "actor_rollout_ref.ref"),
    RoleSpec("reward", "reward_model", "reward_model_devices", False, "reward_model"),
)

# worker groups that hold no role of the tables above: group -> its resource_pool key
_GROUP_ONLY = {"teacher": "teacher_devices"}

ROLES: dict[str, RoleSpec] = {spec.name: spec for spec in _SPECS}
TRAINABLE_ROLES: tuple[str, ...] = tuple(spec.name for spec in _SPECS if spec.trainable)
# worker groups in placement order (the actor's first: the others default to its devices)
GROUPS: tuple[str, ...] = (*dict.fromkeys(spec.group for spec in _SPECS), *_GROUP_ONLY)


def group_devices_key(group: str) -> str:
    """The ``resource_pool`` key of a worker group's device ids."""
    for spec in _SPECS:
        if spec.group == group:
            return spec.devices_key
    if group in _GROUP_ONLY:
        return _GROUP_ONLY[group]
    raise KeyError(f"unknown worker group {group!r}; groups: {list(GROUPS)}")


def role_of_group(group: str) -> str:
    """The trained role a worker group checkpoints (``actor_rollout_ref`` -> ``actor``)."""
    for spec in _SPECS:
        if spec.group == group and spec.trainable:
            return spec.name
    raise KeyError(f"worker group {group!r} trains no role; trained roles: {TRAINABLE_ROLES}")
