"""The RL loop with per-role precision, and the non-finite guard stopping a run."""

from __future__ import annotations

import math

import pytest
import torch

from verl.engine import NonFiniteLossError
from verl.engine.base import TrainEngine
from verl.trainer.rl.trainer import RLTrainer

PPO = (
    "algorithm.adv_estimator=gae",
    "algorithm.use_kl_in_reward=true",
    "critic.ppo_mini_batch_size=2",
    "critic.ppo_micro_batch_size_per_device=2",
    "trainer.val_before_train=false",
)


def test_ppo_trains_with_bf16_roles_and_an_fp16_reference(rl_config):
    cfg = rl_config(
        *PPO, "trainer.mixed_precision=bf16", "trainer.model_precision_map={reference: fp16}"
    )
    trainer = RLTrainer(cfg)
    trainer.fit()
    assert len(trainer.history) == 2
    for metrics in trainer.history:
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm"):
            assert math.isfinite(metrics[key]), (key, metrics[key])
        assert metrics["actor/skipped_steps"] == 0.0


def test_grpo_trains_with_an_fp8_reference(rl_config):
    cfg = rl_config(
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "trainer.val_before_train=false",
        "trainer.model_precision_map={reference: fp8}",
    )
    trainer = RLTrainer(cfg)
    trainer.fit()
    assert len(trainer.history) == 2
    for metrics in trainer.history:
        # the fp8 reference differs from the (initially identical) fp32 policy by rounding
        assert math.isfinite(metrics["actor/kl_loss"]), metrics["actor/kl_loss"]
    assert trainer.history[0]["actor/kl_loss"] != 0.0


def test_grpo_trains_with_an_int4_reference(rl_config):
    from verl.models.int4 import is_int4_model

    cfg = rl_config(
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "trainer.val_before_train=false",
        "trainer.model_precision_map={reference: int4}",
    )
    trainer = RLTrainer(cfg)
    worker = trainer.actor_rollout_wg.workers[0]
    assert is_int4_model(worker.ref_engine.module) and not is_int4_model(worker.engine.module)
    trainer.fit()
    assert len(trainer.history) == 2
    # the int4 reference differs from the (initially identical) fp32 policy by rounding
    kl = [m["actor/kl_loss"] for m in trainer.history]
    assert all(math.isfinite(v) for v in kl) and kl[0] != 0.0


def test_nonfinite_guard_stops_the_run_with_a_clear_error(rl_config, monkeypatch):
    monkeypatch.setattr(TrainEngine, "_grad_norm", lambda self: torch.tensor(float("nan")))
    cfg = rl_config("trainer.val_before_train=false", "trainer.max_consecutive_nonfinite_steps=2")
    trainer = RLTrainer(cfg)
    # 4 prompts in mini-batches of 2: the first step makes two optimizer steps, both bad
    with pytest.raises(NonFiniteLossError, match=r"2 optimizer steps in a row .* stopping"):
        trainer.fit()
    assert trainer.history == []  # the step never completed, so nothing after it ran


def test_make_trainer_config_takes_the_flat_keys():
    from verl.config import ConfigError
    from verl.trainer.api import make_trainer_config

    cfg = make_trainer_config("ppo", mixed_precision="bf16", max_grad_norm=0.3)
    assert cfg.trainer.mixed_precision == "bf16"
    assert cfg.actor_rollout_ref.actor.grad_clip == cfg.critic.grad_clip == 0.3
    with pytest.raises(ConfigError, match="trainable roles mix bf16 and fp16"):
        make_trainer_config(
            "ppo", overrides=["actor_rollout_ref.actor.precision=bf16", "critic.precision=fp16"]
        )


@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="needs oneDNN bf16 kernels (an AVX-512 bf16 / AMX CPU)",
)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_packed_bf16_rollout_weights_follow_every_update(
    rl_config, tmp_path, monkeypatch, packed_calls, lora
):
    """The native engine's packed bf16 weights follow every optimizer step (fused AdamW
    updates parameters without bumping their version counters): bf16 PPO for 3 steps, with
    packing and with it turned off, gives the same samples, losses and gradient norms step
    for step, with full fine-tuning and with LoRA adapters."""
    from verl.rollout.native import NativeRollout
    from verl.testing import assert_same_metrics

    extra = ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8"]
    overrides = (
        *PPO,  # GAE: the critic's values give every step a policy gradient
        "trainer.total_training_steps=3",
        "trainer.mixed_precision=bf16",
        *(extra if lora else []),
    )
    from verl.rollout import native

    lean_calls = []  # the lean forward packs its own weights (full fine-tuning)
    real_lean = native.LeanForward
    monkeypatch.setattr(native, "LeanForward", lambda *a: lean_calls.append(1) or real_lean(*a))
    packed = RLTrainer(rl_config(*overrides, f"trainer.default_local_dir={tmp_path / 'a'}"))
    packed.fit()
    assert len(packed_calls) + len(lean_calls) >= 3 and all(packed_calls), (
        "the packed path did not run for every generation"
    )
    assert bool(lean_calls) != lora  # LoRA layers take the HF forward
    real_init = NativeRollout.__init__

    def unpacked(self, *args, **kwargs):
        real_init(self, *args, **{**kwargs, "pack_weights": False})

    monkeypatch.setattr(NativeRollout, "__init__", unpacked)
    plain = RLTrainer(rl_config(*overrides, f"trainer.default_local_dir={tmp_path / 'b'}"))
    plain.fit()
    assert len(packed.history) == 3
    assert_same_metrics(packed.history, plain.history)
