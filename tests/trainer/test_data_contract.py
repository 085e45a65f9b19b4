"""One PPO (GAE, with critic) step on the local backend sends each worker method only the
batch keys it declares (``@register(reads=..., optional=..., meta=...)``), never the step's
metrics; the bytes are counted by ``verl.controller.traffic.TrafficMeter``."""

from __future__ import annotations

import pytest

from verl.controller.dispatch import get_method_dispatch
from verl.controller.traffic import TrafficMeter, pickled_size
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl.trainer import RLTrainer

GAE = (
    "algorithm.adv_estimator=gae",
    "critic.ppo_mini_batch_size=2",
    "critic.ppo_micro_batch_size_per_device=2",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=false",
)


@pytest.fixture
def gae_trainer(rl_config):
    trainer = RLTrainer(rl_config(*GAE), tracker=Tracker([]))
    yield trainer
    trainer.close()


def test_gae_step_sends_only_declared_keys(gae_trainer):
    trainer = gae_trainer
    batch = next(iter(trainer.train_loader))
    meter = TrafficMeter()
    with meter.watch(trainer.actor_rollout_wg, trainer.critic_wg):
        gen, _ = trainer.collect_data(batch)
        metrics = trainer.update_policy(gen)

    by_method = meter.by_method()
    assert set(by_method) == {
        "generate_sequences",
        "compute_log_prob",
        "compute_values",
        "update_critic",
        "update_actor",
    }
    groups = {"update_critic": trainer.critic_wg, "compute_values": trainer.critic_wg}
    for method, row in by_method.items():
        worker_cls = groups.get(method, trainer.actor_rollout_wg).worker_cls
        spec = get_method_dispatch(getattr(worker_cls, method))
        assert row["calls"] == 1
        # every declared key crossed, and nothing else (optional keys only if present)
        assert set(spec.reads) <= row["keys"] <= set(spec.reads) | set(spec.optional), method
        assert row["meta_keys"] <= set(spec.meta), method
        assert "metrics" not in row["meta_keys"]

    # the prompts' per-sample fields stayed on the driver and are back on the rollout
    assert {"uid", "ground_truth", "data_source"} <= set(gen.non_tensor_batch)
    assert len(gen) == len(batch) * trainer.config.actor_rollout_ref.rollout.n
    # metrics come back as return values
    assert "actor/pg_loss" in metrics and "critic/vf_loss" in metrics

    # the update batch holds far more than the updates read (measured: update_actor gets
    # 9.5 kB of the batch's 15.5 kB, update_critic less)
    whole = pickled_size(gen)
    for method in ("update_actor", "update_critic"):
        assert by_method[method]["sent_bytes"] < 0.7 * whole, (method, whole)
    for record in meter.records:
        assert record.returned_bytes is not None and record.returned_bytes > 0


def test_kl_loss_step_sends_the_reference_log_probs_to_the_update(rl_config):
    # An optional key (ref_log_probs) crosses when the batch has it; no critic, no values.
    cfg = rl_config(
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
    )
    trainer = RLTrainer(cfg, tracker=Tracker([]))
    try:
        meter = TrafficMeter()
        with meter.watch(trainer.actor_rollout_wg):
            trainer.train_step(next(iter(trainer.train_loader)))
    finally:
        trainer.close()
    by_method = meter.by_method()
    assert by_method["compute_ref_log_prob"]["keys"] == by_method["compute_log_prob"]["keys"]
    assert "ref_log_probs" in by_method["update_actor"]["keys"]
    assert not {"values", "returns", "uid"} & by_method["update_actor"]["keys"]
