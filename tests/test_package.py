"""The package imports cheaply: no torch, Ray or GPU-only package at `import verl`."""

from __future__ import annotations

import subprocess
import sys

import verl


def test_version_and_light_import():
    code = (
        "import sys, verl; print(verl.__version__); "
        "print(sorted(m for m in ('torch', 'ray', 'vllm', 'flash_attn', 'sglang', 'megatron') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == verl.__version__
    assert out[1] == "[]"


def test_lazy_public_names():
    assert verl.TrainerConfig.__name__ == "TrainerConfig"
    assert verl.DataProto.__name__ == "DataProto"
    assert callable(verl.make_trainer_config)
    try:
        verl.NotAThing  # noqa: B018
    except AttributeError as e:
        assert "NotAThing" in str(e)
    else:
        raise AssertionError("unknown attribute did not raise")


def test_the_rl_trainer_does_not_import_what_a_jsonl_run_does_not_use():
    """pyarrow costs ~28 MiB of RSS in every process that imports it: the trainer imports
    it only when a parquet file is read or written (verl/data/io.py, lazy_dataset.py)."""
    code = (
        "import sys, verl.cli.ppo, verl.trainer.rl.trainer; "
        "print(sorted(m for m in ('pyarrow', 'ray', 'datasets') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
