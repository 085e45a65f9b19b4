"""The calculator recipe through an agent program (examples/calculator_sft_grpo.py
``--rollout agent``, the OpenAI-client ``calculator_tools_agent`` of
examples/agents/calculator_agent.py).

Fast: the agent's conversation through the endpoint is, token for token in text, the SFT
transcript the warm start was trained on (the tools line, the call, the tool's result, the
answer); its second request is stitched onto the sampled ids by messages; its reward is the
right number; the recipe counts its tool calls from the conversation; a bad rollout name and
an ``--sft-dir`` without the tools template are refused. Slow: the recipe's GRPO runs 2 steps
through the agent on the tiny model from ``--sft-dir``, with greedy validation before and
after through the same agent.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from verl.data.arithmetic import tool_transcript_row
from verl.protocol import DataProto
from verl.rollout import SamplingParams
from verl.rollout.agent_program import AgentProgramRollout
from verl.rollout.agent_turns import TurnOutput

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def recipe():
    return load("calculator_sft_grpo", EXAMPLES / "calculator_sft_grpo.py")


@pytest.fixture(scope="module")
def agents():
    return load("calculator_agent", EXAMPLES / "agents" / "calculator_agent.py")


class Replies:
    """A TurnGenerator that answers the n-th request of a conversation with ``texts[n]``
    (then EOS), the n-th found by the tool results already in the context."""

    def __init__(self, tokenizer, texts: list[str]):
        self.tokenizer, self.texts = tokenizer, texts
        self.contexts: list[list[int]] = []

    def generate_turns(self, contexts, budgets, params):
        outs = []
        for context in contexts:
            self.contexts.append(list(context))
            turn = self.tokenizer.decode(context).count("<|im_start|>tool")
            ids = self.tokenizer.encode(self.texts[turn], add_special_tokens=False)
            ids.append(self.tokenizer.eos_token_id)
            outs.append(TurnOutput(ids, [-0.5] * len(ids)))
        return outs


def prompt_batch(tokenizer, problem: tuple[int, str, int]) -> DataProto:
    """One dataset row as RLHFDataset gives it without tools: the user question."""
    user = tool_transcript_row(problem, [{"function": {"name": "calculator"}}])["messages"][1]
    ids = tokenizer.apply_chat_template([user], add_generation_prompt=True, return_dict=False)
    raw = np.empty(1, dtype=object)
    raw[0] = [user]
    a, _, b = problem
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.tensor([ids]),
            "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
        },
        non_tensors={
            "raw_prompt": raw,
            "data_source": np.array(["arithmetic"], dtype=object),
            "ground_truth": np.array([str(a * b)], dtype=object),
        },
    )


def test_the_tools_agent_replays_the_sft_transcript(recipe, agents):
    tokenizer = recipe.tool_tokenizer()
    problem = (123, "*", 456)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "123 * 456"}}</tool_call>'
    generator = Replies(tokenizer, [call, "56088"])
    rollout = AgentProgramRollout(
        generator, tokenizer, agents.calculator_tools_agent, timeout_s=60, max_prompt_length=64
    )
    try:
        out = rollout.run(prompt_batch(tokenizer, problem), SamplingParams(n=1, max_new_tokens=96))
    finally:
        rollout.close()
    non = out.non_tensor_batch
    assert non["agent_status"].tolist() == ["ok"]
    assert non["extra_info"][0]["agent_reward"] == 1.0
    assert [t["stitch"] for t in non["turn_info"][0]] == ["new", "messages"]
    # the whole trajectory is the SFT transcript of the same problem
    mask = out.batch["attention_mask"][0].bool()
    text = tokenizer.decode(out.batch["input_ids"][0][mask])
    sft = tool_transcript_row(problem, [recipe.CALCULATOR_SCHEMA], recipe.SYSTEM)["messages"]
    assert text == tokenizer.apply_chat_template(sft, tokenize=False).removesuffix("\n")
    # trained: the two replies (call and answer, each with its EOS), nothing the agent sent
    assert out.batch["prompts"].shape[1] == 64  # max_prompt_length: room for the tools line
    trained = out.batch["responses"][0][out.batch["response_mask"][0].bool()].tolist()
    eos = tokenizer.eos_token_id
    sampled = [[*tokenizer.encode(t, add_special_tokens=False), eos] for t in (call, "56088")]
    assert trained == sampled[0] + sampled[1]
    # the second request continues the first's context and sampled ids exactly
    assert generator.contexts[1][: len(generator.contexts[0])] == generator.contexts[0]
    assert generator.contexts[1][len(generator.contexts[0]) :][: len(sampled[0])] == sampled[0]
    assert recipe.tool_calls(non) == ([1], [0])


def test_tool_calls_are_counted_from_either_rollout(recipe):
    loop = {"num_tool_calls": np.array([0, 2]), "num_tool_errors": np.array([0, 1])}
    assert recipe.tool_calls(loop) == ([0, 2], [0, 1])
    messages = np.empty(3, dtype=object)
    messages[0] = [{"role": "assistant", "content": "56088"}]
    messages[1] = [
        {"role": "tool", "content": "56088"},
        {"role": "assistant", "content": "56088"},
    ]
    messages[2] = [{"role": "tool", "content": "Error: malformed tool call"}, {"role": "tool"}]
    assert recipe.tool_calls({"messages": messages}) == ([0, 1, 2], [0, 0, 1])


def test_bad_rollout_and_sft_dir_are_refused(recipe, tmp_path):
    with pytest.raises(ValueError, match="--rollout 'graph'"):
        recipe.rollout_overrides("graph")
    agent = recipe.rollout_overrides("agent")
    assert "reward_model.reward_manager=agent" in agent
    assert any(o.endswith("calculator_agent.py:calculator_tools_agent") for o in agent)
    from verl.models.tiny import save_tiny_model_dir

    plain = save_tiny_model_dir(tmp_path / "plain")  # the plain chat template
    with pytest.raises(ValueError, match=r"--sft-dir .*plain.*tools template"):
        recipe.main(["--out", str(tmp_path / "out"), "--smoke", "--sft-dir", str(plain)])


@pytest.mark.slow
def test_recipe_grpo_through_the_agent_two_steps(recipe, tmp_path):
    from verl.models.tiny import save_tiny_model_dir

    warm = save_tiny_model_dir(
        tmp_path / "warm",
        tokenizer=recipe.tool_tokenizer(),
        hidden_size=128,
        num_layers=4,
        intermediate_size=256,
        max_position_embeddings=recipe.MAX_PROMPT + recipe.MAX_RESPONSE,
        seed=0,
    )
    argv = ["--out", str(tmp_path / "run"), "--smoke", "--model", "tiny", "--rollout", "agent"]
    assert recipe.main([*argv, "--sft-dir", str(warm)]) == 0
    result = json.loads((tmp_path / "run" / "curve.json").read_text())
    assert result["sft_loss"] == [] and not (tmp_path / "run" / "sft_ckpt").exists()
    assert [c["step"] for c in result["steps"]] == [1, 2]
    for point in result["steps"]:
        assert 0.0 <= point["correct"] <= 1.0 and point["tool_calls_mean"] >= 0.0
        assert point["turns_mean"] >= 1.0  # model requests per agent
        assert math.isfinite(point["step_seconds"])
    assert [v["step"] for v in result["val"]] == [0, 2]  # greedy, through the agent
    for point in result["val"]:
        assert 0.0 <= point["correct"] <= 1.0 and point["tool_calls_mean"] >= 0.0
    logged = (tmp_path / "run" / "grpo_logs" / "metrics.jsonl").read_text().splitlines()
    steps = [row for row in map(json.loads, logged) if "agent/ok" in row]
    assert [row["step"] for row in steps] == [1, 2]
    assert all(row["agent/ok"] == 4 and row["agent/errors"] == 0 for row in steps)
