"""LoRA through peft in the RL loop: only adapters train, the reference is the base model,
export merges the adapters, and a resumed run is bit for bit the uninterrupted one."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from verl.cli.export import merge_checkpoint
from verl.models.lora import LORA_ADAPTER_DIR
from verl.rewards.placement import place_on_last_token
from verl.testing import assert_bitwise, checkpoint_tensors
from verl.trainer.rl.trainer import RLTrainer

LORA = (
    "actor_rollout_ref.model.lora_rank=4",
    "actor_rollout_ref.model.lora_alpha=8",
    "actor_rollout_ref.actor.use_kl_loss=true",  # the reference is used every step
    "actor_rollout_ref.actor.optim.weight_decay=0.0",
    "trainer.val_before_train=false",
)


def even_token_reward(batch):
    """Fraction of even token ids in the response: varies within a group, so advantages
    are nonzero from the first step."""
    responses, mask = batch.batch["responses"], batch.batch["response_mask"]
    even = ((responses % 2 == 0) & mask.bool()).sum(-1).float()
    score = even / mask.sum(-1).clamp(min=1).float()
    return place_on_last_token(score, mask), {}, {}


def _token_log_probs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(3, 200, (3, 12), generator=torch.Generator().manual_seed(0))


@pytest.mark.slow
def test_lora_trains_only_adapters_and_the_reference_is_the_base_model(
    rl_config, tiny_model_dir, ids, tmp_path
):
    trainer = RLTrainer(rl_config(*LORA, "trainer.save_freq=2"), reward_fn=even_token_reward)
    worker = trainer.actor_rollout_wg.workers[0]
    module = worker.engine.module
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert worker.ref_engine is None  # no second copy of the weights
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    result = trainer.fit()

    after = dict(module.named_parameters())
    moved = [n for n in before if not torch.equal(before[n], after[n])]
    assert moved and all(".lora_" in n for n in moved)
    assert any(".lora_B." in n for n in moved)  # B starts at zero: it moved off it
    assert trainer.history[-1]["actor/kl_loss"] != 0  # the policy left the reference

    # the reference (adapters disabled) is exactly the base model
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with module.disable_adapter():
        reference = _token_log_probs(module, ids)
    torch.testing.assert_close(reference, _token_log_probs(base, ids), rtol=0, atol=0)

    # the export is a plain HF model whose log-probs are the adapted model's
    adapted = _token_log_probs(module, ids)
    assert not torch.allclose(adapted, reference)
    exported = AutoModelForCausalLM.from_pretrained(result["hf_dir"], dtype=torch.float32)
    assert not any("lora" in n for n, _ in exported.named_parameters())
    torch.testing.assert_close(_token_log_probs(exported, ids), adapted, rtol=0, atol=1e-5)

    # the adapters alone, loaded by peft onto the base model, give the same log-probs
    from peft import PeftModel

    adapter_dir = tmp_path / "hf_adapter"
    adapter_dir.mkdir()
    peft_model = PeftModel.from_pretrained(base, str(result["hf_dir"]) + "/" + LORA_ADAPTER_DIR)
    torch.testing.assert_close(_token_log_probs(peft_model, ids), adapted, rtol=0, atol=1e-5)

    # the checkpoint exports (verl export / model_merger) to the same merged weights
    out = merge_checkpoint(result["checkpoint"], tmp_path / "merged")
    merged, saved = (
        load_file(out / "model.safetensors"),
        load_file(f"{result['hf_dir']}/model.safetensors"),
    )
    assert merged.keys() == saved.keys()
    for name in merged:
        torch.testing.assert_close(merged[name], saved[name], rtol=0, atol=1e-6)


# the checkpoints of the resume test also hold the merged HF model
HF_MODEL = "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"


@pytest.mark.slow
def test_lora_resume_is_bit_for_bit(rl_config, tmp_path):
    straight = RLTrainer(
        rl_config(
            *LORA, HF_MODEL, "trainer.save_freq=1", f"trainer.default_local_dir={tmp_path}/a"
        ),
        reward_fn=even_token_reward,
    )
    straight.fit()
    first = RLTrainer(
        rl_config(
            *LORA,
            HF_MODEL,
            "trainer.save_freq=1",
            "trainer.total_training_steps=1",
            f"trainer.default_local_dir={tmp_path}/b",
        ),
        reward_fn=even_token_reward,
    )
    first.fit()
    resumed = RLTrainer(
        rl_config(
            *LORA, HF_MODEL, "trainer.save_freq=1", f"trainer.default_local_dir={tmp_path}/b"
        ),
        reward_fn=even_token_reward,
    )
    resumed.fit()
    assert resumed.resumed_from is not None
    assert_bitwise(
        checkpoint_tensors(tmp_path / "a" / "global_step_2"),
        checkpoint_tensors(tmp_path / "b" / "global_step_2"),
    )
    # hf_model: the checkpoint's merged model is the run's final export, its adapters sit
    # in lora_adapter/, and verl export of the checkpoint folds them in to the same weights
    hf = tmp_path / "a" / "global_step_2" / "actor" / "huggingface"
    assert (hf / LORA_ADAPTER_DIR / "adapter_config.json").is_file()
    saved = load_file(hf / "model.safetensors")
    assert_bitwise(saved, load_file(tmp_path / "a" / "huggingface" / "model.safetensors"))
    merged = load_file(
        merge_checkpoint(tmp_path / "a" / "global_step_2", tmp_path / "merged")
        / "model.safetensors"
    )
    assert merged.keys() == saved.keys()
    for name in merged:
        torch.testing.assert_close(merged[name], saved[name], rtol=0, atol=1e-6)
