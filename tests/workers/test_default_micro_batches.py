"""How the trained roles' passes are cut into micro-batches by default and when a row count
is set (``verl.config.schema_roles.MicroBatchSplit``, ``verl.workers.common.micro_batches``).

Defaults: a token budget (``DEFAULT_TOKEN_BUDGET`` real tokens per micro-batch for the
packed actor, rows x padded length for the critic) for the update and the no-gradient
passes. A row count set by the user is honoured; ``use_dynamic_bsz`` forces one or the other.
"""

from __future__ import annotations

import pytest
import torch

from verl.config import ConfigError, TrainerConfig, load_config
from verl.config.schema_roles import DEFAULT_TOKEN_BUDGET
from verl.protocol import DataProto
from verl.workers.common import micro_batches

A, ROLLOUT, REF = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
P, R = 40, 60


def _batch(prompt_lens: list[int], response_lens: list[int]) -> DataProto:
    """Left-padded prompts of ``P`` columns + right-padded responses of ``R`` columns."""
    rows = len(prompt_lens)
    mask = torch.zeros(rows, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        mask[i, P - p : P + r] = 1
    ids = torch.randint(3, 50, (rows, P + R), generator=torch.Generator().manual_seed(0)) * mask
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
            "response_mask": mask[:, P:].float(),
        }
    )


def _uneven_batch(rows: int = 64) -> DataProto:
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(5, P + 1, (rows,), generator=gen).tolist()
    responses = torch.randint(1, R + 1, (rows,), generator=gen).tolist()
    return _batch(prompts, responses)


def _cfg(*overrides: str):
    return load_config(
        overrides=[
            "data.max_prompt_length=40",
            "data.max_response_length=60",
            "data.train_batch_size=16",
            f"{ROLLOUT}.n=4",
            f"{A}.ppo_mini_batch_size=16",
            "critic.ppo_mini_batch_size=16",
            *overrides,
        ]
    )


def _real_tokens(mb) -> int:
    return int(mb.data.batch["attention_mask"].sum())


def _covers_every_row_once(parts, rows: int) -> None:
    index = torch.cat([mb.index for mb in parts])
    assert sorted(index.tolist()) == list(range(rows))


def test_the_defaults_use_the_token_budget_for_every_pass():
    cfg = load_config()
    for role in (cfg.actor_rollout_ref.actor, cfg.critic):
        assert role.ppo_micro_batch_size_per_device is None and role.use_dynamic_bsz is None
        assert role.uses_token_budget and role.token_budget == DEFAULT_TOKEN_BUDGET
        assert role.rows_per_micro_batch() is None
    assert cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_device is None
    assert cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_device is None
    assert cfg.critic.forward_micro_batch_size_per_device is None


def test_the_default_budget_bounds_real_tokens_per_actor_micro_batch():
    actor = _cfg().actor_rollout_ref.actor
    actor.ppo_max_token_len_per_device = 500  # several micro-batches from 64 rows
    data = _uneven_batch()
    parts = micro_batches(data, R, None, actor)
    assert len(parts) >= 3
    _covers_every_row_once(parts, len(data))
    assert all(_real_tokens(mb) <= 500 for mb in parts)
    # greedy packing: no two consecutive micro-batches would have fit in one
    assert sum(_real_tokens(mb) for mb in parts) > 500 * (len(parts) - 1) / 2


def test_an_unpacked_critic_budget_counts_rows_times_padded_length():
    critic = _cfg("critic.ppo_max_token_len_per_device=500", "critic.pack_sequences=false").critic
    data = _uneven_batch()
    parts = micro_batches(data, R, None, critic)
    _covers_every_row_once(parts, len(data))
    for mb in parts:
        rows, width = mb.data.batch["attention_mask"].shape
        assert rows * width <= 500 or rows == 1


def test_a_sample_longer_than_the_default_budget_goes_alone():
    cfg = _cfg("data.max_prompt_length=4096", "data.max_response_length=4096")  # no error
    actor = cfg.actor_rollout_ref.actor
    actor.ppo_max_token_len_per_device = None
    data = _batch([40, 3, 3], [60, 2, 2])
    actor_budget = actor.token_budget
    actor.ppo_max_token_len_per_device = 50  # as if the default were below one sample
    parts = micro_batches(data, R, None, actor)
    assert [len(mb.index) for mb in parts] == [1, 2]
    assert actor_budget == DEFAULT_TOKEN_BUDGET


def test_an_explicit_row_count_is_honoured_by_the_update_and_the_log_prob_passes():
    cfg = _cfg(f"{A}.ppo_micro_batch_size_per_device=8")
    actor = cfg.actor_rollout_ref.actor
    assert not actor.uses_token_budget
    data = _uneven_batch()
    update = micro_batches(data, R, None, actor)
    assert [len(mb.index) for mb in update] == [8] * 8
    # a null log-prob key follows the update's rows; a set one is its own
    log_prob = micro_batches(data, R, None, actor)
    assert [len(mb.index) for mb in log_prob] == [8] * 8
    own = micro_batches(data, R, 32, actor)
    assert [len(mb.index) for mb in own] == [32, 32]


def test_a_log_prob_row_count_alone_leaves_the_update_on_the_token_budget():
    cfg = _cfg(f"{ROLLOUT}.log_prob_micro_batch_size_per_device=16")
    actor = cfg.actor_rollout_ref.actor
    data = _uneven_batch()
    update = micro_batches(data, R, None, actor)
    assert all(_real_tokens(mb) <= DEFAULT_TOKEN_BUDGET for mb in update)
    fewest = -(-int(data.batch["attention_mask"].sum()) // DEFAULT_TOKEN_BUDGET)
    assert fewest <= len(update) <= fewest + 1  # greedy packing fills the micro-batches
    rows = cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_device
    assert [len(mb.index) for mb in micro_batches(data, R, rows, actor)] == [16] * 4


def test_use_dynamic_bsz_true_overrides_row_counts():
    cfg = _cfg(
        f"{A}.use_dynamic_bsz=true",
        f"{A}.ppo_micro_batch_size_per_device=8",
        f"{A}.ppo_max_token_len_per_device=500",
    )
    actor = cfg.actor_rollout_ref.actor
    assert actor.uses_token_budget
    data = _uneven_batch()
    for rows in (None, 32):
        parts = micro_batches(data, R, rows, actor)
        assert all(_real_tokens(mb) <= 500 for mb in parts)
        _covers_every_row_once(parts, len(data))


def test_use_dynamic_bsz_false_needs_a_row_count():
    with pytest.raises(ConfigError) as err:
        _cfg(f"{A}.use_dynamic_bsz=false")
    assert (
        f"{A}.use_dynamic_bsz=false: row-count micro-batches need "
        f"{A}.ppo_micro_batch_size_per_device (samples per forward/backward), which is null; "
        f"set it, or leave use_dynamic_bsz null to use the token budget "
        f"{A}.ppo_max_token_len_per_device"
    ) in str(err.value)
    actor = _cfg(f"{A}.use_dynamic_bsz=false", f"{A}.ppo_micro_batch_size_per_device=4")
    actor = actor.actor_rollout_ref.actor
    assert actor.rows_per_micro_batch() == 4 and actor.rows_per_micro_batch(16) == 16
    # built in Python without validation: the worker's split names the missing key
    actor.ppo_micro_batch_size_per_device = None
    with pytest.raises(ValueError, match="use_dynamic_bsz=false needs ppo_micro_batch_size"):
        micro_batches(_uneven_batch(), R, None, actor)


def test_an_explicit_budget_below_one_sample_is_an_error_naming_it():
    with pytest.raises(ConfigError) as err:
        _cfg(f"{A}.ppo_max_token_len_per_device=64")
    assert (
        f"{A}.ppo_max_token_len_per_device=64: smaller than one sample (max_prompt_length + "
        "max_response_length = 100); raise it to at least 100"
    ) in str(err.value)
    # a row count set: the budget is not used, so not checked
    _cfg(f"{A}.ppo_max_token_len_per_device=64", f"{A}.ppo_micro_batch_size_per_device=4")


def test_the_gradient_accumulation_flat_key_sets_row_counts():
    # 4 prompts x rollout.n=4 per mini-batch in 2 accumulation steps: rows of 8
    cfg = TrainerConfig(gradient_accumulation_steps=2)
    actor = cfg.actor_rollout_ref.actor
    assert actor.ppo_micro_batch_size_per_device == 8 and not actor.uses_token_budget
