"""Test helpers for the batches an asynchronous run trains on: record them as the batch
source hands them to the step, and check their per-token policy versions."""

from __future__ import annotations

from typing import Any

import numpy as np

from verl.rollout.partial import TOKEN_VERSIONS


def fit_recording_batches(trainer: Any) -> list[Any]:
    """Run ``trainer.fit()`` (closing the trainer after) and return each step's batch as the
    batch source gave it to the step."""
    taken: list[Any] = []
    real_next = trainer.batch_source.next

    def next_batch(draw):
        gen, metrics = real_next(draw)
        taken.append(gen)
        return gen, metrics

    trainer.batch_source.next = next_batch
    try:
        trainer.fit()
    finally:
        trainer.close()
    return taken


def assert_token_versions(gen: Any, step: int) -> None:
    """Step ``step``'s batch (from 0, ``max_staleness=1``): model tokens carry a version and
    everything else -1; a sample's version is its oldest model token's, one of the two
    versions the step may train on."""
    versions = gen.batch[TOKEN_VERSIONS]
    mask = gen.batch["response_mask"].bool()
    assert (versions[~mask] == -1).all() and (versions[mask] >= 0).all()
    oldest = versions.masked_fill(~mask, 10**9).min(-1).values.numpy()
    sample_versions = gen.non_tensor_batch["rollout_policy_version"]
    has_tokens = mask.any(-1).numpy()
    assert np.array_equal(sample_versions[has_tokens], oldest[has_tokens])
    assert (sample_versions <= step).all() and (sample_versions >= step - 1).all()
