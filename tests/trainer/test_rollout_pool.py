"""A pool of rollout copies (``trainer.rollout_copies`` > 1, ``trainer.backend=ray``).

The copy group has one Ray actor per copy; each generation batch's prompts are split into
equal shares of whole prompts by rank, every weight load reaches every copy, the streamed
groups of every copy are polled with the batch's prompt indices, and the output is the
concatenation in prompt order. Each copy's native engine draws a sample's uniforms by its
row in the whole batch, so the pool samples what one copy would.

Slow (Ray): one-step-off with 2 copies trains 2 steps, each copy sampling its own half of
the rows (rows 0-3 and 4-7 of 4 prompts x 2 samples); streaming with ``max_staleness=0``
and 2 slowed copies trains on the synchronous local run's samples with its losses, groups of
both halves reaching the driver while their call runs, and a pool resumed from its step-2
checkpoint trains step 3 as it did (``max_staleness=1``: ``test_rollout_pool_resume.py``).
Fast: the config refusals, and partial rollouts taken (``test_rollout_pool_partial.py``).
"""

from __future__ import annotations

import shutil
import threading
import time

import pytest
import torch

from verl.config import ConfigError
from verl.controller import Dispatch, register
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl.trainer import RLTrainer
from verl.workers.rollout_copy import RolloutCopyWorker

from .taken_batches import record_group_arrivals
from .varied_reward import assert_updates_moved, even_token_reward

ASYNC = ("trainer.async_rollout=true", "trainer.backend=ray")
SLOW_STEP_S = 0.1


class CountingCopy(RolloutCopyWorker):
    """The rollout copy recording the batch rows its native engine samples (as the engine
    sees them: after the pool's shift); ``slow``: each sampling step takes ``SLOW_STEP_S``
    longer (the samples do not change)."""

    slow = False

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        super().init_model(total_steps)
        self.rows_sampled: set[int] = set()
        plain = self.rollout._sample
        slow = self.slow

        def counting(logits, rows, steps, params, seed):
            self.rows_sampled.update(int(r) for r in rows)
            if slow:
                time.sleep(SLOW_STEP_S)
            return plain(logits, rows, steps, params, seed)

        self.rollout._sample = counting

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, beside=True)
    def sampled_rows(self) -> list[int]:
        return sorted(self.rows_sampled)


class SlowCountingCopy(CountingCopy):
    slow = True


def _fit(config, on_trainer=None):
    """``(trainer, responses trained per step, each step's rows sampled by rank)``."""
    trainer = RLTrainer(config, reward_fn=even_token_reward, tracker=Tracker([]))
    if on_trainer is not None:
        on_trainer(trainer)
    trained, rows = [], []
    update = trainer.update_policy

    def recording_update(gen):
        trained.append(gen.batch["responses"].clone())
        copy = getattr(trainer, "async_rollout", None)
        if copy is not None:
            rows.append(copy.group.sampled_rows())
        return update(gen)

    trainer.update_policy = recording_update
    trainer.fit()  # on Ray, its worker groups are shut down at the end
    return trainer, trained, rows


def test_rollout_copies_refusals(rl_config):
    assert rl_config(*ASYNC, "trainer.rollout_copies=2").trainer.rollout_copies == 2
    assert rl_config(*ASYNC).trainer.rollout_copies == 1
    cases = {
        ("trainer.async_rollout=true", "trainer.backend=local"): "starts one process per copy",
        ("trainer.backend=ray",): "splits the generation of the asynchronous rollout",
        (*ASYNC, "data.train_batch_size=3"): r"must divide data\.train_batch_size=3",
        (*ASYNC, "actor_rollout_ref.rollout.name=vllm"): "one vllm engine in lock step",
        (*ASYNC, "actor_rollout_ref.rollout.name=sglang"): "one sglang engine in lock step",
    }
    for overrides, message in cases.items():
        with pytest.raises(ConfigError, match=rf"trainer\.rollout_copies=2.*{message}"):
            rl_config(*overrides, "trainer.rollout_copies=2")
    with pytest.raises(ConfigError, match="rollout_copies"):
        rl_config(*ASYNC, "trainer.rollout_copies=0")
    for mode in ("continue", "resume"):  # each copy owns its mailbox (test_rollout_pool_partial)
        pooled = rl_config(
            *ASYNC,
            "trainer.rollout_mode=streaming",
            f"trainer.partial_rollout={mode}",
            "trainer.rollout_copies=2",
        )
        assert pooled.trainer.partial_rollout == mode and pooled.trainer.rollout_copies == 2


@pytest.mark.slow
def test_one_step_off_with_two_copies(rl_config, ray_session, monkeypatch):
    import verl.workers.rollout_copy as rollout_copy

    monkeypatch.setattr(rollout_copy, "RolloutCopyWorker", CountingCopy)
    trainer, trained, rows = _fit(
        rl_config(*ASYNC, "trainer.rollout_copies=2", "trainer.total_training_steps=2")
    )
    assert trainer.async_rollout.group.world_size == 2
    assert len(trained) == 2 and all(len(r) == 8 for r in trained)  # 4 prompts x 2 samples
    # each copy sampled its own half of the batch's rows, counted as the batch's
    assert rows[-1] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [m["async/staleness_max"] for m in trainer.history] == [0.0, 1.0]
    assert not [t for t in threading.enumerate() if t.name.startswith("verl-rollout")]


SEEDED = (
    "actor_rollout_ref.rollout.seed=11",
    "algorithm.adv_estimator=grpo",
    "trainer.total_training_steps=3",
    "trainer.val_before_train=false",
    # 3 slots < 2 prompts x 2 samples per copy: groups finish mid-call
    "actor_rollout_ref.rollout.decode_slots=3",
)
STREAMING_POOL = (
    *SEEDED,
    *ASYNC,
    "trainer.rollout_mode=streaming",
    "trainer.max_staleness=0",
    "trainer.rollout_copies=2",
    "trainer.save_freq=2",  # the resumed run starts from its step-2 checkpoint
)


@pytest.fixture(scope="module")
def streaming_pool(module_rl_config, ray_session, tmp_path_factory):
    """The runs the two streaming tests read, made once: the synchronous local run, the
    streaming run with 2 slowed copies (its group arrivals recorded; saved after steps 2 and
    3), and a pool run resumed from a copy of that run's step-2 checkpoint."""
    import verl.workers.rollout_copy as rollout_copy

    tmp = tmp_path_factory.mktemp("streaming_pool")
    runs = {"sync": _fit(module_rl_config(*SEEDED))}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rollout_copy, "RolloutCopyWorker", SlowCountingCopy)
        arrivals, watch_calls = record_group_arrivals(mp)
        straight = f"trainer.default_local_dir={tmp / 'straight'}"
        runs["streaming"] = _fit(module_rl_config(*STREAMING_POOL, straight), watch_calls)
        runs["arrivals"] = list(arrivals)
        shutil.copytree(tmp / "straight" / "global_step_2", tmp / "resumed" / "global_step_2")
        resumed = f"trainer.default_local_dir={tmp / 'resumed'}"
        runs["resumed"] = _fit(
            module_rl_config(*STREAMING_POOL, "trainer.resume_mode=auto", resumed)
        )
    return runs


@pytest.mark.slow
def test_streaming_with_two_copies_trains_the_synchronous_samples(streaming_pool):
    sync, sync_samples, _ = streaming_pool["sync"]
    streaming, samples, rows = streaming_pool["streaming"]
    arrivals = streaming_pool["arrivals"]
    # groups of both copies' shares reached the driver while their call ran
    mid_call = {prompt for _, prompt, done in arrivals if not done}
    assert mid_call & {0, 1} and mid_call & {2, 3}, arrivals
    assert len(set(arrivals)) == len(arrivals)  # each group reported once
    assert rows[-1] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(samples) == len(sync_samples) == 3
    for got, want in zip(samples, sync_samples):
        assert torch.equal(got, want)
    assert_updates_moved(sync.history)
    for got, want in zip(streaming.history, sync.history, strict=True):  # the same updates
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert abs(got[key] - want[key]) <= 1e-6 * max(1.0, abs(want[key])), key
    assert [m["async/staleness_max"] for m in streaming.history] == [0.0, 0.0, 0.0]
    assert all(m["stream/dropped_groups"] == 0 for m in streaming.history)
    assert not [t for t in threading.enumerate() if t.name.startswith("verl-rollout")]


@pytest.mark.slow
def test_a_resumed_streaming_pool_trains_the_straight_runs_step(streaming_pool):
    """``max_staleness=0`` (the resumed step's batch is generated by the fresh pool after its
    first weight load): the run resumed from the streaming run's step-2 checkpoint trains
    step 3 on its responses with its policy loss and gradient norm (within 1e-6).
    ``max_staleness=1`` is in ``test_rollout_pool_resume.py``."""
    straight, straight_trained, _ = streaming_pool["streaming"]
    resumed, after, _ = streaming_pool["resumed"]
    assert straight.async_rollout.group.world_size == resumed.async_rollout.group.world_size == 2
    assert len(straight_trained) == 3 and len(after) == 1
    assert all(len(r) == 8 for r in straight_trained)  # 4 prompts x 2 samples, both copies
    assert torch.equal(after[0], straight_trained[2])
    assert_updates_moved(resumed.history)
    (got,) = resumed.history
    want = straight.history[2]
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert abs(got[key] - want[key]) <= 1e-6 * max(1.0, abs(want[key])), key
    assert got["async/staleness_max"] == want["async/staleness_max"] == 0.0
    assert got["stream/dropped_groups"] == 0
