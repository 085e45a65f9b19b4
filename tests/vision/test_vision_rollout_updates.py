"""The rollout of an image run samples from the updated policy, not the initial weights.

The ``hf`` and ``native`` engines generate with the actor's own module (no weight copy to
sync), so after step 1's update the rollout log-probs of step 2's samples must equal the
updated actor's recomputed ones (the old-log-prob pass) and differ from the initial
model's. Two GRPO steps of the tiny Qwen2-VL, fp32, lr 1e-2, with a reward that varies
within groups (the share of even token ids) so the update moves the policy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.config import load_config
from verl.kernels.torch_functional import compute_response_log_probs
from verl.models.vision_model import load_vision_model
from verl.trainer.rl.trainer import RLTrainer
from verl.workers.vision_inputs import forward_inputs


def _even_token_reward(batch):
    """Score: the share of a response's tokens with an even id, on its last token."""
    b = batch.batch
    responses, mask = b["responses"], b["response_mask"]
    score = ((responses % 2 == 0) & mask.bool()).sum(-1) / mask.sum(-1).clamp(min=1)
    scores = torch.zeros(responses.shape, dtype=torch.float32)
    last = (mask.sum(-1) - 1).clamp(min=0)
    scores[torch.arange(len(responses)), last] = score.float()
    values = score.double().numpy()
    return scores, {}, {"score": values, "acc": np.array(values)}


@pytest.mark.slow
@pytest.mark.parametrize("rollout", ["hf", "native"])
def test_step_two_samples_from_the_updated_policy(vl, tmp_path, rollout):
    model_dir, train, _, _ = vl
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            f"data.train_files={train}",
            f"data.val_files={train.parent / 'test.parquet'}",
            f"actor_rollout_ref.rollout.name={rollout}",
            "algorithm.adv_estimator=grpo",
            "data.train_batch_size=4",
            "data.max_prompt_length=64",
            "data.max_response_length=4",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.optim.lr=1e-2",
            "actor_rollout_ref.actor.entropy_coeff=0",
            # the separate old-log-prob pass: the updated actor's log-probs of each batch
            "actor_rollout_ref.actor.recompute_old_log_prob=true",
            "trainer.total_training_steps=2",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "trainer.mixed_precision=none",
            "trainer.logger=[]",
            f"trainer.default_local_dir={tmp_path}",
            f"trainer.log_dir={tmp_path}",
        ]
    )
    trainer = RLTrainer(cfg, reward_fn=_even_token_reward)
    batches = []
    prepare_update = trainer.prepare_update

    def recording(gen, *args, **kwargs):
        out, metrics = prepare_update(gen, *args, **kwargs)
        batches.append(out)
        return out, metrics

    trainer.prepare_update = recording
    try:
        trainer.fit()
    finally:
        trainer.close()
    assert len(batches) == 2
    initial = load_vision_model(model_dir).float().eval()
    gaps = []
    for gen in batches:
        b = gen.batch
        mask = b["response_mask"].bool()
        positions, inputs = forward_inputs(gen)
        with torch.no_grad():
            initial_lp, _ = compute_response_log_probs(
                initial,
                b["input_ids"],
                b["attention_mask"],
                positions,
                response_len=b["responses"].shape[1],
                model_inputs=inputs,
            )
        to_actor = (b["rollout_log_probs"] - b["old_log_probs"])[mask].abs().max().item()
        to_initial = (b["rollout_log_probs"] - initial_lp)[mask].abs().max().item()
        gaps.append((to_actor, to_initial))
    (actor_1, initial_1), (actor_2, initial_2) = gaps
    assert actor_1 < 1e-4 and initial_1 < 1e-4, gaps  # step 1: nothing updated yet
    # step 2: the rollout's log-probs are the updated actor's (fp32 bound) ...
    assert actor_2 < 1e-4, gaps
    # ... and not the initial weights' (0.5 to 1.1 nats at this lr, measured over seeds)
    assert initial_2 > 0.05, gaps
