"""docs/concepts.md's batch-size statements, checked against the code that does the splitting
(the worker's mini- and micro-batching, the config check)."""

from __future__ import annotations

import pytest
import torch

from verl.config import ConfigError, load_config
from verl.protocol import DataProto
from verl.workers.common import iter_ppo_mini_batches, micro_batches


def _samples(rows: int, prompt_len: int = 5, response_len: int = 3) -> DataProto:
    ids = torch.arange(rows * (prompt_len + response_len)).view(rows, -1) % 50
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(ids.shape[1]).expand(rows, -1).clone(),
            "response_mask": torch.ones(rows, response_len, dtype=torch.long),
        }
    )


def _optimizer_steps(train_batch, n, mini, devices, micro, epochs=1):
    """(optimizer steps, samples per device per step, micro-batches per step) of one rank,
    split the way ``run_ppo_update`` splits its share of a step's batch."""
    per_device = _samples(train_batch * n // devices)
    minis = list(
        iter_ppo_mini_batches(
            per_device, mini_batch_size=mini * n // devices, epochs=epochs, shuffle=True, seed=0
        )
    )
    micro_counts = {len(micro_batches(m, 3, micro)) for m in minis}
    return len(minis), {len(m) for m in minis}, micro_counts


def test_the_docs_example_and_the_main_job():
    # train_batch_size=16, n=4, ppo_mini_batch_size=8, 2 devices, micro 4
    assert _optimizer_steps(16, 4, 8, 2, 4) == (2, {16}, {4})
    # the main job: 8 prompts x 4, mini-batch 8, one device, micro 8
    assert _optimizer_steps(8, 4, 8, 1, 8) == (1, {32}, {4})
    # ppo_epochs multiplies the optimizer steps
    assert _optimizer_steps(16, 4, 8, 2, 4, epochs=3)[0] == 6


def test_sizes_that_do_not_split_are_refused_naming_the_key():
    with pytest.raises(ConfigError) as err:
        load_config(
            overrides=["data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=6"]
        )
    assert (
        "actor_rollout_ref.actor.ppo_mini_batch_size=6: does not divide "
        "data.train_batch_size=16 (prompts per step); use one of 1, 2, 4, 8, 16"
    ) in str(err.value)
