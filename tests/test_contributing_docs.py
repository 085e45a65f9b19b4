"""Each example of docs/contributing.md ("Adding an estimator, ...") runs and works.

The ```python blocks of that section are executed as written; each registers one entry,
which is then used the way verl uses it (and unregistered again).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from verl.algorithms import actor_loss
from verl.config import ConfigError, load_config
from verl.protocol import DataProto
from verl.registry import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    REWARD_SCORERS,
    ROLLOUT_BACKENDS,
)
from verl.rewards import default_compute_score
from verl.rollout import SamplingParams, build_rollout

DOC = Path(__file__).resolve().parents[1] / "docs" / "contributing.md"
SECTION = "## Adding an estimator, a loss, a scorer or a rollout backend"


def examples() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def run_example(index: int, registry, name: str):
    code = examples()[index]
    assert f'"{name}"' in code
    namespace: dict = {}
    exec(compile(code, f"{DOC.name}[example {index}]", "exec"), namespace)
    assert name in registry
    return namespace


@pytest.fixture
def cleanup():
    added = []
    yield added.append
    for registry, name in added:
        registry.remove(name)


def test_the_section_has_one_example_per_extension_point():
    assert len(examples()) == 4


def test_estimator_example(cleanup):
    run_example(0, ADVANTAGE_ESTIMATORS, "sign_of_score")
    cleanup((ADVANTAGE_ESTIMATORS, "sign_of_score"))
    entry = ADVANTAGE_ESTIMATORS.entry("sign_of_score")
    assert entry.hyperparameters == {"scale": 1.0}
    rewards = torch.tensor([[0.0, 2.0, 9.0], [0.0, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    inputs = {"token_level_rewards": rewards, "response_mask": mask, "values": None}
    adv, _ = entry.target(**entry.call_kwargs(inputs, {"scale": 0.5}))
    assert adv.tolist() == [[0.5, 0.5, 0.0], [-0.5, -0.5, -0.5]]
    overrides = ["algorithm.adv_estimator=sign_of_score", "algorithm.adv_estimator_kwargs.scale=2"]
    assert load_config(overrides=overrides).algorithm.adv_estimator_kwargs == {"scale": 2}
    with pytest.raises(ConfigError, match="its hyperparameters are: scale; did you mean scale"):
        load_config(overrides=[*overrides[:1], "algorithm.adv_estimator_kwargs.scal=2"])


def test_policy_loss_example(cleanup):
    run_example(1, POLICY_LOSSES, "shifted_reinforce")
    cleanup((POLICY_LOSSES, "shifted_reinforce"))
    entry = POLICY_LOSSES.entry("shifted_reinforce")
    assert entry.hyperparameters == {"advantage_shift": 0.0}
    log_prob = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    advantages = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    kwargs = entry.call_kwargs({"clip_ratio_low": 0.2}, {"advantage_shift": 1.0})
    loss, metrics = actor_loss(
        log_prob,
        log_prob.detach(),
        advantages,
        mask,
        policy_loss_fn=entry.target,
        policy_loss_kwargs=kwargs,
    )
    # -(A - 1) * log_prob over the 3 valid tokens: (0 + 0 + (-3 * 0.5)) / 3
    assert loss.item() == pytest.approx(-0.5)
    assert "pg_loss" in metrics and "approx_kl" in metrics
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, 0.0], [1.0, 0.0]]))


def test_scorer_example(cleanup):
    run_example(2, REWARD_SCORERS, "exact_match")
    cleanup((REWARD_SCORERS, "exact_match"))
    assert default_compute_score("exact_match", " 42 ", 42) == {"score": 1.0, "acc": 1.0}
    assert default_compute_score("exact_match", "41", "42")["score"] == 0.0


def test_rollout_backend_example(cleanup):
    from verl.models.tiny import build_tiny_model, build_tiny_tokenizer
    from verl.rollout.native import NativeRollout

    run_example(3, ROLLOUT_BACKENDS, "native_greedy")
    cleanup((ROLLOUT_BACKENDS, "native_greedy"))
    assert load_config(overrides=["actor_rollout_ref.rollout.name=native_greedy"])
    tokenizer = build_tiny_tokenizer()
    tokenizer.padding_side = "left"
    model = build_tiny_model(tokenizer=tokenizer, hidden_size=32, num_layers=1, seed=0).eval()
    enc = tokenizer(["1+2=", "hello there"], return_tensors="pt", padding=True)
    prompts = DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": enc["attention_mask"],
            "position_ids": (enc["attention_mask"].cumsum(-1) - 1).clamp_min(0),
        }
    )
    sampled = SamplingParams(n=2, do_sample=True, max_new_tokens=5, seed=3)
    out = build_rollout("native_greedy", model, tokenizer).generate(prompts, sampled)
    greedy = NativeRollout(model, tokenizer).generate(
        prompts, SamplingParams(n=2, do_sample=False, max_new_tokens=5)
    )
    assert torch.equal(out.batch["responses"], greedy.batch["responses"])
