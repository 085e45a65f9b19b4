"""Tutorial 002, "verl策略梯度优化: 训练收敛加速实战案例" (policy gradient): every code block."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def reward_function(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """The tutorial's reward model is a 3B RM; here: the fraction of digits in the reply."""
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)


PROMPTS = ["1+1=", "2+3=", "4+4=", "5+2="]


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


def test_002_section_2_1_and_2_2_install():
    # `python -m venv verl-env`, `pip install verl` / `pip install -e .`: the package
    # metadata that pip reads names the dependencies the tutorial lists
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "verl"
    deps = " ".join(project["dependencies"])
    for name in ("torch", "transformers", "accelerate"):
        assert name in deps


def test_002_section_2_3_import_and_version():
    run = _run("import verl; print(verl.__version__)")
    assert run.returncode == 0, run.stderr
    major, minor, _ = run.stdout.strip().split(".")
    assert (int(major), int(minor)) >= (0, 1)


def _config(tiny_model, tmp_path, **knobs):
    from verl import make_trainer_config

    return make_trainer_config(
        algo="ppo",
        model=str(tiny_model),
        actor_micro_batch_size=4,
        critic_micro_batch_size=4,
        rollouts_per_device=knobs.pop("rollouts_per_device", 8),  # tutorial: 64
        vf_coef=0.1,
        clip_eps=0.2,
        n=2,
        max_response_length=6,
        ppo_mini_batch_size=2,
        overrides=[
            "trainer.logger=[]",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            f"trainer.log_dir={tmp_path / 'logs'}",
            "data.arithmetic.train_size=16",
            "data.arithmetic.val_size=4",
            *knobs.pop("overrides", ()),
        ],
        **knobs,
    )


@pytest.mark.slow
def test_002_section_4_2_make_config_trainer_and_loop(tiny_model, tmp_path, capsys):
    from verl import DataCollector, Trainer
    from verl.models import load_causal_lm

    # 1. 配置训练参数
    config = _config(tiny_model, tmp_path)
    assert config.data.train_batch_size == 4  # 8 rollouts per device / rollout.n=2
    assert config.critic.loss_coef == 0.1 and config.actor_rollout_ref.actor.clip_ratio == 0.2
    # 2. 创建 trainer (models as modules and as a path)
    actor_model = load_causal_lm(str(tiny_model))
    critic_model = str(tiny_model)
    trainer = Trainer(
        config, actor_model=actor_model, critic_model=critic_model, reward_fn=reward_function
    )
    try:
        # 3. 数据采集 + 更新循环 (1000 steps there, 2 here)
        for step in range(2):
            data = trainer.collect_data(PROMPTS)  # 采样
            results = trainer.update_policy(data)  # 更新策略
            print(f"Step {step}, reward: {results['reward']}")
        assert len(data) == 4 * 2
        assert 0.0 <= results["reward"] <= 1.0
        assert results["critic/grad_norm"] > 0  # the critic trained (PPO)
        lines = capsys.readouterr().out.splitlines()
        assert [line.split(",")[0] for line in lines] == ["Step 0", "Step 1"]
        # the imported DataCollector: batches of prompts through the same trainer
        collector = DataCollector(trainer, PROMPTS * 2, batch_size=4)
        assert len(collector) == 2
        sizes = [len(batch) for batch in collector]
        assert sizes == [8, 8]
    finally:
        trainer.close()


def test_002_section_4_2_rollouts_per_device_must_divide(tiny_model, tmp_path):
    with pytest.raises(
        ValueError, match=r"rollouts_per_device=7 .* not a multiple of rollout\.n=2"
    ):
        _config(tiny_model, tmp_path, rollouts_per_device=7)
    with pytest.raises(
        ValueError, match=r"means train_batch_size=4 .* train_batch_size=8 is given"
    ):
        _config(tiny_model, tmp_path, train_batch_size=8)


def test_002_section_5_2_mixed_precision(tiny_model, tmp_path):
    from verl.config.precision import role_precision

    config = _config(tiny_model, tmp_path, mixed_precision="bf16")
    assert config.trainer.mixed_precision == "bf16"
    assert role_precision(config, "actor") == role_precision(config, "critic") == "bf16"
    # generation samples in bf16 too: tests/workers/test_precision_wiring.py
    # (test_generation_computes_in_the_training_precision)


@pytest.mark.slow
def test_002_section_5_3_kl_coefficient_ramp(tiny_model, tmp_path):
    # "初始阶段可设为 kl_coef=0.01, 随着训练推进逐步提高至 0.1"
    from verl import Trainer

    config = _config(
        tiny_model,
        tmp_path,
        kl_coef=0.01,
        overrides=[
            "algorithm.kl_ctrl.type=linear",
            "algorithm.kl_ctrl.final_kl_coef=0.1",
            "algorithm.kl_ctrl.schedule_steps=2",
        ],
    )
    trainer = Trainer(config, reward_fn=reward_function)
    try:
        coefs = []
        for _ in range(3):
            data = trainer.collect_data(PROMPTS)
            coefs.append(data.metrics["actor/reward_kl_penalty_coeff"])
            trainer.update_policy(data)
        assert coefs == pytest.approx([0.01, 0.055, 0.1])
    finally:
        trainer.close()


_USE_VLLM_BLOCK = """
import sys
from verl import Trainer, make_trainer_config

config = make_trainer_config(
    algo="grpo", model=sys.argv[1], n=2, max_response_length=6, train_batch_size=4,
    overrides=["trainer.logger=[]", "data.arithmetic.train_size=8", "data.arithmetic.val_size=4",
               f"trainer.default_local_dir={sys.argv[2]}", f"trainer.log_dir={sys.argv[2]}"],
)
def reward_function(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str) % 2)

trainer = Trainer(config, reward_fn=reward_function, use_vllm=True)  # the tutorial's line
batch = trainer.collect_data(["What is 2 + 3?"] * 2)
print("ROLLOUT", type(trainer.actor_rollout_wg.workers[0].rollout).__name__, len(batch))
trainer.close()
"""


@pytest.mark.slow  # with vLLM installed it starts the engine on SmolLM2 (about a minute)
def test_002_section_5_4_use_vllm(tiny_model, tmp_path):
    # `trainer = Trainer(..., use_vllm=True)`: the vLLM backend (docs/rollout.md)
    import importlib.util

    from verl import Trainer
    from verl.config import ConfigError

    if importlib.util.find_spec("vllm") is None:  # the error names the package to install
        with pytest.raises(ConfigError, match=r"rollout\.name=vllm: needs the 'vllm' package"):
            Trainer(_config(tiny_model, tmp_path), reward_fn=reward_function, use_vllm=True)
        return
    # vLLM installed (the CI set-up on AVX-512 CPUs): generate with it, in a child process
    # (vLLM seeds and configures torch process-wide), on the embedded SmolLM2: vLLM's CPU
    # attention has no kernel for the tiny model's head size of 16
    from verl.config import EMBEDDED_MODEL

    run = subprocess.run(
        [sys.executable, "-c", _USE_VLLM_BLOCK, EMBEDDED_MODEL, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ROLLOUT VLLMRollout 4" in run.stdout
