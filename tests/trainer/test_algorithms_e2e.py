"""Every registered advantage estimator and policy loss trains end to end on a tiny model.

Each case runs 2 RL steps on the tiny Qwen2 model (2 prompts x 2 responses, 4 tokens) with
a tensor reward that varies within a group (the fraction of even token ids in the
response), so advantages are nonzero, and checks that the losses and gradient norms are
finite and that the actor's weights moved (weight decay is off, so only the gradient moves
them).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from verl.algorithms import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
from verl.registry import PF_PPO_WEIGHTS
from verl.rewards.placement import place_on_last_token
from verl.trainer.rl.trainer import RLTrainer


def even_token_reward(batch):
    """Score = fraction of even token ids among the valid response tokens, on the last one."""
    responses, mask = batch.batch["responses"], batch.batch["response_mask"]
    even = ((responses % 2 == 0) & mask.bool()).sum(-1).float()
    score = even / mask.sum(-1).clamp(min=1).float()
    return place_on_last_token(score, mask), {"reward/even_mean": score.mean().item()}, {}


OVERRIDES = (
    "data.train_batch_size=2",
    "data.max_response_length=4",
    "data.arithmetic.train_size=8",
    "data.arithmetic.val_size=2",
    "actor_rollout_ref.actor.optim.weight_decay=0.0",
    "trainer.val_before_train=false",
    "trainer.logger=[]",
)


ESTIMATOR_CASES = {
    "gae": [
        "algorithm.adv_estimator=gae",
        "critic.ppo_mini_batch_size=2",
        "critic.ppo_micro_batch_size_per_device=2",
        "critic.optim.weight_decay=0.0",
    ],
    "grpo": ["algorithm.adv_estimator=grpo"],
    "dr_grpo": [
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=false",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
    ],
    "rloo": ["algorithm.adv_estimator=rloo"],
    "reinforce_plus_plus": ["algorithm.adv_estimator=reinforce_plus_plus"],
    "reinforce_plus_plus_baseline": ["algorithm.adv_estimator=reinforce_plus_plus_baseline"],
    "remax": ["algorithm.adv_estimator=remax"],
    "opo": ["algorithm.adv_estimator=opo"],
    "gpg": ["algorithm.adv_estimator=gpg"],
    "grpo_passk": ["algorithm.adv_estimator=grpo_passk"],
    "optimal_token_baseline": ["algorithm.adv_estimator=optimal_token_baseline"],
}
LOSS_CASES = {
    name: [f"actor_rollout_ref.actor.policy_loss={name}"]
    for name in ("gspo", "cispo", "clip_cov", "kl_cov", "reinforce", "sapo", "gmpo")
}
# a test of its own marks the run slow (test_decoupled_ppo_trains); here only the name
DECOUPLED = "actor_rollout_ref.actor.policy_loss=decoupled_ppo"
# the paper's pairing; "gpg" alone is the estimator's case
LOSS_CASES["gpg_loss"] = ["algorithm.adv_estimator=gpg", "actor_rollout_ref.actor.policy_loss=gpg"]
# The rest of the loop's options, each on top of GRPO.
OPTION_CASES = {
    "rollout_is": ["actor_rollout_ref.actor.rollout_is_threshold=2.0"],
    "rollout_is_sequence": [
        "actor_rollout_ref.actor.rollout_is_threshold=2.0",
        "actor_rollout_ref.actor.rollout_is_level=sequence",
    ],
    "rollout_rs": ["actor_rollout_ref.actor.rollout_rs_threshold=1.5"],
    "dapo": [
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=seq_reward",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
    ],
    "kl_loss": ["actor_rollout_ref.actor.use_kl_loss=true"],
    **{
        f"pf_ppo_{m}": ["algorithm.use_pf_ppo=true", f"algorithm.pf_ppo.reweight_method={m}"]
        for m in ("pow", "max_min", "max_random")
    },
    "kl_in_reward_adaptive": [
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.type=adaptive",
    ],
}
CASES = {**ESTIMATOR_CASES, **LOSS_CASES, **OPTION_CASES}
assert len(CASES) == len(ESTIMATOR_CASES) + len(LOSS_CASES) + len(OPTION_CASES), "case names clash"


def test_every_registered_estimator_and_loss_has_a_case():
    estimators = {o.split("=")[1] for v in ESTIMATOR_CASES.values() for o in v if "estimator" in o}
    assert estimators == set(ADVANTAGE_ESTIMATORS.names())
    losses = {o.split("=")[1] for v in LOSS_CASES.values() for o in v if ".policy_loss=" in o}
    assert losses | {"vanilla", "decoupled_ppo"} == set(POLICY_LOSSES.names())
    reweights = {o.split("=")[1] for v in OPTION_CASES.values() for o in v if "reweight" in o}
    assert reweights == set(PF_PPO_WEIGHTS.names())


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(model_dir) / "model.safetensors"))


@pytest.mark.parametrize("case", list(CASES))
def test_two_steps_train(rl_config, case, tiny_model_dir):
    trainer = RLTrainer(rl_config(*OVERRIDES, *CASES[case]), reward_fn=even_token_reward)
    result = trainer.fit()

    assert trainer.global_step == 2
    for metrics in trainer.history:
        for key, value in metrics.items():
            if isinstance(value, float):
                assert math.isfinite(value), f"{case}: {key}={value}"
        # PF-PPO may redraw a step's responses from groups with equal rewards only (zero
        # advantages, so no gradient that step); it must train on some step
        assert metrics["actor/grad_norm"] > 0 or case.startswith("pf_ppo"), case
        assert "actor/pg_loss" in metrics
        if case == "gae":
            assert metrics["critic/grad_norm"] > 0 and "critic/vf_loss" in metrics
        if case.startswith("rollout_"):
            # same weights and precision: every weight is 1, nothing truncated or rejected
            assert metrics["actor/rollout_is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
            assert metrics["actor/rollout_is_clipfrac"] == 0.0
            assert metrics["actor/rollout_is_ess"] == pytest.approx(1.0, abs=1e-4)
        if case == "rollout_rs":
            assert metrics["actor/rollout_rs_reject_frac"] == 0.0
        if case == "dapo":
            assert metrics["dapo/num_gen_batches"] >= 1
        if case.startswith("pf_ppo"):
            assert 0 < metrics["pf_ppo/unique_fraction"] <= 1
    assert any(m["actor/grad_norm"] > 0 for m in trainer.history), case
    before, after = _weights(tiny_model_dir), _weights(result["hf_dir"])
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, f"{case}: no actor weight changed"


@pytest.mark.slow
def test_decoupled_ppo_trains(rl_config, tiny_model_dir):
    """Two synchronous steps with decoupled PPO: fresh samples, so the behaviour and the
    proximal policy agree to float precision and every behaviour weight is ~1."""
    trainer = RLTrainer(rl_config(*OVERRIDES, DECOUPLED), reward_fn=even_token_reward)
    result = trainer.fit()
    assert trainer.global_step == 2
    for metrics in trainer.history:
        assert metrics["actor/behaviour_weight_mean"] == pytest.approx(1.0, abs=1e-3)
        assert metrics["actor/behaviour_weight_clipfrac"] == 0.0
        assert "actor/rollout_is_weight_mean" not in metrics
    before, after = _weights(tiny_model_dir), _weights(result["hf_dir"])
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_rollout_logprob_mismatch_is_zero_in_fp32(rl_config):
    # The native rollout samples from the training module's own weights in fp32: its
    # sampling log-probs and the trainer's recomputed old log-probs agree to float precision.
    cfg = rl_config(
        *OVERRIDES,
        "actor_rollout_ref.model.dtype=fp32",
        "actor_rollout_ref.rollout.name=native",
        "data.max_response_length=8",
        "trainer.total_training_steps=1",
    )
    trainer = RLTrainer(cfg, reward_fn=even_token_reward)
    gen, metrics = trainer.collect_data(next(iter(trainer.train_loader)))
    assert gen.batch["response_mask"].sum() > 0
    assert metrics["rollout/logprob_abs_diff_max"] < 1e-5
    assert metrics["rollout/logprob_abs_diff_mean"] < 1e-5
    assert abs(metrics["rollout/kl_k3"]) < 1e-5
    assert abs(metrics["rollout/kl_k1"]) < 1e-5
    assert metrics["rollout/geo_ratio_min"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["rollout/geo_ratio_max"] == pytest.approx(1.0, abs=1e-5)
    trainer.close()
