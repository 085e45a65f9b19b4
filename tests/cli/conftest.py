"""Fixtures of the CLI tests: a tiny model directory and a small arithmetic prompt file."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl.data.arithmetic import write_arithmetic_dataset
from verl.models.tiny import save_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen2 saved as a HuggingFace directory (with its tokenizer)."""
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", arch="qwen2")


@pytest.fixture(scope="session")
def arith_file(tmp_path_factory) -> Path:
    """5 one-digit addition prompts in verl's format (``test.parquet``)."""
    out = tmp_path_factory.mktemp("arith")
    _, val = write_arithmetic_dataset(out, 4, 5, 1, ["+"], 0, "parquet", "chat")
    return Path(val)
