"""Micro-batch loss weights: the weighted sum of micro-batch losses equals the full loss."""

from __future__ import annotations

import pytest
import torch

from verl.algorithms import agg_loss
from verl.protocol import DataProto
from verl.workers.common import iter_ppo_mini_batches, micro_batch_weights

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("mode", MODES)
def test_weighted_micro_losses_equal_the_mini_batch_loss(mode):
    gen = torch.Generator().manual_seed(0)
    loss = torch.rand(6, 5, generator=gen)
    mask = torch.tensor(
        [
            [1, 1, 1, 0, 0],
            [1, 0, 0, 0, 0],
            [0, 0, 0, 0, 0],  # an empty response
            [1, 1, 1, 1, 1],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0],
        ],
        dtype=torch.float32,
    )
    data = DataProto.from_dict(tensors={"loss": loss, "response_mask": mask})
    full = agg_loss(loss, mask, mode)
    micro = data.split(4)  # 4 + 2 rows: uneven token and sequence counts
    weights = micro_batch_weights(micro, mode)
    accumulated = sum(
        w * agg_loss(mb.batch["loss"], mb.batch["response_mask"], mode)
        for mb, w in zip(micro, weights)
    )
    torch.testing.assert_close(accumulated, full)


def test_mini_batches_cover_every_sample_each_epoch():
    data = DataProto.from_dict(tensors={"i": torch.arange(10)})
    batches = list(iter_ppo_mini_batches(data, mini_batch_size=4, epochs=2, shuffle=True, seed=3))
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2]
    for epoch in (batches[:3], batches[3:]):
        assert sorted(torch.cat([b.batch["i"] for b in epoch]).tolist()) == list(range(10))
    # reproducible for a seed, different between epochs
    again = list(iter_ppo_mini_batches(data, mini_batch_size=4, epochs=2, shuffle=True, seed=3))
    assert all(torch.equal(a.batch["i"], b.batch["i"]) for a, b in zip(batches, again))
    assert not torch.equal(batches[0].batch["i"], batches[3].batch["i"])
