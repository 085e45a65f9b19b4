"""The device map: role device lists -> resource pools (colocated or apart)."""

from __future__ import annotations

import pytest

from verl.config import TrainerConfig
from verl.config.device_map import (
    DataParallelConfig,
    DeviceMapError,
    resolve_device_map,
    set_device_map,
)


def test_default_places_every_role_on_all_devices_colocated():
    placed = resolve_device_map(DataParallelConfig(), nnodes=2, devices_per_node=2)
    assert placed.pools == {"global_pool": (0, 1, 2, 3)}
    assert placed.roles == {
        "actor_rollout_ref": "global_pool",
        "critic": "global_pool",
        "reward_model": "global_pool",
    }
    assert placed.processes_per_node("global_pool") == [2, 2]
    assert placed.dp_size("critic") == 4
    assert placed.processes == 4


def test_split_placement_makes_one_pool_per_distinct_list():
    dp = DataParallelConfig(actor_devices=[0, 1], critic_devices=[2], reward_model_devices=[3])
    placed = resolve_device_map(dp, nnodes=1, devices_per_node=4)
    assert placed.pools == {
        "actor_rollout_ref_pool": (0, 1),
        "critic_pool": (2,),
        "reward_model_pool": (3,),
    }
    assert placed.roles_in_pool("critic_pool") == ["critic"]
    assert placed.processes == 4


def test_same_list_colocates_and_nodes_are_counted_from_ids():
    dp = DataParallelConfig(actor_devices=[2, 3, 4], critic_devices=[4, 3, 2])
    placed = resolve_device_map(
        dp, nnodes=3, devices_per_node=2, roles=["actor_rollout_ref", "critic"]
    )
    assert placed.pools == {"actor_rollout_ref_pool": (2, 3, 4)}
    assert placed.roles_in_pool("actor_rollout_ref_pool") == ["actor_rollout_ref", "critic"]
    # devices 2, 3 are node 1; device 4 is node 2
    assert placed.processes_per_node("actor_rollout_ref_pool") == [2, 1]


@pytest.mark.parametrize(
    ("dp", "message"),
    [
        (DataParallelConfig(actor_devices=[0, 1], critic_devices=[1, 2]), "partly overlaps"),
        (DataParallelConfig(actor_devices=[0, 9]), "device(s) [9] do not exist"),
        (DataParallelConfig(actor_devices=[1, 1]), "device(s) [1] listed twice"),
        (DataParallelConfig(critic_devices=[]), "a role needs at least one device"),
    ],
)
def test_bad_maps_raise_with_the_key(dp, message):
    with pytest.raises(DeviceMapError, match=r"resource_pool\.") as err:
        resolve_device_map(dp, nnodes=1, devices_per_node=4)
    assert message in str(err.value)


def test_set_device_map_short_form_matches_the_config_section():
    dp = DataParallelConfig(actor_devices=[0, 1], critic_devices=[2], reward_model_devices=[3])
    alone = set_device_map(dp)
    cfg = TrainerConfig()
    cfg.algorithm.adv_estimator = "gae"
    placed = set_device_map(cfg, dp)
    assert cfg.trainer.n_gpus_per_node == 4  # grown to hold device 3
    assert cfg.resource_pool == dp and cfg.resource_pool is not dp
    assert placed == alone
    assert set_device_map(cfg) == alone


def test_backend_and_strategy_auto_follow_the_map():
    cfg = TrainerConfig()
    assert cfg.worker_backend == "local"
    assert cfg.engine_strategy("actor_rollout_ref") == "single"
    cfg.trainer.n_gpus_per_node = 2
    assert cfg.worker_backend == "ray"
    assert cfg.engine_strategy("actor_rollout_ref") == "fsdp2"
    # critic alone on one device: its own process, single engine
    cfg.algorithm.adv_estimator = "gae"
    cfg.resource_pool = DataParallelConfig(actor_devices=[0], critic_devices=[1])
    assert cfg.device_map.processes == 2
    assert cfg.engine_strategy("critic") == "single"
    assert cfg.worker_backend == "ray"
