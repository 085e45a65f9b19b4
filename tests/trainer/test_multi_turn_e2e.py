"""GRPO with multi-turn rollouts and the calculator, end to end through RLTrainer.

The tiny model is first taught (``tool_model_dir``: seconds of supervised training on two
transcripts, tools listed in the system prompt as the dataset renders them; trained once a
session in ``tests/trainer/conftest.py``) to call the calculator, so the run really goes
through tool calls: the worker's agent loop, tool results in the prompt's context, the
reward function's conversation, the multi_turn metrics and an update whose log-probs match
the rollout's over every turn.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest

from verl.rollout.agent_loop import multi_turn_metrics
from verl.tools.calculator import calculate
from verl.trainer.rl.trainer import RLTrainer

from .tool_model import QUESTIONS, calculator_run_overrides


@pytest.mark.slow
def test_grpo_with_the_calculator(rl_config, tool_model_dir, tmp_path):
    cfg = rl_config(*calculator_run_overrides(tool_model_dir, tmp_path))
    trainer = RLTrainer(cfg)
    try:
        gen, _ = trainer.collect_data(next(iter(trainer.train_loader)))
        width = gen.batch["responses"].shape[1]
        real = gen.batch["attention_mask"][:, -width:].bool()
        model_tokens = gen.batch["response_mask"].bool()
        assert bool((real | ~model_tokens).all()) and int((real & ~model_tokens).sum()) > 0
        assert max(gen.non_tensor_batch["num_turns"]) >= 2
        # The taught model calls the tool and repeats its result, so some answers are right
        # (the 2-layer model copies the other question's digits into its call about half
        # the time; how often depends on the draws and on the CPU's kernels, which change
        # what the short teaching converges to: 0.5 or more with AVX-512, 0.25 with AVX2 only)
        assert float(gen.non_tensor_batch["acc"].mean()) > 0
        checked = 0
        for messages in gen.non_tensor_batch["messages"]:
            for turn, reply in itertools.pairwise(messages):
                if reply["role"] == "tool" and not reply["content"].startswith("Error"):
                    (call,) = turn["tool_calls"]
                    assert reply["content"] == calculate(
                        call["function"]["arguments"]["expression"]
                    )
                    checked += 1
        assert checked >= 4
        trainer.fit()
    finally:
        trainer.close()
    assert trainer.global_step == 2
    for metrics in trainer.history:
        assert metrics["multi_turn/turns_mean"] > 1.5, metrics["multi_turn/turns_mean"]
        # a sampled call can be malformed: counted, answered with an error, never fatal
        assert metrics["multi_turn/tool_errors"] < metrics["multi_turn/tool_calls"]
        assert math.isfinite(metrics["actor/pg_loss"]) and metrics["actor/grad_norm"] > 0
        # Exact ids across turns: the trainer's log-probs are the rollout's.
        assert metrics["rollout/logprob_abs_diff_mean"] < 1e-4


@pytest.mark.parametrize(
    ("interaction", "error", "match"),
    [
        ("{path: /nonexistent/env.py, name: judge}", FileNotFoundError, "interaction file not"),
        ("{path: builtin, name: judge}", AttributeError, "built-in interactions"),
    ],
)
def test_a_bad_interaction_fails_before_training(rl_config, interaction, error, match):
    cfg = rl_config(
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.interaction={interaction}",
    )
    with pytest.raises(error, match=match):
        RLTrainer(cfg)  # raised while the data is built: no worker has started


JUDGE = """
def judge(messages, *, data_source, ground_truth, extra_info, num_replies):
    # the worker's agent loop receives the prompt's fields and the whole conversation
    assert ground_truth in ("408", "4368") and data_source == "arithmetic", ground_truth
    assert messages[0]["role"] == "user" and messages[1]["role"] == "assistant", messages
    return None if num_replies else "Check it once more."
"""


@pytest.mark.slow
def test_interaction_replies_through_the_trainer(rl_config, tool_model_dir, tmp_path):
    data = tmp_path / "train.jsonl"
    rows = [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": q}],
            "reward_model": {"ground_truth": a},
        }
        for q, a in QUESTIONS.items()
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows * 2))
    judge = tmp_path / "judge.py"
    judge.write_text(JUDGE)
    cfg = rl_config(
        f"actor_rollout_ref.model.path={tool_model_dir}",
        f"data.train_files=[{data}]",
        "data.max_prompt_length=512",
        "data.max_response_length=128",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.tools=[{path: builtin, name: calculator}]",
        "actor_rollout_ref.rollout.multi_turn.max_turns=4",
        f"actor_rollout_ref.rollout.multi_turn.interaction={{path: {judge}, name: judge}}",
        "actor_rollout_ref.rollout.temperature=0.5",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
    )
    trainer = RLTrainer(cfg)
    try:
        gen, _ = trainer.collect_data(next(iter(trainer.train_loader)))
    finally:
        trainer.close()
    replies = gen.non_tensor_batch["num_interaction_turns"].tolist()
    # every sample that gave an answer (a turn without a call) before its last turn got one
    # (4 or more of the 8 with AVX-512, 2 with AVX2 only: the taught model differs, above)
    assert sum(replies) >= 1 and set(replies) <= {0, 1}
    metrics = multi_turn_metrics(gen.non_tensor_batch)
    assert metrics["multi_turn/interaction_turns"] == float(sum(replies))
    for messages, n in zip(gen.non_tensor_batch["messages"], replies):
        # the rollout's conversation (the prompt's messages are joined on for the reward)
        users = [m["content"] for m in messages if m["role"] == "user"]
        assert users == ["Check it once more."] * n
