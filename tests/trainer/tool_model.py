"""The tiny model taught to call the calculator, shared by the multi-turn trainer tests.

``train_tool_model(path)`` fits a 2-layer tiny Qwen2 (seeded, one thread, deterministic) on
two tool-call transcripts of :data:`QUESTIONS` (tools listed in the system prompt as the
dataset renders them) and saves it with its tokenizer under ``path``. The session fixture
``tool_model_dir`` (``tests/trainer/conftest.py``) trains it once for every test module that
asks for it. :data:`REWARD` is the reward-function source those tests run it with: 1 when
the conversation holds the calculator's right result and the answer ends with it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from verl.data.base import render_chat
from verl.models.tiny import build_tiny_model, build_tiny_tokenizer
from verl.tools.calculator import CALCULATOR_SCHEMA

QUESTIONS = {"12*34": "408", "56*78": "4368"}

REWARD = """
def score(data_source, solution_str, ground_truth, extra_info=None):
    messages = extra_info["messages"]
    assert messages[0]["role"] == "user" and messages[1]["role"] == "assistant"
    used_tool = any(m["role"] == "tool" and m["content"] == ground_truth for m in messages)
    correct = used_tool and solution_str.strip().endswith(ground_truth)
    return {"score": float(correct), "acc": float(correct)}
"""


def _transcript(tokenizer, question: str, answer: str) -> str:
    prompt = render_chat(
        tokenizer, [{"role": "user", "content": question}], True, tools=[CALCULATOR_SCHEMA]
    )
    call = json.dumps({"name": "calculator", "arguments": {"expression": question}})
    return (
        prompt
        + f"<tool_call>{call}</tool_call><|im_end|>\n<|im_start|>tool\n{answer}<|im_end|>\n"
        + f"<|im_start|>assistant\nThe answer is {answer}<|im_end|>"
    )


def train_tool_model(path: Path) -> Path:
    """Teach the tiny model the two transcripts (until the loss is under 0.02, at most 300
    Adam steps) and save it, tokenizer included, at ``path``; returns ``path``."""
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(
        tokenizer=tokenizer, hidden_size=64, num_layers=2, max_position_embeddings=1024, seed=0
    )
    texts = [_transcript(tokenizer, q, a) for q, a in QUESTIONS.items()]
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    # Only the answer's tokens are learned: the system prompt is the same in both
    # transcripts, and dropping it from the loss makes the fit take ~100 steps instead of ~300.
    prompt = _transcript(tokenizer, "Q", "A").split("<tool_call>")[0].rsplit("user", 1)[0]
    labels[:, : len(tokenizer.encode(prompt))] = -100
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small only loses to thread contention
    try:
        for _ in range(300):
            loss = model(**enc, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            if loss.item() < 0.02:
                break
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def calculator_run_overrides(tool_model_dir: Path, tmp_path: Path, repeats: int = 2) -> list[str]:
    """Config overrides of a GRPO run on ``QUESTIONS`` (``repeats`` times each) with the
    calculator tool and ``REWARD``, written under ``tmp_path``: the tests add their own keys."""
    data = tmp_path / "train.jsonl"
    rows = [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": q}],
            "reward_model": {"ground_truth": a},
        }
        for q, a in QUESTIONS.items()
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows * repeats))
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    return [
        f"actor_rollout_ref.model.path={tool_model_dir}",
        f"data.train_files=[{data}]",
        "data.max_prompt_length=512",
        "data.max_response_length=96",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.tools=[{path: builtin, name: calculator}]",
        "actor_rollout_ref.rollout.multi_turn.max_turns=3",
        "actor_rollout_ref.rollout.temperature=0.5",
        f"custom_reward_function.path={reward}",
        "custom_reward_function.name=score",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
    ]
