"""The run scripts of ``examples/`` (upstream verl's layout: ``examples/<trainer>/run_*.sh``).

Fast tests: each script's config validates as written, the GRPO script is exactly the main
job's preset, and the GPU script converts GSM8K and explains what is missing. Slow tests: every
CPU script trains two steps on a tiny model (extra ``key=value`` arguments, which every script
passes on after its own) and leaves its metrics and its final HuggingFace model behind; their
``$PYTHON`` forks each run from a parent that imported the trainers once
(``tests/prewarmed_python.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.prewarmed_python import prewarmed_python
from verl.models.tiny import save_tiny_model_dir

ROOT = Path(__file__).resolve().parents[2]
# what the CPU scripts' trainers import before they train, imported once (fixture ``python``)
PREWARM = (
    "verl.trainer.main_ppo",
    "verl.trainer.main_sft",
    "verl.trainer.main_dpo",
    "verl.trainer.rl.trainer",
    "verl.workers",
)
EXAMPLES = ROOT / "examples"
GRPO = EXAMPLES / "grpo_trainer" / "run_smollm2_arith.sh"
GAE = EXAMPLES / "ppo_trainer" / "run_smollm2_arith_gae.sh"
CALCULATOR = EXAMPLES / "grpo_trainer" / "run_smollm2_calculator.sh"
SFT = EXAMPLES / "sft" / "run_smollm2_sft.sh"
DPO = EXAMPLES / "dpo" / "run_smollm2_dpo.sh"
GSM8K = EXAMPLES / "grpo_trainer" / "run_qwen3-0.6b_gsm8k.sh"
CPU_SCRIPTS = (GRPO, GAE, CALCULATOR, SFT, DPO)

# two short RL steps: 4 prompts x 2 responses of at most 6 tokens
RL_SHORT = (
    "data.train_batch_size=4",
    "data.max_response_length=6",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_device=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=8",
    "critic.ppo_mini_batch_size=4",
    "critic.ppo_micro_batch_size_per_device=8",
    "trainer.total_training_steps=2",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    # the main job's dynamic sampling waits for groups with mixed rewards, which a random tiny
    # model never produces on arithmetic (tests/trainer covers dynamic sampling itself)
    "algorithm.filter_groups.enable=false",
)
BUILTIN_SMALL = ("data.arithmetic.train_size=16", "data.arithmetic.val_size=4")
OFFLINE_SHORT = (
    "data.train_batch_size=4",
    "data.micro_batch_size_per_device=4",
    *BUILTIN_SMALL,
    "trainer.total_training_steps=2",
    "trainer.val_before_train=false",
)


def _env(**extra: str) -> dict[str, str]:
    # one OpenMP thread per run, as in the pytest process (tests/conftest.py): two stall on
    # two cores shared with the other xdist worker
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return {**env, **extra}


def _run(script: Path, *args: str, cwd: Path, timeout: float = 120, **env: str):
    return subprocess.run(
        ["bash", str(script), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_env(**env),
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> Iterator[str]:
    """The training runs' ``$PYTHON``: forked from a parent that imported the trainers once
    (``tests/prewarmed_python.py``), not a fresh interpreter per run."""
    with prewarmed_python(PREWARM, _env(), tmp_path_factory.mktemp("python")) as exe:
        yield exe


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return save_tiny_model_dir(tmp_path_factory.mktemp("examples") / "model", arch="qwen2")


@pytest.fixture()
def gsm8k_dir(tmp_path) -> Path:
    """Two GSM8K-format rows per split (the dataset itself is not shipped here)."""
    rows = [
        {"question": "Tom has 3 apples and buys 4 more. How many now?", "answer": "3+4=7\n#### 7"},
        {"question": "What is 12 divided by 4?", "answer": "12/4=3\n#### 3"},
    ]
    src = tmp_path / "gsm8k"
    src.mkdir()
    for split in ("train", "test"):
        (src / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return src


def test_every_script_is_executable_and_passes_extra_arguments_on():
    for script in (*CPU_SCRIPTS, GSM8K, EXAMPLES / "grpo_trainer" / "run_qwen3-0.6b.sh"):
        assert os.access(script, os.X_OK), script
        assert '"$@"' in script.read_text(), script


def test_grpo_script_is_the_main_job_preset(tmp_path):
    # the same resolved config as examples/grpo_smollm2_arithmetic.yaml (scripts/run.sh),
    # but for the run's name
    script = _run(GRPO, "--print-config", cwd=tmp_path)
    assert script.returncode == 0, script.stderr
    preset_file = str(EXAMPLES / "grpo_smollm2_arithmetic.yaml")
    preset = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", "--print-config", "--config", preset_file],
        capture_output=True,
        text=True,
        env=_env(),
        check=True,
    ).stdout
    name = "experiment_name: grpo_smollm2_arith"
    assert script.stdout.replace(f"{name}\n", f"{name}metic\n") == preset


def test_main_job_is_the_harder_task_with_per_op_validation(tmp_path):
    # issue 14: one- and two-digit +, - and *, validation grouped by operation with enough
    # problems per operation to compare them, the settings its README numbers were measured with
    from collections import Counter

    from verl.config import load_config
    from verl.data.io import read_records
    from verl.trainer.lifecycle.setup import prepare_data_files

    cfg = load_config(EXAMPLES / "grpo_smollm2_arithmetic.yaml")
    a = cfg.data.arithmetic
    assert (a.digit_range, sorted(a.ops), a.balance_digits) == ((1, 2), ["*", "+", "-"], True)
    assert cfg.trainer.val_group_by == ["op"]
    assert cfg.algorithm.filter_groups.enable
    # one optimizer step per batch: no clip epsilons, which would do nothing (and warn)
    assert cfg.actor_rollout_ref.actor.clip_ratio_high is None
    assert not [w for w in cfg.validate() if "has no effect" in w]
    assert (cfg.trainer.total_training_steps, cfg.trainer.test_freq) == (48, 12)
    _, (val_file,) = prepare_data_files(cfg, tmp_path)
    val = [r.data["extra_info"] for r in read_records(val_file).records]
    per_op = Counter(info["op"] for info in val)
    assert len(val) == 192 and min(per_op.values()) >= 50, per_op
    digit_counts = Counter(max(len(str(i["a"])), len(str(i["b"]))) for i in val)
    assert digit_counts[1] >= 30 and digit_counts[2] >= 100, digit_counts


def test_quick_preset_is_the_one_digit_job():
    # the earlier main job, kept for the measurements that name it (docs/memory.md, bench/)
    from verl.config import load_config

    cfg = load_config(EXAMPLES / "grpo_smollm2_arithmetic_quick.yaml")
    a = cfg.data.arithmetic
    assert (a.digit_range, sorted(a.ops)) == ((1, 1), ["*", "+"])
    assert (cfg.data.max_response_length, cfg.actor_rollout_ref.rollout.n) == (8, 4)
    assert cfg.trainer.total_training_steps == 16


@pytest.mark.parametrize("script", [GAE, SFT, DPO], ids=lambda p: p.name)
def test_cpu_script_config_validates_as_written(script, tmp_path):
    run = _run(script, "--validate-only", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "config OK"


def test_cpu_script_rejects_a_mistyped_override_naming_it(tmp_path):
    run = _run(SFT, "optim.lrr=1e-5", "--validate-only", cwd=tmp_path)
    assert run.returncode == 2
    assert "optim.lrr: unknown key" in run.stderr and "did you mean optim.lr" in run.stderr


def test_gsm8k_script_converts_the_data_and_validates(tiny_model, gsm8k_dir, tmp_path):
    data = tmp_path / "data"
    # vLLM is not installed in the test environment: the native rollout stands in for it
    run = _run(
        GSM8K,
        "--validate-only",
        "actor_rollout_ref.rollout.name=native",
        cwd=tmp_path,
        MODEL_PATH=str(tiny_model),
        GSM8K_DIR=str(gsm8k_dir),
        DATA_DIR=str(data),
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "config OK"
    import pyarrow.parquet as pq

    train = pq.read_table(data / "train.parquet").to_pylist()
    assert [r["data_source"] for r in train] == ["openai/gsm8k"] * 2
    assert [r["reward_model"]["ground_truth"] for r in train] == ["7", "3"]
    assert (data / "test.parquet").is_file()
    # as written (no override) it asks for the vllm rollout
    printed = _run(
        GSM8K, "--print-config", cwd=tmp_path, MODEL_PATH=str(tiny_model), DATA_DIR=str(data)
    )
    if printed.returncode == 0:
        assert "name: vllm" in printed.stdout
    else:  # the config check refuses rollout.name=vllm without the package, naming it
        assert "rollout.name=vllm: needs the 'vllm' package" in printed.stderr


def test_gsm8k_script_says_what_is_missing(tiny_model, tmp_path):
    no_model = _run(GSM8K, cwd=tmp_path, MODEL_PATH="")
    assert no_model.returncode == 2
    assert "Qwen3-0.6B is not shipped" in no_model.stderr
    assert "set MODEL_PATH=DIR" in no_model.stderr
    no_data = _run(
        GSM8K, cwd=tmp_path, MODEL_PATH=str(tiny_model), DATA_DIR=str(tmp_path / "nothing")
    )
    assert no_data.returncode == 2
    assert "set GSM8K_DIR to the directory with GSM8K's train.jsonl" in no_data.stderr


def _steps(log_dir: Path) -> list[int]:
    lines = (log_dir / "metrics.jsonl").read_text().splitlines()
    return sorted({json.loads(line)["step"] for line in lines if '"step"' in line})


def _assert_trained(run: subprocess.CompletedProcess, out: Path) -> None:
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert _steps(out / "logs")[-1] == 2
    hf = out / "ckpt" / "huggingface"
    assert (hf / "config.json").is_file()
    assert any(hf.glob("*.safetensors"))


def _outputs(out: Path) -> list[str]:
    return [
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={out / 'ckpt'}",
        f"trainer.log_dir={out / 'logs'}",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("script", [GRPO, GAE], ids=lambda p: p.name)
def test_rl_script_trains_two_steps(script, tiny_model, python, tmp_path):
    overrides = [f"actor_rollout_ref.model.path={tiny_model}", *RL_SHORT, *BUILTIN_SMALL]
    run = _run(script, *overrides, *_outputs(tmp_path), cwd=tmp_path, timeout=900, PYTHON=python)
    _assert_trained(run, tmp_path)
    if script is GAE:  # the critic trained too
        lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
        critic = [r for r in map(json.loads, lines) if "critic/vf_loss" in r]
        assert [r["step"] for r in critic] == [1, 2]


@pytest.mark.slow
def test_calculator_script_writes_its_data_and_trains_two_steps(tiny_model, python, tmp_path):
    overrides = [
        f"actor_rollout_ref.model.path={tiny_model}",
        *RL_SHORT,
        "data.max_response_length=24",
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_tokens=8",
    ]
    run = _run(
        CALCULATOR,
        *overrides,
        *_outputs(tmp_path),
        cwd=tmp_path,
        timeout=900,
        DATA_DIR=str(tmp_path / "calc"),
        TRAIN_SIZE="16",
        VAL_SIZE="4",
        PYTHON=python,
    )
    assert (tmp_path / "calc" / "train.parquet").is_file()
    _assert_trained(run, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("script", [SFT, DPO], ids=lambda p: p.name)
def test_offline_script_trains_two_steps(script, tiny_model, python, tmp_path):
    overrides = [f"model.path={tiny_model}", *OFFLINE_SHORT]
    run = _run(script, *overrides, *_outputs(tmp_path), cwd=tmp_path, timeout=900, PYTHON=python)
    _assert_trained(run, tmp_path)
