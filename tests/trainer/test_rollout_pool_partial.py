"""Partial rollouts with a pool of rollout copies (``trainer.rollout_copies=2``, Ray,
``trainer.partial_rollout``; ``verl/trainer/rl/ray_copy_link.py``).

Each copy owns its weight mailbox; every post goes to both, and each copy swaps the new
weights in at its own decode step. Through ``fit`` (slow, Ray, 3 streaming GRPO steps on the
tiny model with the even-token reward): each copy's second call waits at its third sampling
step for the step-2 post, so both copies swap mid-call; the rows of both copies (prompts 0-1
of a batch on rank 0, 2-3 on rank 1) hold tokens of versions 0 and 1, and each token's
recorded log-prob equals a no-cache recomputation under the weights of its recorded version
(``resume``: every token; ``continue``: the tokens of the version each copy's call started
with). The driver's counters are the copies' sums: the step-2 metric counts both copies'
swaps, and after the run the driver's mailbox holds the sum of the copies' final counters.
Resumed from the ``resume``-mode run's step-2 checkpoint (slow), the fresh copies get the
resumed step's post once and every token of both copies' rows is exact under its version.
Fast: the driver's bookkeeping for a fake pool of two ranks.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.rollout.partial import TOKEN_VERSIONS, WeightMailbox
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl import ray_copy_link as link
from verl.trainer.rl.trainer import RLTrainer
from verl.workers.rollout_copy import WEIGHT_MAILBOX, RolloutCopyWorker

from .taken_batches import assert_token_versions, fit_recording_batches
from .test_streaming_ray_partial import LOGPROB_BOUND, WaitingCopy, _gaps, _straddling_rows
from .varied_reward import assert_updates_moved, even_token_reward

PROMPTS_PER_COPY = 2  # data.train_batch_size=4 over 2 copies


def _pool_run(rl_config, monkeypatch, mode, copy_cls=WaitingCopy, *extra):
    """A 3-step streaming GRPO run with 2 copies of ``copy_cls`` (``extra``: more
    overrides): the trained batches, the weights posted per version, the metrics, every
    per-rank mailbox state the driver read (in order) and the driver's mailbox counters
    after the run."""
    import verl.workers.rollout_copy as rollout_copy

    monkeypatch.setattr(rollout_copy, "RolloutCopyWorker", copy_cls)
    config = rl_config(
        "actor_rollout_ref.rollout.seed=11",
        # 3 slots < 2 prompts x 2 samples per copy: rows start and finish mid-call
        "actor_rollout_ref.rollout.decode_slots=3",
        "algorithm.adv_estimator=grpo",
        "trainer.backend=ray",
        "trainer.async_rollout=true",
        "trainer.rollout_mode=streaming",
        "trainer.rollout_copies=2",
        "trainer.max_staleness=1",
        f"trainer.partial_rollout={mode}",
        "actor_rollout_ref.actor.rollout_is_threshold=2.0",
        "actor_rollout_ref.actor.entropy_coeff=0.05",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "trainer.val_before_train=false",
        "trainer.total_training_steps=3",
        *extra,
    )
    trainer = RLTrainer(config, reward_fn=even_token_reward, tracker=Tracker([]))
    group = trainer.async_rollout.group
    assert type(group).__name__ == "RayWorkerGroup" and group.world_size == 2
    posted: dict[int, dict[str, torch.Tensor]] = {}
    states: list[list[dict]] = []
    plain_post, plain_state = group.post_policy_weights, group.weight_mailbox_state

    def recording_post(state, version, box_mode):
        posted[version] = {k: v.clone() for k, v in state.items()}
        return plain_post(state, version, box_mode)

    def recording_state():
        got = plain_state()
        states.append(got)
        return got

    group.post_policy_weights = recording_post
    group.weight_mailbox_state = recording_state
    taken = fit_recording_batches(trainer)
    return taken, posted, trainer.history, states, dict(trainer.async_rollout.mailbox.stats)


def _rank_rows(gen: DataProto, rank: int) -> DataProto:
    """The rows of ``gen`` one copy generated (its prompts' share of each batch)."""
    prompts = np.array([int(uid.split("-")[1]) for uid in gen.non_tensor_batch["uid"]])
    return gen[prompts // PROMPTS_PER_COPY == rank]


@pytest.fixture(scope="module")
def resume_mode_pool_run(module_rl_config, ray_session, tmp_path_factory):
    """The ``resume``-mode :func:`_pool_run`, saved after step 2 (and 3), made once: the swap
    test reads it and the resume test resumes from its step-2 checkpoint. Returns what
    :func:`_pool_run` does, then the run's directory."""
    run_dir = tmp_path_factory.mktemp("resume_mode_pool_run") / "run"
    saving = ("trainer.save_freq=2", f"trainer.default_local_dir={run_dir}")
    with pytest.MonkeyPatch.context() as mp:
        return (*_pool_run(module_rl_config, mp, "resume", WaitingCopy, *saving), run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["continue", "resume"])
def test_each_copy_of_a_pool_swaps_mid_call_with_exact_log_probs(
    rl_config, ray_session, monkeypatch, mode, request
):
    if mode == "resume":  # the run the resume test starts from
        *run, _ = request.getfixturevalue("resume_mode_pool_run")
        taken, posted, history, states, driver_stats = run
    else:
        taken, posted, history, states, driver_stats = _pool_run(rl_config, monkeypatch, mode)
    assert len(taken) == 3 and sorted(posted) == [0, 1, 2]  # one post per step, to both
    assert_updates_moved(history)
    assert any(not torch.equal(posted[0][k], posted[1][k]) for k in posted[0])
    for step, gen in enumerate(taken):
        assert_token_versions(gen, step)
    model = rl_config().actor_rollout_ref.model.path
    for rank in (0, 1):
        mine = [_rank_rows(gen, rank) for gen in taken]
        assert all(len(rows) for rows in mine)  # the copy's rows trained at every step
        assert _straddling_rows(mine) >= 1, rank  # this copy swapped mid-call
        assert {0, 1} <= set(mine[1].batch[TOKEN_VERSIONS].flatten().tolist()), rank
        gaps = _gaps(mine, posted, model, mode)  # continue: each call's start on this copy
        if mode == "resume":
            assert {0, 1} <= set(gaps), (rank, gaps)
        else:
            assert 0 in gaps and len(gaps) >= 2, (rank, gaps)
        assert max(gaps.values()) < LOGPROB_BOUND, (rank, gaps)
    # the driver's counters are the copies' sums: both copies' swaps by step 2, and the last
    # states read (after the last call) add up to the driver's mailbox
    last = states[-1]
    assert len(last) == 2 and all(s["stats"]["swaps"] >= 1 for s in last), last
    assert history[1]["stream/midcall_weight_swaps_total"] >= 2
    assert driver_stats["swaps"] == sum(s["stats"]["swaps"] for s in last)
    assert history[-1]["stream/midcall_weight_swaps_total"] <= driver_stats["swaps"]


@pytest.mark.slow
def test_a_resumed_pool_posts_again_into_fresh_copies(
    rl_config, ray_session, monkeypatch, tmp_path, resume_mode_pool_run
):
    """Resumed from the step-2 checkpoint of the ``resume``-mode pool run (both copies
    swapped mid-call): the fresh copies' mailboxes start empty, the resumed step posts its
    version once (to both) and trains on both copies' rows of versions 1-2, each token exact
    under its version."""
    *_, history, _, _, saved_dir = resume_mode_pool_run
    assert history[1]["stream/midcall_weight_swaps_total"] >= 2
    shutil.copytree(saved_dir / "global_step_2", tmp_path / "run" / "global_step_2")
    run_dir = f"trainer.default_local_dir={tmp_path / 'run'}"
    after, posted, history, _, _ = _pool_run(
        rl_config, monkeypatch, "resume", RolloutCopyWorker, "trainer.resume_mode=auto", run_dir
    )
    assert len(after) == 1 and sorted(posted) == [2]  # the resumed step's post, once
    assert_updates_moved(history)
    assert_token_versions(after[0], 2)
    model = rl_config().actor_rollout_ref.model.path
    for rank in (0, 1):
        rows = _rank_rows(after[0], rank)
        assert len(rows), rank
        gaps = _gaps([rows], posted, model, "resume")
        assert all(gap < LOGPROB_BOUND for gap in gaps.values()), (rank, gaps)


class _FakePool:
    """A pool of two copies as the driver sees it: rank 0 started a call with version 3
    after a 0.5 s load and swapped once, rank 1 started with version 2 (the post came after
    its call began) after none and swapped twice; both hold version 4 now."""

    world_size = 2

    def weight_mailbox_state(self):
        calls = [
            {"start": 3, "held": 4, "load_s": 0.5, "stats": {"swaps": 1.0, "load_s": 0.25}},
            {"start": 2, "held": 4, "load_s": 0.0, "stats": {"swaps": 2.0, "load_s": 0.5}},
        ]
        return [{"held": c["held"], "stats": c["stats"], "call": c} for c in calls]


def test_a_pool_calls_bookkeeping_takes_every_rank():
    gen = DataProto.from_dict({"x": torch.zeros(2)})
    gen.meta_info[WEIGHT_MAILBOX] = {"start": 3, "held": 4, "load_s": 0.5, "stats": {}}  # rank 0
    box = WeightMailbox("resume")
    start, load_s = link.absorb_call_output(box, gen, _FakePool())
    assert WEIGHT_MAILBOX not in gen.meta_info
    assert (start, load_s) == (2, 0.5)  # the oldest start; the loads ran side by side
    assert box.held == 4
    assert box.stats["swaps"] == 3.0 and box.stats["load_s"] == 0.75  # summed
    # each poll too: the oldest version a copy holds, the counters summed
    link._mirror(box, [{"held": 5, "stats": {"swaps": 1.0}}, {"held": 4, "stats": {}}])
    assert box.held == 4 and box.stats["swaps"] == 1.0


def test_a_pool_missing_a_ranks_call_is_an_error():
    class Silent(_FakePool):
        def weight_mailbox_state(self):
            return [super().weight_mailbox_state()[0], None]

    gen = DataProto.from_dict({"x": torch.zeros(2)})
    gen.meta_info[WEIGHT_MAILBOX] = {"start": 3, "held": 4, "load_s": 0.5, "stats": {}}
    with pytest.raises(RuntimeError, match="pool of 2 rollout copies reported 1 mailbox"):
        link.absorb_call_output(WeightMailbox("resume"), gen, Silent())


def test_a_rank_loading_its_first_post_keeps_its_counters_in_the_sums():
    """After a checkpoint load the copies' mailboxes hold no version until each call's
    start loads the new post; a poll meanwhile (one rank loaded, the other still loading)
    still counts the slow rank's swaps: the driver's ``..._total`` counters never go back."""
    from types import SimpleNamespace

    boxes = [WeightMailbox("continue"), WeightMailbox("continue")]
    for box, swaps in zip(boxes, (2.0, 3.0)):
        box.held, box.stats["swaps"] = 1, swaps
    copies = [SimpleNamespace(weight_box=box, call_mailbox=None) for box in boxes]

    class Pool:
        world_size = 2

        def weight_mailbox_state(self):
            return [RolloutCopyWorker.weight_mailbox_state(c) for c in copies]

    driver = WeightMailbox("continue")
    link._mirror(driver, link.rank_states(Pool()))
    assert driver.held == 1 and driver.stats["swaps"] == 5.0
    for box in boxes:
        box.reset()  # a checkpoint loaded
    boxes[0].held = 2  # rank 0 loaded the new post; rank 1 still loads it
    link._mirror(driver, link.rank_states(Pool()))
    assert driver.held == 2 and driver.stats["swaps"] == 5.0
