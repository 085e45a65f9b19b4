"""Partial rollouts with agent programs: the OpenAI endpoint's records keep each token's
policy version (``verl/rollout/agent_trajectory.py``).

An agent of two chat requests posts new weights (v1) between them, as a trainer step would;
the engine takes them before the second turn and a third version (v2) in the middle of it
(resume mode). Each model token of the trajectory carries the version that sampled it, ids
the agent inserted carry -1, and every model token's log-prob equals a no-cache
recomputation with the weights of its recorded version. Without a mailbox the output has no
version column, as before.
"""

from __future__ import annotations

import copy
import threading

import numpy as np
import torch
from openai import OpenAI

from verl.protocol import DataProto
from verl.rollout import SamplingParams
from verl.rollout.agent_program import AgentProgramRollout
from verl.rollout.native import NativeRollout
from verl.rollout.partial import TOKEN_VERSIONS, WeightMailbox, weight_mailbox

from .token_versions import behaviour, by_version, perturbed

QUESTIONS = ["1+2=", "what is 3*4?"]
PARAMS = SamplingParams(n=2, max_new_tokens=48, seed=5, temperature=1.0, stop_token_ids=[])
TURN_TOKENS = 8
SWAP_AT = 3  # v2 is posted when a row sampling under v1 reaches its 4th token


def _prompts(tokenizer) -> DataProto:
    messages = [[{"role": "user", "content": q}] for q in QUESTIONS]
    rows = [
        tokenizer.apply_chat_template(m, add_generation_prompt=True, return_dict=False)
        for m in messages
    ]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    raw = np.empty(len(rows), dtype=object)
    for i, m in enumerate(messages):
        raw[i] = m
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask}, non_tensors={"raw_prompt": raw}
    )


def _two_turn_agent(mailbox: WeightMailbox | None, weights: dict[int, dict]):
    # every agent has its first reply before any posts v1: all first turns are v0, however
    # the endpoint batched the first requests
    first_replies = threading.Barrier(len(QUESTIONS) * PARAMS.n, timeout=30)

    def agent(base_url, api_key, task):
        client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        messages = list(task["messages"])
        first = client.chat.completions.create(
            model="policy", messages=messages, max_tokens=TURN_TOKENS
        )
        first_replies.wait()
        if mailbox is not None:
            mailbox.post(weights[1], 1)  # a trainer step between the agent's two requests
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content or ""},
            {"role": "user", "content": "go on"},
        ]
        client.chat.completions.create(model="policy", messages=messages, max_tokens=TURN_TOKENS)
        return 0.0

    return agent


def _rollout(model, tokenizer, mailbox: WeightMailbox | None):
    weights = {1: perturbed(model, 9), 2: perturbed(model, 10)}

    def scripted_trainer(logits, rows, steps):
        if mailbox is not None and mailbox.held == 1 and int(steps.max()) >= SWAP_AT:
            mailbox.post(weights[2], 2)  # another step, mid-way through a v1 turn
        return logits

    engine = NativeRollout(copy.deepcopy(model), tokenizer, logits_processor=scripted_trainer)
    rollout = AgentProgramRollout(
        engine, tokenizer, _two_turn_agent(mailbox, weights), concurrency=4, timeout_s=60
    )
    prompts = _prompts(tokenizer)
    try:
        if mailbox is None:
            out = rollout.run(prompts, PARAMS)
        else:
            with weight_mailbox(mailbox):
                out = rollout.run(prompts, PARAMS)
    finally:
        rollout.close()
    return out, prompts, weights


def test_agent_turns_straddling_weight_swaps_record_each_tokens_version(model, tokenizer):
    mailbox = WeightMailbox("resume")
    mailbox.held = 0
    out, _, weights = _rollout(model, tokenizer, mailbox)
    assert out.non_tensor_batch["agent_status"].tolist() == ["ok"] * len(out)
    assert out.non_tensor_batch["agent_requests"].tolist() == [2] * len(out)
    assert mailbox.stats["swaps"] == 2 and mailbox.held == 2
    versions = out.batch[TOKEN_VERSIONS]
    mask = out.batch["response_mask"].bool()
    width = mask.shape[1]
    real = out.batch["attention_mask"][:, -width:].bool()
    assert versions.dtype == torch.long and versions.shape == mask.shape
    assert (versions[~mask] == -1).all()  # the agent's own messages and padding
    assert (versions[mask] >= 0).all()
    assert bool((real & ~mask).any())  # the inserted user turn is in the trajectories
    for r in range(len(out)):
        row = versions[r][mask[r]].tolist()
        assert row == sorted(row), row  # versions only move forward along a trajectory
        assert row[0] == 0, row  # every first turn was sampled before v1 was posted
    assert {0, 1, 2} <= set(versions[mask].tolist())
    assert any(len(set(versions[r][mask[r]].tolist())) >= 2 for r in range(len(out)))

    # resume mode: every model token's log-prob is its version's no-cache recomputation
    log_probs = by_version(model, weights, out)
    gap = (out.batch["rollout_log_probs"] - behaviour(log_probs, versions)).abs()
    assert float(gap.masked_fill(~mask, 0).max()) < 1e-4
    # and the versions differ where it matters: v0's weights do not explain the v2 tokens
    v0 = log_probs[0]
    assert float((out.batch["rollout_log_probs"] - v0).abs()[versions == 2].max()) > 1e-2


def test_without_a_mailbox_agent_trajectories_have_no_token_versions(model, tokenizer):
    out, _, _ = _rollout(model, tokenizer, None)
    assert out.non_tensor_batch["agent_status"].tolist() == ["ok"] * len(out)
    assert TOKEN_VERSIONS not in out.batch
    assert out.batch["response_mask"].sum() > 0
