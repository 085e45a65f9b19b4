"""Seam for model-based rewards: a reward model's outputs -> token-level scores.

A reward model (e.g. `AutoModelForSequenceClassification` with one label, or a causal LM
with a value head) emits one value per token of `input_ids` (batch, prompt_len +
response_len); the sequence's score is the value at its last real token. The
`RewardModelWorker` runs the model; these two functions are everything after the forward
pass, so rule-based and model-based rewards end in the same `token_level_scores` layout.
"""

from __future__ import annotations

import torch

from verl.rewards.placement import last_valid_index, place_on_last_token


def sequence_scores_from_values(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence reward (batch,) from per-token values (batch, seq_len).

    Takes the value at the last position where `attention_mask` is 1 (left or right
    padding both work). A (batch, seq_len, 1) value-head output is squeezed first.
    """
    if values.ndim == 3 and values.shape[-1] == 1:
        values = values.squeeze(-1)
    if values.shape != attention_mask.shape:
        raise ValueError(
            f"values {tuple(values.shape)} and attention_mask {tuple(attention_mask.shape)} "
            "must both be (batch, seq_len)"
        )
    index = last_valid_index(attention_mask)
    return values.gather(1, index.unsqueeze(1)).squeeze(1)


def rm_scores_to_token_level(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Reward-model sequence scores (batch,) -> `token_level_scores` (batch, response_len).

    Same placement as the rule-based `RewardManager`: the score sits on the last valid
    response token (position 0 for an empty response), zeros elsewhere.
    """
    return place_on_last_token(scores.float(), response_mask)
