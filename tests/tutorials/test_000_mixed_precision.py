"""Tutorial 000, "verl混合精度训练设置" (mixed precision): every code block, in order."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from verl.config import ConfigError, load_config
from verl.config.precision import auto_select_precision, role_precision

NO_GPU = shutil.which("nvidia-smi") is None


@pytest.mark.skipif(not NO_GPU, reason="a GPU machine runs the block as written")
def test_000_section_3_1_gpu_check_needs_nvidia_hardware():
    # `nvidia-smi | head -n 10`: no NVIDIA driver on this machine
    assert NO_GPU
    # `python -c "...torch.cuda.get_device_capability()"`: the CPU build of torch says so
    code = "import torch; print(torch.__version__, torch.cuda.is_available()); "
    code += "torch.cuda.get_device_capability()"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode != 0
    assert "False" in run.stdout
    assert "Torch not compiled with CUDA enabled" in run.stderr
    # verl's own check names what to use instead
    from verl.utils.device import resolve_device

    with pytest.raises(RuntimeError, match=r"use trainer\.device=auto or trainer\.device=cpu"):
        resolve_device("cuda")
    assert resolve_device("auto").type == "cpu"


def test_000_section_3_2_dev_extra():
    # `pip install -e ".[dev]"`: the extra exists; it brings the test tools, not flash-attn
    # or vLLM, which need CUDA (pyproject.toml says so)
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parents[2]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = [req.split(">")[0].split("[")[0] for req in extras["dev"]]
    assert {"pytest", "ruff", "ray"} <= set(names)
    assert "flash-attn" not in names
    assert "flash-attn builds only\n# against CUDA" in (root / "pyproject.toml").read_text()


def test_000_section_3_3_install_check(capsys):
    import verl

    print(verl.__version__)
    print(verl.__file__)
    from verl import TrainerConfig

    config = TrainerConfig()
    print(" verl安装验证通过")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == verl.__version__ and out[0].count(".") == 2
    assert out[1].endswith("verl/__init__.py")
    assert config.validate() == []  # the default config is valid, with no warning


def test_000_section_4_1_mixed_precision():
    from verl import TrainerConfig

    config = TrainerConfig(
        mixed_precision="bf16",  # 可选:'bf16', 'fp16', 'fp8', 'none'
    )
    config.validate()
    for role in ("actor", "critic", "reference", "reward"):
        assert role_precision(config, role) == "bf16"
    # the same with a torch dtype
    assert TrainerConfig(mixed_precision=torch.bfloat16).trainer.mixed_precision == "bf16"


def test_000_section_4_2_model_precision_map(caplog):
    from verl import TrainerConfig
    from verl.workers.role_options import precision_options

    config = TrainerConfig(
        mixed_precision="bf16",
        model_precision_map={
            "actor": "bf16",  # 生成主干,精度优先
            "critic": "fp16",  # 回归任务,fp16足够
            "reward": "fp8",  # 判别模型,fp8推理无损
            "reference": "bf16",  # 对齐Actor,避免KL散度计算失真
        },
    )
    # GRPO (the default) trains no critic, builds no reward model: each unused entry is
    # named, with why, not silently ignored
    with caplog.at_level(logging.WARNING, logger="verl.config"):
        warnings = config.validate()
    assert (
        "trainer.model_precision_map.critic=fp16 is unused: algorithm.adv_estimator=grpo "
        "trains no critic"
    ) in "\n".join(warnings)
    assert any(w.startswith("trainer.model_precision_map.reward=fp8 is unused") for w in warnings)
    assert role_precision(config, "reward") == "fp8"
    assert role_precision(config, "reference") == "bf16"
    # With a critic (PPO), the fp16 critic beside the bf16 actor is what the tip of section
    # 4.1 says not to do; its advice is applied: the critic computes in bf16, with a warning
    # quoting the tip, and the engine gets bf16
    config.algorithm.adv_estimator = "gae"
    warnings = config.validate()
    mix = [w for w in warnings if "model_precision_map.critic=fp16 beside actor=bf16" in w]
    assert len(mix) == 1 and "the critic computes in bf16" in mix[0]
    assert "不要混用bf16和fp16在同一训练流程中" in mix[0] and "NaN" in mix[0]
    assert role_precision(config, "critic") == "bf16" == role_precision(config, "actor")
    opts = precision_options(config, "critic", "fsdp2", {})
    assert opts["mixed_precision"]["param_dtype"] == "bf16"
    # written on the role's own key, the mix is refused, citing the same tip
    config.trainer.model_precision_map = {}
    config.actor_rollout_ref.actor.precision, config.critic.precision = "bf16", "fp16"
    with pytest.raises(ConfigError, match="trainable roles mix bf16 and fp16") as err:
        config.validate()
    assert "tutorial 000 §4.1: '不要混用bf16和fp16" in str(err.value)


def test_000_section_4_3_checkpointing_and_gradient_precision():
    from verl import TrainerConfig

    config = TrainerConfig(
        activation_checkpointing=True,
        gradient_precision="fp32",
        use_flash_attention=True,
    )
    config.validate()
    assert config.actor_rollout_ref.model.enable_gradient_checkpointing
    assert config.critic.model.enable_gradient_checkpointing
    assert config.trainer.gradient_precision == "fp32"
    assert config.trainer.use_flash_attention  # falls back to SDPA off CUDA (logged)


def test_000_section_4_4_fsdp_config_with_torch_dtypes():
    from verl import TrainerConfig

    config = TrainerConfig(
        mixed_precision="bf16",
        fsdp_config={
            "sharding_strategy": "FULL_SHARD",
            "cpu_offload": False,
            "mixed_precision": {
                "param_dtype": torch.bfloat16,
                "reduce_dtype": torch.float32,
                "buffer_dtype": torch.bfloat16,
            },
        },
    )
    config.validate()  # torch dtypes used to crash here with a yaml RepresenterError
    for fsdp in (config.actor_rollout_ref.actor.fsdp_config, config.critic.fsdp_config):
        assert fsdp.reshard_after_forward is True and fsdp.param_offload is False
        mp = fsdp.mixed_precision
        assert (mp.param_dtype, mp.reduce_dtype, mp.buffer_dtype) == ("bf16", "fp32", "bf16")


def test_000_section_6_1_torch_version():
    # "upgrade to PyTorch >= 2.2": this project requires torch >= 2.6 already; the CUDA
    # nightly wheel of the block is for NVIDIA GPUs, not this CPU
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    assert (major, minor) >= (2, 2)


def test_000_section_6_2_clipping_scaling_accumulation():
    from verl import TrainerConfig

    config = TrainerConfig(
        max_grad_norm=0.5,
        use_gradient_scaling=True,
        gradient_accumulation_steps=4,
    )
    assert config.actor_rollout_ref.actor.grad_clip == 0.5
    # 4 prompts x rollout.n=4 per optimizer step, in 4 micro-batches of 4 samples
    assert config.actor_rollout_ref.actor.ppo_micro_batch_size_per_device == 4
    # loss scaling protects fp16 gradients only: in a bf16 (or fp32) run it is a no-op, said
    # so, and no scaler is built
    from verl.workers.role_options import precision_options

    config.trainer.mixed_precision = "bf16"
    config.actor_rollout_ref.actor.precision = config.critic.precision = None
    warnings = config.validate()
    assert any("trainer.use_gradient_scaling=true is a no-op" in w for w in warnings)
    assert precision_options(config, "actor", "fsdp2", {})["grad_scaling"] is None
    assert precision_options(config, "actor", "single", {})["grad_scaling"] is None
    fp16 = TrainerConfig(
        mixed_precision="fp16",
        max_grad_norm=0.5,
        use_gradient_scaling=True,
        gradient_accumulation_steps=4,
    )
    fp16.validate()  # warns that fp16 is emulated on a CPU
    assert fp16.trainer.use_gradient_scaling is True
    assert precision_options(fp16, "actor", "single", {})["grad_scaling"] is True


def test_000_section_6_3_reward_normalization_and_clip(small, tiny_reward_model):
    from verl.trainer.ppo import PPOTrainer

    config = load_config(
        overrides=small(
            "reward_model.enable=true",
            f"reward_model.model.path={tiny_reward_model}",
            "trainer.model_precision_map={reward: fp8}",
        )
    )
    trainer = PPOTrainer(
        config=config,
        reward_normalization=True,
        reward_clip_range=(-5.0, 5.0),
    )
    try:
        gen, _ = trainer.collect_data(next(iter(trainer.train_loader)))
        raw = gen.non_tensor_batch["score"].astype(np.float64)  # the fp8 model's scores
        shaped = gen.batch["token_level_scores"].sum(-1).double().numpy()
        want = np.clip((raw - raw.mean()) / (raw.std() + 1e-8), -5.0, 5.0)
        assert np.allclose(shaped, want, atol=1e-5)
        assert abs(shaped.mean()) < 1e-5 and abs(shaped.std() - 1) < 1e-3
        assert np.all((shaped >= -5) & (shaped <= 5))
    finally:
        trainer.close()
    # a tighter range clips
    trainer = PPOTrainer(config=config, reward_normalization=True, reward_clip_range=(-0.5, 0.5))
    try:
        gen, metrics = trainer.collect_data(next(iter(trainer.train_loader)))
        shaped = gen.batch["token_level_scores"].sum(-1)
        assert shaped.abs().max().item() == pytest.approx(0.5)
        assert metrics["reward/clip_ratio"] > 0
    finally:
        trainer.close()


def test_000_section_6_4_hybrid_engine(caplog):
    from verl import TrainerConfig

    with caplog.at_level(logging.WARNING, logger="verl.compat"):
        config = TrainerConfig(
            enable_3d_hybrid_engine=True,
            hybrid_engine_config={
                "actor_shard_dim": 0,
                "critic_shard_dim": 1,
                "enable_activation_recomputation": True,
            },
        )
    config.validate()
    assert config.actor_rollout_ref.model.enable_gradient_checkpointing
    # the shard dims are honoured per role: FSDP2's shard_placement_fn shards the actor's
    # weights by rows and the critic's by columns (the shard shapes, and the same training
    # results: tests/engine/test_fsdp2_shard_dim_and_reduce_dtype.py)
    assert config.actor_rollout_ref.actor.fsdp_config.shard_dim == 0
    assert config.critic.fsdp_config.shard_dim == 1
    assert "hybrid_engine_config.critic_shard_dim -> critic.fsdp_config.shard_dim=1" in caplog.text
    with pytest.raises(ValueError, match="actor_shard_dim=2: a shard dim is 0 or 1"):
        TrainerConfig(hybrid_engine_config={"actor_shard_dim": 2})


def test_000_section_7_auto_select_precision():
    from verl import TrainerConfig

    def auto_select_precision_():  # the tutorial's function, as written
        if torch.cuda.is_available():
            device_cap = torch.cuda.get_device_capability()
            if device_cap >= (9, 0):
                return "fp8"
            elif device_cap >= (8, 0):
                return "bf16"
            else:
                return "fp16"
        return "bf16"

    config = TrainerConfig(mixed_precision=auto_select_precision_())
    config.validate()
    assert config.trainer.mixed_precision == "bf16"
    # verl's own: mixed_precision="auto" resolves per device (fp32 on a CPU without bf16)
    assert set(auto_select_precision("cpu").values()) <= {"bf16", "none"}
    # "dynamic precision" of the block's last paragraph: trainer.dynamic_precision
    assert TrainerConfig(dynamic_precision=True).trainer.dynamic_precision


@pytest.mark.slow
def test_000_section_8_offline_dataset_with_mixed_precision(small, tiny_model, tmp_path):
    # "结合verl的offline_dataset功能,用混合精度加速离线PPO数据生成": generate the offline
    # rollouts with the model in bf16 (`verl generate ... actor_rollout_ref.model.dtype=bf16`),
    # then train PPO/GRPO from the file (data.rollout_files) with the fp32 actor; the bf16
    # log-probs are the behaviour policy of the rollout correction
    import pyarrow.parquet as pq

    from verl import cli
    from verl.data.arithmetic import write_arithmetic_dataset
    from verl.trainer.rl.trainer import RLTrainer

    train, _ = write_arithmetic_dataset(tmp_path / "data", 8, 2, 1, ["+"], 0, "parquet", "chat")
    out = tmp_path / "offline.parquet"
    args = ["generate", "--model", str(tiny_model), "--data", str(train), "--n", "2"]
    args += ["--max-new-tokens", "6", "-o", str(out), "actor_rollout_ref.model.dtype=bf16"]
    assert cli.main(args) == 0
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 8 and all(len(r["response_token_log_probs"]) == 2 for r in rows)
    config = load_config(
        overrides=small(
            f"data.rollout_files=[{out}]",
            "actor_rollout_ref.actor.rollout_is_threshold=2.0",
            "trainer.save_freq=-1",
        )
    )
    trainer = RLTrainer(config)
    try:
        trainer.fit()
        history = trainer.history
    finally:
        trainer.close()
    assert len(history) == 2
    # bf16 sampling vs the fp32 trainer: weights near 1 but not all exactly 1
    weight = history[0]["actor/rollout_is_weight_mean"]
    assert 0.8 < weight < 1.25 and weight != 1.0
    assert history[0]["rollout/logprob_abs_diff_mean"] > 0
