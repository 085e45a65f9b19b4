"""Streaming rollout with the rollout copy in a Ray actor (``trainer.backend=ray``).

The copy's ``generate_sequences`` keeps each group as its native engine finishes it and the
driver polls ``take_streamed_groups`` while the call runs (``ray_copy_link.polling``), so
groups reach the driver's buffer before the call that generated them has returned. Through
``fit`` (slow, Ray): a copy whose decode steps are slowed (a call outlasts many polls)
hands groups over mid-call, and with ``max_staleness=0`` the run trains on the synchronous
local run's samples with its losses and gradient norms; a run resumed from its step-2
checkpoint trains step 3 on its samples, loss and gradient norm (the runs are made once for
both tests). The poll itself: a stale call's groups are never handed over, and a failed poll
leaves the groups to the call's whole output.
"""

from __future__ import annotations

import shutil
import threading
import time

import pytest
import torch

from verl.controller import Dispatch, register
from verl.protocol import DataProto
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl.async_rollout import AsyncRollout
from verl.trainer.rl.trainer import RLTrainer
from verl.workers.rollout_copy import RolloutCopyWorker

from .taken_batches import record_group_arrivals
from .varied_reward import assert_updates_moved, even_token_reward

SLOW_STEP_S = 0.1  # each sampling step of the slowed copy (max_response_length 6, 3 slots)


class SlowCopy(RolloutCopyWorker):
    """The rollout copy with every sampling step of its native engine slowed by
    ``SLOW_STEP_S`` (the samples do not change)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        super().init_model(total_steps)
        plain = self.rollout._sample

        def slow(*args, **kwargs):
            time.sleep(SLOW_STEP_S)
            return plain(*args, **kwargs)

        self.rollout._sample = slow


def _fit(config, on_trainer=None):
    trainer = RLTrainer(config, reward_fn=even_token_reward, tracker=Tracker([]))
    if on_trainer is not None:
        on_trainer(trainer)
    trained = []
    update = trainer.update_policy

    def recording_update(gen):
        trained.append(gen.batch["responses"].clone())
        return update(gen)

    trainer.update_policy = recording_update
    trainer.fit()  # on Ray, its worker groups are shut down at the end
    return trainer, trained


SEEDED = (
    "actor_rollout_ref.rollout.seed=11",
    "trainer.total_training_steps=3",
    # 3 slots < 4 prompts x 2 samples: continuous batching, groups finish mid-call
    "actor_rollout_ref.rollout.decode_slots=3",
)


RAY_STREAM = (
    *SEEDED,
    "trainer.backend=ray",
    "trainer.async_rollout=true",
    "trainer.rollout_mode=streaming",
    "trainer.max_staleness=0",
    "trainer.save_freq=2",  # the resumed run starts from its step-2 checkpoint
)


@pytest.fixture(scope="module")
def ray_runs(module_rl_config, ray_session, tmp_path_factory):
    """The runs both slow tests read, made once: the synchronous local run, the streaming
    run on Ray with the slowed copy (its group arrivals recorded; saved after steps 2 and
    3), and a run resumed from a copy of that run's step-2 checkpoint."""
    import verl.workers.rollout_copy as rollout_copy

    runs = {}
    runs["sync"] = _fit(module_rl_config(*SEEDED))
    tmp = tmp_path_factory.mktemp("streaming_ray")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rollout_copy, "RolloutCopyWorker", SlowCopy)
        arrivals, watch_calls = record_group_arrivals(mp)

        def on_trainer(trainer):
            assert type(trainer.async_rollout.group).__name__ == "RayWorkerGroup"
            watch_calls(trainer)

        straight = tmp / "straight"
        runs["streaming"] = _fit(
            module_rl_config(*RAY_STREAM, f"trainer.default_local_dir={straight}"), on_trainer
        )
        runs["arrivals"] = list(arrivals)
        resumed = tmp / "resumed"
        shutil.copytree(straight / "global_step_2", resumed / "global_step_2")
        runs["resumed"] = _fit(
            module_rl_config(
                *RAY_STREAM, "trainer.resume_mode=auto", f"trainer.default_local_dir={resumed}"
            )
        )
    return runs


@pytest.mark.slow
def test_groups_stream_out_of_the_ray_actor_mid_call(ray_runs):
    sync, sync_samples = ray_runs["sync"]
    assert_updates_moved(sync.history)
    streaming, samples = ray_runs["streaming"]
    arrivals = ray_runs["arrivals"]
    # groups reached the driver's buffer while the actor's call still ran
    mid_call = [(b, p) for b, p, done in arrivals if not done]
    assert len(mid_call) >= 3, arrivals
    assert len(set(arrivals)) == len(arrivals)  # each group reported once
    assert len(samples) == len(sync_samples) == 3
    for got, want in zip(samples, sync_samples):
        assert torch.equal(got, want)
    for got, want in zip(streaming.history, sync.history, strict=True):  # the same updates
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert abs(got[key] - want[key]) <= 1e-6 * max(1.0, abs(want[key])), key
    assert [m["async/staleness_max"] for m in streaming.history] == [0.0, 0.0, 0.0]
    assert all(m["stream/dropped_groups"] == 0 for m in streaming.history)
    assert not [t for t in threading.enumerate() if t.name.startswith("verl-rollout")]


class _PolledCopy:
    """A copy group in another process, as the pipeline sees it: ``generate_sequences``
    runs on the caller's thread, its groups are taken through ``take_streamed_groups``."""

    def __init__(self, fail_polls: bool = False) -> None:
        self.fail_polls = fail_polls
        self.kept: list[tuple[str, int, DataProto, float]] = []
        self.lock = threading.Lock()
        self.tokens: list[str] = []

    def load_policy_weights(self, state, version):
        return [{"async/weight_sync_seconds": 0.0}]

    def take_streamed_groups(self, token):
        if self.fail_polls:
            raise RuntimeError("the actor died")
        with self.lock:
            taken, self.kept = self.kept, []
        return [(p, g, t) for tok, p, g, t in taken if tok == token]

    def generate(self, _group, prompts: DataProto) -> DataProto:
        token = prompts.meta_info["stream_token"]
        self.tokens.append(token)
        x = prompts.batch["x"]
        rows = x.repeat_interleave(2)
        with self.lock:  # a stale group of another call first: never handed over
            self.kept.append(("old", 0, DataProto.from_dict({"x": rows[:2]}), 1.0))
        for prompt in range(len(x)):
            group = DataProto.from_dict({"x": rows[2 * prompt : 2 * prompt + 2]})
            with self.lock:
                self.kept.append((token, prompt, group, 1.0))
            time.sleep(0.15)  # several polls per group
        return DataProto.from_dict({"x": rows})


@pytest.mark.parametrize("fail_polls", [False, True], ids=["polled", "poll_fails"])
def test_polled_groups_are_taken_once(monkeypatch, fail_polls, caplog):
    monkeypatch.setattr(AsyncRollout, "_copy_in_other_process", lambda self: True)
    copy_group = _PolledCopy(fail_polls)
    pipe = AsyncRollout(copy_group, copy_group.generate, lambda: {}, max_staleness=0, seed=0)
    pipe.stream_groups = True
    try:
        pipe.fill(lambda: DataProto.from_dict({"x": torch.tensor([10, 20, 30])}), 0)
        early = []
        deadline = time.monotonic() + 30
        while not pipe.head_ready() and time.monotonic() < deadline:
            got, _ = pipe.take_groups()
            early += got
            pipe.wait_progress(0.05)
        rest, _ = pipe.take_groups()
    finally:
        pipe.close()
    assert copy_group.tokens == ["0-0"]  # (dropped queues so far, batch index)
    if fail_polls:
        assert early == []
        assert "polling the rollout copy's streamed groups failed" in caplog.text
    else:
        assert len(early) >= 1  # taken while the call ran
    groups = {where: group.batch["x"].tolist() for group, _, where in early + rest}
    assert len(early) + len(rest) == 3
    assert groups == {(0, 0): [10, 10], (0, 1): [20, 20], (0, 2): [30, 30]}
    assert not [t for t in threading.enumerate() if t.name == "verl-rollout-poll"]


@pytest.mark.slow
def test_streaming_on_ray_resumes_with_each_group_once(ray_runs):
    """max_staleness=0 on Ray with the slowed copy: a run resumed from the streaming run's
    step-2 checkpoint trains step 3 on the uninterrupted run's samples (no group lost or
    repeated) with its loss and gradient norm."""
    straight, straight_samples = ray_runs["streaming"]
    resumed, after = ray_runs["resumed"]
    assert len(straight_samples) == 3 and len(after) == 1
    assert torch.equal(after[0], straight_samples[2])
    (got,) = resumed.history
    for key in ("actor/pg_loss", "actor/grad_norm"):
        want = straight.history[2][key]
        assert abs(got[key] - want) <= 1e-6 * max(1.0, abs(want)), key
    assert got["stream/dropped_groups"] == 0
