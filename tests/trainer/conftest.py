"""Fixtures of the trainer tests: one tiny model directory and the RL config built on it, and
the tiny model taught to call the calculator (``tool_model_dir``, trained once a session)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from verl.config import TrainerConfig, load_config
from verl.models.tiny import save_tiny_model_dir

from .tool_model import train_tool_model

# Two steps of 4 prompts x 2 responses of at most 6 tokens on the built-in arithmetic data.
BASE_OVERRIDES = (
    "data.train_batch_size=4",
    "data.max_response_length=6",
    "data.arithmetic.train_size=16",
    "data.arithmetic.val_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=2",
    "actor_rollout_ref.actor.optim.lr=1e-3",
    "trainer.total_training_steps=2",
    "trainer.logger=[jsonl]",
    # fp32 whatever the CPU: the default (auto) is bf16 autocast on CPUs with native bf16,
    # which would make these runs machine-dependent (and slower: the tiny model is overhead
    # bound); the default itself is tested in tests/workers/test_precision_wiring.py
    "trainer.mixed_precision=none",
)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen2 saved as a HuggingFace directory (with its tokenizer)."""
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", arch="qwen2")


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory) -> Path:
    """The tiny model taught to call the calculator (``tool_model.train_tool_model``): the
    multi-turn, streaming multi-turn and chaos tests all start from it."""
    return train_tool_model(tmp_path_factory.mktemp("tool_model") / "model")


def config_factory(model_dir: Path, out: Path) -> Callable[..., TrainerConfig]:
    """``make(*overrides)``: the tiny-model RL config of ``model_dir`` writing under ``out``;
    ``overrides`` come after :data:`BASE_OVERRIDES`, so they win."""

    def make(*extra: str) -> TrainerConfig:
        return load_config(
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                *BASE_OVERRIDES,
                f"trainer.default_local_dir={out}",
                f"trainer.log_dir={out}",
                *extra,
            ]
        )

    return make


@pytest.fixture
def rl_config(tiny_model_dir: Path, tmp_path: Path) -> Callable[..., TrainerConfig]:
    """``rl_config(*overrides)``: the tiny-model RL config writing under ``tmp_path``.

    ``overrides`` come after :data:`BASE_OVERRIDES`, so they win.
    """
    return config_factory(tiny_model_dir, tmp_path)


@pytest.fixture(scope="module")
def module_rl_config(tiny_model_dir: Path, tmp_path_factory) -> Callable[..., TrainerConfig]:
    """``rl_config`` for a module-scoped fixture (runs that several tests assert on): the
    same configs, writing under a directory of the module's."""
    return config_factory(tiny_model_dir, tmp_path_factory.mktemp("module_runs"))
