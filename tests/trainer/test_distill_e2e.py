"""On-policy distillation end to end: ``verl distill`` with the example config trains two
steps on the tiny model (teacher = another tiny model with the same tokenizer), the
teacher pass runs in every step and the update logs the distillation loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl import cli
from verl.config import load_config
from verl.models.tiny import save_tiny_model_dir
from verl.trainer.rl.passes import old_log_prob_pass

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "distill" / "opd_smollm2_arithmetic.yaml"

SHORT = (
    "data.train_batch_size=4",
    "data.max_response_length=6",
    "data.arithmetic.train_size=16",
    "data.arithmetic.val_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=8",
    "trainer.total_training_steps=2",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.mixed_precision=none",
    "trainer.device=cpu",
    "trainer.logger=[jsonl]",
)


def test_example_config_validates_with_a_teacher(tiny_model_dir):
    cfg = load_config(
        str(EXAMPLE),
        overrides=[
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"algorithm.distill.teacher_path={tiny_model_dir}",
        ],
    )
    assert cfg.algorithm.distill.enable and cfg.algorithm.distill.estimator == "k1"
    # one optimizer step per batch: the update's own log-probs stand in for the old ones
    assert not old_log_prob_pass(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["k3", "topk"])
def test_verl_distill_trains_the_example_two_steps(tiny_model_dir, tmp_path, estimator):
    teacher = save_tiny_model_dir(tmp_path / "teacher", arch="qwen2", seed=3)
    code = cli.main(
        [
            "distill",
            "--config",
            str(EXAMPLE),
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"algorithm.distill.teacher_path={teacher}",
            f"algorithm.distill.estimator={estimator}",
            "algorithm.distill.topk=4",
            *SHORT,
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            f"trainer.log_dir={tmp_path / 'logs'}",
        ]
    )
    assert code == 0
    rows = [
        json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    trained = [r for r in rows if "actor/distill_loss" in r]
    assert [r["step"] for r in trained] == [1, 2]
    for r in trained:
        assert r["actor/distill_loss"] > 0  # a different teacher: a positive KL
        assert r["actor/distill_coef"] == 1.0
    assert (tmp_path / "ckpt" / "huggingface" / "config.json").is_file()
