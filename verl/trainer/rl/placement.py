"""Placing the roles: the device map becomes resource pools, each pool one worker group.

This is the one place where the trainer meets the worker-group backend. For every pool of
the device map (``verl.config.device_map``) it builds a colocated worker class holding the
roles mapped there (``create_colocated_worker_cls``), starts one group over the pool with
the configured backend (``local``: in this process; ``ray``: one actor per device), and
hands out one group per role (``WorkerGroup.spawn()``). The trainer then calls roles
through those groups the same way on every backend.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from verl.config import TrainerConfig
from verl.controller import (
    ClassWithInitArgs,
    ResourcePool,
    WorkerGroup,
    create_colocated_worker_cls,
    make_worker_group,
)
from verl.utils.device import resolve_device

logger = logging.getLogger(__name__)

__all__ = ["Placement", "place_roles"]


@dataclass
class Placement:
    """The worker groups of a run: one per role, and the pool-level groups that own them."""

    roles: dict[str, WorkerGroup]
    pools: list[WorkerGroup] = field(default_factory=list)
    backend: str = "local"
    # called once after the last pool stops (e.g. ray.shutdown for a cluster we started)
    on_shutdown: Callable[[], None] | None = None

    def shutdown(self) -> None:
        """Stop every worker (Ray actors and their placement groups); idempotent."""
        while self.pools:
            self.pools.pop().shutdown()
        if self.on_shutdown is not None:
            hook, self.on_shutdown = self.on_shutdown, None
            hook()


def place_roles(cfg: TrainerConfig, specs: Mapping[str, ClassWithInitArgs]) -> Placement:
    """Start the workers of ``specs`` (``{role: worker class + init args}``) on their pools.

    Roles follow ``cfg.resource_pool``; roles that share a device list share processes.
    """
    placed = cfg.device_map
    backend = cfg.worker_backend
    device_type = resolve_device(cfg.trainer.device).type
    placement = Placement(roles={}, backend=backend)
    options: dict[str, Any] = {}
    if backend == "ray":
        extra = 1 if cfg.trainer.async_rollout else 0  # the rollout copy's process
        options, placement.on_shutdown = _start_ray(cfg, placed.processes + extra, device_type)
    try:
        for pool_name in placed.pools:
            roles = [role for role in placed.roles_in_pool(pool_name) if role in specs]
            if not roles:
                continue
            pool = ResourcePool(
                placed.processes_per_node(pool_name),
                use_gpu=device_type == "cuda",
                name=pool_name,
            )
            colocated = create_colocated_worker_cls({role: specs[role] for role in roles})
            group = make_worker_group(backend, colocated, pool, **options)
            placement.pools.append(group)
            placement.roles |= group.spawn()
            logger.info(
                "%s backend: %s on %s (devices %s)",
                backend,
                "+".join(roles),
                pool_name,
                list(placed.pools[pool_name]),
            )
    except BaseException:
        placement.shutdown()
        raise
    missing = sorted(set(specs) - set(placement.roles))
    if missing:
        placement.shutdown()
        raise ValueError(f"roles {missing} have no pool in the device map {placed.roles}")
    return placement


def _start_ray(
    cfg: TrainerConfig, processes: int, device_type: str
) -> tuple[dict[str, Any], Callable[[], None] | None]:
    """Join (or start) the Ray cluster; the group options and, if we started it, a stop hook."""
    import ray

    from verl.controller.ray_backend import RayOptions, ensure_ray
    from verl.controller.ray_cluster import shutdown_ray

    heartbeat = cfg.trainer.worker_heartbeat_timeout
    if heartbeat is not None and not heartbeat > 0:
        raise ValueError(
            f"trainer.worker_heartbeat_timeout={heartbeat!r} must be > 0 seconds, or null to "
            "turn the workers' heartbeat off"
        )
    started = not ray.is_initialized()
    ensure_ray(
        num_cpus=max(os.cpu_count() or 1, processes),
        address=cfg.trainer.ray_address,
        include_dashboard=cfg.trainer.ray_dashboard,
    )
    options = {"ray_options": RayOptions(device_type=device_type, heartbeat_timeout_s=heartbeat)}
    return options, (shutdown_ray if started else None)
