"""Streaming rollout (``trainer.rollout_mode=streaming``, ``verl/trainer/rl/streaming.py``).

Against a fake rollout copy: whole groups in order, the policy version and staleness of
every sample, stale groups dropped and counted (never trained), the buffer bounded, and
the buffer saved and restored as data. Through ``fit`` (slow): with ``max_staleness=0`` the
streaming trainer trains on the synchronous trainer's samples and ends on its weights
(within 1e-6); a streaming run killed and resumed mid-stream ends bit-identical.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl.async_rollout import AsyncRollout
from verl.trainer.rl.streaming import STREAM_FILES, StreamingSource
from verl.trainer.rl.trainer import RLTrainer

N = 2  # responses per prompt
GROUPS = 2  # prompts per batch = groups per training batch


class _FakeCopy:
    """A rollout group: each prompt x becomes N rows (x, version that generated it)."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.generations = 0

    def load_policy_weights(self, state, version):
        self.version = version
        return [{"async/weight_sync_seconds": 0.0}]

    def generate(self, group, prompts: DataProto) -> DataProto:
        self.generations += 1
        x = prompts.batch["x"].repeat_interleave(N)
        return DataProto.from_dict(
            tensors={"x": x},
            non_tensors={
                "uid": np.repeat(prompts.non_tensor_batch["uid"], N),
                "seen_version": np.full(len(x), self.version),
            },
            meta_info={"seed": prompts.meta_info["seed"]},
        )


def _source(actor: dict, max_staleness: int, buffer_groups: int | None = None):
    fake = _FakeCopy()
    pipe = AsyncRollout(
        fake,
        fake.generate,
        lambda: {"w": torch.tensor(actor["version"])},
        max_staleness=max(max_staleness, 1),
        seed=3,
    )
    source = StreamingSource(
        pipe,
        lambda gen, metrics: (gen, metrics),
        lambda: actor["version"],
        num_groups=GROUPS,
        max_staleness=max_staleness,
        buffer_groups=buffer_groups,
    )
    return fake, pipe, source


def _draws():
    stream = iter(range(0, 1000, GROUPS))

    def draw():
        start = next(stream)
        return DataProto.from_dict(tensors={"x": torch.arange(start, start + GROUPS)})

    return draw


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
def test_default_buffer_never_drops_and_records_versions(max_staleness):
    actor = {"version": 0}
    _, pipe, source = _source(actor, max_staleness)
    draw = _draws()
    try:
        seen = []
        for _ in range(6):
            gen, metrics = source.next(draw)
            assert len(gen) == GROUPS * N
            made_by = gen.non_tensor_batch["rollout_policy_version"]
            assert (gen.non_tensor_batch["seen_version"] == made_by).all()
            assert (gen.non_tensor_batch["staleness"] == actor["version"] - made_by).all()
            assert metrics["async/staleness_max"] <= max_staleness
            assert metrics["stream/dropped_groups"] == 0
            # whole groups: each prompt's N rows together
            assert (
                gen.batch["x"].tolist()
                == gen.batch["x"].view(-1, N)[:, :1].repeat(1, N).flatten().tolist()
            )
            seen += gen.batch["x"][::N].tolist()
            actor["version"] += 1
        assert seen == list(range(6 * GROUPS))  # every prompt, in order, none skipped
        assert metrics["async/staleness_max"] == max_staleness  # steady state
    finally:
        pipe.close()


def test_stale_groups_are_dropped_and_counted():
    """A buffer of 3 batches with max_staleness=1: every third batch is 2 updates old
    when its turn comes, and is dropped, never trained on."""
    actor = {"version": 0}
    _, pipe, source = _source(actor, max_staleness=1, buffer_groups=3 * GROUPS)
    draw = _draws()
    trained, dropped = [], []
    try:
        for _ in range(6):
            gen, metrics = source.next(draw)
            assert (gen.non_tensor_batch["staleness"] <= 1).all()
            assert metrics["stream/buffered_groups"] + metrics["stream/queued_prompts"] <= 3 * 2
            trained += gen.batch["x"][::N].tolist()
            dropped.append(metrics["stream/dropped_groups"])
            actor["version"] += 1
    finally:
        pipe.close()
    assert sum(dropped) > 0 and metrics["stream/dropped_groups_total"] == sum(dropped)
    assert len(trained) == len(set(trained)) == 6 * GROUPS
    assert len(trained) + sum(dropped) == max(trained) + 1  # every prompt: trained or dropped


def test_buffer_is_saved_and_restored(tmp_path):
    actor = {"version": 0}
    _, pipe, source = _source(actor, max_staleness=1, buffer_groups=3 * GROUPS)
    draw = _draws()
    for _ in range(2):
        source.next(draw)
        actor["version"] += 1
    source._collect({"timing_s/async_gen": 0.0, "timing_s/async_weight_sync": 0.0}, wait=True)
    assert source.groups, "the test needs buffered groups"
    state = pipe.state_dict()
    pipe.save_files(tmp_path / "async_rollout")
    files = sorted(p.name for p in (tmp_path / "async_rollout").iterdir())
    assert files == sorted(
        [
            "inflight.json",
            "inflight.safetensors",
            f"{STREAM_FILES}.json",
            f"{STREAM_FILES}.safetensors",
        ]
    )
    want = [source.next(draw)[0].batch["x"].tolist() for _ in range(3)]
    pipe.close()

    actor["version"] = 2
    _, fresh_pipe, fresh = _source(actor, max_staleness=1, buffer_groups=3 * GROUPS)
    draw = _draws()
    for _ in range(state["launched"]):  # the loader position after the saved draws
        draw()
    try:
        fresh_pipe.load_state_dict(state)
        fresh_pipe.load_files(tmp_path / "async_rollout")
        got = []
        for _ in range(3):
            got.append(fresh.next(draw)[0].batch["x"].tolist())
            actor["version"] += 1
        assert got == want
    finally:
        fresh_pipe.close()


def test_config(rl_config):
    from verl.config import ConfigError

    cfg = rl_config(
        "trainer.async_rollout=true", "trainer.rollout_mode=streaming", "trainer.max_staleness=0"
    )
    assert cfg.trainer.rollout_mode == "streaming" and cfg.trainer.max_staleness == 0
    # nothing is older than the policy: no correction switched on
    assert cfg.actor_rollout_ref.actor.rollout_is_threshold is None
    with pytest.raises(ConfigError, match="max_staleness=0"):
        rl_config("trainer.async_rollout=true", "trainer.max_staleness=0")
    with pytest.raises(ConfigError, match="rollout_mode"):
        rl_config("trainer.async_rollout=true", "trainer.rollout_mode=eager")


# ---------------------------------------------------------------------- through fit

SEEDED = ("actor_rollout_ref.rollout.seed=11", "trainer.total_training_steps=3")


def _recorded_fit(config):
    trainer = RLTrainer(config, tracker=Tracker([]))
    trained = []
    update = trainer.update_policy

    def recording_update(gen):
        trained.append(gen.batch["responses"].clone())
        return update(gen)

    trainer.update_policy = recording_update
    trainer.fit()
    weights = trainer.actor_rollout_wg.state_dict_for_save()[0]
    return trainer, trained, weights


@pytest.mark.slow
def test_streaming_with_max_staleness_zero_equals_sync(rl_config):
    _, sync_samples, sync_weights = _recorded_fit(rl_config(*SEEDED))
    streaming, samples, weights = _recorded_fit(
        rl_config(
            *SEEDED,
            "trainer.async_rollout=true",
            "trainer.rollout_mode=streaming",
            "trainer.max_staleness=0",
        )
    )
    assert len(samples) == len(sync_samples) == 3
    for got, want in zip(samples, sync_samples):
        assert torch.equal(got, want)
    for name, tensor in sync_weights.items():
        assert torch.allclose(weights[name], tensor, atol=1e-6, rtol=0), name
    assert [m["async/staleness_max"] for m in streaming.history] == [0.0, 0.0, 0.0]
    assert all(m["stream/dropped_groups"] == 0 for m in streaming.history)
    assert not [t for t in threading.enumerate() if t.name.startswith("verl-rollout")]


STREAM_STEPS = 6
STREAM_KILLS = 4


@pytest.mark.slow
def test_streaming_run_killed_and_resumed_ends_bit_identical(rl_config, tmp_path):
    """A 3-batch buffer with max_staleness=1 (so groups are dropped on the way), killed at
    seeded points and resumed: the checkpoints hold the buffer, the end is bit-identical."""
    from . import test_chaos as chaos

    streaming = (
        "trainer.async_rollout=true",
        "trainer.rollout_mode=streaming",
        "trainer.max_staleness=1",
        "trainer.stream_buffer_groups=12",
        "actor_rollout_ref.actor.rollout_is_threshold=2.0",
        f"trainer.total_training_steps={STREAM_STEPS}",
    )
    straight_dir = tmp_path / "straight"
    straight = RLTrainer(chaos._config(rl_config, tmp_path, straight_dir, *streaming))
    straight.fit()
    assert sum(m["stream/dropped_groups"] for m in straight.history) > 0

    run_dir = tmp_path / "chaos"
    config = chaos._config(rl_config, tmp_path, run_dir, *streaming)
    phases = ("score", "update", "save", "log")
    plan = chaos._kill_plan(6, STREAM_KILLS, phases)
    killed = chaos._kill_and_resume(tmp_path, config, plan, STREAM_STEPS)
    assert len(killed) == STREAM_KILLS, f"the run ended before every kill point: {killed}"
    chaos._same_run(run_dir, straight_dir, straight, STREAM_STEPS)
