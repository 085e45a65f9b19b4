"""Partial rollouts with the multi-turn agent loop (``verl/rollout/agent_turns.py``).

Each engine call of the agent loop (a turn) returns its tokens' policy versions, and the
trajectory concatenates them: a model token has the version that sampled it, a tool /
interaction token -1. Here a trajectory's turns straddle two weight swaps, one between the
turns (posted by the interaction) and one in the middle of the second turn (resume mode);
each token's log-prob equals a no-cache recomputation with the weights of its recorded
version, and the truncated IS weights computed from the output equal a hand computation
from those recomputations. Slow: a 2-step streaming GRPO run with multi_turn and
``partial_rollout=continue``.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from tests.rollout.token_versions import (
    behaviour,
    by_version,
    perturbed,
    tiny_tokenizer,
    varied_tiny_model,
)
from verl.algorithms.rollout_correction import compute_rollout_is_weights
from verl.protocol import DataProto
from verl.rollout import SamplingParams
from verl.rollout.agent_loop import AgentLoop
from verl.rollout.agent_turns import EngineTurnGenerator
from verl.rollout.native import NativeRollout
from verl.rollout.partial import TOKEN_VERSIONS, WeightMailbox, weight_mailbox

from .taken_batches import assert_token_versions, fit_recording_batches

TEXTS = ["1+2=", "the cat has 5 apples and"]
PARAMS = SamplingParams(n=2, max_new_tokens=40, seed=11, temperature=1.0, stop_token_ids=[])
TURN_TOKENS = 8  # each turn is cut here: the interaction then answers
SWAP_AT = 3  # v2 is posted when a row of the second turn samples its 4th token
THRESHOLD = 2.0
AGENT = Path(__file__).resolve().parents[2] / "examples/agents/calculator_agent.py:calculator_agent"


@pytest.fixture(scope="module")
def tokenizer(pytestconfig):
    return tiny_tokenizer(pytestconfig)


@pytest.fixture(scope="module")
def model(tokenizer):
    return varied_tiny_model(tokenizer)


class _CutTurns(EngineTurnGenerator):
    """The engine's turns, each cut at TURN_TOKENS (as if it had stopped there)."""

    calls = 0

    def generate_turns(self, contexts, budgets, params):
        self.calls += 1
        return super().generate_turns(contexts, [min(b, TURN_TOKENS) for b in budgets], params)


def _prompts(tokenizer) -> DataProto:
    enc = tokenizer(TEXTS, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
        }
    )


def _straddling_rollout(model, tokenizer):
    """Two turns per trajectory under a resume-mode mailbox: v0 for the first turn, v1
    posted by the interaction between the turns, v2 posted mid-way through the second."""
    weights = {1: perturbed(model, 9), 2: perturbed(model, 10)}
    mailbox = WeightMailbox("resume")
    mailbox.held = 0

    def scripted_trainer(logits, rows, steps):
        if generator.calls == 2 and mailbox.posted_version == 1 and int(steps.max()) >= SWAP_AT:
            mailbox.post(weights[2], 2)
        return logits

    def interaction(messages, *, num_replies, **context):
        if num_replies:
            return None
        mailbox.post(weights[1], 1)  # a step boundary between the two turns
        return "go on"

    engine = NativeRollout(copy.deepcopy(model), tokenizer, logits_processor=scripted_trainer)
    generator = _CutTurns(engine)
    loop = AgentLoop(generator, tokenizer, [], max_turns=2, interaction=interaction)
    prompts = _prompts(tokenizer)
    with weight_mailbox(mailbox):
        out = loop.run(prompts, PARAMS)
    return out, prompts, weights, mailbox


def test_turns_straddling_weight_swaps_record_each_tokens_version(model, tokenizer):
    out, _, weights, mailbox = _straddling_rollout(model, tokenizer)
    assert mailbox.stats["swaps"] == 2 and mailbox.held == 2
    versions = out.batch[TOKEN_VERSIONS]
    mask = out.batch["response_mask"].bool()
    width = mask.shape[1]
    real = out.batch["attention_mask"][:, -width:].bool()
    assert versions.dtype == torch.long and versions.shape == mask.shape
    assert (versions[~mask] == -1).all()  # interaction tokens and padding
    assert bool((real & ~mask).any())  # the interaction's reply is in the trajectories
    for r in range(len(out)):
        info = out.non_tensor_batch["turn_info"][r]
        assert len(info) == 2, info
        first, second = info[0]["model_tokens"], info[1]["model_tokens"]
        model_versions = versions[r][mask[r]].tolist()
        assert len(model_versions) == first + second
        # the first turn: v0; the second: v1 until the mid-turn swap, then v2 (never back)
        assert model_versions[:first] == [0] * first
        turn2 = model_versions[first:]
        assert turn2 == sorted(turn2) and set(turn2) <= {1, 2} and turn2[0] == 1
    assert {1, 2} <= set(versions[mask].tolist())
    spans = [r for r in range(len(out)) if {1, 2} <= set(versions[r][mask[r]].tolist())]
    assert spans, "the v2 swap must land in the middle of some second turn"

    # resume mode: every model token's log-prob is its version's no-cache recomputation
    log_probs = by_version(model, weights, out)
    sampled_by = behaviour(log_probs, versions)
    rollout_lp = out.batch["rollout_log_probs"]
    assert float((rollout_lp - sampled_by).abs().masked_fill(~mask, 0).max()) < 1e-4

    # the truncated IS weights against the trainer's current policy (v2), by hand: per model
    # token min(exp(log pi_v2 - log pi_version), C); 0 on tool / interaction tokens
    old = log_probs[2]
    got, metrics = compute_rollout_is_weights(old, rollout_lp, mask.long(), threshold=THRESHOLD)
    by_hand = torch.zeros_like(old)
    for r in range(len(out)):
        for t in range(width):
            if mask[r, t]:
                ratio = math.exp(float(old[r, t]) - float(sampled_by[r, t]))
                by_hand[r, t] = min(ratio, THRESHOLD)
    assert torch.allclose(got, by_hand, rtol=1e-3, atol=1e-5)
    assert bool((by_hand[versions == 2] - 1).abs().max() < 1e-3)  # fresh tokens: weight 1
    assert bool((by_hand[(versions >= 0) & (versions < 2)] != 1).any())  # stale ones are not
    clipped = float((by_hand[mask] >= THRESHOLD).float().mean())
    assert float(metrics["rollout_is_clipfrac"]) == pytest.approx(clipped, abs=1e-6)


def test_without_a_mailbox_the_trajectory_has_no_token_versions(model, tokenizer):
    engine = NativeRollout(copy.deepcopy(model), tokenizer)
    loop = AgentLoop(_CutTurns(engine), tokenizer, [], max_turns=2, interaction=lambda m, **k: None)
    out = loop.run(_prompts(tokenizer), PARAMS)
    assert TOKEN_VERSIONS not in out.batch
    assert out.batch["response_mask"].sum() > 0


def test_config_takes_partial_rollouts_with_multi_turn_and_with_an_agent_program(rl_config):
    stream = ("trainer.async_rollout=true", "trainer.rollout_mode=streaming")
    partial = ("trainer.partial_rollout=continue", "actor_rollout_ref.rollout.name=native")
    multi = "actor_rollout_ref.rollout.multi_turn.enable=true"
    cfg = rl_config(*stream, *partial, multi)
    assert cfg.trainer.partial_rollout == "continue"
    cfg = rl_config(*stream, *partial, f"actor_rollout_ref.rollout.agent.program={AGENT}")
    assert cfg.trainer.partial_rollout == "continue" and cfg.actor_rollout_ref.rollout.agent.enable


@pytest.mark.slow
def test_streaming_multi_turn_with_partial_rollouts_trains(rl_config, tool_model_dir, tmp_path):
    from verl.trainer.rl.trainer import RLTrainer

    from .tool_model import calculator_run_overrides

    cfg = rl_config(
        *calculator_run_overrides(tool_model_dir, tmp_path, repeats=4),
        "trainer.async_rollout=true",
        "trainer.rollout_mode=streaming",
        "trainer.partial_rollout=continue",
        "trainer.max_staleness=1",
        "trainer.total_training_steps=2",
    )
    trainer = RLTrainer(cfg)
    taken = fit_recording_batches(trainer)
    assert trainer.global_step == 2 and len(taken) == 2
    assert any(m["actor/grad_norm"] > 0 for m in trainer.history)
    for step, (gen, metrics) in enumerate(zip(taken, trainer.history)):
        assert math.isfinite(metrics["actor/pg_loss"])
        assert max(gen.non_tensor_batch["num_turns"]) >= 2
        assert_token_versions(gen, step)
        assert metrics["stream/dropped_groups"] == 0
