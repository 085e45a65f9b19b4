"""The trainer keys upstream verl's run scripts use, done natively: ``trainer.critic_warmup``
(the critic trains alone first), ``trainer.val_only`` (one validation, nothing trained), and
``trainer.rollout_data_dir`` / ``validation_data_dir`` (every generated sample as jsonl)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from verl.config import ConfigError
from verl.trainer.lifecycle.checkpoint import complete_checkpoints
from verl.trainer.rl.trainer import RLTrainer

GAE = (
    "algorithm.adv_estimator=gae",
    "critic.ppo_mini_batch_size=2",
    "critic.ppo_micro_batch_size_per_device=2",
    "critic.optim.lr=1e-3",
    "trainer.val_before_train=false",
)


def _weights(group) -> dict[str, torch.Tensor]:
    """The weights of a one-process (local) group's worker."""
    return {k: v.clone() for k, v in group.workers[0].engine.module.state_dict().items()}


def _changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(before[k], after[k]) for k in before)


def test_critic_warmup_updates_only_the_critic_for_its_steps(rl_config):
    trainer = RLTrainer(
        rl_config(*GAE, "trainer.critic_warmup=2", "trainer.total_training_steps=3")
    )
    try:
        batches = iter(trainer.train_loader)
        actor, critic = _weights(trainer.actor_rollout_wg), _weights(trainer.critic_wg)
        for step in (1, 2):
            trainer.global_step = step
            metrics = trainer.train_step(next(batches))
            assert metrics["actor/critic_warmup"] == 1.0
            assert "actor/pg_loss" not in metrics and math.isfinite(metrics["critic/vf_loss"])
        assert not _changed(actor, _weights(trainer.actor_rollout_wg))
        assert _changed(critic, _weights(trainer.critic_wg))
        trainer.global_step = 3
        metrics = trainer.train_step(next(batches))
        assert "actor/critic_warmup" not in metrics and math.isfinite(metrics["actor/pg_loss"])
        assert _changed(actor, _weights(trainer.actor_rollout_wg))
    finally:
        trainer.close()


def test_critic_warmup_needs_a_critic(rl_config):
    with pytest.raises(ConfigError, match=r"trainer\.critic_warmup=2: the run has no critic"):
        rl_config("algorithm.adv_estimator=grpo", "trainer.critic_warmup=2")


def test_val_only_validates_once_and_trains_nothing(rl_config, tmp_path):
    run = tmp_path / "run"
    straight = RLTrainer(rl_config("trainer.save_freq=2", f"trainer.default_local_dir={run}")).fit()
    checkpoint = run / "global_step_2"
    assert complete_checkpoints(run) == [(2, checkpoint)]
    # the resumed checkpoint is validated at its step; nothing is saved or exported again
    (run / "huggingface").rename(tmp_path / "exported")
    trainer = RLTrainer(rl_config("trainer.val_only=true", f"trainer.default_local_dir={run}"))
    results = trainer.fit()
    assert results["resumed_from"] == checkpoint
    assert results["val_only"] == straight["val_after"]  # greedy validation, same weights
    assert trainer.history == [] and trainer.global_step == 2
    assert complete_checkpoints(run) == [(2, checkpoint)]
    assert not (run / "huggingface").exists()


def test_val_only_without_validation_data_is_refused(rl_config):
    trainer = RLTrainer(rl_config("trainer.val_only=true", "data.arithmetic.val_size=0"))
    with pytest.raises(ValueError, match=r"trainer\.val_only=true needs validation data"):
        trainer.fit()


def test_rollouts_and_validations_are_written_as_jsonl(rl_config, tmp_path):
    rollouts, validations = tmp_path / "rollouts", tmp_path / "val"
    trainer = RLTrainer(
        rl_config(
            f"trainer.rollout_data_dir={rollouts}",
            f"trainer.validation_data_dir={validations}",
            "trainer.test_freq=1",
        )
    )
    trainer.fit()
    assert sorted(p.name for p in rollouts.iterdir()) == ["1.jsonl", "2.jsonl"]
    for step, metrics in enumerate(trainer.history, start=1):
        rows = [json.loads(line) for line in (rollouts / f"{step}.jsonl").read_text().splitlines()]
        assert len(rows) == 4 * 2  # train_batch_size x rollout.n
        assert {"prompt", "response", "ground_truth", "score", "data_source"} <= rows[0].keys()
        assert all(row["step"] == step for row in rows)
        mean = sum(row["score"] for row in rows) / len(rows)
        assert mean == pytest.approx(metrics["critic/score/mean"], abs=1e-6)
    # validation before training (step 0) and after each step
    assert sorted(p.name for p in validations.iterdir()) == ["0.jsonl", "1.jsonl", "2.jsonl"]
    rows = [json.loads(line) for line in (validations / "2.jsonl").read_text().splitlines()]
    assert len(rows) == 4  # data.arithmetic.val_size, one greedy response each
    mean = sum(r["score"] for r in rows) / len(rows)
    assert mean == pytest.approx(trainer.validation_history[-1]["val/score"], abs=1e-6)


def test_an_unwritable_sample_directory_is_named_before_loading(rl_config):
    with pytest.raises(
        ValueError, match=r"trainer\.rollout_data_dir='/dev/null/x' is not a writable"
    ):
        RLTrainer(rl_config("trainer.rollout_data_dir=/dev/null/x"))
