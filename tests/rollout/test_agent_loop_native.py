"""The agent loop on the real native engine (and the hf backend), with a tiny model taught (a few seconds of
training on two transcripts) to call the calculator: the rollout's log-probs equal the
trainer's recomputation over the whole multi-turn sequence, and the loss ignores tool
tokens (perturbing their advantages or old log-probs changes no gradient)."""

from __future__ import annotations

import json

import pytest
import torch

from verl.algorithms import POLICY_LOSSES
from verl.algorithms.losses import actor_loss
from verl.kernels.torch_functional import compute_response_log_probs
from verl.models.tiny import build_tiny_model
from verl.rollout import SamplingParams, build_rollout
from verl.rollout.agent_loop import AgentLoop, EngineTurnGenerator
from verl.tools.calculator import calculate, calculator_tool

from .conftest import make_batch

QUESTIONS = {"12*34": "408", "56*78": "4368"}


def prompt_text(tokenizer, question: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )


def transcript(tokenizer, question: str, answer: str) -> str:
    call = json.dumps({"name": "calculator", "arguments": {"expression": question}})
    return (
        prompt_text(tokenizer, question)
        + f"<tool_call>{call}</tool_call><|im_end|>\n<|im_start|>tool\n{answer}<|im_end|>\n"
        + f"<|im_start|>assistant\nThe answer is {answer}<|im_end|>"
    )


@pytest.fixture(scope="module")
def tool_model(tokenizer):
    return train_tool_model(tokenizer)


def train_tool_model(tokenizer):
    """A tiny Qwen2 that answers QUESTIONS by calling the calculator, then the result."""
    torch.manual_seed(0)
    model = build_tiny_model(tokenizer=tokenizer, hidden_size=64, num_layers=2, seed=0)
    texts = [transcript(tokenizer, q, a) for q, a in QUESTIONS.items()]
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(300):
        loss = model(**enc, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    return model.eval()


def rollout(tokenizer, model, engine_name="native", do_sample=True, **loop_kwargs):
    engine = build_rollout(engine_name, model, tokenizer)
    loop = AgentLoop(EngineTurnGenerator(engine), tokenizer, [calculator_tool()], **loop_kwargs)
    batch = make_batch(tokenizer, [prompt_text(tokenizer, q) for q in QUESTIONS])
    params = SamplingParams(n=2, max_new_tokens=96, temperature=1.0, seed=3, do_sample=do_sample)
    return loop.run(batch, params)


@pytest.mark.parametrize("engine_name", ["native", "hf"])
def test_engine_calls_the_calculator(tokenizer, tool_model, engine_name):
    # The native engine samples; the hf backend's sampler draws differently, so it runs
    # greedy to make every sample call the tool.
    out = rollout(tokenizer, tool_model, engine_name, do_sample=engine_name == "native")
    assert out.non_tensor_batch["num_turns"].tolist() == [2, 2, 2, 2]
    assert out.non_tensor_batch["num_tool_errors"].tolist() == [0, 0, 0, 0]
    for messages in out.non_tensor_batch["messages"]:
        # Sampled at temperature 1, the tiny model may copy the other question; whatever
        # it wrote, the calculator's result comes back and the model repeats it.
        (call,) = messages[0]["tool_calls"]
        expression = call["function"]["arguments"]["expression"]
        answer = calculate(expression)
        assert expression in QUESTIONS
        assert messages[1] == {"role": "tool", "name": "calculator", "content": answer}
        assert messages[2] == {"role": "assistant", "content": f"The answer is {answer}"}

    # The trainer's forward over prompt + all turns gives the rollout's log-probs back.
    width = out.batch["responses"].shape[1]
    with torch.no_grad():
        (recomputed,) = compute_response_log_probs(
            tool_model,
            out.batch["input_ids"],
            out.batch["attention_mask"],
            out.batch["position_ids"],
            response_len=width,
        )[:1]
    mask = out.batch["response_mask"].bool()
    diff = (recomputed - out.batch["rollout_log_probs"]).abs()[mask]
    assert float(diff.max()) < 1e-4
    # Tool tokens are attended to, not trained on.
    real = out.batch["attention_mask"][:, -width:].bool()
    assert int((real & ~mask).sum()) > 0 and bool((real | ~mask).all())


def test_tool_tokens_do_not_change_the_loss(tokenizer, tool_model):
    out = rollout(tokenizer, tool_model)
    b = out.batch
    width = b["responses"].shape[1]
    mask = b["response_mask"]
    tool = b["attention_mask"][:, -width:].bool() & ~mask.bool()
    policy_loss_fn = POLICY_LOSSES.entry("vanilla").target
    gen = torch.Generator().manual_seed(0)
    advantages = torch.randn(mask.shape, generator=gen)
    old = b["rollout_log_probs"] + 0.05 * torch.randn(mask.shape, generator=gen)

    def grads(adv, old_lp):
        tool_model.zero_grad()
        lp = compute_response_log_probs(
            tool_model, b["input_ids"], b["attention_mask"], b["position_ids"], response_len=width
        )[0]
        loss, _ = actor_loss(
            lp, old_lp, adv, mask, policy_loss_fn=policy_loss_fn, loss_agg_mode="token-mean"
        )
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in tool_model.parameters()]

    loss0, g0 = grads(advantages, old)
    loss1, g1 = grads(
        advantages + 100.0 * torch.randn(mask.shape, generator=gen) * tool,
        old + 5.0 * tool,
    )
    assert torch.equal(loss0, loss1)
    assert all(torch.equal(a, c) for a, c in zip(g0, g1))
    # The same perturbation on model tokens does change the gradient: the test can fail.
    _, g2 = grads(advantages + 1.0 * mask, old)
    assert any(not torch.allclose(a, c) for a, c in zip(g0, g2))
    tool_model.zero_grad()
