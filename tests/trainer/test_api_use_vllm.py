"""The seeds' spelling ``Trainer(..., use_vllm=True)`` / ``PPOTrainer(..., use_vllm=True)``."""

from __future__ import annotations

import importlib.util

import pytest

from verl.config import ConfigError
from verl.trainer.api import PPOTrainer, Trainer, with_rollout_backend


def test_use_vllm_selects_the_vllm_backend_on_a_copy(rl_config):
    cfg = rl_config()
    assert cfg.actor_rollout_ref.rollout.name == "native"
    chosen = with_rollout_backend(cfg, True)
    assert chosen.actor_rollout_ref.rollout.name == "vllm"
    assert cfg.actor_rollout_ref.rollout.name == "native"  # the caller's config is untouched
    assert chosen.actor_rollout_ref.rollout.n == cfg.actor_rollout_ref.rollout.n
    assert with_rollout_backend(cfg, False).actor_rollout_ref.rollout.name == "native"
    with pytest.raises(TypeError, match="use_vllm='yes' must be True or False"):
        with_rollout_backend(cfg, "yes")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
@pytest.mark.parametrize("trainer_cls", [PPOTrainer, Trainer])
def test_use_vllm_without_vllm_names_the_package(rl_config, trainer_cls):
    with pytest.raises(ConfigError, match=r"rollout\.name=vllm: needs the 'vllm' package"):
        trainer_cls(rl_config(), use_vllm=True)
