"""Fixtures of the tutorial tests (the tutorials 000-003, ``docs/tutorials/``): a tiny local model in
place of the tutorials' 7B/8B checkpoints, the overrides that size a run down to this CPU,
and a clean ``set_device_map`` state around every test.

Each test names its tutorial and section (``test_000_section_4_4_fsdp_config``) and runs
that section's code block, adapted only where the hardware forces it: the model path, the
CPU for ``cuda``, sizes down. See ``docs/tutorials/``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from verl.models.tiny import save_tiny_model_dir

# Two steps of 4 prompts x 2 responses of at most 6 tokens on the built-in arithmetic data.
SMALL = (
    "data.train_batch_size=4",
    "data.max_response_length=6",
    "data.arithmetic.train_size=16",
    "data.arithmetic.val_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=2",
    "critic.ppo_mini_batch_size=2",
    "critic.ppo_micro_batch_size_per_device=2",
    "trainer.total_training_steps=2",
    "trainer.val_before_train=false",
    "trainer.logger=[]",
)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random Qwen2 causal LM directory (with tokenizer): the tutorials' model."""
    return save_tiny_model_dir(tmp_path_factory.mktemp("tut") / "model", arch="qwen2")


@pytest.fixture(scope="session")
def tiny_reward_model(tmp_path_factory) -> Path:
    """A one-layer Qwen2 with a scalar reward head: the tutorials' reward model."""
    return save_tiny_model_dir(
        tmp_path_factory.mktemp("tut") / "rm", arch="qwen2", num_layers=1, reward_head=True
    )


@pytest.fixture
def small(tiny_model: Path, tmp_path: Path) -> Callable[..., list[str]]:
    """``small(*extra)``: overrides running on the tiny model, writing under ``tmp_path``."""

    def make(*extra: str) -> list[str]:
        return [
            f"actor_rollout_ref.model.path={tiny_model}",
            *SMALL,
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            f"trainer.log_dir={tmp_path / 'logs'}",
            *extra,
        ]

    return make


@pytest.fixture(autouse=True)
def _no_kept_device_map() -> Iterator[None]:
    """``set_device_map(dp_config)`` keeps a map for the process; no test leaks one."""
    from verl.compat import clear_device_map

    clear_device_map()
    yield
    clear_device_map()
