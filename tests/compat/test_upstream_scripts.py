"""Upstream verl's run scripts, one per family, run from a shell as a user pastes them.

Each script below is written for this repository in the shape of upstream's
``examples/*/run_*.sh`` and ``recipe/*/*.sh`` (v0.5 to its head): the same keys and values
a real upstream script passes (``rollout.mode=async``, ``tensor_model_parallel_size=2``,
``use_remove_padding``, ``policy_loss.loss_mode``, the DAPO reward manager with its
overlong buffer, ``ray_kwargs.ray_init``, profilers, ...), with only the model path, the
data files, the device counts, the batch sizes, the step counts and the logger changed
(a tiny model, two steps, ``trainer.logger=console``) and the native rollout engine. The
fast test validates each script's config (``--validate-only``); the slow one trains two
steps and checks the run's metrics and final model. The slow tests' ``$PYTHON`` forks each
run from a parent that imported the trainer once (``tests/prewarmed_python.py``): the
scripts, their arguments and ``-m verl.trainer.main_ppo`` are the user's, the interpreter's
start-up is paid once a module (a validation alone imports little: the fast tests run the
real interpreter).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.prewarmed_python import prewarmed_python
from verl.models.tiny import save_tiny_model_dir

ROOT = Path(__file__).resolve().parents[2]
# what `python -m verl.trainer.main_ppo` imports before it trains, imported once (the fixture
# ``python``)
PREWARM = ("verl.trainer.main_ppo", "verl.trainer.rl.trainer", "verl.workers")

# the keys every upstream RL script of the family passes (sizes already cut down)
COMMON = """\
    data.train_files=$DATA/train.parquet \\
    data.val_files=$DATA/test.parquet \\
    data.train_batch_size=4 \\
    data.max_prompt_length=64 \\
    data.max_response_length=8 \\
    data.filter_overlong_prompts=True \\
    data.truncation='error' \\
    data.return_raw_chat=True \\
    actor_rollout_ref.model.path=$MODEL \\
    actor_rollout_ref.model.use_remove_padding=True \\
    actor_rollout_ref.model.enable_gradient_checkpointing=True \\
    actor_rollout_ref.model.use_shm=False \\
    actor_rollout_ref.actor.optim.lr=1e-6 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.actor.use_dynamic_bsz=False \\
    actor_rollout_ref.actor.fsdp_config.param_offload=False \\
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \\
    actor_rollout_ref.actor.fsdp_config.model_dtype=fp32 \\
    actor_rollout_ref.actor.entropy_checkpointing=True \\
    actor_rollout_ref.actor.use_torch_compile=False \\
    actor_rollout_ref.rollout.name=native \\
    actor_rollout_ref.rollout.mode=async \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \\
    actor_rollout_ref.rollout.load_format=safetensors \\
    actor_rollout_ref.rollout.layered_summon=True \\
    actor_rollout_ref.rollout.multi_stage_wake_up=True \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \\
    actor_rollout_ref.rollout.calculate_log_probs=True \\
    actor_rollout_ref.rollout.n=2 \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \\
    actor_rollout_ref.ref.fsdp_config.param_offload=True \\
    trainer.critic_warmup=0 \\
    trainer.logger=console \\
    trainer.use_legacy_worker_impl=auto \\
    trainer.project_name=verl_upstream \\
    trainer.experiment_name=$NAME \\
    trainer.n_gpus_per_node=1 \\
    trainer.nnodes=1 \\
    trainer.save_freq=-1 \\
    trainer.test_freq=-1 \\
    trainer.val_before_train=False \\
    trainer.default_local_dir=$OUT/ckpt \\
    trainer.log_dir=$OUT/logs \\
    trainer.total_training_steps=2 \\
    trainer.total_epochs=1 \\
    ray_kwargs.ray_init.num_cpus=4 \\
    global_profiler.tool=torch_memory \\
    global_profiler.steps=null \\"""

FAMILIES: dict[str, str] = {
    # examples/grpo_trainer/run_qwen3-8b.sh (v0.7 / head)
    "grpo": """\
    algorithm.adv_estimator=grpo \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.actor.kl_loss_coef=0.001 \\
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \\
    actor_rollout_ref.actor.entropy_coeff=0 \\
    algorithm.use_kl_in_reward=False \\""",
    # examples/ppo_trainer/run_deepseek7b_llm.sh (critic, GAE)
    "ppo_critic": """\
    algorithm.adv_estimator=gae \\
    critic.optim.lr=1e-5 \\
    critic.model.use_remove_padding=True \\
    critic.model.path=$MODEL \\
    critic.model.enable_gradient_checkpointing=True \\
    critic.ppo_micro_batch_size_per_gpu=4 \\
    critic.model.fsdp_config.param_offload=False \\
    critic.model.fsdp_config.optimizer_offload=False \\
    algorithm.use_kl_in_reward=False \\""",
    # examples/rloo_trainer/run_qwen2-7b.sh
    "rloo": """\
    algorithm.adv_estimator=rloo \\
    actor_rollout_ref.actor.use_kl_loss=False \\
    algorithm.use_kl_in_reward=True \\
    algorithm.kl_penalty=kl \\
    algorithm.kl_ctrl.kl_coef=0.001 \\""",
    # examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh
    "reinforce_plus_plus": """\
    algorithm.adv_estimator=reinforce_plus_plus \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.actor.kl_loss_coef=0.001 \\
    actor_rollout_ref.actor.kl_loss_type=mse \\
    algorithm.use_kl_in_reward=False \\""",
    # examples/remax_trainer/run_qwen2.5-3b_seq_balance.sh
    "remax": """\
    algorithm.adv_estimator=remax \\
    actor_rollout_ref.actor.use_kl_loss=False \\
    algorithm.use_kl_in_reward=True \\
    algorithm.kl_penalty=kl \\
    algorithm.kl_ctrl.kl_coef=0.001 \\""",
    # recipe/dapo/test_dapo_7b_math.sh (main_ppo with the DAPO reward manager)
    "dapo": """\
    algorithm.adv_estimator=grpo \\
    algorithm.use_kl_in_reward=False \\
    algorithm.kl_ctrl.kl_coef=0.0 \\
    actor_rollout_ref.actor.use_kl_loss=False \\
    actor_rollout_ref.actor.kl_loss_coef=0.0 \\
    actor_rollout_ref.actor.clip_ratio_low=0.2 \\
    actor_rollout_ref.actor.clip_ratio_high=0.28 \\
    actor_rollout_ref.actor.clip_ratio_c=10.0 \\
    actor_rollout_ref.actor.loss_agg_mode=token-mean \\
    actor_rollout_ref.actor.optim.weight_decay=0.1 \\
    actor_rollout_ref.actor.optim.lr_warmup_steps=1 \\
    actor_rollout_ref.actor.grad_clip=1.0 \\
    actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \\
    actor_rollout_ref.rollout.val_kwargs.top_p=0.7 \\
    actor_rollout_ref.rollout.val_kwargs.do_sample=True \\
    actor_rollout_ref.rollout.val_kwargs.n=1 \\
    reward_model.reward_manager=dapo \\
    +reward_model.reward_kwargs.overlong_buffer_cfg.enable=True \\
    +reward_model.reward_kwargs.overlong_buffer_cfg.len=4 \\
    +reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 \\
    +reward_model.reward_kwargs.overlong_buffer_cfg.log=False \\
    +reward_model.reward_kwargs.max_resp_len=8 \\""",
    # examples/gspo_trainer/run_qwen30b_gspo.sh
    "gspo": """\
    algorithm.adv_estimator=grpo \\
    actor_rollout_ref.actor.policy_loss.loss_mode=gspo \\
    actor_rollout_ref.actor.clip_ratio_low=0.0003 \\
    actor_rollout_ref.actor.clip_ratio_high=0.0004 \\
    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean \\
    actor_rollout_ref.actor.use_kl_loss=False \\
    algorithm.use_kl_in_reward=False \\""",
    # examples/gmpo_trainer/run_qwen2_5-7b_math.sh
    "gmpo": """\
    algorithm.adv_estimator=grpo \\
    actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean \\
    actor_rollout_ref.actor.clip_ratio_low=0.4 \\
    actor_rollout_ref.actor.clip_ratio_high=0.4 \\
    actor_rollout_ref.actor.use_kl_loss=False \\
    algorithm.use_kl_in_reward=False \\""",
    # examples/gpg_trainer/run_qwen2-7b_math.sh
    "gpg": """\
    algorithm.adv_estimator=gpg \\
    actor_rollout_ref.actor.policy_loss.loss_mode=gpg \\
    actor_rollout_ref.actor.use_kl_loss=False \\
    algorithm.use_kl_in_reward=False \\""",
    # examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh
    "lora": """\
    algorithm.adv_estimator=grpo \\
    actor_rollout_ref.model.lora_rank=8 \\
    actor_rollout_ref.model.lora_alpha=16 \\
    actor_rollout_ref.model.target_modules=all-linear \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.actor.kl_loss_coef=0.001 \\""",
}

SCRIPT = """\
#!/usr/bin/env bash
set -xeuo pipefail
$PYTHON -m verl.trainer.main_ppo \\
{family}
{common}
    "$@"
"""


def _rows(n: int) -> list[dict]:
    """GSM8K rows in upstream's layout (examples/data_preprocess/gsm8k.py)."""
    rows = []
    for i in range(n):
        a, b = i + 2, i + 3
        question = f"What is {a} plus {b}? Let's think step by step and output the final answer after ####."
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": question}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": "train", "index": i},
            }
        )
    return rows


@pytest.fixture(scope="module")
def upstream_env(tmp_path_factory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("upstream")
    model = save_tiny_model_dir(base / "model", arch="qwen2")
    data = base / "data"
    data.mkdir()
    pq.write_table(pa.Table.from_pylist(_rows(16)), data / "train.parquet")
    pq.write_table(pa.Table.from_pylist(_rows(4)), data / "test.parquet")
    return {"MODEL": str(model), "DATA": str(data)}


def _script(tmp_path: Path, family: str) -> Path:
    path = tmp_path / f"run_{family}.sh"
    path.write_text(SCRIPT.format(family=FAMILIES[family], common=COMMON))
    return path


def _env(env: dict[str, str]) -> dict[str, str]:
    return {
        **os.environ,
        **env,
        "PYTHONPATH": str(ROOT),
        # one OpenMP thread per run, as in the pytest process (tests/conftest.py): two stall
        # on two cores shared with the other xdist worker
        "OMP_NUM_THREADS": "1",
    }


@pytest.fixture(scope="module")
def python(upstream_env, tmp_path_factory) -> Iterator[str]:
    """The scripts' ``$PYTHON``: forked from a parent that imported the trainer once
    (``tests/prewarmed_python.py``), not a fresh interpreter per run."""
    with prewarmed_python(PREWARM, _env(upstream_env), tmp_path_factory.mktemp("python")) as exe:
        yield exe


def _run(
    script: Path,
    env: dict[str, str],
    out: Path,
    *args: str,
    timeout: float = 900,
    python: str = sys.executable,
):
    full = {**_env(env), "PYTHON": python, "OUT": str(out), "NAME": script.stem}
    return subprocess.run(
        ["bash", str(script), *args],
        capture_output=True,
        text=True,
        cwd=out,
        env=full,
        timeout=timeout,
    )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_upstream_script_config_loads(family, upstream_env, tmp_path):
    run = _run(_script(tmp_path, family), upstream_env, tmp_path, "--validate-only", timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "config OK" in run.stdout
    # the notes name what each dropped upstream key would have done
    # upstream's rollout size is vLLM's: unused (and said so) with the native rollout
    assert (
        "actor_rollout_ref.rollout.tensor_model_parallel_size -> "
        "actor_rollout_ref.rollout.vllm.tensor_parallel_size=2" in run.stderr
    )
    assert (
        "actor_rollout_ref.rollout.vllm.tensor_parallel_size=2 (upstream's "
        "actor_rollout_ref.rollout.tensor_model_parallel_size is read as it) is not used with "
        "actor_rollout_ref.rollout.name=native" in run.stderr
    )
    assert "actor_rollout_ref.rollout.mode='async' is dropped" in run.stderr


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_upstream_script_trains_two_steps(family, upstream_env, python, tmp_path):
    run = _run(_script(tmp_path, family), upstream_env, tmp_path, python=python)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "wall time" in run.stdout, run.stdout[-2000:]
    assert (tmp_path / "ckpt" / "huggingface" / "config.json").is_file()


# upstream's SFT scripts: sft_trainer (engine=fsdp, engine.strategy=fsdp2, its sequence
# parallel size) under torchrun on one rank, and fsdp_sft_trainer's multi-turn SP script
SFT_SCRIPT = """\
#!/usr/bin/env bash
set -xeuo pipefail
SP_SIZE=${SP_SIZE:-8}
$PYTHON -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=1 \\
    -m verl.trainer.sft_trainer \\
    data.train_files=$DATA/sft.parquet \\
    data.train_batch_size=4 \\
    data.max_length=128 \\
    data.pad_mode=no_padding \\
    data.truncation=error \\
    data.use_dynamic_bsz=True \\
    data.max_token_len_per_gpu=1024 \\
    data.messages_key=messages \\
    model.path=$MODEL \\
    model.use_remove_padding=True \\
    engine=fsdp \\
    optim=fsdp \\
    optim.lr=2e-5 \\
    optim.warmup_style=cosine \\
    engine.ulysses_sequence_parallel_size=${SP_SIZE} \\
    engine.strategy=fsdp2 \\
    engine.fsdp_size=-1 \\
    trainer.test_freq=-1 \\
    trainer.logger=['console'] \\
    trainer.total_epochs=1 \\
    trainer.total_training_steps=2 \\
    trainer.default_local_dir=$OUT/ckpt \\
    "$@"
"""


@pytest.fixture(scope="module")
def sft_data(upstream_env) -> dict[str, str]:
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"What is {i} plus 2?"},
                {"role": "assistant", "content": f"{i + 2}"},
            ]
        }
        for i in range(8)
    ]
    pq.write_table(pa.Table.from_pylist(rows), Path(upstream_env["DATA"]) / "sft.parquet")
    return upstream_env


def test_upstream_sft_trainer_script_validates(sft_data, tmp_path):
    script = tmp_path / "run_sft.sh"
    script.write_text(SFT_SCRIPT)
    run = _run(script, {**sft_data, "WANDB_MODE": "disabled"}, tmp_path, "--validate-only")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "engine.ulysses_sequence_parallel_size=8 is dropped" in run.stderr


@pytest.mark.slow
def test_upstream_sft_trainer_script_trains_on_one_torchrun_rank(sft_data, python, tmp_path):
    """engine.strategy=fsdp2 on one torchrun rank trains as one process (with a note)."""
    script = tmp_path / "run_sft.sh"
    script.write_text(SFT_SCRIPT)
    env = {**sft_data, "WANDB_MODE": "disabled"}
    run = _run(script, env, tmp_path, timeout=600, python=python)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "trains as engine.strategy=single" in run.stderr
    assert "(step 2)" in run.stdout and (tmp_path / "ckpt" / "huggingface").is_dir()
