"""A run whose final actor update had a non-finite loss ends with `NonFiniteLossError` and
exports nothing (issue 20: "a run whose loss diverged ends with a non-zero exit and does
not overwrite the last good export"); one that diverges with finite numbers (a learning
rate of 10) ends with `TrainingDivergedError` the same way, and a sane run is not stopped."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from verl.engine import NonFiniteLossError
from verl.trainer.lifecycle.stopping import TrainingDivergedError
from verl.trainer.rl.trainer import RLTrainer

# GRPO learns nothing from the tiny model's all-zero arithmetic rewards; this reward varies
# within a group, so the update has a gradient to follow.
LENGTH_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str) % 3) / 2.0
"""


def _length_reward(tmp_path) -> str:
    path = tmp_path / "length_reward.py"
    path.write_text(LENGTH_REWARD)
    return f"custom_reward_function.path={path}"


pytestmark = pytest.mark.slow


def test_non_finite_loss_in_the_final_step_stops_without_export(rl_config, tmp_path):
    trainer = RLTrainer(rl_config("trainer.save_freq=1"))
    real = trainer.update_policy

    def update_policy(*args: Any, **kwargs: Any) -> dict[str, Any]:
        if trainer.global_step == 2:  # the model breaks after step 2's rollout
            engine = trainer.actor_rollout_wg.workers[0].engine
            with torch.no_grad():
                engine.module.get_output_embeddings().weight.fill_(float("nan"))
        return real(*args, **kwargs)

    trainer.update_policy = update_policy
    with pytest.raises(NonFiniteLossError, match="final step 2") as err:
        trainer.fit()
    assert "global_step_1" in str(err.value)  # names the last good checkpoint
    assert trainer.history[0]["actor/nonfinite_loss_steps"] == 0.0
    assert trainer.history[1]["actor/nonfinite_loss_steps"] >= 1.0
    assert (tmp_path / "global_step_1").is_dir()
    assert not (tmp_path / "global_step_2").exists()  # a broken step is never checkpointed
    assert not (tmp_path / "huggingface").exists()


def test_a_huge_learning_rate_ends_the_run_with_an_error(rl_config, tmp_path):
    """lr=1e3 with AdamW's weight decay wrecks the tiny model within a few steps (measured:
    the loss is NaN at step 6); the run used to save that model and exit 0."""
    trainer = RLTrainer(
        rl_config(
            "actor_rollout_ref.actor.optim.lr=1e3",
            "trainer.total_training_steps=6",
            # the finite-divergence guard would stop it at step 1: this tests the NaN path
            "trainer.divergence_max_grad_norm=0",
            "trainer.divergence_max_policy_kl=0",
        )
    )
    with pytest.raises(NonFiniteLossError):
        trainer.fit()
    assert not (tmp_path / "huggingface").exists()


def test_a_learning_rate_of_10_stops_with_the_message(rl_config, tmp_path):
    """lr=10 collapses the tiny policy in its first update (measured: the policy moves
    ~1e3 nats per token within step 1, entropy 6.57 -> 0 at step 2, and the gradient
    vanishes after); the run used to go on and export the collapsed model with exit 0."""
    trainer = RLTrainer(
        rl_config(
            _length_reward(tmp_path),
            "actor_rollout_ref.actor.optim.lr=10",
            "trainer.total_training_steps=4",
            "trainer.save_freq=1",
        )
    )
    with pytest.raises(TrainingDivergedError) as err:
        trainer.fit()
    message = str(err.value)
    assert message.startswith("training diverged at step 1: |actor/approx_kl|=")
    assert "> trainer.divergence_max_policy_kl=10 (1 step(s) in a row" in message
    assert "no checkpoint was saved before it" in message and "optim.lr" in message
    assert abs(trainer.history[0]["actor/approx_kl"]) > 100  # logged before the stop
    assert len(trainer.history) == 1
    assert not (tmp_path / "global_step_1").exists()  # a flagged step is never saved
    assert not (tmp_path / "huggingface").exists()


def test_a_finite_grad_norm_explosion_stops_after_the_streak(rl_config, tmp_path):
    """The probe's numbers: a finite grad norm of 1.6e6 from step 2 on. With
    max_consecutive_divergent_steps=2 step 2 is flagged and not saved, step 3 stops the
    run, naming step 1's checkpoint."""
    trainer = RLTrainer(
        rl_config(
            "trainer.save_freq=1",
            "trainer.total_training_steps=4",
            "trainer.max_consecutive_divergent_steps=2",
        )
    )
    real = trainer.update_policy

    def update_policy(*args: Any, **kwargs: Any) -> dict[str, Any]:
        metrics = real(*args, **kwargs)
        if trainer.global_step >= 2:
            metrics["actor/grad_norm"] = 1.6e6
        return metrics

    trainer.update_policy = update_policy
    with pytest.raises(TrainingDivergedError) as err:
        trainer.fit()
    message = str(err.value)
    assert message.startswith(
        "training diverged at step 3: actor/grad_norm=1.6e+06 > "
        "trainer.divergence_max_grad_norm=100000 (2 step(s) in a row; "
        "trainer.max_consecutive_divergent_steps=2)"
    )
    assert f"the last checkpoint, of a step before the divergence, is {tmp_path}" in message
    assert "global_step_1" in message
    assert (tmp_path / "global_step_1").is_dir()
    assert not (tmp_path / "global_step_2").exists()
    assert not (tmp_path / "global_step_3").exists()
    assert not (tmp_path / "huggingface").exists()


def test_a_sane_run_is_far_from_the_bounds(rl_config, tmp_path):
    """The default run (lr=1e-3 on the tiny model, varied rewards) finishes and exports;
    its largest grad norm and policy KL are orders of magnitude below the bounds."""
    cfg = rl_config(_length_reward(tmp_path), "trainer.total_training_steps=4")
    trainer = RLTrainer(cfg)
    results = trainer.fit()
    assert (tmp_path / "huggingface").is_dir() and "hf_dir" in results
    norms = [m["actor/grad_norm"] for m in trainer.history]
    kls = [abs(m["actor/approx_kl"]) for m in trainer.history]
    assert len(norms) == 4 and max(norms) > 0  # the reward gave the update a gradient
    assert max(norms) < cfg.trainer.divergence_max_grad_norm / 1e3
    assert max(kls) < cfg.trainer.divergence_max_policy_kl / 100
