"""Every module a user runs with ``python -m`` (or ``torchrun -m``) runs: upstream verl's
SFT entry point ``verl.trainer.sft_trainer`` trains with its engine-based trainer's keys,
and no module with a ``main()`` lacks its ``__main__`` guard (which would exit 0 having
done nothing).

The ``python -m verl.trainer.sft_trainer`` runs use a ``python`` forked from one parent that
imported the trainer for the module (``tests/prewarmed_python.py``): the module runs as
``__main__`` with the command line's ``sys.argv``, its exit status and streams are the
command's, without each run's seconds of imports. ``torchrun -m`` of upstream's SFT entry
point starts real interpreters (``tests/trainer/test_driver_signals.py``)."""

from __future__ import annotations

import ast
import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.prewarmed_python import prewarmed_python
from verl.config import ConfigError, load_sft_config
from verl.data.io import write_records
from verl.models.tiny import build_tiny_tokenizer, save_tiny_model_dir

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "verl"

# upstream verl's module entry points, and this build's own
ENTRY_MODULES = [
    "verl.trainer.main_ppo",
    "verl.trainer.main_sft",
    "verl.trainer.main_dpo",
    "verl.trainer.main_generation",
    "verl.trainer.main_eval",
    "verl.trainer.fsdp_sft_trainer",
    "verl.trainer.sft_trainer",
    "verl.cli.config_gen",
    "verl.model_merger",
]

# The keys of upstream's engine-based SFT trainer (its sft_trainer_engine.yaml and
# examples/sft scripts), written for this test in their style.
UPSTREAM_SFT = [
    "engine=fsdp",
    "optim=fsdp",
    "model=hf_model",
    "engine.strategy=fsdp",
    "engine.ulysses_sequence_parallel_size=1",
    "model.use_remove_padding=true",
    "data.messages_key=conversation",
    "data.micro_batch_size_per_gpu=2",
    "data.train_batch_size=4",
    "data.max_length=64",
    "data.pad_mode=no_padding",
    "data.use_dynamic_bsz=true",
    "data.max_token_len_per_gpu=4096",
    "optim.lr=1e-4",
    "optim.clip_grad=0.5",
]


PREWARM = ("verl.trainer.sft_trainer", "verl.trainer.offline.sft", "verl.trainer.offline.launch")


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> Iterator[str]:
    """The module's prewarmed ``python`` (see the module's docstring)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with prewarmed_python(PREWARM, env, tmp_path_factory.mktemp("python")) as exe:
        yield exe


def _has_main_guard(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test):
            return "__main__" in ast.unparse(node.test)
    return False


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_every_module_with_a_main_has_a_main_guard():
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        has_main = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
        if path.name == "__init__.py" and (path.parent / "__main__.py").is_file():
            continue  # python -m <package> runs its __main__.py
        if path.name == "__main__.py" or not has_main:
            continue
        if not _has_main_guard(tree):
            missing.append(_module_name(path))
    for name in ENTRY_MODULES:
        path = ROOT / (name.replace(".", "/") + ".py")
        if not _has_main_guard(ast.parse(path.read_text())):
            missing.append(name)
    assert not missing, f"python -m would exit 0 doing nothing: {missing}"


def test_sft_trainer_module_answers_its_options(python):
    out = subprocess.run(
        [python, "-m", "verl.trainer.sft_trainer", "--validate-only", "engine=fsdp"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "config OK"
    bad = subprocess.run(
        [
            python,
            "-m",
            "verl.trainer.sft_trainer",
            "--validate-only",
            "engine.ulysses_sequence_parallel_size=0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert bad.returncode == 2
    assert "engine.ulysses_sequence_parallel_size=0" in bad.stderr
    assert "a sequence-parallel size is a positive integer" in bad.stderr


def test_upstream_sft_keys_read_onto_the_schema(caplog):
    caplog.set_level(logging.WARNING, logger="verl.compat")
    cfg = load_sft_config(overrides=UPSTREAM_SFT)
    assert cfg.engine.strategy == "auto"  # fsdp2 on several ranks, single on one
    assert cfg.engine.grad_clip == 0.5 and cfg.optim.lr == 1e-4
    assert cfg.data.micro_batch_size_per_device == 2 and cfg.data.messages_key == "conversation"
    assert cfg.data.packing is False  # removing padding is not packing (see the table)
    for key in ("model.use_remove_padding", "data.pad_mode", "engine.ulysses_sequence_parallel"):
        assert key in caplog.text
    # the group choice selects the engine, an explicit strategy sets it within
    explicit = load_sft_config(overrides=["engine=fsdp", "engine.strategy=fsdp2"])
    assert explicit.engine.strategy == "fsdp2"
    explicit = load_sft_config(overrides=["engine.strategy=single", "engine=fsdp"])
    assert explicit.engine.strategy == "single"
    # a mapping under engine is the native section
    assert load_sft_config(overrides=["engine.grad_clip=0.25"]).engine.grad_clip == 0.25


@pytest.mark.parametrize(
    "override, message",
    [
        ("engine.ulysses_sequence_parallel_size=0", "a sequence-parallel size is a positive"),
        ("engine=megatron", "Megatron-LM is not available"),
        ("optim=megatron", "Megatron-LM's optimizer is not available"),
    ],
)
def test_upstream_sft_values_without_a_meaning_here_are_refused(override, message):
    with pytest.raises(ConfigError) as err:
        load_sft_config(overrides=[override])
    assert override in str(err.value) and message in str(err.value)


@pytest.mark.slow
def test_python_m_sft_trainer_trains_with_upstream_keys(python, tmp_path):
    """``python -m verl.trainer.sft_trainer`` as upstream's scripts call it: two steps on a
    tiny model and multi-turn ``conversation`` rows, metrics, a checkpoint and the model."""
    tok = build_tiny_tokenizer()
    model = save_tiny_model_dir(tmp_path / "model", tokenizer=tok)
    rows = [
        {
            "conversation": [
                {"role": "user", "content": f"What is {i} + 1?"},
                {"role": "assistant", "content": f"{i + 1}"},
                {"role": "user", "content": "And twice that?"},
                {"role": "assistant", "content": f"{2 * (i + 1)}"},
            ]
        }
        for i in range(8)
    ]
    train = write_records(rows, tmp_path / "train.parquet")
    run = tmp_path / "run"
    argv = [
        *UPSTREAM_SFT,
        "data.max_length=96",
        f"model.path={model}",
        f"data.train_files={train}",
        "trainer.total_training_steps=2",
        "trainer.save_freq=2",
        "trainer.val_before_train=false",
        "trainer.logger=['console','jsonl']",
        "trainer.project_name=upstream",
        "trainer.experiment_name=sft",
        f"trainer.default_local_dir={run}",
        f"trainer.log_dir={run / 'logs'}",
    ]
    out = subprocess.run(
        [python, "-m", "verl.trainer.sft_trainer", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = [
        json.loads(line) for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["train/samples"] == 4 and m["train/loss_tokens"] > 0 for m in metrics)
    assert (run / "global_step_2" / "checkpoint.json").is_file()
    assert (run / "huggingface" / "model.safetensors").is_file()
