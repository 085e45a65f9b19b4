"""GRPO on an agent program end to end: the calculator task as a plain OpenAI-client agent
(examples/agents/calculator_agent.py) trains 2 steps through RLTrainer on the tiny model."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest

from verl.trainer.rl.trainer import RLTrainer

from .taken_batches import assert_token_versions, fit_recording_batches

AGENT = Path(__file__).resolve().parents[2] / "examples" / "agents" / "calculator_agent.py"
OVERRIDES = (
    f"actor_rollout_ref.rollout.agent.program={AGENT}:calculator_agent",
    "actor_rollout_ref.rollout.agent.concurrency=8",
    "actor_rollout_ref.rollout.agent.timeout_s=120",
    "reward_model.reward_manager=agent",
    "data.max_prompt_length=256",
    "data.max_response_length=160",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
)


@pytest.mark.slow
def test_grpo_trains_the_calculator_agent(rl_config):
    cfg = rl_config(
        *OVERRIDES,
    )
    trainer = RLTrainer(cfg)
    try:
        gen, _ = trainer.collect_data(next(iter(trainer.train_loader)))
        non = gen.non_tensor_batch
        assert non["agent_status"].tolist() == ["ok"] * len(gen)
        # every row's prompt is the agent's own (its system message), its response the
        # model's turns (trained) and the tool results (not trained)
        assert all(
            "You have a calculator" in m
            for m in trainer.tokenizer.batch_decode(gen.batch["prompts"], skip_special_tokens=True)
        )
        assert int(gen.batch["response_mask"].sum(-1).min()) > 0
        assert set(gen.non_tensor_batch["score"].tolist()) <= {0.0, 1.0}
        trainer.fit()
    finally:
        trainer.close()
    assert trainer.global_step == 2
    for metrics in trainer.history:
        assert metrics["agent/ok"] == 8 and metrics["agent/errors"] == 0
        assert metrics["agent/requests_mean"] >= 1
        assert math.isfinite(metrics["actor/pg_loss"])
        # exact ids across turns: the trainer's log-probs are the rollout's
        assert metrics["rollout/logprob_abs_diff_mean"] < 1e-4
    assert not [t for t in threading.enumerate() if t.name.startswith("verl-openai")]


@pytest.mark.slow
def test_streaming_partial_rollouts_train_the_calculator_agent(rl_config):
    """The same agent in the streaming pipeline with ``partial_rollout=continue``: every
    trained model token carries the policy version that sampled it (the endpoint's records
    keep them), a sample's version is its oldest token's, and 2 steps train."""
    cfg = rl_config(
        *OVERRIDES,
        "trainer.async_rollout=true",
        "trainer.rollout_mode=streaming",
        "trainer.partial_rollout=continue",
        "trainer.max_staleness=1",
    )
    trainer = RLTrainer(cfg)
    taken = fit_recording_batches(trainer)
    assert trainer.global_step == 2 and len(taken) == 2
    for step, (gen, metrics) in enumerate(zip(taken, trainer.history)):
        assert metrics["agent/errors"] == 0 and math.isfinite(metrics["actor/pg_loss"])
        assert_token_versions(gen, step)
    assert not [t for t in threading.enumerate() if t.name.startswith("verl-openai")]
