"""Tutorial 001, "快速掌握verl: PyTorch FSDP无缝集成教程" (FSDP): every code block, in order."""

from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from verl.compat import AliasError
from verl.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "grpo_trainer" / "run_qwen3-0.6b.sh"

ACTOR_BLOCK = """
actor_rollout_ref:
  actor:
    parallel_config:
      type: fsdp
      sharding_strategy: FULL_SHARD
      cpu_offload: false
      mixed_precision: true
      activation_checkpointing: true
"""
ROLLOUT_BLOCK = """
actor_rollout_ref:
  rollout:
    parallel_config:
      type: fsdp
      sharding_strategy: FULL_SHARD
      cpu_offload: false
      mixed_precision: true
      activation_checkpointing: false # rollout 不需反向可关闭检查点
"""
TRAINER_BLOCK = """
trainer:
  fsdp_init: true # 关键启用 verl 内置的 FSDP 初始化流程
"""
DATALOADER_BLOCK = """
data:
  train_dataloader:
    persistent_workers: true
    num_workers: 4
    prefetch_factor: 2
"""


def _merge(into: dict, update: dict) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _load(tmp_path, small, *blocks: str, extra: tuple[str, ...] = ()):
    tree: dict = {}
    for block in blocks:
        _merge(tree, yaml.safe_load(block))
    path = tmp_path / "tutorial.yaml"
    path.write_text(yaml.safe_dump(tree))
    return load_config(path, small(*extra))


def test_001_section_2_1_cpu_build_of_torch():
    # `pip install torch ... --index-url .../cu118`: a CUDA wheel is for NVIDIA GPUs; this
    # machine runs the CPU build, which verl uses as is (trainer.device=auto -> cpu)
    from verl.utils.device import resolve_device

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    assert (major, minor) >= (2, 1)
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")


def test_001_section_2_2_import_and_version():
    run = subprocess.run(
        [sys.executable, "-c", "import verl; print(verl.__version__)"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().count(".") == 2


def test_001_section_3_1_actor_parallel_config(tmp_path, small, caplog):
    with caplog.at_level(logging.WARNING, logger="verl.compat"):
        cfg = _load(tmp_path, small, ACTOR_BLOCK)
    actor = cfg.actor_rollout_ref.actor
    assert actor.strategy == "fsdp2"
    assert actor.fsdp_config.reshard_after_forward is True  # FULL_SHARD
    assert actor.fsdp_config.param_offload is False and actor.fsdp_config.optimizer_offload is False
    assert actor.fsdp_config.mixed_precision.param_dtype == "bf16"
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is True
    assert (
        "config alias actor_rollout_ref.actor.parallel_config.type -> "
        "actor_rollout_ref.actor.strategy='fsdp2' (the native spelling)"
    ) in caplog.text


def test_001_section_3_2_rollout_parallel_config(tmp_path, small, caplog):
    with caplog.at_level(logging.WARNING, logger="verl.compat"):
        cfg = _load(tmp_path, small, ACTOR_BLOCK, ROLLOUT_BLOCK)
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp2"
    assert "rollout.parallel_config.activation_checkpointing=False is dropped" in caplog.text
    # the rollout generates with the actor's module: a block that disagrees is refused
    with pytest.raises(ConfigError, match="rollout generates with the actor's own FSDP module"):
        _load(tmp_path, small, ACTOR_BLOCK, ROLLOUT_BLOCK.replace("FULL_SHARD", "SHARD_GRAD_OP"))


@pytest.mark.parametrize(
    ("blocks", "extra"),
    [
        # the YAML blocks agree; a command-line override of the rollout's setting does not
        (
            (ACTOR_BLOCK, ROLLOUT_BLOCK),
            ("actor_rollout_ref.rollout.parallel_config.sharding_strategy=SHARD_GRAD_OP",),
        ),
        # the rollout block in YAML, the actor's setting on the command line
        ((ROLLOUT_BLOCK,), ("actor_rollout_ref.actor.parallel_config.cpu_offload=true",)),
        # both on the command line, the actor's native key and the rollout's alias
        (
            (),
            (
                "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false",
                "actor_rollout_ref.rollout.parallel_config.sharding_strategy=FULL_SHARD",
            ),
        ),
    ],
)
def test_001_section_3_2_rollout_override_on_the_command_line_is_refused(
    tmp_path, small, blocks, extra
):
    # the same disagreement as the YAML block above, made by an override: refused alike
    with pytest.raises(
        ConfigError, match="rollout generates with the actor's own FSDP module"
    ) as err:
        _load(tmp_path, small, *blocks, extra=extra)
    assert "(command line)" in str(err.value)
    # an override that agrees is fine
    agree = "actor_rollout_ref.rollout.parallel_config.sharding_strategy=FULL_SHARD"
    cfg = _load(tmp_path, small, ACTOR_BLOCK, ROLLOUT_BLOCK, extra=(agree,))
    assert cfg.actor_rollout_ref.actor.fsdp_config.reshard_after_forward is True


def test_001_section_3_3_fsdp_init(tmp_path, small):
    cfg = _load(tmp_path, small, TRAINER_BLOCK)
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp2"
    off = _load(tmp_path, small, TRAINER_BLOCK.replace("true", "false"))
    assert off.actor_rollout_ref.actor.strategy == "single"


def test_001_section_3_yaml_keys_as_command_line_overrides(tmp_path, small, caplog):
    # the same tutorial keys given as dotted overrides (`python -m verl.trainer.main_ppo
    # trainer.fsdp_init=true actor_rollout_ref.actor.parallel_config.mixed_precision=true`)
    # go through the same alias table as the YAML blocks and build the same config
    overrides = (
        "trainer.fsdp_init=true",
        "actor_rollout_ref.actor.parallel_config.sharding_strategy=SHARD_GRAD_OP",
        "actor_rollout_ref.actor.parallel_config.cpu_offload=true",
        "actor_rollout_ref.actor.parallel_config.mixed_precision=true",
        "actor_rollout_ref.actor.parallel_config.activation_checkpointing=true",
    )
    with caplog.at_level(logging.WARNING, logger="verl.compat"):
        cfg = load_config(overrides=small(*overrides))
    block = ACTOR_BLOCK.replace("FULL_SHARD", "SHARD_GRAD_OP").replace(
        "cpu_offload: false", "cpu_offload: true"
    )
    assert cfg == _load(tmp_path, small, block, TRAINER_BLOCK)
    actor = cfg.actor_rollout_ref.actor
    assert actor.strategy == "fsdp2" and actor.fsdp_config.reshard_after_forward is False
    assert actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload
    assert actor.fsdp_config.mixed_precision.param_dtype == "bf16"
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is True
    assert "config alias trainer.fsdp_init -> actor_rollout_ref.actor.strategy" in caplog.text
    # a bad alias value on the command line is a config error naming the override
    with pytest.raises(ConfigError, match=r"override 'trainer.fsdp_init=maybe'.*true or false"):
        load_config(overrides=small("trainer.fsdp_init=maybe"))


def test_001_section_3_3_lora_ignore_modules(small, caplog):
    # The tip: LoRA adapter layers must be kept out of FSDP's sharding (ignore_modules).
    # Here FSDP2 shards each adapter with the layer it belongs to (frozen and trainable
    # parameters in one unit), so no ignore list is needed; LoRA is model.lora_rank.
    from verl.models import build_tiny_model
    from verl.models.lora import apply_lora, lora_spec_from_config

    cfg = load_config(overrides=small("actor_rollout_ref.model.lora_rank=8"))
    assert cfg.actor_rollout_ref.model.lora_rank == 8
    # the tip's ignore_modules is accepted (YAML block and Python fsdp_config), with a note
    # saying why it needs no effect; the config is the one without it
    from verl import TrainerConfig

    block = ACTOR_BLOCK + "      ignore_modules: [LoraLayer]\n"
    tmp = Path(cfg.trainer.log_dir).parent
    with caplog.at_level(logging.WARNING, logger="verl.compat"):
        with_list = _load(tmp, small, block, extra=("actor_rollout_ref.model.lora_rank=8",))
        flat = TrainerConfig(fsdp_config={"ignore_modules": ["LoraLayer"]})
    assert with_list == _load(
        tmp, small, ACTOR_BLOCK, extra=("actor_rollout_ref.model.lora_rank=8",)
    )
    assert flat == TrainerConfig()
    text = "ignore_modules=['LoraLayer'] is accepted and needs no effect: FSDP2 shards each LoRA"
    assert caplog.text.count(text) == 2
    model = apply_lora(build_tiny_model(), lora_spec_from_config(cfg.actor_rollout_ref.model))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)


def test_001_section_4_1_train_dataloader(tmp_path, small, caplog):
    with caplog.at_level(logging.WARNING, logger="verl.compat"):
        cfg = _load(tmp_path, small, DATALOADER_BLOCK)
    d = cfg.data
    assert (d.dataloader_num_workers, d.persistent_workers, d.prefetch_factor) == (4, True, 2)
    assert (
        "config alias data.train_dataloader.num_workers -> data.dataloader_num_workers=4"
    ) in caplog.text
    # the workers read and tokenize the prompt rows lazily; the batches are the ones the
    # in-process loader gives (the tutorial's 4 workers, 2 here: the machine has 2 cores)
    from verl.data import LazyRLHFDataset
    from verl.models import load_tokenizer
    from verl.trainer.rl.build import build_data

    cfg.data.dataloader_num_workers = 2
    # an earlier test of the same pytest worker may have left daemons of its own
    before = set(multiprocessing.active_children())
    tokenizer = load_tokenizer(cfg.actor_rollout_ref.model.path)
    data = build_data(cfg, tokenizer, tmp_path)
    assert isinstance(data.train_dataset, LazyRLHFDataset)
    cfg.data.dataloader_num_workers, cfg.data.persistent_workers = 0, False
    cfg.data.prefetch_factor = None
    plain = build_data(cfg, tokenizer, tmp_path)
    with_workers = list(data.train_loader)
    assert len(with_workers) == 16 // 4
    assert set(multiprocessing.active_children()) - before  # persistent
    for a, b in zip(with_workers, plain.train_loader):
        assert torch.equal(a.batch["input_ids"], b.batch["input_ids"])
    data.train_loader.close()
    assert set(multiprocessing.active_children()) - before == set()


def test_001_section_4_2_state_dict_for_save(small, tmp_path):
    from transformers import AutoModelForCausalLM

    from verl.trainer.ppo import PPOTrainer

    cfg = load_config(overrides=small())
    trainer = PPOTrainer(cfg)
    try:
        model = trainer.model  # the model the trainer hands out
        full_state_dict = model.state_dict_for_save()  # verl 自动 gather 全局完整 state dict
        torch.save(full_state_dict, tmp_path / "actor_full.pt")
    finally:
        trainer.close()
    # a single-device model loads it
    plain = AutoModelForCausalLM.from_pretrained(cfg.actor_rollout_ref.model.path)
    plain.load_state_dict(torch.load(tmp_path / "actor_full.pt"))
    for name, tensor in plain.state_dict().items():
        assert torch.equal(tensor, full_state_dict[name]), name


def test_001_section_5_run_script_without_the_model_says_what_to_do():
    run = subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        env={**os.environ, "MODEL_PATH": ""},
    )
    assert run.returncode == 2
    assert "Qwen3-0.6B is not shipped" in run.stderr
    assert "set MODEL_PATH=DIR" in run.stderr and "bash scripts/run.sh" in run.stderr


@pytest.mark.slow
def test_001_section_5_run_script_trains_with_fsdp_over_two_ranks(tiny_model, tmp_path):
    # `bash run_qwen3-0.6b.sh` on the tiny model, one step; sections 5.1 and 6.2 too:
    # the FSDP log lines reach the driver's console, under `ulimit -n 65536` where allowed
    overrides = [
        "data.train_batch_size=4",
        "data.max_response_length=6",
        "data.arithmetic.train_size=8",
        "data.arithmetic.val_size=2",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=2",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        f"trainer.log_dir={tmp_path / 'logs'}",
    ]
    env = {**os.environ, "MODEL_PATH": str(tiny_model), "PYTHON": sys.executable}
    env["PYTHONPATH"] = str(ROOT)
    command = f"ulimit -n 65536 2>/dev/null; bash {SCRIPT} " + " ".join(overrides)
    run = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, env=env, timeout=600
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert "over 2 ranks (reshard_after_forward=True" in out  # the worker's FSDP2 line
    assert "config alias trainer.fsdp_init" in out
    assert (tmp_path / "logs" / "metrics.jsonl").is_file()


def test_001_section_6_1_reward_tensors_and_devices(tiny_model):
    # "use model.device for tensors a reward function creates": here a reward function
    # returns one number per response (a 0-d tensor on any device is read as its value), so
    # its tensors never meet the model's; a per-batch tensor is refused with the reason
    from transformers import AutoModelForCausalLM

    from verl.rewards.results import coerce_result

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    reward = torch.tensor(0.5, device=model.device)
    assert coerce_result(reward).score == 0.5
    bad = coerce_result(torch.tensor([1.0, 0.5], device=model.device))
    assert not bad.ok
    assert "reward must be a number or a dict with a numeric 'score'" in bad.message


def test_001_section_7_1_cpu_offload(tmp_path, small):
    block = ACTOR_BLOCK.replace(
        "cpu_offload: false", "cpu_offload: true\n      offload_params: true"
    )
    fsdp = _load(tmp_path, small, block).actor_rollout_ref.actor.fsdp_config
    assert fsdp.param_offload is True and fsdp.optimizer_offload is True
    # the same keys in Python, TrainerConfig(fsdp_config={...}), as in YAML
    from verl import TrainerConfig

    config = TrainerConfig(fsdp_config={"cpu_offload": True, "offload_params": True})
    for fsdp in (config.actor_rollout_ref.actor.fsdp_config, config.critic.fsdp_config):
        assert fsdp.param_offload is True and fsdp.optimizer_offload is True
    params_only = TrainerConfig(fsdp_config={"offload_params": True})
    fsdp = params_only.actor_rollout_ref.actor.fsdp_config
    assert fsdp.param_offload is True and fsdp.optimizer_offload is False
    with pytest.raises(ConfigError, match="both set param_offload"):
        TrainerConfig(fsdp_config={"cpu_offload": False, "offload_params": True})


def test_001_megatron_names_what_to_use_instead(tmp_path, small):
    # strategy=megatron (and parallel_config.type: megatron): no Megatron engine; FSDP2, with
    # Ulysses sequence parallelism for Megatron's
    with pytest.raises(ConfigError) as err:
        load_config(overrides=small("actor_rollout_ref.actor.strategy=megatron"))
    assert "no Megatron engine" in str(err.value)
    assert "ulysses_sequence_parallel_size" in str(err.value)
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, small, ACTOR_BLOCK.replace("type: fsdp", "type: megatron"))
    assert "there is no Megatron-LM engine here" in str(err.value)
    assert "ulysses_sequence_parallel_size" in str(err.value)
    # `pip install verl[megatron]`: the extra installs nothing; the docs say what instead
    text = (ROOT / "docs" / "distributed.md").read_text()
    assert "verl[megatron]" in text and "ulysses_sequence_parallel_size" in text


def test_001_section_7_2_fp8_needs_an_h100(tmp_path, small):
    block = ACTOR_BLOCK.replace("mixed_precision: true", "mixed_precision: fp8")
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, small, block)
    msg = str(err.value)
    assert "fp8 training compute needs an H100-class GPU" in msg
    assert "trainer.model_precision_map={reference: fp8, reward: fp8}" in msg
    # the same check from Python, without a file
    from verl.compat import translate_tree

    with pytest.raises(AliasError, match="fp8 here is weight-only"):
        translate_tree(yaml.safe_load(block))


ASYNC_BLOCK = """
trainer:
  async_rollout: true
  rollout_batch_size: 64
"""


def test_001_section_7_3_async_rollout(tmp_path, small, caplog):
    # the block as pasted, beside a training batch of 4 prompts: nothing else set
    with caplog.at_level(logging.WARNING, logger="verl.config"):
        cfg = _load(tmp_path, small, ASYNC_BLOCK)
    assert cfg.trainer.async_rollout is True and cfg.data.rollout_batch_size == 64
    # the rollout correction the stale samples need is switched on, saying so
    assert cfg.actor_rollout_ref.actor.rollout_is_threshold == 2.0
    assert "rollout correction switched on, actor_rollout_ref.actor.rollout_is_threshold=2.0" in (
        caplog.text
    )
    # 64 prompts generating ahead of training = 16 training batches of 4: the pipeline depth
    assert cfg.trainer.max_staleness == 16
    assert "the pipeline keeps 64 prompts (16 training batches) generating ahead" in caplog.text
    # a threshold of the user's is kept; a size that is not a multiple is refused
    cfg = _load(
        tmp_path, small, ASYNC_BLOCK, extra=("actor_rollout_ref.actor.rollout_is_threshold=5.0",)
    )
    assert cfg.actor_rollout_ref.actor.rollout_is_threshold == 5.0
    with pytest.raises(ConfigError, match=r"a multiple of data\.train_batch_size=4"):
        _load(tmp_path, small, ASYNC_BLOCK.replace("64", "62"))
    # without async, a generation batch is one training batch
    with pytest.raises(ConfigError, match=r"without trainer\.async_rollout"):
        _load(tmp_path, small, ASYNC_BLOCK.replace("true", "false"))
    # the same from Python: TrainerConfig(...).validate() resolves the config itself
    from verl import TrainerConfig

    py = TrainerConfig()
    py.data.train_batch_size, py.data.rollout_batch_size = 4, 8
    py.trainer.async_rollout = True
    py.validate()
    assert py.actor_rollout_ref.actor.rollout_is_threshold == 2.0 and py.trainer.max_staleness == 2


@pytest.mark.slow
def test_001_section_7_3_async_rollout_trains_with_the_pipeline_full(tmp_path, small):
    # the block with 8 prompts per generation ahead of 4-prompt training batches: two
    # batches in flight, the stale samples importance-corrected
    from verl.trainer.rl.trainer import RLTrainer

    block = ASYNC_BLOCK.replace("64", "8")
    cfg = _load(tmp_path, small, block, extra=("trainer.total_training_steps=3",))
    assert cfg.trainer.max_staleness == 2
    trainer = RLTrainer(cfg)
    try:
        trainer.fit()
        history = trainer.history
    finally:
        trainer.close()
    assert len(history) == 3
    assert max(h["async/staleness_max"] for h in history) == 2
    assert all("actor/rollout_is_weight_mean" in h for h in history)
