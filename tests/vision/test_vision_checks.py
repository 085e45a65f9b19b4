"""Start-up checks of an image run (verl.trainer.rl.vision_checks): the default config runs
as it is for a Qwen2-VL actor (native rollout, packing kept; another vision model_type is
adjusted to the hf rollout), every setting images cannot take is refused by its key before
any data or model loads, and a text actor's config is left alone."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from verl.config import TrainerConfig
from verl.trainer.rl.vision_checks import VisionConfigError, vision_run_config


def _config(model_path):
    cfg = TrainerConfig()
    cfg.actor_rollout_ref.model.path = str(model_path)
    cfg.algorithm.adv_estimator = "grpo"
    return cfg


def test_the_default_config_runs_with_images_on_the_native_rollout(vl, caplog):
    cfg = _config(vl.model_dir)
    assert cfg.actor_rollout_ref.rollout.name == "native"
    with caplog.at_level(logging.WARNING, logger="verl.trainer.rl.vision_checks"):
        out = vision_run_config(cfg)
    assert out is cfg and out.actor_rollout_ref.rollout.name == "native"
    assert out.actor_rollout_ref.actor.pack_sequences  # packing takes images
    assert "rollout.name" not in caplog.text


def test_another_vision_model_type_is_adjusted_to_the_hf_rollout(vl, tmp_path, caplog):
    model_dir = shutil.copytree(vl.model_dir, tmp_path / "qwen25")
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "model_type": "qwen2_5_vl"}))
    cfg = _config(model_dir)
    with caplog.at_level(logging.WARNING, logger="verl.trainer.rl.vision_checks"):
        out = vision_run_config(cfg)
    assert out.actor_rollout_ref.rollout.name == "hf"
    assert cfg.actor_rollout_ref.rollout.name == "native"  # the caller's config is unchanged
    assert "actor_rollout_ref.rollout.name=native" in caplog.text
    assert "'qwen2_5_vl'" in caplog.text


def test_every_incompatible_setting_is_refused_by_its_key(vl):
    cfg = _config(vl.model_dir)
    arr = cfg.actor_rollout_ref
    arr.rollout.name = "vllm"
    arr.actor.ulysses_sequence_parallel_size = 2
    arr.ref.ulysses_sequence_parallel_size = 2
    cfg.algorithm.distill.enable = True
    cfg.critic.enable = True
    arr.rollout.multi_turn.enable = True
    cfg.trainer.async_rollout = True
    cfg.data.rollout_files = ["rollouts.jsonl"]
    with pytest.raises(VisionConfigError) as info:
        vision_run_config(cfg)
    message = str(info.value)
    for key in (
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2",
        "algorithm.distill.enable=true",
        "critic.enable=True",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "trainer.async_rollout=true",
        "data.rollout_files",
    ):
        assert key in message, key
    assert "8 setting(s)" in message


def test_a_text_actor_is_left_alone(tmp_path):
    from verl.models.tiny import save_tiny_model_dir

    cfg = _config(save_tiny_model_dir(tmp_path / "text"))
    cfg.actor_rollout_ref.rollout.name = "vllm"
    assert vision_run_config(cfg) is cfg
