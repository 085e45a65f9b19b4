"""Checkpoint and resume of a pool of rollout copies (``trainer.rollout_copies=2``, Ray).

A 3-step run straight through (saved after step 2) against a run resumed from a copy of that
step-2 checkpoint (``trainer.resume_mode=auto``): the resumed step trains on the straight
run's responses (``torch.equal``) with its policy loss and gradient norm (within 1e-6), and
the updates have real gradients (the even-token reward). Slow (Ray), for the streaming
pipeline with a batch generated ahead (``max_staleness=1``: the in-flight batch, split
across both copies, is saved and restored); without (``max_staleness=0``) the pool resumes
from the streaming run of ``test_rollout_pool.py``, in that module.
"""

from __future__ import annotations

import shutil
import threading

import pytest
import torch

from .taken_batches import fit_recording_updates
from .varied_reward import assert_updates_moved

POOL = (
    "actor_rollout_ref.rollout.seed=11",
    "algorithm.adv_estimator=grpo",
    "trainer.val_before_train=false",
    "trainer.total_training_steps=3",
    # 3 slots < 2 prompts x 2 samples per copy: groups finish mid-call
    "actor_rollout_ref.rollout.decode_slots=3",
    "trainer.backend=ray",
    "trainer.async_rollout=true",
    "trainer.rollout_mode=streaming",
    "trainer.rollout_copies=2",
)


@pytest.mark.slow
def test_a_resumed_pool_trains_the_straight_runs_steps(rl_config, ray_session, tmp_path):
    staleness = 1
    pool = (*POOL, f"trainer.max_staleness={staleness}", "trainer.save_freq=2")
    # trains on samples of the previous version: corrected against them
    pool = (*pool, "actor_rollout_ref.actor.rollout_is_threshold=2.0")
    straight_dir, run_dir = tmp_path / "straight", tmp_path / "resumed"
    straight, straight_trained = fit_recording_updates(
        rl_config(*pool, f"trainer.default_local_dir={straight_dir}")
    )
    shutil.copytree(straight_dir / "global_step_2", run_dir / "global_step_2")
    resumed, after = fit_recording_updates(
        rl_config(*pool, "trainer.resume_mode=auto", f"trainer.default_local_dir={run_dir}")
    )
    assert straight.async_rollout.group.world_size == resumed.async_rollout.group.world_size == 2
    assert len(straight_trained) == 3 and len(after) == 1
    assert all(len(r) == 8 for r in straight_trained)  # 4 prompts x 2 samples, both copies
    assert torch.equal(after[0], straight_trained[2])
    assert_updates_moved(straight.history)
    assert_updates_moved(resumed.history)
    (got,) = resumed.history
    want = straight.history[2]
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert abs(got[key] - want[key]) <= 1e-6 * max(1.0, abs(want[key])), key
    assert got["async/staleness_max"] == want["async/staleness_max"] == float(staleness)
    assert got["stream/dropped_groups"] == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("verl-rollout")]
