"""``set_device_map(dp_config)`` alone: a device map kept for the trainers built afterwards.

Tutorial 003 writes::

    dp_config = DataParallelConfig(actor_devices=[0, 1], critic_devices=[2],
                                   reward_model_devices=[3])
    set_device_map(dp_config)
    # models initialised from here on are placed by this map

The native form writes the map into a config (``set_device_map(cfg, dp)``, see
``verl.config.device_map``). Called with the ``DataParallelConfig`` alone, this module's
``set_device_map`` resolves it (raising ``DeviceMapError`` for a map that cannot be placed),
keeps it for this process, and logs that trainers built from now on use it:
every ``RLTrainer`` (``PPOTrainer`` and ``Trainer`` of ``verl.trainer.api`` too) calls
:func:`apply_pending_device_map` on its config, which takes the kept map when the config names no devices of its own
(``resource_pool`` all null). ``clear_device_map()`` forgets it.
"""

from __future__ import annotations

import dataclasses
import logging

from verl.config import DataParallelConfig, DeviceMap, TrainerConfig
from verl.config import set_device_map as _write_device_map

logger = logging.getLogger(__name__)

__all__ = [
    "apply_pending_device_map",
    "clear_device_map",
    "pending_device_map",
    "set_device_map",
]

_pending: DataParallelConfig | None = None


def set_device_map(
    cfg: TrainerConfig | DataParallelConfig, dp: DataParallelConfig | None = None
) -> DeviceMap:
    """Place roles on devices; with a ``DataParallelConfig`` alone, also keep it for the
    trainers built afterwards (see the module docstring). Returns the resolved map."""
    global _pending
    placed = _write_device_map(cfg, dp)
    if isinstance(cfg, DataParallelConfig):
        _pending = dataclasses.replace(cfg)
        logger.info(
            "device map set: %s (%d devices); trainers built from now on use it "
            "(PPOTrainer/Trainer whose config names no resource_pool devices)",
            describe(placed),
            placed.num_devices,
        )
    else:
        logger.info("device map written into the config: %s", describe(placed))
    return placed


def describe(placed: DeviceMap) -> str:
    """``actor_rollout_ref on [0, 1], critic on [2]`` — one entry per role."""
    return ", ".join(f"{role} on {list(placed.devices(role))}" for role in placed.roles)


def pending_device_map() -> DataParallelConfig | None:
    """The map kept by ``set_device_map(dp_config)``, or None."""
    return None if _pending is None else dataclasses.replace(_pending)


def clear_device_map() -> None:
    """Forget the kept map; trainers built afterwards use their config's own."""
    global _pending
    _pending = None


def apply_pending_device_map(cfg: TrainerConfig) -> TrainerConfig:
    """``cfg`` with the kept map written in when ``cfg.resource_pool`` names no devices.

    Returns a copy when it writes (the caller's config is never changed); ``cfg`` itself
    otherwise. A config with its own device lists keeps them (logged).
    """
    if _pending is None:
        return cfg
    if cfg.resource_pool != DataParallelConfig():
        logger.info(
            "the config's own resource_pool %s is used, not the map of set_device_map(%s)",
            cfg.resource_pool,
            _pending,
        )
        return cfg
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer))
    placed = _write_device_map(cfg, _pending)
    logger.info("trainer placed by the map of set_device_map(...): %s", describe(placed))
    return cfg
