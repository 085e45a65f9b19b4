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
    _, plain = _run(rl_config)
    trainer, workers = _run(
        rl_config, "data.dataloader_num_workers=2", "data.persistent_workers=true"
    )
    assert isinstance(trainer.train_dataset, LazyRLHFDataset)
    assert multiprocessing.active_children() == []  # close() stopped the persistent workers
    assert len(plain) == len(workers) == 2
    for a, b in zip(plain, workers):
        for key in ("critic/score/mean", "response_length/mean", "actor/pg_loss"):
            assert a[key] == b[key], key
