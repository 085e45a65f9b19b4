"""A short GRPO run (n=4) with shared-prompt packing trains the same weights as one that
computes every row's prompt (sharing off): only the packing differs, not the math."""

from __future__ import annotations

import pytest
import torch

import verl.kernels.packed_model as pm
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl.trainer import RLTrainer

A = "actor_rollout_ref.actor"
GRPO = (
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.n=4",
    f"{A}.ppo_mini_batch_size=4",  # one optimizer step per batch of 4 prompts x 4
    f"{A}.ppo_micro_batch_size_per_device=8",
    f"{A}.entropy_coeff=0.01",
    f"{A}.use_kl_loss=true",  # the reference pass shares prompts too
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
)


def _train(cfg) -> tuple[list[dict], dict[str, torch.Tensor]]:
    trainer = RLTrainer(cfg, tracker=Tracker([]))
    try:
        trainer.fit()
        module = trainer.actor_rollout_wg.workers[0].engine.module
        weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
    finally:
        trainer.close()
    return trainer.history, weights


@pytest.mark.slow
def test_grpo_with_shared_prompts_trains_like_without(rl_config, monkeypatch):
    shared = []
    real = pm.pack_shared_prefix
    monkeypatch.setattr(pm, "pack_shared_prefix", lambda *a, **k: shared.append(1) or real(*a, **k))
    history_on, weights_on = _train(rl_config(*GRPO))
    # 2 steps x (reference pass + update), at least one micro-batch each
    assert len(shared) >= 4
    shared.clear()
    history_off, weights_off = _train(rl_config(*GRPO, f"{A}.share_prompt_prefix=false"))
    assert not shared
    assert len(history_on) == len(history_off) == 2
    for row_on, row_off in zip(history_on, history_off, strict=True):
        for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert row_on[key] == pytest.approx(row_off[key], abs=1e-5), key
    assert history_on[0]["actor/grad_norm"] > 0  # a gradient was applied
    for name, value in weights_off.items():
        torch.testing.assert_close(weights_on[name], value, atol=1e-5, rtol=0)
