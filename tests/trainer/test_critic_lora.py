"""Critic LoRA (``critic.model.lora_rank``): adapters in the value model's body, the value head
fully trainable, the body's weights frozen, export folding the adapters in."""

from __future__ import annotations

import pytest
import torch

from verl.cli.export import merge_checkpoint
from verl.models.lora import LoraSpec, apply_lora_to_value_model, merged_state_dict
from verl.models.value_model import CausalLMWithValueHead
from verl.trainer.rl.trainer import RLTrainer

CRITIC_LORA = (
    "algorithm.adv_estimator=gae",
    "critic.model.lora_rank=4",
    "critic.model.lora_alpha=8",
    "critic.optim.lr=1e-2",
    "critic.optim.weight_decay=0.0",
    "critic.ppo_mini_batch_size=2",
    "critic.ppo_micro_batch_size_per_device=2",
    "trainer.val_before_train=false",
)


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(3, 200, (3, 12), generator=torch.Generator().manual_seed(0))


def _values(module: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return module(input_ids=ids, attention_mask=torch.ones_like(ids)).float()


def test_value_model_lora_trains_adapters_and_the_whole_head(tiny_model_dir, ids):
    critic = CausalLMWithValueHead.from_pretrained(tiny_model_dir)
    before = _values(critic, ids)
    apply_lora_to_value_model(critic, LoraSpec(rank=4, alpha=8))
    trainable = {n for n, p in critic.named_parameters() if p.requires_grad}
    assert {"value_head.weight", "value_head.bias"} <= trainable
    assert all(".lora_" in n for n in trainable - {"value_head.weight", "value_head.bias"})
    assert any(".lora_A." in n for n in trainable)
    # lora_B starts at zero: the values are the plain model's, exactly
    torch.testing.assert_close(_values(critic, ids), before, rtol=0, atol=0)

    frozen = {n: p.detach().clone() for n, p in critic.named_parameters() if not p.requires_grad}
    optim = torch.optim.SGD([p for p in critic.parameters() if p.requires_grad], lr=1.0)
    critic(input_ids=ids, attention_mask=torch.ones_like(ids)).pow(2).mean().backward()
    optim.step()
    optim.zero_grad()
    critic(input_ids=ids, attention_mask=torch.ones_like(ids)).sub(1).pow(2).mean().backward()
    optim.step()
    params = dict(critic.named_parameters())
    assert all(torch.equal(params[n], frozen[n]) for n in frozen)
    assert not torch.equal(_values(critic, ids), before)

    # the adapters folded into the body: a plain value model computes the same values
    plain = CausalLMWithValueHead.from_pretrained(tiny_model_dir)
    merged = merged_state_dict(critic.state_dict(), scaling=8 / 4)
    plain.load_state_dict(merged, strict=True)
    # folding changes float rounding: values are ~10, so the tolerance is relative as well
    torch.testing.assert_close(_values(plain, ids), _values(critic, ids), rtol=1e-5, atol=1e-5)


def test_value_model_lora_names_the_modules_that_matched_nothing(tiny_model_dir):
    critic = CausalLMWithValueHead.from_pretrained(tiny_model_dir)
    with pytest.raises(ValueError, match=r"target_modules=\['no_such_proj'\].*matched no layer"):
        apply_lora_to_value_model(critic, LoraSpec(rank=4, target_modules=["no_such_proj"]))


@pytest.mark.slow
def test_ppo_with_a_lora_critic_trains_and_exports(rl_config, tiny_model_dir, ids, tmp_path):
    trainer = RLTrainer(rl_config(*CRITIC_LORA, "trainer.save_freq=2"))
    module = trainer.critic_wg.workers[0].engine.module
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    result = trainer.fit()
    assert [h["critic/vf_loss"] > 0 for h in trainer.history] == [True, True]

    after = dict(module.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert "value_head.weight" in moved
    assert moved - {"value_head.weight", "value_head.bias"}
    assert all(".lora_" in n for n in moved - {"value_head.weight", "value_head.bias"})

    # verl export --role critic: a plain critic directory with the adapters folded in
    out = merge_checkpoint(result["checkpoint"], tmp_path / "critic", role="critic")
    exported = CausalLMWithValueHead.from_pretrained(out)
    assert not any("lora" in n for n, _ in exported.named_parameters())
    torch.testing.assert_close(_values(exported, ids), _values(module, ids), rtol=0, atol=1e-5)
