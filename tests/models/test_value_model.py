"""Tests for verl/models/value_model.py: the critic with a value head and reward-model loading."""

import pytest
import torch
from transformers import AutoModel, LlamaConfig, LlamaForSequenceClassification

from verl.models import (
    CausalLMWithValueHead,
    build_tiny_model,
    build_tiny_tokenizer,
    enable_activation_checkpointing,
    load_reward_model,
    save_tiny_model_dir,
)
from verl.models.precision import is_activation_checkpointing


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def lm_dir(request, tmp_path_factory):
    return save_tiny_model_dir(
        tmp_path_factory.mktemp(request.param),
        arch=request.param,
        seed=1,
        tie_word_embeddings=request.param == "qwen2",
    )


def _batch():
    ids = torch.randint(3, 700, (3, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding
    ids[0, :2] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


def test_forward_shape_and_reference(lm_dir):
    critic = CausalLMWithValueHead.from_pretrained(lm_dir)
    assert not hasattr(critic, "lm_head") and "lm_head" not in str(critic.state_dict().keys())
    ids, mask, pos = _batch()
    values = critic(ids, mask, pos)
    assert values.shape == (3, 6) and values.dtype == torch.float32
    # Reference: the causal LM's final hidden state through the head by hand.
    lm = build_tiny_model(
        arch=critic.config.model_type,
        seed=1,
        tie_word_embeddings=critic.config.model_type == "qwen2",
    )
    with torch.no_grad():
        hidden = lm(
            input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True
        ).hidden_states[-1]
    ref = hidden @ critic.value_head.weight[0] + critic.value_head.bias[0]
    torch.testing.assert_close(values.detach(), ref, rtol=1e-5, atol=1e-6)


def test_value_head_init_and_padding_invariance(lm_dir):
    critic = CausalLMWithValueHead.from_pretrained(lm_dir)
    w, b = critic.value_head.weight, critic.value_head.bias
    assert w.shape == (1, 64) and torch.all(b == 0)
    assert 0.5e-3 < w.std().item() < 1.5e-3
    assert torch.equal(w, CausalLMWithValueHead.from_pretrained(lm_dir).value_head.weight)
    ids, mask, pos = _batch()
    with torch.no_grad():
        padded = critic(ids, mask, pos)
        alone = critic(ids[:1, 2:])
    torch.testing.assert_close(padded[0, 2:], alone[0], rtol=1e-4, atol=1e-6)
    assert padded.abs().max() < 0.05  # ~1e-3 * sqrt(64) scale


def test_bf16_body_gives_fp32_values(lm_dir):
    critic = CausalLMWithValueHead.from_pretrained(lm_dir, dtype="bf16")
    assert critic.model.dtype == torch.bfloat16 and critic.value_head.weight.dtype == torch.float32
    ids, mask, pos = _batch()
    assert critic(ids, mask, pos).dtype == torch.float32


def test_gradients_reach_body_and_checkpointing_matches(lm_dir):
    ids, mask, pos = _batch()

    def grads(critic):
        critic.train()
        critic(ids, mask, pos).pow(2).sum().mul(1e4).backward()
        return {n: p.grad.clone() for n, p in critic.named_parameters()}

    plain = grads(CausalLMWithValueHead.from_pretrained(lm_dir))
    ckpt_model = enable_activation_checkpointing(CausalLMWithValueHead.from_pretrained(lm_dir))
    assert is_activation_checkpointing(ckpt_model)
    ckpt = grads(ckpt_model)
    assert plain["model.layers.0.mlp.up_proj.weight"].abs().sum() > 0
    for name, g in plain.items():
        torch.testing.assert_close(ckpt[name], g, rtol=1e-4, atol=1e-8)


def test_save_load_round_trip(lm_dir, tmp_path):
    critic = CausalLMWithValueHead.from_pretrained(lm_dir)
    with torch.no_grad():
        critic.value_head.weight.add_(0.5)
        critic.value_head.bias.fill_(0.25)
    out = critic.save_pretrained(tmp_path / "critic")
    assert (out / "value_head.safetensors").is_file() and (out / "config.json").is_file()
    again = CausalLMWithValueHead.from_pretrained(out)
    sd, sd2 = critic.state_dict(), again.state_dict()
    assert sd.keys() == sd2.keys()
    for k in sd:
        assert torch.equal(sd[k], sd2[k]), k
    ids, mask, pos = _batch()
    assert torch.equal(critic(ids, mask, pos), again(ids, mask, pos))
    assert isinstance(AutoModel.from_pretrained(out), type(critic.model))


def test_load_reward_model(tmp_path):
    tok = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    rm = load_reward_model(tmp_path)
    assert not rm.training and rm.config.pad_token_id == tok.pad_token_id == 0
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = (ids != 0).long()
    with torch.no_grad():
        scores = rm(input_ids=ids, attention_mask=mask).logits
        alone = rm(input_ids=ids[:1, 2:]).logits
    assert scores.shape == (2, 1)
    torch.testing.assert_close(scores[0], alone[0], rtol=1e-4, atol=1e-5)


def test_critic_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        CausalLMWithValueHead.from_pretrained(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="has no weights"):
        load_reward_model(tmp_path)


def test_override_config_reaches_critic_and_reward_model(lm_dir, tmp_path):
    critic = CausalLMWithValueHead.from_pretrained(lm_dir, override_config={"rms_norm_eps": 0.25})
    assert critic.model.config.rms_norm_eps == 0.25
    rm_dir = save_tiny_model_dir(tmp_path / "rm", num_layers=1, reward_head=True)
    rm = load_reward_model(rm_dir, override_config={"rms_norm_eps": 0.25})
    assert rm.config.rms_norm_eps == 0.25
    with pytest.raises(ValueError, match=r"reward_model\.model\.override_config: 'nope'"):
        load_reward_model(rm_dir, override_config={"nope": 1})
