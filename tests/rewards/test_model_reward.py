"""Placement of sequence scores on the last valid token, and the reward-model seam."""

from __future__ import annotations

import pytest
import torch

from verl.rewards.model_reward import rm_scores_to_token_level, sequence_scores_from_values
from verl.rewards.placement import last_valid_index, place_on_last_token


def test_last_valid_index_any_mask():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0]])
    assert last_valid_index(mask).tolist() == [2, 0, 0, 3, 2]


def test_place_on_last_token():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    out = place_on_last_token(torch.tensor([0.5, -2.0, 3.0], dtype=torch.float64), mask)
    assert out.dtype == torch.float32
    assert out.tolist() == [[0.0, 0.5, 0.0], [0.0, 0.0, -2.0], [3.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match=r"scores \(2,\)"):
        place_on_last_token(torch.zeros(2), mask)


def test_sequence_scores_from_values_left_and_right_padding():
    values = torch.arange(12, dtype=torch.float32).reshape(2, 6, 1)  # value-head output
    attention = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    assert sequence_scores_from_values(values, attention).tolist() == [5.0, 8.0]
    with pytest.raises(ValueError, match=r"values \(2, 5\)"):
        sequence_scores_from_values(torch.zeros(2, 5), attention)


def test_rm_scores_to_token_level():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    out = rm_scores_to_token_level(torch.tensor([0.25, -1.0]), mask)
    assert out.tolist() == [[0.0, 0.25, 0.0, 0.0], [0.0, 0.0, 0.0, -1.0]]
