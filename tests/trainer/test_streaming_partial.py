"""Partial rollouts in the streaming pipeline (``trainer.partial_rollout``,
``verl/trainer/rl/streaming.py`` over ``AsyncRollout``'s mailbox).

Against fake rollout copies: each step posts its weights, a call in flight takes them
mid-call, a sample's version is its oldest token's and a group is dropped by its oldest
token, and the buffered groups' per-token versions survive a checkpoint (data files, no
pickle). Through ``fit`` (slow): ``max_staleness=0`` with partial rollouts on is still the
synchronous run, and a resume-mode run trains on per-token versions.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.rollout.partial import TOKEN_VERSIONS, WeightMailbox, current_weight_mailbox
from verl.trainer.rl.async_rollout import AsyncRollout
from verl.trainer.rl.streaming import STREAM_FILES, StreamingSource

from .test_streaming import GROUPS, SEEDED, SLOTS, N, _draws, _FakeCopy, _recorded_fit
from .varied_reward import assert_updates_moved

R = 4  # tokens per response


class _MailboxCopy(_FakeCopy):
    """Each response has R tokens: the first half sampled with the version the copy holds
    when the call starts, then (calls after the first) it waits up to 2 s for a newer post
    and takes it, as the engine does between two decode steps."""

    def generate(self, group, prompts: DataProto) -> DataProto:
        out = super().generate(group, prompts)
        box = current_weight_mailbox()
        assert box is not None, "generation must run inside weight_mailbox"
        first = box.held
        if self.generations > 1:
            for _ in range(200):
                if box.posted_version is not None and box.posted_version > box.held:
                    break
                time.sleep(0.01)
            pending = box.take()
            if pending is not None:
                box.held = pending[1]
        halves = [first] * (R // 2) + [box.held] * (R - R // 2)
        out.batch[TOKEN_VERSIONS] = torch.tensor([halves] * len(out))
        return out


def _source(copy_cls, actor: dict, max_staleness: int, version=None):
    fake = copy_cls()
    pipe = AsyncRollout(
        fake,
        fake.generate,
        lambda: {"w": torch.tensor(actor["version"])},
        max_staleness=max(max_staleness, 1),
        seed=3,
        mailbox=WeightMailbox("resume"),
    )
    source = StreamingSource(
        pipe,
        lambda gen, metrics: (gen, metrics),
        version or (lambda: actor["version"]),
        num_groups=GROUPS,
        max_staleness=max_staleness,
    )
    return fake, pipe, source


def test_weights_reach_the_call_in_flight_and_samples_take_their_oldest_version():
    actor = {"version": 0}
    _, pipe, source = _source(_MailboxCopy, actor, max_staleness=1)
    draw = _draws()
    mixed = 0
    try:
        for step in range(4):
            gen, metrics = source.next(draw)
            assert pipe.mailbox.posted_version == step  # posted at the step boundary
            tokens = gen.batch[TOKEN_VERSIONS]
            oldest = tokens.min(dim=-1).values.numpy()
            assert (gen.non_tensor_batch["rollout_policy_version"] == oldest).all()
            assert (gen.non_tensor_batch["staleness"] == step - oldest).all()
            assert metrics["async/staleness_max"] <= 1
            mixed += int((tokens[:, 0] != tokens[:, -1]).sum())
            actor["version"] += 1
    finally:
        pipe.close()
    assert mixed > 0, "some responses must span a mid-call swap"


class _FixedVersionsCopy(_FakeCopy):
    """Even prompts: tokens of versions (3, 5, 5, 5); odd prompts: (4, 5, 5, 5)."""

    def generate(self, group, prompts: DataProto) -> DataProto:
        out = super().generate(group, prompts)
        first = torch.where(out.batch["x"] % 2 == 0, 3, 4)
        out.batch[TOKEN_VERSIONS] = torch.stack([first, *[torch.full_like(first, 5)] * 3], -1)
        return out


def test_a_group_is_dropped_by_its_oldest_token():
    actor = {"version": 5}
    _, pipe, source = _source(_FixedVersionsCopy, actor, max_staleness=1)
    pipe.mailbox.held = 5
    try:
        gen, metrics = source.next(_draws())
    finally:
        pipe.close()
    assert (gen.batch["x"] % 2 == 1).all()  # the groups whose oldest token is 2 updates old: out
    assert gen.non_tensor_batch["rollout_policy_version"].tolist() == [4] * (GROUPS * N)
    assert gen.non_tensor_batch["staleness"].tolist() == [1] * (GROUPS * N)
    assert metrics["stream/dropped_groups"] == GROUPS


def test_buffered_token_versions_survive_a_checkpoint(tmp_path):
    actor = {"version": 0}
    _, pipe, source = _source(_MailboxCopy, actor, max_staleness=1)
    draw = _draws()
    try:
        for _ in range(2):
            source.next(draw)
            actor["version"] += 1
        pipe.post_weights(actor["version"])  # lets the call in flight end
        source._collect({"timing_s/async_gen": 0.0, "timing_s/async_weight_sync": 0.0}, True)
        state = pipe.state_dict()
        pipe.save_files(tmp_path)
        saved = [(g.batch[TOKEN_VERSIONS].clone(), v, k) for g, v, k in source.groups]
    finally:
        pipe.close()
    assert saved, "the test needs buffered groups"
    doc = json.loads((tmp_path / f"{STREAM_FILES}.json").read_text())
    assert "pickle" not in json.dumps(doc) and not list(tmp_path.glob("*.pt"))

    _, fresh_pipe, fresh = _source(_MailboxCopy, actor, max_staleness=1)
    try:
        fresh_pipe.load_state_dict(state)
        fresh_pipe.load_files(tmp_path)
        assert fresh_pipe.mailbox.posted_version is None  # the next step posts again
        got = [(g.batch[TOKEN_VERSIONS], v, k) for g, v, k in fresh.groups]
        assert len(got) == len(saved)
        for (t1, v1, k1), (t2, v2, k2) in zip(got, saved):
            assert torch.equal(t1, t2) and t1.dtype == torch.long and (v1, k1) == (v2, k2)
            assert v1 == int(t1.min())
    finally:
        fresh_pipe.close()


def test_config(rl_config):
    from verl.config import ConfigError

    stream = ("trainer.async_rollout=true", "trainer.rollout_mode=streaming")
    cfg = rl_config(*stream, "trainer.partial_rollout=resume")
    assert cfg.trainer.partial_rollout == "resume"
    assert rl_config().trainer.partial_rollout == "off"
    with pytest.raises(ConfigError, match=r"trainer\.rollout_mode=streaming"):
        rl_config("trainer.async_rollout=true", "trainer.partial_rollout=continue")
    with pytest.raises(ConfigError, match="continuous_batching=False"):
        rl_config(
            *stream,
            "trainer.partial_rollout=continue",
            "actor_rollout_ref.rollout.continuous_batching=false",
        )


# ---------------------------------------------------------------------- through fit

STREAM = ("trainer.async_rollout=true", "trainer.rollout_mode=streaming")


@pytest.mark.slow
def test_partial_rollout_with_max_staleness_zero_equals_sync(rl_config):
    """Nothing is generated ahead, so no post lands mid-call: the synchronous samples."""
    sync, sync_samples, sync_weights = _recorded_fit(rl_config(*SEEDED, SLOTS))
    assert_updates_moved(sync.history)
    trainer, samples, weights = _recorded_fit(
        rl_config(
            *SEEDED, SLOTS, *STREAM, "trainer.max_staleness=0", "trainer.partial_rollout=resume"
        )
    )
    assert len(samples) == len(sync_samples) == 3
    for got, want in zip(samples, sync_samples):
        assert torch.equal(got, want)
    for name, tensor in sync_weights.items():
        assert torch.allclose(weights[name], tensor, atol=1e-6, rtol=0), name
    assert [m["async/staleness_max"] for m in trainer.history] == [0.0, 0.0, 0.0]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["continue", "resume"])
def test_partial_rollout_run_trains_on_token_versions(rl_config, mode):
    from verl.trainer.lifecycle.tracking import Tracker
    from verl.trainer.rl.trainer import RLTrainer

    config = rl_config(
        *SEEDED,
        SLOTS,
        *STREAM,
        "trainer.max_staleness=1",
        f"trainer.partial_rollout={mode}",
        "actor_rollout_ref.actor.rollout_is_threshold=2.0",
    )
    trainer = RLTrainer(config, tracker=Tracker([]))
    seen = []
    update = trainer.update_policy

    def recording_update(gen):
        seen.append(gen)
        return update(gen)

    trainer.update_policy = recording_update
    trainer.fit()
    assert len(seen) == 3
    for step, gen in enumerate(seen):
        tokens = gen.batch[TOKEN_VERSIONS]
        mask = gen.batch["response_mask"].bool()
        assert (tokens[~mask] == -1).all() and (tokens[mask] >= 0).all()
        oldest = tokens.masked_fill(~mask, 10**9).min(-1).values.numpy()
        assert np.array_equal(gen.non_tensor_batch["rollout_policy_version"], oldest)
        assert (step - oldest <= 1).all()
    assert all("stream/midcall_weight_swaps_total" in m for m in trainer.history)
