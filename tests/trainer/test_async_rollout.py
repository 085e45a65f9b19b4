"""One-step-off asynchronous training (``trainer.async_rollout``, ``verl/trainer/rl/async_rollout.py``).

The pipeline against a fake rollout group (weights only change between generations,
staleness recorded and bounded, the in-flight batches saved and restored), the config
checks, a short async run through ``fit`` with per-sample staleness, and (slow) the reward
trend of async against sync on the tiny model. Exact resume in async mode is a variant of
``tests/trainer/test_checkpoint.py::test_resume_is_bit_exact``.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from verl.config import ConfigError
from verl.protocol import DataProto
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl.async_rollout import AsyncRollout, StalenessError
from verl.trainer.rl.trainer import RLTrainer

ASYNC = ("trainer.async_rollout=true", "actor_rollout_ref.actor.rollout_is_threshold=2.0")


class _FakeCopy:
    """A rollout group that records loads and generations (and their overlap)."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.generating = threading.Event()
        self.events: list[tuple[str, int | None]] = []
        self.loaded_mid_generation = False

    def load_policy_weights(self, state, version):
        if self.generating.is_set():
            self.loaded_mid_generation = True
        self.version = version
        self.events.append(("load", int(state["w"].item())))
        return [{"async/weight_sync_seconds": 0.0}]

    def generate(self, group, prompts: DataProto) -> DataProto:
        self.generating.set()
        time.sleep(0.01)
        out = DataProto.from_dict(
            tensors={"x": prompts.batch["x"].clone()},
            non_tensors={"seen_version": np.full(len(prompts), self.version)},
            meta_info={"seed": prompts.meta_info["seed"]},
        )
        self.events.append(("gen", self.version))
        self.generating.clear()
        return out


def _prompts(start: int) -> DataProto:
    return DataProto.from_dict(tensors={"x": torch.arange(start, start + 2)})


def _pipeline(fake: _FakeCopy, actor: dict, max_staleness: int = 1) -> AsyncRollout:
    return AsyncRollout(
        fake,
        fake.generate,
        lambda: {"w": torch.tensor(actor["version"])},
        max_staleness=max_staleness,
        seed=3,
    )


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_pipeline_staleness_and_weights_at_step_boundaries(max_staleness):
    fake, actor = _FakeCopy(), {"version": 0}
    pipe = _pipeline(fake, actor, max_staleness)
    stream = iter(range(0, 100, 2))
    seen = []
    try:
        for step in range(1, 7):
            version = step - 1
            pipe.fill(lambda: _prompts(next(stream)), version)
            assert len(pipe) == max_staleness + 1
            gen, metrics = pipe.pop(version)
            staleness = gen.non_tensor_batch["staleness"]
            # generated with the policy it records, that many updates behind the trainer
            assert (gen.non_tensor_batch["seen_version"] == version - staleness).all()
            assert (gen.non_tensor_batch["rollout_policy_version"] == version - staleness).all()
            assert metrics["async/staleness_max"] == staleness[0] <= max_staleness
            seen.append(int(staleness[0]))
            # prompts in order: step k trains on the k-th batch drawn
            assert gen.batch["x"].tolist() == [2 * (step - 1), 2 * (step - 1) + 1]
            actor["version"] += 1  # the update
    finally:
        pipe.close()
    assert seen == [min(k, max_staleness) for k in range(6)]
    assert not fake.loaded_mid_generation
    # one load per new version, in order; close() may cancel the queued tasks that have not
    # started (up to max_staleness of them, each carrying its version's weights)
    loads = [v for kind, v in fake.events if kind == "load"]
    assert loads == list(range(len(loads))) and len(loads) >= 6 - max_staleness


def test_pop_refuses_a_batch_staler_than_max_staleness():
    fake, actor = _FakeCopy(), {"version": 0}
    pipe = _pipeline(fake, actor, max_staleness=1)
    try:
        pipe.fill(lambda: _prompts(0), 0)
        with pytest.raises(StalenessError, match=r"staleness 2 > trainer\.max_staleness=1"):
            pipe.pop(2)
    finally:
        pipe.close()


def test_rollout_thread_has_its_own_intra_op_threads():
    """trainer.rollout_num_threads: the rollout thread keeps its count, the trainer's thread
    keeps its own (setting it on one thread would otherwise reset the other's)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    pipe = AsyncRollout(None, None, dict, max_staleness=1, seed=0, threads=1)
    try:
        assert pipe._executor.submit(torch.get_num_threads).result() == 1
        assert torch.get_num_threads() == 2
        torch.set_num_threads(2)  # the trainer sets its count again: the rollout's stays
        assert pipe._executor.submit(torch.get_num_threads).result() == 1
    finally:
        pipe.close()
        torch.set_num_threads(before)


def test_inflight_batches_are_saved_and_restored(tmp_path):
    fake, actor = _FakeCopy(), {"version": 0}
    pipe = _pipeline(fake, actor)
    stream = iter(range(0, 100, 2))
    pipe.fill(lambda: _prompts(next(stream)), 0)
    pipe.pop(0)
    actor["version"] = 1
    pipe.fill(lambda: _prompts(next(stream)), 1)
    state = pipe.state_dict()
    pipe.save_files(tmp_path / "async_rollout")
    want, _ = pipe.pop(1)
    pipe.close()

    fresh = _pipeline(_FakeCopy(), actor)
    try:
        fresh.load_state_dict(state)
        fresh.load_files(tmp_path / "async_rollout")
        got, metrics = fresh.pop(1)
        assert got.batch["x"].tolist() == want.batch["x"].tolist()
        assert metrics["async/staleness_max"] == 1.0
        assert fresh.state_dict()["launched"] == state["launched"]
    finally:
        fresh.close()


# ---------------------------------------------------------------------- config


def test_config_checks(rl_config):
    cfg = rl_config(*ASYNC)
    assert cfg.trainer.async_rollout is True and cfg.trainer.max_staleness == 1
    # no correction given: switched on (logged), never left off
    assert (
        rl_config("trainer.async_rollout=true").actor_rollout_ref.actor.rollout_is_threshold == 2.0
    )
    assert rl_config(*ASYNC, "trainer.backend=ray").trainer.async_rollout is True
    with pytest.raises(ConfigError, match="dynamic sampling"):
        rl_config(*ASYNC, "algorithm.adv_estimator=grpo", "algorithm.filter_groups.enable=true")
    with pytest.raises(ConfigError, match=r"data\.rollout_batch_size=3"):
        rl_config("data.rollout_batch_size=3")
    assert rl_config("data.rollout_batch_size=4").data.rollout_batch_size == 4
    with pytest.raises(ConfigError, match="max_staleness"):
        rl_config(*ASYNC, "trainer.max_staleness=0")
    with pytest.raises(ConfigError, match="generates nothing to overlap"):
        rl_config(*ASYNC, "data.rollout_files=[rollouts.parquet]")


def test_tutorial_rollout_batch_size_spelling(tmp_path, tiny_model_dir):
    from verl.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text(
        f"actor_rollout_ref:\n  model:\n    path: {tiny_model_dir}\n"
        "  actor:\n    rollout_is_threshold: 2.0\n"
        "data:\n  train_batch_size: 64\n"
        "trainer:\n  async_rollout: true\n  rollout_batch_size: 64\n"
    )
    cfg = load_config(path)
    assert cfg.data.rollout_batch_size == 64 and cfg.trainer.async_rollout is True


# ---------------------------------------------------------------------- through fit


def test_async_run_records_staleness_and_corrects_with_tis(rl_config):
    trainer = RLTrainer(
        rl_config(*ASYNC, "trainer.total_training_steps=3", "trainer.val_before_train=false"),
        tracker=Tracker([]),
    )
    trained = []
    update = trainer.update_policy

    def recording_update(gen):
        trained.append((gen.non_tensor_batch["staleness"].copy(), "rollout_log_probs" in gen.batch))
        return update(gen)

    trainer.update_policy = recording_update
    trainer.fit()
    assert [s.tolist() for s, _ in trained] == [[0] * 8, [1] * 8, [1] * 8]
    assert all(has for _, has in trained)  # the behaviour policy's log-probs reach the loss
    assert [m["async/staleness_max"] for m in trainer.history] == [0.0, 1.0, 1.0]
    # the truncated-IS weights were applied (stale samples: some weight differs from 1)
    assert all("actor/rollout_is_weight_mean" in m for m in trainer.history)
    assert trainer.history[-1]["actor/rollout_is_weight_mean"] != 1.0
    # no rollout thread left behind
    assert not [t for t in threading.enumerate() if t.name.startswith("verl-rollout")]


# ---------------------------------------------------------------------- learning


def _digit_fraction(data_source, solution_str, ground_truth, extra_info=None) -> float:
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)


@pytest.mark.slow
def test_async_reward_trend_matches_sync(tmp_path):
    """30 GRPO steps on a dense reward: async learns like sync (both rise, and the mean
    reward of their last 10 steps is within noise of each other). Measured (40 steps): the
    two curves cross 0.5 at steps 23 and 23 and reach 0.97+ by step 34."""
    from verl.models.tiny import save_tiny_model_dir
    from verl.trainer.api import Trainer, make_trainer_config

    model_dir = save_tiny_model_dir(tmp_path / "m", arch="qwen2", hidden_size=64, num_layers=2)
    curves = {}
    for mode, extra in (("sync", ()), ("async", ASYNC)):
        cfg = make_trainer_config(
            "grpo",
            model=str(model_dir),
            train_batch_size=8,
            n=4,
            max_response_length=8,
            lr=5e-3,
            actor_micro_batch_size=32,
            ppo_mini_batch_size=8,
            seed=0,
            overrides=[
                "trainer.logger=[]",
                f"trainer.default_local_dir={tmp_path / mode}",
                f"trainer.log_dir={tmp_path / mode}",
                "data.arithmetic.train_size=64",
                "data.arithmetic.val_size=4",
                "trainer.total_training_steps=30",
                "trainer.val_before_train=false",
                *extra,
            ],
        )
        trainer = Trainer(cfg, reward_fn=_digit_fraction)
        trainer.fit()
        curves[mode] = [m["critic/score/mean"] for m in trainer.history]
    for mode, rewards in curves.items():
        first, last = np.mean(rewards[:5]), np.mean(rewards[-5:])
        assert last > first + 0.5, (mode, rewards)
    gap = abs(np.mean(curves["async"][-10:]) - np.mean(curves["sync"][-10:]))
    assert gap < 0.15, curves


@pytest.mark.slow
def test_async_on_ray_with_two_actor_ranks(rl_config, ray_session):
    """Ray: the actor on two FSDP2 ranks, the rollout copy in a Ray actor of its own; the
    full weights are gathered and pushed into it at every step boundary."""
    trainer = RLTrainer(
        rl_config(
            *ASYNC,
            "trainer.n_gpus_per_node=2",
            "trainer.device=cpu",
            "trainer.total_training_steps=3",
            "trainer.val_before_train=false",
        ),
        tracker=Tracker([]),
    )
    assert trainer.placement.backend == "ray"
    assert trainer.actor_rollout_wg.world_size == 2
    assert trainer.async_rollout.group.world_size == 1
    trainer.fit()
    assert [m["async/staleness_max"] for m in trainer.history] == [0.0, 1.0, 1.0]
    for m in trainer.history:
        assert np.isfinite(m["actor/pg_loss"]) and np.isfinite(m["actor/grad_norm"])
        # the copy's log-probs of its samples reach the loss: the IS weights are computed
        assert np.isfinite(m["actor/rollout_is_weight_mean"])
    assert trainer.history[-1]["timing_s/async_weight_sync"] > 0
