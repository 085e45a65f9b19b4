"""Placement groups of Ray worker groups: one per node of a ``ResourcePool``, shared by the
groups built over the same pool object (colocation by pool), removed with the last of them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from verl.controller.resource_pool import ResourcePool

logger = logging.getLogger(__name__)


@dataclass
class PoolPlacement:
    """The placement groups of one pool (one per node) and how many groups use them."""

    session: tuple[str, str]
    bundle: dict[str, float]
    groups: list[PlacementGroup]
    users: int = 0


def _ray_session() -> tuple[str, str]:
    # placement groups belong to one job on one cluster; a new ray.init makes them stale
    ctx = ray.get_runtime_context()
    return ctx.get_node_id(), ctx.get_job_id()


def acquire_placement(
    pool: ResourcePool, bundle: dict[str, float], timeout_s: float
) -> PoolPlacement:
    """The pool's placement groups, created and scheduled on first use, with a user more."""
    cached: PoolPlacement | None = pool.backend_state.get("ray")
    if cached is not None and cached.session == _ray_session() and cached.users > 0:
        if cached.bundle != bundle:
            raise ValueError(
                f"resource pool {pool.name!r} already has placement groups with bundles "
                f"{cached.bundle}; a group asking for {bundle} cannot share them (use the same "
                "RayOptions.num_cpus_per_worker for every group of a pool, or another pool)"
            )
        cached.users += 1
        return cached

    cluster = ray.cluster_resources()
    for resource, per_bundle in bundle.items():
        need = per_bundle * pool.world_size
        have = cluster.get(resource, 0)
        if have < need:
            fix = (
                f"start Ray with more logical CPUs, e.g. ensure_ray(num_cpus={int(need)})"
                if resource == "CPU"
                else "use_gpu=False on a machine without GPUs"
                if resource == "GPU"
                else "add the resource to the cluster"
            )
            raise ValueError(
                f"resource pool {pool.name!r} (process_on_nodes={pool.process_on_nodes}) needs "
                f"{need:g} {resource} but the Ray cluster has {have:g}; {fix}"
            )
    groups = [
        placement_group(
            [dict(bundle) for _ in range(count)],
            strategy="STRICT_PACK",
            name=f"verl_{pool.name}_node{node}_{os.getpid()}_{id(pool):x}",
        )
        for node, count in enumerate(pool.process_on_nodes)
    ]
    ready, _ = ray.wait([pg.ready() for pg in groups], num_returns=len(groups), timeout=timeout_s)
    if len(ready) < len(groups):
        for pg in groups:
            remove_placement_group(pg)
        raise TimeoutError(
            f"resource pool {pool.name!r}: the Ray cluster did not grant "
            f"{pool.process_on_nodes} bundles of {bundle} (one placement group per node, "
            f"STRICT_PACK) within {timeout_s:g}s; available now: {ray.available_resources()}. "
            "Other pools or groups may hold the resources: shut them down, or start Ray with "
            "more (ensure_ray(num_cpus=...))"
        )
    placement = PoolPlacement(_ray_session(), dict(bundle), groups, users=1)
    pool.backend_state["ray"] = placement
    logger.debug("placed pool %r: %d placement group(s) of %s", pool.name, len(groups), bundle)
    return placement


def release_placement(pool: ResourcePool, placement: PoolPlacement) -> None:
    placement.users -= 1
    if placement.users > 0:
        return
    if pool.backend_state.get("ray") is placement:
        del pool.backend_state["ray"]
    if ray.is_initialized() and placement.session == _ray_session():
        for pg in placement.groups:
            try:
                remove_placement_group(pg)
            except Exception as e:  # the cluster may be going down already
                logger.debug("could not remove placement group %s: %s", pg.id, e)
