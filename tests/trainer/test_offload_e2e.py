"""The offload keys reach the engines of actor, reference and critic, and PPO still trains."""

from __future__ import annotations

import math

from verl.trainer.rl.trainer import RLTrainer


def test_offload_keys_reach_every_engine_and_ppo_trains(rl_config):
    cfg = rl_config(
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "critic.ppo_mini_batch_size=2",
        "critic.ppo_micro_batch_size_per_device=2",
        "trainer.val_before_train=false",
        "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
        "actor_rollout_ref.ref.fsdp_config.param_offload=true",
        "critic.fsdp_config.optimizer_offload=true",
    )
    trainer = RLTrainer(cfg)
    actor = trainer.actor_rollout_wg.workers[0]
    critic = trainer.critic_wg.workers[0]
    assert (actor.engine.offload_params, actor.engine.offload_optimizer) == (True, True)
    assert (actor.ref_engine.offload_params, actor.ref_engine.offload_optimizer) == (True, False)
    assert (critic.engine.offload_params, critic.engine.offload_optimizer) == (False, True)
    trainer.fit()
    assert len(trainer.history) == 2
    for metrics in trainer.history:
        assert math.isfinite(metrics["actor/pg_loss"]) and math.isfinite(metrics["critic/vf_loss"])


def test_dynamic_precision_puts_the_reference_in_fp8_under_pressure(rl_config):
    from verl.models.fp8 import is_fp8_model

    cfg = rl_config(
        "actor_rollout_ref.actor.use_kl_loss=true",
        "trainer.val_before_train=false",
        "trainer.dynamic_precision=true",
    )
    trainer = RLTrainer(cfg)
    dyn = trainer.actor_rollout_wg.workers[0].ref_dynamic
    dyn.probe = lambda device: 0  # no free memory at all
    trainer.fit()
    assert dyn.switches == 1 and is_fp8_model(dyn.module)
    assert all(math.isfinite(m["actor/kl_loss"]) for m in trainer.history)
