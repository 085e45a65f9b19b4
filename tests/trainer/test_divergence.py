"""A run whose final actor update had a non-finite loss ends with `NonFiniteLossError` and
exports nothing (issue 20: "a run whose loss diverged ends with a non-zero exit and does
not overwrite the last good export")."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from verl.engine import NonFiniteLossError
from verl.trainer.ppo_trainer import RLTrainer

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
        rl_config("actor_rollout_ref.actor.optim.lr=1e3", "trainer.total_training_steps=6")
    )
    with pytest.raises(NonFiniteLossError):
        trainer.fit()
    assert not (tmp_path / "huggingface").exists()
