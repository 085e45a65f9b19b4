"""ResumableBatchSampler / PromptDataLoader: seeded order, remainders, exact resume."""

from __future__ import annotations

import itertools
import json
import logging

import pytest
import torch

from verl.data.io import write_records
from verl.data.rl_dataset import RLHFDataset
from verl.data.sampler import PromptDataLoader, ResumableBatchSampler


def perm(n: int, seed: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()


def flat(batches) -> list[int]:
    return list(itertools.chain.from_iterable(batches))


def take(sampler, n_batches: int) -> list[list[int]]:
    out = []
    while len(out) < n_batches:
        for batch in sampler:
            out.append(batch)
            if len(out) == n_batches:
                break
    return out


def test_partial_last_batch_one_pass_per_epoch():
    s = ResumableBatchSampler(10, 4, shuffle=True, seed=7, drop_last=False)
    assert len(s) == 3
    epoch0, epoch1 = list(s), list(s)
    assert [len(b) for b in epoch0] == [4, 4, 2]
    assert flat(epoch0) == perm(10, 7)
    assert flat(epoch1) == perm(10, 8)  # seed + epoch
    assert s.epoch == 2 and s.position == 0


def test_no_shuffle_keeps_file_order():
    s = ResumableBatchSampler(5, 2, shuffle=False, drop_last=False)
    assert list(s) == [[0, 1], [2, 3], [4]]


def test_carry_remainder_streams_every_sample():
    n, b = 10, 4
    s = ResumableBatchSampler(n, b, seed=3, drop_last=True, carry_remainder=True)
    assert len(s) == 2
    batches = take(s, 10)  # 5 epochs = 40 samples = 4 full passes
    assert all(len(x) == b for x in batches)
    stream = flat(batches)
    assert stream == perm(n, 3) + perm(n, 4) + perm(n, 5) + perm(n, 6)
    # Epoch 1 opens with the 2 samples epoch 0 had left over from pass 0.
    assert batches[2][:2] == perm(n, 3)[8:]
    assert (s.epoch, s.position) == (4, 2)  # stopped right after the last batch of epoch 4


def test_drop_last_without_carry_logs_unused(caplog):
    s = ResumableBatchSampler(10, 4, seed=0, drop_last=True, carry_remainder=False)
    with caplog.at_level(logging.INFO, logger="verl.data.sampler"):
        epoch0, epoch1 = list(s), list(s)
    assert flat(epoch0) == perm(10, 0)[:8]
    assert flat(epoch1) == perm(10, 1)[:8]
    assert caplog.text.count("2 of 10 samples unused") == 2


def test_break_and_reiterate_continues_the_epoch():
    s = ResumableBatchSampler(12, 3, seed=1)
    full = list(ResumableBatchSampler(12, 3, seed=1))
    first = []
    for batch in s:
        first.append(batch)
        if len(first) == 2:
            break
    assert (s.epoch, s.position) == (0, 2)
    assert first + list(s) == full


def test_state_at_end_of_epoch_resumes_next_epoch():
    s = ResumableBatchSampler(6, 2, seed=0)
    it = iter(s)
    for _ in range(3):
        next(it)
    state = s.state_dict()
    assert (state["epoch"], state["position"]) == (0, 3)
    t = ResumableBatchSampler(6, 2, seed=0)
    t.load_state_dict(state)
    assert flat(list(t)) == perm(6, 1)
    assert t.epoch == 2


def test_errors():
    with pytest.raises(ValueError, match="batch_size=8 is larger than the dataset"):
        ResumableBatchSampler(5, 8, drop_last=True)
    assert len(ResumableBatchSampler(5, 8, drop_last=False)) == 1
    with pytest.raises(ValueError, match="empty"):
        ResumableBatchSampler(0, 1)
    s = ResumableBatchSampler(10, 2, seed=0)
    state = s.state_dict()
    with pytest.raises(ValueError, match="batch_size=2 but this sampler has batch_size=5"):
        ResumableBatchSampler(10, 5, seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="seed=0 but this sampler has seed=1"):
        ResumableBatchSampler(10, 2, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="position=9"):
        s.load_state_dict({**state, "position": 9})


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, tokenizer):
    rows = [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": f"What is {i} + {i % 3}?"}],
            "reward_model": {"ground_truth": str(i + i % 3)},
        }
        for i in range(20)
    ]
    path = write_records(rows, tmp_path_factory.mktemp("sampler") / "train.parquet")
    return RLHFDataset(path, tokenizer)


def run_loop(loader, steps: int):
    """The RL loop's shape: epochs of batches, stopping after `steps` batches."""
    out = []
    while len(out) < steps:
        for batch in loader:
            out.append(batch)
            if len(out) == steps:
                break
    return out


@pytest.mark.parametrize(
    ("drop_last", "carry", "shuffle"),
    [(True, True, True), (True, False, True), (False, False, True), (True, True, False)],
)
def test_loader_resume_mid_epoch_is_identical(dataset, drop_last, carry, shuffle):
    kwargs = dict(batch_size=3, shuffle=shuffle, seed=11, drop_last=drop_last)
    loader = PromptDataLoader(dataset, carry_remainder=carry, **kwargs)
    per_epoch = len(loader)
    assert per_epoch == (6 if drop_last else 7)
    head_steps = per_epoch * 2 + per_epoch // 2  # 2.5 epochs
    run_loop(loader, head_steps)
    state = json.loads(json.dumps(loader.state_dict()))  # must survive a checkpoint file
    assert state["sampler"]["epoch"] == 2
    continued = run_loop(loader, 2 * per_epoch)

    resumed_loader = PromptDataLoader(dataset, carry_remainder=carry, **kwargs)
    resumed_loader.load_state_dict(state)
    resumed = run_loop(resumed_loader, 2 * per_epoch)
    assert len(resumed) == len(continued)
    for a, b in zip(continued, resumed):
        assert a.equals(b)
    assert resumed_loader.epoch == loader.epoch


def test_loader_batches_are_collated(dataset, tokenizer):
    loader = PromptDataLoader(dataset, batch_size=4, shuffle=True, seed=0)
    batch = next(iter(loader))
    expected = perm(20, 0)[:4]
    assert batch.non_tensor_batch["index"].tolist() == expected
    assert batch.non_tensor_batch["ground_truth"].tolist() == [str(i + i % 3) for i in expected]
    mask = batch.batch["attention_mask"]
    assert mask.shape == batch.batch["input_ids"].shape and mask[:, -1].eq(1).all()
    assert mask.sum(-1).tolist() == [int(dataset.prompt_lengths[i]) for i in expected]
    assert loader.state_dict()["sampler"]["position"] == 1


def test_loader_custom_collate_fn(dataset):
    loader = PromptDataLoader(
        dataset,
        8,
        shuffle=False,
        drop_last=False,
        collate_fn=lambda items: [i["index"] for i in items],
    )
    assert list(loader) == [list(range(8)), list(range(8, 16)), list(range(16, 20))]
