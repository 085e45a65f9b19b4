"""The RL loop with prompt-loader worker processes (data.dataloader_num_workers): the same
run as with the in-process loader, and no process left after close()."""

from __future__ import annotations

import multiprocessing

import pytest

from verl.data import LazyRLHFDataset
from verl.trainer.rl.trainer import RLTrainer

QUIET = ("trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1")


def _run(rl_config, *extra):
    trainer = RLTrainer(rl_config(*QUIET, *extra))
    try:
        trainer.fit()
        return trainer, trainer.history
    finally:
        trainer.close()


@pytest.mark.slow
def test_two_steps_with_persistent_workers_equal_the_in_process_loader(rl_config):
    # children of this process that an earlier test of the same xdist worker left running
    # (its reward workers, say) are not this test's to count
    before = set(multiprocessing.active_children())
    _, plain = _run(rl_config)
    trainer, workers = _run(
        rl_config, "data.dataloader_num_workers=2", "data.persistent_workers=true"
    )
    assert isinstance(trainer.train_dataset, LazyRLHFDataset)
    # close() stopped the persistent workers (and the runs' reward workers)
    assert set(multiprocessing.active_children()) - before == set()
    assert len(plain) == len(workers) == 2
    for a, b in zip(plain, workers):
        for key in ("critic/score/mean", "response_length/mean", "actor/pg_loss"):
            assert a[key] == b[key], key
