"""Keys of upstream verl's real run scripts (``bench/upstream_scripts.py`` runs them from
upstream's repository) that the upstream table reads: each key's translation, as the
script writes it, with the note it leaves."""

from __future__ import annotations

import logging

import pytest

from verl.config import ConfigError, load_config, load_sft_config


def test_the_reward_loop_engine_of_a_discriminative_reward_model_is_dropped(caplog, tmp_path):
    """The head's PPO-with-a-reward-model script serves its sequence classifier through
    upstream's reward loop (``reward_model.rollout.name=vllm``): the same scores as the
    classifier here, which scores in its worker."""
    caplog.set_level(logging.WARNING, logger="verl.compat")
    rm = tmp_path / "rm"
    rm.mkdir()
    cfg = load_config(
        overrides=[
            "reward_model.enable=True",
            f"reward_model.model.path={rm}",
            "reward_model.use_reward_loop=True",
            "reward_model.rollout.name=vllm",
            "reward_model.rollout.gpu_memory_utilization=0.8",
            "reward_model.rollout.tensor_model_parallel_size=1",
            "reward_model.rollout.prompt_length=8192",
            "reward_model.rollout.response_length=4096",
        ]
    )
    assert cfg.reward_model.enable and cfg.reward_model.model.path == str(rm)
    assert "reward_model.rollout.name='vllm' is dropped" in caplog.text
    assert "the same scores" in caplog.text
    assert "reward_model.rollout.prompt_length=8192 is dropped" in caplog.text


@pytest.mark.parametrize("engine", ["vllm", "sglang", None])
def test_every_reward_loop_engine_reads_the_same(engine):
    cfg = load_config(overrides=[f"reward_model.rollout.name={engine}"])
    assert cfg.reward_model == load_config().reward_model


@pytest.mark.parametrize(
    "override", ["ulysses_sequence_parallel_size=2", "engine.ulysses_sequence_parallel_size=8"]
)
def test_an_sft_sequence_parallel_size_is_dropped_with_a_note(override, caplog):
    """fsdp_sft_trainer's top-level key and sft_trainer's engine key: the offline ranks are
    data-parallel over the same global batch here (memory and speed only)."""
    caplog.set_level(logging.WARNING, logger="verl.compat")
    cfg = load_sft_config(overrides=[override])
    assert cfg == load_sft_config()
    assert f"{override} is dropped" in caplog.text and "the same loss" in caplog.text


def test_an_sft_sequence_parallel_size_must_be_a_size():
    with pytest.raises(ConfigError, match="positive integer"):
        load_sft_config(overrides=["ulysses_sequence_parallel_size=0"])


def test_an_empty_flag_value_is_read_as_off(caplog):
    """``actor_rollout_ref.actor.use_kl_loss=${use_kl_loss}`` with the variable unset
    (upstream's multi-turn vLLM script): Hydra passes '', which upstream reads as off."""
    caplog.set_level(logging.WARNING, logger="verl.compat")
    cfg = load_config(
        overrides=[
            "actor_rollout_ref.actor.use_kl_loss=True",
            "actor_rollout_ref.actor.use_kl_loss=",
        ]
    )
    assert cfg.actor_rollout_ref.actor.use_kl_loss is False
    assert "actor_rollout_ref.actor.use_kl_loss= (an empty value" in caplog.text


def test_an_empty_value_of_another_kind_is_still_refused():
    with pytest.raises(ConfigError, match=r"data\.train_batch_size"):
        load_config(overrides=["data.train_batch_size="])


def test_fsdp2_on_one_rank_trains_as_one_process(caplog):
    """sft_trainer's ``engine.strategy=fsdp2`` under ``torchrun --nproc-per-node=1`` (no
    process group): one process's training, with a note; on two ranks it stays FSDP2."""
    from types import SimpleNamespace

    from verl.trainer.offline.base import OfflineTrainer

    caplog.set_level(logging.WARNING)
    cfg = load_sft_config(overrides=["engine.strategy=fsdp2"])
    one_rank = SimpleNamespace(world_size=1)
    assert OfflineTrainer._check_strategy(one_rank, cfg) == "single"
    assert "FSDP2 over one rank" in caplog.text
    two = load_sft_config(overrides=["engine.strategy=fsdp2", "trainer.n_gpus_per_node=2"])
    with pytest.raises(ValueError, match="this process is one of 1"):
        OfflineTrainer._check_strategy(one_rank, two)
