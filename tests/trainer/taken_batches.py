"""Test helpers for the batches an asynchronous run trains on: record them as the batch
source hands them to the step (or the responses each update trains on), and check their
per-token policy versions."""

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


def fit_recording_updates(config: Any, on_trainer: Any = None) -> tuple[Any, list[Any]]:
    """``(trainer, the responses each update trained on)`` of an RLTrainer run on ``config``
    scored by ``even_token_reward`` (it varies within groups, so updates move the weights);
    ``on_trainer(trainer)`` runs before the fit. ``fit`` closes the trainer (on Ray its
    worker groups are shut down)."""
    from verl.trainer.lifecycle.tracking import Tracker
    from verl.trainer.rl.trainer import RLTrainer

    from .varied_reward import even_token_reward

    trainer = RLTrainer(config, reward_fn=even_token_reward, tracker=Tracker([]))
    if on_trainer is not None:
        on_trainer(trainer)
    trained: list[Any] = []
    update = trainer.update_policy

    def recording_update(gen):
        trained.append(gen.batch["responses"].clone())
        return update(gen)

    trainer.update_policy = recording_update
    trainer.fit()
    return trainer, trained


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


def record_group_arrivals(monkeypatch: Any) -> tuple[list[tuple[int, int, bool]], Any]:
    """Record each group the pipeline's sink receives as ``(batch, prompt, whether that
    batch's copy call had returned)``; returns the list and an ``on_trainer(trainer)`` hook
    that wraps the copy group's ``generate_sequences`` to note each call's return."""
    from verl.trainer.rl.async_rollout import AsyncRollout

    arrivals: list[tuple[int, int, bool]] = []
    returned: set[int] = set()  # batches whose copy call has returned
    plain_sink_for = AsyncRollout._sink_for

    def recording_sink_for(self, item, prompts):
        sink = plain_sink_for(self, item, prompts)

        def recorded(prompt, group, params):
            arrivals.append((item.index, prompt, item.index in returned))
            sink(prompt, group, params)

        return recorded

    monkeypatch.setattr(AsyncRollout, "_sink_for", recording_sink_for)

    def watch_calls(trainer: Any) -> None:
        group = trainer.async_rollout.group
        plain = group.generate_sequences

        def timed(prompts):
            index = int(prompts.meta_info["stream_token"].split("-")[1])
            out = plain(prompts)
            returned.add(index)
            return out

        group.generate_sequences = timed

    return arrivals, watch_calls
