"""A registered estimator or rollout backend trains with no other edit; kwargs reach calls.

The new estimator needs a critic, and nothing but its registration says so: the trainer
must place the critic role, pass values and the ``algorithm.adv_estimator_kwargs``
hyperparameter. The new rollout backend is a name in ``rollout.name`` that only its
registration makes valid.
"""

from __future__ import annotations

import math

import pytest
import torch

from verl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    compute_gae_advantages,
    compute_remax_advantages,
    register_advantage_estimator,
)
from verl.rewards.placement import place_on_last_token
from verl.rollout import register_rollout
from verl.rollout.native import NativeRollout
from verl.rollout.registry import ROLLOUT_BACKENDS
from verl.trainer.rl.trainer import RLTrainer

# as in test_algorithms_e2e: 2 prompts x 2 responses of at most 4 tokens
OVERRIDES = (
    "data.train_batch_size=2",
    "data.max_response_length=4",
    "data.arithmetic.train_size=8",
    "data.arithmetic.val_size=2",
    "trainer.val_before_train=false",
    "trainer.logger=[]",
)


def even_token_reward(batch):
    """Score = fraction of even token ids among the valid response tokens, on the last one."""
    responses, mask = batch.batch["responses"], batch.batch["response_mask"]
    score = ((responses % 2 == 0) & mask.bool()).sum(-1).float() / mask.sum(-1).clamp(min=1)
    return place_on_last_token(score, mask), {}, {}


SEEN: dict[str, list] = {"td_lambda": [], "values": [], "generate": []}


class CountingRollout(NativeRollout):
    """The native sampler, counting its calls."""

    def generate(self, prompts, params):
        SEEN["generate"].append(len(prompts))
        return super().generate(prompts, params)


def fixed_lambda_gae(token_level_rewards, values, response_mask, gamma=1.0, td_lambda=0.0, **kw):
    """GAE with its own lambda hyperparameter (not algorithm.lam)."""
    SEEN["td_lambda"].append(td_lambda)
    SEEN["values"].append(values is not None)
    return compute_gae_advantages(token_level_rewards, values, response_mask, gamma, td_lambda)


@pytest.fixture
def custom_entries():
    for seen in SEEN.values():
        seen.clear()
    register_advantage_estimator("test_fixed_lambda_gae", needs_critic=True)(fixed_lambda_gae)
    register_rollout("test_counting", CountingRollout)
    yield
    ADVANTAGE_ESTIMATORS.remove("test_fixed_lambda_gae")
    ROLLOUT_BACKENDS.remove("test_counting")


def test_registered_critic_estimator_and_rollout_backend_train_two_steps(rl_config, custom_entries):
    cfg = rl_config(
        *OVERRIDES,
        "algorithm.adv_estimator=test_fixed_lambda_gae",
        "algorithm.adv_estimator_kwargs.td_lambda=0.5",
        "actor_rollout_ref.rollout.name=test_counting",
        "critic.ppo_mini_batch_size=2",
        "critic.ppo_micro_batch_size_per_device=2",
    )
    assert cfg.critic.enable is None  # nothing asks for a critic but the estimator's entry
    trainer = RLTrainer(cfg, reward_fn=even_token_reward)
    assert trainer.use_critic and trainer.critic_wg is not None
    trainer.fit()
    assert trainer.global_step == 2
    assert SEEN["td_lambda"] == [0.5, 0.5] and SEEN["values"] == [True, True]
    assert len(SEEN["generate"]) >= 2  # the registered backend sampled every step
    for metrics in trainer.history:
        assert metrics["critic/grad_norm"] > 0 and math.isfinite(metrics["critic/vf_loss"])
        assert metrics["actor/grad_norm"] > 0


def test_remax_reward_to_go_reaches_the_estimator(rl_config):
    # A dense reward (1 per even token), where reward-to-go differs from the whole score.
    def dense_reward(batch):
        responses, mask = batch.batch["responses"], batch.batch["response_mask"]
        return ((responses % 2 == 0) & mask.bool()).float(), {}, {}

    cfg = rl_config(
        *OVERRIDES,
        "algorithm.adv_estimator=remax",
        "algorithm.adv_estimator_kwargs.reward_to_go=true",
        "trainer.total_training_steps=1",
    )
    trainer = RLTrainer(cfg, reward_fn=dense_reward)
    try:
        gen, _ = trainer.collect_data(next(iter(trainer.train_loader)))
    finally:
        trainer.close()
    b = gen.batch
    args = (b["token_level_rewards"], b["response_mask"], b["reward_baselines"])
    to_go, _ = compute_remax_advantages(*args, reward_to_go=True)
    whole, _ = compute_remax_advantages(*args, reward_to_go=False)
    torch.testing.assert_close(b["advantages"], to_go)
    assert not torch.allclose(to_go, whole)


def test_kl_cov_hyperparameters_reach_the_loss(rl_config):
    # kl_cov_ratio=1 treats every valid token; the default (0.0002) treats one per batch.
    cfg = rl_config(
        *OVERRIDES,
        "actor_rollout_ref.actor.policy_loss=kl_cov",
        "actor_rollout_ref.actor.policy_loss_kwargs.kl_cov_ratio=1.0",
        "actor_rollout_ref.actor.policy_loss_kwargs.ppo_kl_coef=0.1",
        "trainer.total_training_steps=1",
    )
    trainer = RLTrainer(cfg, reward_fn=even_token_reward)
    trainer.fit()
    assert trainer.history[0]["actor/kl_cov_frac"] == pytest.approx(1.0)
