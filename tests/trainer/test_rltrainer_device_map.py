"""``set_device_map(dp_config)`` alone is honoured by ``verl.RLTrainer`` as by ``PPOTrainer``
(the base class ignored it without a word)."""

from __future__ import annotations

import logging

import pytest

import verl
from verl import DataParallelConfig
from verl.compat import clear_device_map
from verl.utils import set_device_map


@pytest.fixture
def kept_map():
    set_device_map(DataParallelConfig(actor_devices=[0]))
    yield
    clear_device_map()


def test_rltrainer_takes_the_kept_map(rl_config, kept_map, caplog):
    cfg = rl_config()
    with caplog.at_level(logging.INFO, logger="verl.compat.device_map"):
        trainer = verl.RLTrainer(cfg)
    try:
        assert trainer.config.resource_pool.actor_devices == [0]
        assert cfg.resource_pool == DataParallelConfig()  # the caller's config is unchanged
        assert "trainer placed by the map of set_device_map(...)" in caplog.text
    finally:
        trainer.close()
    # PPOTrainer goes through the same constructor: placed once, with no "own map" note
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="verl.compat.device_map"):
        ppo = verl.PPOTrainer(rl_config())
    try:
        assert ppo.config.resource_pool.actor_devices == [0]
        assert caplog.text.count("trainer placed by the map") == 1
        assert "is used, not the map" not in caplog.text
    finally:
        ppo.close()
