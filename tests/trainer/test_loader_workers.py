"""The RL loop with prompt-loader worker processes (data.dataloader_num_workers): the same
run as with the in-process loader (a reward that differs within groups, so the updates move
the weights and step 2 samples from them), and no process left after close()."""

from __future__ import annotations

import multiprocessing

import pytest

from verl.data import LazyRLHFDataset
from verl.trainer.rl.trainer import RLTrainer

from .varied_reward import assert_updates_moved, even_token_reward

QUIET = ("trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1")


def _run(rl_config, *extra):
    # a reward that differs within groups: the default one is 0 on the random model, so every
    # update would be a no-op and step 2 would sample from the initial weights in both runs
    trainer = RLTrainer(rl_config(*QUIET, *extra), reward_fn=even_token_reward)
    try:
        trainer.fit()
        return trainer, trainer.history
    finally:
        trainer.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "seed",
    [
        # rollout.seed fixed: the sampler is seeded per call, the runs agree step for step
        ("actor_rollout_ref.rollout.seed=5",),
        # rollout.seed null (the default): the sampler draws from torch's global generator,
        # which the loader's workers must not move (their base seed has a generator of its own)
        (),
    ],
    ids=["seeded", "global-rng"],
)
def test_two_steps_with_persistent_workers_equal_the_in_process_loader(rl_config, seed):
    # children of this process that an earlier test of the same xdist worker left running
    # (its reward workers, say) are not this test's to count
    before = set(multiprocessing.active_children())
    _, plain = _run(rl_config, *seed)
    trainer, workers = _run(
        rl_config, *seed, "data.dataloader_num_workers=2", "data.persistent_workers=true"
    )
    assert isinstance(trainer.train_dataset, LazyRLHFDataset)
    # close() stopped the persistent workers (and the runs' reward workers)
    assert set(multiprocessing.active_children()) - before == set()
    assert len(plain) == len(workers) == 2
    assert_updates_moved(plain)
    for a, b in zip(plain, workers):
        for key in (
            "critic/score/mean",
            "response_length/mean",
            "actor/pg_loss",
            "actor/grad_norm",
        ):
            assert a[key] == b[key], key
