"""The RL loop on the Ray backend: two FSDP2 ranks, colocated and split placements.

Each test starts real Ray actors (one process per device) that load a tiny model, shard it
with FSDP2 over gloo and train for two steps; the driver is this process. They share one
Ray session (``ray_session`` in ``tests/conftest.py``).
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from verl.models.tiny import save_tiny_model_dir
from verl.trainer.rl.trainer import RLTrainer

pytestmark = pytest.mark.slow


OVERRIDES = (
    "trainer.val_before_train=false",
    "trainer.device=cpu",
)


def _assert_finite(metrics: dict) -> None:
    for key, value in metrics.items():
        if isinstance(value, float):
            assert math.isfinite(value), f"{key}={value}"


def test_grpo_on_two_fsdp2_ranks_colocated(rl_config, ray_session, tiny_model_dir):
    # Token-budget micro-batches: the ranks pack different numbers of rows per micro-batch
    # but must run the same number of FSDP2 forwards (a mismatch would hang a collective).
    cfg = rl_config(
        *OVERRIDES,
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_device=140",
    )
    trainer = RLTrainer(cfg)
    assert trainer.placement.backend == "ray"
    assert trainer.actor_rollout_wg.world_size == 2
    result = trainer.fit()
    metrics = result["last_metrics"]
    _assert_finite(metrics)
    assert metrics["actor/grad_norm"] > 0
    assert "actor/kl_loss" in metrics
    # 4 prompts x n=2 = 8 responses per step, split 4 + 4 over the two ranks
    assert metrics["response_length/mean"] > 0
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    after = AutoModelForCausalLM.from_pretrained(result["hf_dir"])
    changed = [
        name
        for name, p in after.state_dict().items()
        if not torch.equal(p, before.state_dict()[name])
    ]
    assert changed, "two GRPO steps on two ranks left every weight unchanged"


def test_ppo_with_critic_and_reward_model_on_pools_of_their_own(rl_config, ray_session, tmp_path):
    rm_dir = save_tiny_model_dir(tmp_path / "rm", arch="qwen2", num_layers=1, reward_head=True)
    cfg = rl_config(
        *OVERRIDES,
        "algorithm.adv_estimator=gae",
        "trainer.n_gpus_per_node=3",
        "resource_pool.actor_devices=[0]",
        "resource_pool.critic_devices=[1]",
        "resource_pool.reward_model_devices=[2]",
        "critic.ppo_mini_batch_size=2",
        "critic.ppo_micro_batch_size_per_device=2",
        "critic.optim.lr=1e-3",
        "reward_model.enable=true",
        f"reward_model.model.path={rm_dir}",
    )
    trainer = RLTrainer(cfg)
    try:
        assert trainer.placement.backend == "ray"
        assert len(trainer.placement.pools) == 3
        pids = [
            set(group.pids)
            for group in (trainer.actor_rollout_wg, trainer.critic_wg, trainer.rm_wg)
        ]
        assert len(set().union(*pids)) == 3, f"roles share processes: {pids}"
    except BaseException:
        trainer.close()
        raise
    history_start = len(trainer.history)
    metrics = trainer.fit()["last_metrics"]
    assert len(trainer.history) == history_start + 2
    _assert_finite(metrics)
    assert metrics["critic/grad_norm"] > 0
    assert "critic/vf_loss" in metrics
    # reward-model scores are real-valued, not the rules' 0/1
    assert metrics["critic/score/mean"] not in (0.0, 1.0)


def test_killed_rank_fails_the_run_quickly_and_names_it(rl_config, ray_session):
    import os
    import signal
    import time

    from verl.controller import WorkerDiedError

    trainer = RLTrainer(rl_config(*OVERRIDES, "trainer.n_gpus_per_node=2"))
    try:
        os.kill(trainer.actor_rollout_wg.pids[1], signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as err:
            trainer.fit()
        elapsed = time.monotonic() - start
    finally:
        trainer.close()
    assert err.value.rank == 1
    assert "actor_rollout_ref" in str(err.value) and "rank 1" in str(err.value)
    assert elapsed < 30, f"the driver took {elapsed:.1f}s to report the dead worker"


def _even_token_reward(batch):
    """Fraction of even token ids in the response: nonzero advantages from the first step."""
    from verl.rewards.placement import place_on_last_token

    responses, mask = batch.batch["responses"], batch.batch["response_mask"]
    score = ((responses % 2 == 0) & mask.bool()).sum(-1).float() / mask.sum(-1).clamp(min=1)
    return place_on_last_token(score, mask), {}, {}


def test_lora_on_two_fsdp2_ranks(rl_config, ray_session, tiny_model_dir):
    # FSDP2 shards the base weights and the adapters together (frozen and trainable
    # parameters in one unit); the reference is the actor with its adapters disabled.
    cfg = rl_config(
        *OVERRIDES,
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.model.lora_rank=4",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.optim.lr=1e-2",
    )
    trainer = RLTrainer(cfg, reward_fn=_even_token_reward)
    assert trainer.actor_rollout_wg.world_size == 2
    result = trainer.fit()
    metrics = result["last_metrics"]
    _assert_finite(metrics)
    assert metrics["actor/grad_norm"] > 0
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    after = AutoModelForCausalLM.from_pretrained(result["hf_dir"])
    assert not any("lora" in name for name in after.state_dict())
    changed = [
        name
        for name, p in after.state_dict().items()
        if not torch.equal(p, before.state_dict()[name])
    ]
    # the adapters were folded into the attention and MLP projections, nothing else moved
    assert changed and all("proj" in name for name in changed), changed
