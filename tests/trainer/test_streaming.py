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
from verl.rollout import SamplingParams
from verl.rollout.continuous import current_group_sink
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl.async_rollout import AsyncRollout
from verl.trainer.rl.streaming import STREAM_FILES, StreamingSource, _group_prompts
from verl.trainer.rl.trainer import RLTrainer

from .taken_batches import fit_recording_updates
from .varied_reward import assert_updates_moved

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
            stale = (gen.non_tensor_batch["staleness"] > 0).mean()
            assert metrics["async/stale_sample_fraction"] == pytest.approx(stale)
            assert metrics["stream/buffered_groups"] + metrics["stream/queued_prompts"] <= 3 * 2
            trained += gen.batch["x"][::N].tolist()
            dropped.append(metrics["stream/dropped_groups"])
            actor["version"] += 1
    finally:
        pipe.close()
    assert sum(dropped) > 0 and metrics["stream/dropped_groups_total"] == sum(dropped)
    assert metrics["async/stale_sample_fraction"] > 0  # the kept stale ones: corrected
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


class _StreamingCopy(_FakeCopy):
    """Reports each prompt's group to the engine sink, last prompt first; the groups after
    the first ``hold_after`` wait for ``release`` (the call's long tail)."""

    def __init__(self, hold_after: int) -> None:
        super().__init__()
        self.hold_after = hold_after
        self.release = threading.Event()
        self.params = SamplingParams(n=N, max_new_tokens=4)

    def generate(self, group, prompts: DataProto) -> DataProto:
        out = super().generate(group, prompts)
        sink = current_group_sink()
        for count, prompt in enumerate(reversed(range(len(prompts)))):
            if count == self.hold_after:
                assert self.release.wait(30), "the test never released the long tail"
            rows = out[prompt * N : (prompt + 1) * N]
            # the engine's output holds the rollout's keys only; the prompts' are joined on
            sink(prompt, rows.select(batch_keys=[], non_tensor_keys=["seen_version"]), self.params)
        return out


def test_groups_are_taken_while_their_call_still_generates():
    """One call of 2 * GROUPS prompts: a step takes the GROUPS groups streamed first while
    the rest of the call is held back, in the order of their prompts, with every field."""
    actor = {"version": 0}
    fake = _StreamingCopy(hold_after=GROUPS)
    pipe = AsyncRollout(
        fake, fake.generate, lambda: {"w": torch.tensor(0)}, max_staleness=1, seed=3
    )
    source = StreamingSource(
        pipe,
        lambda gen, metrics: (gen, metrics),
        lambda: actor["version"],
        num_groups=GROUPS,
        max_staleness=1,
        buffer_groups=2 * GROUPS,
    )
    stream = iter(range(0, 1000, 2 * GROUPS))

    def draw():
        start = next(stream)
        return DataProto.from_dict(tensors={"x": torch.arange(start, start + 2 * GROUPS)})

    try:
        gen, metrics = source.next(draw)
        assert not fake.release.is_set() and len(pipe) == 1  # the call is still running
        # the last prompts (streamed first), in prompt order, each with its N rows
        assert gen.batch["x"].tolist() == [2, 2, 3, 3]
        assert (gen.non_tensor_batch["seen_version"] == 0).all()
        assert gen.non_tensor_batch["uid"].tolist() == ["0-2", "0-2", "0-3", "0-3"]
        assert gen.meta_info["temperature"] == 1.0
        assert metrics["stream/buffered_groups"] == 0
        fake.release.set()
        pipe._queue[0].result.result(timeout=30)  # the call ends before the next take
        actor["version"] = 1
        gen, metrics = source.next(draw)
        assert gen.batch["x"].tolist() == [0, 0, 1, 1]  # the long tail of the first call
        assert (gen.non_tensor_batch["staleness"] == 1).all()
        assert metrics["timing_s/async_gen"] > 0  # the call ended: its timing is counted
    finally:
        fake.release.set()
        pipe.close()


def _acc_score(gen: DataProto, metrics):
    """Every response of an even prompt scores 1 (a group without signal); odd prompts
    have one correct response of N."""
    x = gen.batch["x"]
    first = torch.arange(len(gen)) % N == 0
    acc = torch.where(x % 2 == 0, 1.0, first.double())
    gen.non_tensor_batch["acc"] = acc.numpy()
    gen.batch["token_level_scores"] = acc.unsqueeze(1).float()
    return gen, metrics | {"critic/score/mean": float(acc.mean())}


def test_dynamic_sampling_filters_groups_in_the_stream():
    actor = {"version": 0}
    fake = _FakeCopy()
    pipe = AsyncRollout(
        fake, fake.generate, lambda: {"w": torch.tensor(0)}, max_staleness=1, seed=3
    )
    source = StreamingSource(
        pipe,
        _acc_score,
        lambda: actor["version"],
        num_groups=GROUPS,
        max_staleness=1,
        filter_groups={"metric": "acc", "max_num_gen_batches": 0},
    )
    draw = _draws()
    try:
        trained = []
        for _ in range(3):
            gen, metrics = source.next(draw)
            assert len(gen) == GROUPS * N
            x = gen.batch["x"][::N]
            assert (x % 2 == 1).all()  # only the informative groups
            trained += x.tolist()
            # each take: GROUPS groups, half of them without signal
            assert metrics["dapo/num_gen_batches"] == 2
            assert metrics["dapo/groups_dropped"] == 2 and metrics["dapo/groups_trimmed"] == 0
            assert metrics["stream/dropped_groups"] == 0
            actor["version"] += 1
        assert trained == [1, 3, 5, 7, 9, 11]
    finally:
        pipe.close()

    fake = _FakeCopy()
    pipe = AsyncRollout(
        fake, fake.generate, lambda: {"w": torch.tensor(0)}, max_staleness=1, seed=3
    )
    bounded = StreamingSource(
        pipe,
        _even,  # no group has a signal
        lambda: 0,
        num_groups=GROUPS,
        max_staleness=1,
        filter_groups={"metric": "acc", "max_num_gen_batches": 3},
    )
    try:
        with pytest.raises(RuntimeError, match="after 3 generation batches"):
            bounded.next(_draws())
    finally:
        pipe.close()


def _even(gen: DataProto, metrics):
    """Every response scores 1."""
    gen.non_tensor_batch["acc"] = np.ones(len(gen))
    gen.batch["token_level_scores"] = torch.ones(len(gen), 1)
    return gen, metrics


def test_remax_scorer_gets_the_groups_prompts():
    rows = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [7, 8, 9]])
    responses = torch.tensor([[1, 2], [3, 4], [5, 6], [7, 8]])
    gen = DataProto.from_dict(
        tensors={
            "prompts": rows,
            "responses": responses,
            "input_ids": torch.cat([rows, responses], 1),
            "attention_mask": torch.cat([(rows != 0).long(), torch.ones(4, 2).long()], 1),
            "position_ids": torch.cat(
                [
                    torch.tensor([[0, 0, 1]] * 2 + [[0, 1, 2]] * 2),
                    torch.tensor([[2, 3]] * 2 + [[3, 4]] * 2),
                ],
                1,
            ),
        },
        non_tensors={
            "uid": np.array(["a", "a", "b", "b"], dtype=object),
            "ground_truth": np.array(["1", "1", "2", "2"], dtype=object),
            "staleness": np.zeros(4),
        },
    )
    prompts = _group_prompts(gen)
    assert prompts.batch["input_ids"].tolist() == [[0, 5, 6], [7, 8, 9]]
    assert prompts.batch["attention_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert prompts.batch["position_ids"].tolist() == [[0, 0, 1], [0, 1, 2]]
    assert prompts.non_tensor_batch["ground_truth"].tolist() == ["1", "2"]
    assert "staleness" not in prompts.non_tensor_batch


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
    # dynamic sampling and ReMax: streaming takes them, one-step-off still refuses them
    stream = ("trainer.async_rollout=true", "trainer.rollout_mode=streaming")
    dapo = ("algorithm.adv_estimator=grpo", "algorithm.filter_groups.enable=true")
    assert rl_config(*stream, *dapo).algorithm.filter_groups.enable is True
    assert rl_config(*stream, "algorithm.adv_estimator=remax").algorithm.adv_estimator == "remax"
    with pytest.raises(ConfigError, match=r"use trainer\.rollout_mode=streaming"):
        rl_config("trainer.async_rollout=true", *dapo)
    with pytest.raises(ConfigError, match=r"use trainer\.rollout_mode=streaming"):
        rl_config("trainer.async_rollout=true", "algorithm.adv_estimator=remax")


# ---------------------------------------------------------------------- through fit

SEEDED = ("actor_rollout_ref.rollout.seed=11", "trainer.total_training_steps=3")


def _recorded_fit(config):
    """``(trainer, responses trained per step, final weights)`` of a run scored by a reward
    that varies within groups (its updates move the weights)."""
    trainer, trained = fit_recording_updates(config)
    return trainer, trained, trainer.actor_rollout_wg.state_dict_for_save()[0]


# decode_slots=3 < 4 prompts x 2 samples: continuous batching, groups streamed mid-call
SLOTS = "actor_rollout_ref.rollout.decode_slots=3"


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [(), (SLOTS,), (SLOTS, "algorithm.adv_estimator=remax")],
    ids=["whole_calls", "groups_streamed", "remax"],
)
def test_streaming_with_max_staleness_zero_equals_sync(rl_config, extra):
    sync, sync_samples, sync_weights = _recorded_fit(rl_config(*SEEDED, *extra))
    assert_updates_moved(sync.history)
    streaming, samples, weights = _recorded_fit(
        rl_config(
            *SEEDED,
            *extra,
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


@pytest.mark.slow
def test_streaming_stale_samples_train_with_decoupled_ppo(rl_config):
    """max_staleness=1 with decoupled PPO: the stale samples train, weighted by the truncated
    proximal/behaviour ratio (its metrics), and no second rollout IS weight applies."""
    trainer, _, _ = _recorded_fit(
        rl_config(
            *SEEDED,
            SLOTS,
            "trainer.async_rollout=true",
            "trainer.rollout_mode=streaming",
            "trainer.max_staleness=1",
            "actor_rollout_ref.actor.policy_loss=decoupled_ppo",
        )
    )
    history = trainer.history
    assert len(history) == 3
    assert max(m["async/stale_sample_fraction"] for m in history) > 0
    for m in history:
        assert 0 < m["actor/behaviour_weight_mean"] <= 2.0  # the default cap
        assert "actor/rollout_is_weight_mean" not in m
    # the first step's samples are fresh: behaviour == proximal to float precision
    assert history[0]["actor/behaviour_weight_mean"] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.slow
def test_streaming_dynamic_sampling_keeps_the_sync_groups(rl_config):
    """DAPO in the stream, max_staleness=0, groups streamed mid-call: the same informative
    groups and the same dapo/* counts as the synchronous run of
    tests/trainer/test_dynamic_sampling.py."""
    from .test_dynamic_sampling import scripted_reward

    config = rl_config(
        SLOTS,
        "data.shuffle=false",
        "algorithm.adv_estimator=grpo",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=acc",
        "algorithm.filter_groups.max_num_gen_batches=5",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=4",
        "trainer.async_rollout=true",
        "trainer.rollout_mode=streaming",
        "trainer.max_staleness=0",
    )
    trainer = RLTrainer(config, reward_fn=scripted_reward, tracker=Tracker([]))
    updated = []
    update = trainer.update_policy

    def recording_update(gen):
        updated.append(gen.non_tensor_batch["index"].tolist())
        return update(gen)

    trainer.update_policy = recording_update
    trainer.fit()
    assert updated == [[2, 2, 5, 5, 8, 8, 11, 11], [14, 14, 2, 2, 5, 5, 8, 8]]
    first, second = trainer.history
    assert (first["dapo/num_gen_batches"], first["dapo/prompts_generated"]) == (3.0, 12.0)
    assert (first["dapo/groups_dropped"], first["dapo/groups_trimmed"]) == (8.0, 0.0)
    assert (second["dapo/num_gen_batches"], second["dapo/prompts_generated"]) == (4.0, 16.0)
    assert (second["dapo/groups_dropped"], second["dapo/groups_trimmed"]) == (11.0, 1.0)
    assert first["stream/dropped_groups"] == second["stream/dropped_groups"] == 0


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
