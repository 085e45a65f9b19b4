"""Bad inputs stop `RLTrainer(config)` itself, before the first step (docs/errors.md)."""

from __future__ import annotations

import shutil

import pytest

from verl.config import ConfigError
from verl.trainer.rl.trainer import RLTrainer


def test_missing_data_file_fails_config_validation(rl_config, tmp_path):
    missing = tmp_path / "nope.parquet"
    with pytest.raises(ConfigError) as err:
        RLTrainer(rl_config(f"data.train_files=[{missing}]"))
    assert f"data.train_files: file '{missing}' does not exist" in str(err.value)


def test_nonexistent_model_path_fails_config_validation(rl_config, tmp_path):
    missing = tmp_path / "no-model"
    with pytest.raises(ConfigError) as err:
        RLTrainer(rl_config(f"actor_rollout_ref.model.path={missing}"))
    msg = str(err.value)
    assert f"actor_rollout_ref.model.path={missing}: no such local model directory" in msg


def test_model_directory_without_weights(rl_config, tiny_model_dir, tmp_path):
    no_weights = tmp_path / "no-weights"
    shutil.copytree(tiny_model_dir, no_weights, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(FileNotFoundError) as err:
        RLTrainer(rl_config(f"actor_rollout_ref.model.path={no_weights}"))
    assert f"model directory '{no_weights.resolve()}' has no weights" in str(err.value)


def test_tokenizer_without_chat_template(rl_config, tiny_model_dir, tmp_path):
    from verl.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.chat_template = None
    with pytest.raises(ValueError) as err:
        RLTrainer(rl_config(), tokenizer=tokenizer)
    assert "has no chat template, and data.apply_chat_template=True needs one" in str(err.value)


def test_truncated_prompts_are_counted_in_the_step_metrics(rl_config):
    # Every built-in arithmetic prompt is 26 tiny-tokenizer tokens long.
    trainer = RLTrainer(
        rl_config(
            "data.max_prompt_length=24",
            "data.truncation=left",
            "trainer.total_training_steps=1",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
        )
    )
    assert trainer.train_dataset.num_truncated == 16
    trainer.fit()
    assert trainer.history[0]["data/truncated_prompts"] == 16.0
    assert trainer.history[0]["data/dropped_prompts"] == 0.0


def test_tokenizer_larger_than_the_model_vocabulary(rl_config, tiny_model_dir, tmp_path):
    from verl.models import load_tokenizer

    # A tokenizer with ids the model has no embedding row for: without the check the first
    # rollout fails with a bare IndexError inside the embedding.
    tokenizer = load_tokenizer(tiny_model_dir)
    rows = len(tokenizer)
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(10)])
    with pytest.raises(ValueError) as err:
        RLTrainer(rl_config(), tokenizer=tokenizer)
    message = str(err.value)
    assert f"the model has {rows} token embeddings but its tokenizer has {rows + 10}" in message
    assert message.startswith("actor_rollout_ref.model:")
