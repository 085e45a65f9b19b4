"""Tests for verl/workers/micro_batching.py: trimming, token-budget packing, gathering."""

from __future__ import annotations

import pytest
import torch

from verl.kernels.torch_functional import compute_response_log_probs
from verl.models.tiny import build_tiny_model
from verl.protocol import DataProto
from verl.workers.micro_batching import (
    gather_response_outputs,
    split_micro_batches,
    trim_padding,
)

P, R = 5, 4


def _batch(prompt_lens: list[int], response_lens: list[int], vocab: int = 50) -> DataProto:
    """Left-padded prompts of ``P`` columns + right-padded responses of ``R`` columns."""
    rows = len(prompt_lens)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, P + R), generator=gen)
    mask = torch.zeros(rows, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        mask[i, P - p : P + r] = 1
    ids = ids * mask  # pad id 0
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
            "responses": ids[:, P:],
            "response_mask": mask[:, P:].float(),
            "advantages": torch.arange(rows * R, dtype=torch.float32).view(rows, R),
        },
        non_tensors={"uid": [f"u{i}" for i in range(rows)]},
        meta_info={"temperature": 0.7},
    )


def test_trim_padding_keeps_exactly_the_used_columns():
    data = _batch([2, 3], [1, 2])
    trimmed, r = trim_padding(data, R)
    assert r == 2
    assert trimmed.batch["input_ids"].shape == (2, 3 + 2)
    assert trimmed.batch["responses"].shape == (2, 2)
    assert trimmed.batch["advantages"].tolist() == [[0.0, 1.0], [4.0, 5.0]]
    # the cut columns were all padding: the kept mask holds every valid token
    assert trimmed.batch["attention_mask"].sum() == data.batch["attention_mask"].sum()
    assert torch.equal(trimmed.batch["input_ids"], data.batch["input_ids"][:, 2:7])
    assert list(trimmed.non_tensor_batch["uid"]) == ["u0", "u1"]
    assert trimmed.meta_info == {"temperature": 0.7}


def test_trim_padding_keeps_one_response_column_for_empty_responses():
    data = _batch([5, 1], [0, 0])
    trimmed, r = trim_padding(data, R)
    assert r == 1 and trimmed.batch["input_ids"].shape == (2, 5 + 1)


def test_fixed_size_micro_batches_keep_order():
    data = _batch([1, 2, 3, 4, 5], [4, 3, 2, 1, 0])
    parts = split_micro_batches(data, R, micro_batch_size=2)
    assert [mb.index.tolist() for mb in parts] == [[0, 1], [2, 3], [4]]
    assert [mb.response_len for mb in parts] == [4, 2, 1]
    assert [mb.data.batch["input_ids"].shape[1] for mb in parts] == [2 + 4, 4 + 2, 5 + 1]


def test_token_budget_packs_every_row_once_within_budget():
    prompt_lens = [1, 5, 2, 4, 3, 1, 5, 2]
    response_lens = [1, 4, 1, 3, 2, 0, 4, 2]
    data = _batch(prompt_lens, response_lens)
    budget = 12
    parts = split_micro_batches(data, R, max_token_len=budget)
    seen = sorted(i for mb in parts for i in mb.index.tolist())
    assert seen == list(range(8)), "every row lands in exactly one micro-batch"
    for mb in parts:
        rows, width = mb.data.batch["input_ids"].shape
        assert rows * width <= budget or rows == 1
    # longest rows first: the two 9-token rows cannot share a 12-token budget
    assert parts[0].index.tolist() == [1]
    assert len(parts) < len(prompt_lens), "short rows share micro-batches"


def test_a_row_longer_than_the_budget_gets_its_own_micro_batch():
    parts = split_micro_batches(_batch([5, 1], [4, 1]), R, max_token_len=3)
    assert [mb.index.tolist() for mb in parts] == [[0], [1]]


def test_bad_arguments_are_refused():
    data = _batch([1], [1])
    with pytest.raises(ValueError, match="exactly one"):
        split_micro_batches(data, R)
    with pytest.raises(ValueError, match="exactly one"):
        split_micro_batches(data, R, micro_batch_size=1, max_token_len=4)
    with pytest.raises(ValueError, match="max_token_len must be positive"):
        split_micro_batches(data, R, max_token_len=0)


def test_log_probs_from_trimmed_packed_micro_batches_equal_the_full_batch():
    model = build_tiny_model(seed=3).eval()
    data = _batch([1, 5, 2, 4, 3, 1], [1, 4, 1, 3, 2, 4], vocab=model.config.vocab_size)
    b = data.batch
    with torch.no_grad():
        full, _ = compute_response_log_probs(
            model, b["input_ids"], b["attention_mask"], b["position_ids"], response_len=R
        )
        parts = []
        for mb in split_micro_batches(data, R, max_token_len=14):
            x = mb.data.batch
            lp, _ = compute_response_log_probs(
                model,
                x["input_ids"],
                x["attention_mask"],
                x["position_ids"],
                response_len=mb.response_len,
            )
            parts.append((mb, lp))
    packed = gather_response_outputs(parts, len(data), R)
    mask = b["response_mask"].bool()
    torch.testing.assert_close(packed[mask], full[mask], rtol=0, atol=1e-5)
    assert torch.isfinite(packed).all()


def test_ranks_agree_on_the_micro_batch_count():
    data = _batch([1, 2, 1, 2, 1, 2], [1, 1, 1, 1, 1, 1])
    alone = split_micro_batches(data, R, max_token_len=100)
    assert len(alone) == 1
    # another rank needs 4 micro-batches: this one splits its largest until it has 4
    parts = split_micro_batches(data, R, max_token_len=100, agree=lambda count: max(count, 4))
    assert len(parts) == 4
    assert sorted(i for mb in parts for i in mb.index.tolist()) == list(range(6))
    with pytest.raises(ValueError, match="cannot make 7 micro-batches from 6 rows"):
        split_micro_batches(data, R, max_token_len=100, agree=lambda count: 7)
