"""Loader worker processes over a lazily read prompt dataset (verl.data.lazy_dataset and
PromptDataLoader(num_workers=...)): the same batches as the in-process loader, exact resume
mid-epoch, and bad rows reported by file and row from inside a worker."""

from __future__ import annotations

import json
import multiprocessing

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from verl.data import DatasetValidationError, PromptDataLoader, RLHFDataset
from verl.data.lazy_dataset import LazyRLHFDataset


@pytest.fixture
def prompt_files(tmp_path, make_row):
    """23 prompts as JSON lines (one a plain string, one blank line) and as parquet in
    row groups of 5."""
    rows = [
        make_row(f"{i} + {i * 7 % 10} = ?" * (1 + i % 3), str(i + i * 7 % 10)) for i in range(23)
    ]
    parquet = tmp_path / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet, row_group_size=5)
    rows[4]["prompt"] = "plain text prompt"  # JSON lines only: parquet needs one type
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text(
        "".join(json.dumps(r) + "\n" + ("\n" if i == 2 else "") for i, r in enumerate(rows))
    )
    return jsonl, parquet


def _same(a, b):
    assert a.batch.keys() == b.batch.keys()
    for key in a.batch:
        assert torch.equal(a.batch[key], b.batch[key]), key
    assert a.non_tensor_batch.keys() == b.non_tensor_batch.keys()
    for key in a.non_tensor_batch:
        assert list(a.non_tensor_batch[key]) == list(b.non_tensor_batch[key]), key


def _children() -> set:
    """This process's live children (an earlier test of the same pytest worker may have left
    daemon processes of its own, e.g. reward workers, which are not these tests' to count)."""
    return set(multiprocessing.active_children())


def _loader(dataset, **kwargs):
    return PromptDataLoader(dataset, batch_size=4, shuffle=True, seed=3, **kwargs)


@pytest.mark.parametrize("which", [0, 1])
def test_two_workers_give_the_batches_of_the_in_process_loader(tokenizer, prompt_files, which):
    before = _children()
    path = prompt_files[which]
    eager = _loader(RLHFDataset(path, tokenizer, max_prompt_length=64))
    lazy_ds = LazyRLHFDataset(path, tokenizer, max_prompt_length=64)
    assert len(lazy_ds) == 23
    lazy = _loader(lazy_ds, num_workers=2, prefetch_factor=3)
    for _epoch in range(2):  # 23 // 4 = 5 batches an epoch, 3 prompts carried over
        expected, got = list(eager), list(lazy)
        assert len(expected) == len(got) == 5
        for a, b in zip(expected, got):
            _same(a, b)
    assert lazy.sampler.state_dict() == eager.sampler.state_dict()
    assert _children() - before == set()  # non-persistent workers are gone


def test_an_epoch_with_workers_leaves_the_global_generator_alone(tokenizer, prompt_files):
    """torch's DataLoader draws its workers' base seed at each epoch's start, from the global
    generator unless it has one: the rollout's unseeded sampling would then differ with and
    without loader workers."""
    loader = _loader(LazyRLHFDataset(prompt_files[0], tokenizer), num_workers=2)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    assert len(list(loader)) == 5
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("persistent", [False, True])
def test_resume_mid_epoch_with_workers_equals_without(tokenizer, prompt_files, persistent):
    before = _children()
    path = prompt_files[0]
    eager = _loader(RLHFDataset(path, tokenizer))
    reference = list(eager) + list(eager)  # two epochs
    lazy_ds = LazyRLHFDataset(path, tokenizer)
    first = _loader(lazy_ds, num_workers=2, persistent_workers=persistent, prefetch_factor=4)
    taken = []
    for batch in first:  # the workers have read ahead well past batch 2
        taken.append(batch)
        if len(taken) == 2:
            break
    state = first.state_dict()
    assert state["sampler"]["position"] == 2
    first.close()
    resumed = _loader(
        LazyRLHFDataset(path, tokenizer), num_workers=2, persistent_workers=persistent
    )
    resumed.load_state_dict(state)
    taken += list(resumed) + list(resumed)
    assert len(taken) == len(reference) == 10
    for a, b in zip(reference, taken):
        _same(a, b)
    resumed.close()
    assert _children() - before == set()


def test_a_bad_row_is_named_from_inside_the_worker(tokenizer, tmp_path, make_row):
    path = tmp_path / "bad.jsonl"
    rows = [make_row("1 + 1 = ?", "2") for _ in range(7)]
    rows[5]["reward_model"] = {"style": "rule"}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loader = PromptDataLoader(
        LazyRLHFDataset(path, tokenizer), batch_size=2, shuffle=False, num_workers=2
    )
    before = _children()
    with pytest.raises(DatasetValidationError, match=rf"{path} line 6: missing ground truth"):
        list(loader)
    # the error stopped the workers: they do not wait for a garbage collection to find the
    # torch iterator in the traceback's reference cycle
    assert not [p for p in _children() - before if p.is_alive()]
    loader.close()


def test_long_prompts_error_or_truncate_counted_and_drop_refused(tokenizer, tmp_path, make_row):
    path = tmp_path / "long.jsonl"
    rows = [make_row("short?", "1"), make_row("very long " * 40, "2")] * 2
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"truncation=drop with data\.dataloader_num_workers > 0"):
        LazyRLHFDataset(path, tokenizer, max_prompt_length=30, truncation="drop")
    failing = PromptDataLoader(
        LazyRLHFDataset(path, tokenizer, max_prompt_length=30), 2, shuffle=False, num_workers=1
    )
    with pytest.raises(DatasetValidationError, match=rf"{path} line 2: the prompt has \d+ tokens"):
        list(failing)
    ds = LazyRLHFDataset(path, tokenizer, max_prompt_length=30, truncation="truncate")
    eager = RLHFDataset(path, tokenizer, max_prompt_length=30, truncation="truncate")
    batches = list(PromptDataLoader(ds, 2, shuffle=False, num_workers=2))
    assert ds.num_truncated == eager.num_truncated == 2  # counted in the driver's copy
    assert all("num_truncated" not in b.meta_info for b in batches)
    ids = torch.cat([b.batch["input_ids"] for b in batches])
    assert ids.shape == (4, 30)
    eager_ids = [eager[i]["input_ids"].tolist() for i in range(4)]
    assert [row[row != 0].tolist()[-len(e) :] for row, e in zip(ids, eager_ids)] == eager_ids


def test_settings_without_workers_and_json_arrays_are_refused(tokenizer, tmp_path, make_row):
    path = tmp_path / "array.json"
    path.write_text(json.dumps([make_row("1 + 1 = ?", "2")]))
    with pytest.raises(DatasetValidationError, match="a JSON array cannot be read lazily"):
        LazyRLHFDataset(path, tokenizer)
    ds = RLHFDataset(path, tokenizer)
    with pytest.raises(ValueError, match="need worker processes: set num_workers >= 1"):
        PromptDataLoader(ds, 1, persistent_workers=True)
    assert np.asarray(ds.prompt_lengths).size == 1
