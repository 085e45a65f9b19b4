"""Two GRPO steps with an LLM judge as the reward (a scripted OpenAI-compatible endpoint on
127.0.0.1, deterministic), scored overlapped with generation."""

from __future__ import annotations

import pytest

from verl.trainer.rl.trainer import RLTrainer

from ..rewards.reward_loop_helpers import JsonServer, scripted_judge


@pytest.mark.slow
def test_grpo_with_the_judge_as_reward(rl_config):
    with JsonServer(scripted_judge) as server:
        cfg = rl_config(
            "algorithm.adv_estimator=grpo",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "reward_model.judge.enable=true",
            "reward_model.judge.backend=http",
            f"reward_model.judge.base_url={server.url}/v1",
            "reward_model.judge.model=scripted",
            "reward_model.overlap.num_chunks=2",
            # the tiny random model rarely answers right: only the plumbing is checked
            "reward_model.max_failure_rate=1.0",
        )
        trainer = RLTrainer(cfg)
        trainer.fit()
        trainer.close()
        judged = len(server.requests)
    assert len(trainer.history) == 2
    assert judged == 2 * 8  # 4 prompts x 2 responses per step
    for row in trainer.history:
        assert row["judge/parse_failures"] == 0.0
        assert 0.0 <= row["judge/mean_score"] <= 1.0
        assert row["judge/latency_s_mean"] > 0
        assert "actor/pg_loss" in row
